package openaiapi

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

func TestDecodeEmbeddingsRequest(t *testing.T) {
	dims := int32(256)
	tests := []struct {
		name      string
		body      string
		want      *routerv1.EmbedRequest
		wantField string // the refused field
	}{
		{"one string", `{"model":"e","input":"hi"}`, &routerv1.EmbedRequest{Model: "e", Input: []string{"hi"}}, ""},
		{"strings", `{"model":"e","input":["a","b"],"user":"u","encoding_format":"base64","dimensions":256}`,
			&routerv1.EmbedRequest{Model: "e", Input: []string{"a", "b"}, User: "u", EncodingFormat: "base64", Dimensions: &dims}, ""},
		{"tokens", `{"model":"e","input":[1,2,3]}`, &routerv1.EmbedRequest{Model: "e", InputTokens: []*routerv1.TokenInput{{Tokens: []int64{1, 2, 3}}}}, ""},
		{"token lists", `{"model":"e","input":[[1],[2,3]]}`, &routerv1.EmbedRequest{Model: "e", InputTokens: []*routerv1.TokenInput{{Tokens: []int64{1}}, {Tokens: []int64{2, 3}}}}, ""},
		{"empty string is an input", `{"model":"e","input":""}`, &routerv1.EmbedRequest{Model: "e", Input: []string{""}}, ""},
		{"unknown field", `{"model":"e","input":"x","truncate":true}`, nil, "truncate"},
		{"no input", `{"model":"e"}`, nil, "input"},
		{"empty list", `{"model":"e","input":[]}`, nil, "input"},
		{"mixed list", `{"model":"e","input":["a",[1]]}`, nil, "input[1]"},
		{"mixed tokens", `{"model":"e","input":[[1],"a"]}`, nil, "input[1]"},
		{"not an input", `{"model":"e","input":{"a":1}}`, nil, "input"},
		{"bad format", `{"model":"e","input":"x","encoding_format":"int8"}`, nil, "encoding_format"},
		{"zero dimensions", `{"model":"e","input":"x","dimensions":0}`, nil, "dimensions"},
		{"too many inputs", `{"model":"e","input":[` + strings.Repeat(`"a",`, MaxEmbeddingInputs) + `"a"]}`, nil, "input"},
		{"too many tokens", `{"model":"e","input":[` + strings.Repeat(`1,`, MaxEmbeddingTokens) + `1]}`, nil, "input"},
		{"not an object", `["e"]`, nil, "body"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeEmbeddingsRequest([]byte(tt.body))
			if tt.wantField != "" {
				var v *rpc.ValidationError
				if !errors.As(err, &v) || len(v.Violations) == 0 || v.Violations[0].Field != tt.wantField {
					t.Fatalf("err = %v, want a violation of %s", err, tt.wantField)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// FuzzDecodeEmbeddingsRequest: any body either decodes into a request that marshals and
// respects the input limits, or is refused with a field error; never a panic.
func FuzzDecodeEmbeddingsRequest(f *testing.F) {
	f.Add([]byte(`{"model":"m","input":"hi"}`))
	f.Add([]byte(`{"model":"m","input":[[1,2],[3]],"dimensions":8,"encoding_format":"base64","user":"u"}`))
	f.Add([]byte(`{"model":"m","input":["a","b"]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := DecodeEmbeddingsRequest(body)
		if err != nil {
			var v *rpc.ValidationError
			if !errors.As(err, &v) || len(v.Violations) == 0 || v.Violations[0].Field == "" {
				t.Fatalf("error without a field: %v", err)
			}
			return
		}
		if _, err := proto.Marshal(req); err != nil {
			t.Fatalf("decoded request does not marshal: %v", err)
		}
		if n := len(req.Input) + len(req.InputTokens); n == 0 || n > MaxEmbeddingInputs || len(req.Input) > 0 && len(req.InputTokens) > 0 {
			t.Fatalf("%d text and %d token inputs", len(req.Input), len(req.InputTokens))
		}
		for _, ti := range req.InputTokens {
			if len(ti.Tokens) > MaxEmbeddingTokens {
				t.Fatalf("%d tokens", len(ti.Tokens))
			}
		}
	})
}
