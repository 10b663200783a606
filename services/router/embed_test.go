package router

import (
	"context"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	"github.com/mantle-mesh/mantle/pkg/openaiapi"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

func TestEmbedValidation(t *testing.T) {
	cfg := testConfig()
	cfg.Models = append(cfg.Models, ModelConfig{Name: "e", Provider: "p", Capabilities: &Capabilities{Embeddings: true}})
	cfg.MaxPromptBytes = 1000
	h := newHarness(t, cfg, &harness{})
	d0, d := int32(0), int32(8)
	many := make([]string, openaiapi.MaxEmbeddingInputs+1)
	for i := range many {
		many[i] = "x"
	}
	tests := []struct {
		name  string
		req   *routerv1.EmbedRequest
		code  codes.Code
		field string
	}{
		{"no model", &routerv1.EmbedRequest{Input: []string{"x"}}, codes.InvalidArgument, "model"},
		{"no input", &routerv1.EmbedRequest{Model: "e"}, codes.InvalidArgument, "input"},
		{"both kinds", &routerv1.EmbedRequest{Model: "e", Input: []string{"x"}, InputTokens: []*routerv1.TokenInput{{Tokens: []int64{1}}}}, codes.InvalidArgument, "input"},
		{"too many", &routerv1.EmbedRequest{Model: "e", Input: many}, codes.InvalidArgument, "input"},
		{"too large", &routerv1.EmbedRequest{Model: "e", Input: []string{strings.Repeat("x", 1001)}}, codes.InvalidArgument, "input"},
		{"empty string", &routerv1.EmbedRequest{Model: "e", Input: []string{"x", ""}}, codes.InvalidArgument, "input[1]"},
		{"empty tokens", &routerv1.EmbedRequest{Model: "e", InputTokens: []*routerv1.TokenInput{{}}}, codes.InvalidArgument, "input[0]"},
		{"dimensions", &routerv1.EmbedRequest{Model: "e", Input: []string{"x"}, Dimensions: &d0}, codes.InvalidArgument, "dimensions"},
		{"encoding", &routerv1.EmbedRequest{Model: "e", Input: []string{"x"}, EncodingFormat: "int8"}, codes.InvalidArgument, "encoding_format"},
		{"chat route", &routerv1.EmbedRequest{Model: "chat", Input: []string{"x"}, Dimensions: &d}, codes.InvalidArgument, "model"},
		{"unknown route", &routerv1.EmbedRequest{Model: "nope", Input: []string{"x"}}, codes.NotFound, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := h.router.Embed(context.Background(), tt.req)
			st := status.Convert(toStatus(err))
			if st.Code() != tt.code {
				t.Fatalf("code %s (%v), want %s", st.Code(), err, tt.code)
			}
			var v *rpc.ValidationError
			if tt.field != "" && (!errors.As(err, &v) || v.Violations[0].Field != tt.field) {
				t.Errorf("err %v, want a violation of %s", err, tt.field)
			}
		})
	}
	// The embeddings model on the chat door.
	if _, err := h.router.Complete(context.Background(), ask("e")); status.Code(toStatus(err)) != codes.InvalidArgument || !strings.Contains(err.Error(), "embeddings") {
		t.Errorf("chat on an embeddings model: %v", err)
	}
	// A provider without an embeddings API is a request no candidate can serve.
	_, err := h.router.Embed(context.Background(), &routerv1.EmbedRequest{Model: "e", Input: []string{"x"}})
	if status.Code(toStatus(err)) != codes.InvalidArgument {
		t.Errorf("embeddings through an adapter without them: %v", err)
	}
}
