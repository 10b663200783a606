package router

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.MaxPromptBytes = 64
	cfg.MaxOutputTokens = 1000
	r := newHarness(t, cfg, nil).router

	user := func(content string) *mantlev1.ChatMessage {
		return &mantlev1.ChatMessage{Role: "user", Content: content}
	}
	temp := func(v float64) *float64 { return &v }
	tests := []struct {
		name      string
		req       *routerv1.Request
		wantRoute string
		// wantFields are the BadRequest field paths, in order.
		wantFields []string
	}{
		{name: "route", req: &routerv1.Request{Model: "chat", Messages: []*mantlev1.ChatMessage{user("hi")}}, wantRoute: "chat"},
		{name: "model name is a route", req: &routerv1.Request{Model: "b", Messages: []*mantlev1.ChatMessage{user("hi")}}, wantRoute: "b"},
		{name: "every role", req: &routerv1.Request{Model: "chat", Messages: []*mantlev1.ChatMessage{
			{Role: "system", Content: "s"}, {Role: "developer", Content: "d"}, user("u"), {Role: "assistant"}, {Role: "tool", Content: "t"},
		}}, wantRoute: "chat"},
		{name: "nil request", req: nil, wantFields: []string{"request"}},
		{name: "no model", req: &routerv1.Request{Messages: []*mantlev1.ChatMessage{user("hi")}}, wantFields: []string{"request.model"}},
		{name: "no messages", req: &routerv1.Request{Model: "chat"}, wantFields: []string{"request.messages"}},
		{name: "bad role", req: &routerv1.Request{Model: "chat", Messages: []*mantlev1.ChatMessage{user("hi"), {Role: "robot", Content: "x"}}},
			wantFields: []string{"request.messages[1].role"}},
		{name: "empty user content", req: &routerv1.Request{Model: "chat", Messages: []*mantlev1.ChatMessage{{Role: "system", Content: "s"}, user("")}},
			wantFields: []string{"request.messages[1].content"}},
		{name: "no user message", req: &routerv1.Request{Model: "chat", Messages: []*mantlev1.ChatMessage{{Role: "system", Content: "s"}}},
			wantFields: []string{"request.messages"}},
		{name: "prompt too large", req: &routerv1.Request{Model: "chat", Messages: []*mantlev1.ChatMessage{user(strings.Repeat("x", 65))}},
			wantFields: []string{"request.messages"}},
		{name: "negative max_tokens", req: &routerv1.Request{Model: "chat", Messages: []*mantlev1.ChatMessage{user("hi")}, MaxTokens: -1},
			wantFields: []string{"request.max_tokens"}},
		{name: "max_tokens over the limit", req: &routerv1.Request{Model: "chat", Messages: []*mantlev1.ChatMessage{user("hi")}, MaxTokens: 1001},
			wantFields: []string{"request.max_tokens"}},
		{name: "temperature", req: &routerv1.Request{Model: "chat", Messages: []*mantlev1.ChatMessage{user("hi")}, Temperature: temp(2.5)},
			wantFields: []string{"request.temperature"}},
		{name: "json schema missing", req: &routerv1.Request{Model: "chat", Messages: []*mantlev1.ChatMessage{user("hi")},
			ResponseFormat: &mantlev1.ResponseFormat{Type: mantlev1.ResponseFormat_TYPE_JSON_SCHEMA}},
			wantFields: []string{"request.response_format.json_schema"}},
		{name: "json schema invalid", req: &routerv1.Request{Model: "chat", Messages: []*mantlev1.ChatMessage{user("hi")},
			ResponseFormat: &mantlev1.ResponseFormat{Type: mantlev1.ResponseFormat_TYPE_JSON_SCHEMA, JsonSchema: "{"}},
			wantFields: []string{"request.response_format.json_schema"}},
		{name: "idempotency key too long", req: &routerv1.Request{Model: "chat", Messages: []*mantlev1.ChatMessage{user("hi")}, IdempotencyKey: strings.Repeat("k", 257)},
			wantFields: []string{"request.idempotency_key"}},
		{name: "every violation is reported", req: &routerv1.Request{Messages: []*mantlev1.ChatMessage{{Role: "x"}}, MaxTokens: -1, Temperature: temp(-1)},
			wantFields: []string{"request.model", "request.messages[0].role", "request.messages", "request.max_tokens", "request.temperature"}},
		{name: "unknown route", req: &routerv1.Request{Model: "nope", Messages: []*mantlev1.ChatMessage{user("hi")}}},
		{name: "user turn of parts", req: &routerv1.Request{Model: "chat", Messages: []*mantlev1.ChatMessage{{Role: "user", Parts: []*mantlev1.ContentPart{
			{Part: &mantlev1.ContentPart_Image{Image: &mantlev1.ImagePart{Data: []byte{1}, MediaType: "image/png"}}}}}}}, wantRoute: "chat"},
		{name: "parts count against the prompt limit", req: &routerv1.Request{Model: "chat", Messages: []*mantlev1.ChatMessage{{Role: "user", Parts: []*mantlev1.ContentPart{
			{Part: &mantlev1.ContentPart_Image{Image: &mantlev1.ImagePart{Url: "https://x/" + strings.Repeat("y", 64)}}}}}}},
			wantFields: []string{"request.messages"}},
		{name: "n above 1", req: &routerv1.Request{Model: "chat", Messages: []*mantlev1.ChatMessage{user("hi")}, N: proto.Int32(2)},
			wantFields: []string{"request.n"}},
		{name: "tools", req: &routerv1.Request{Model: "chat", Messages: []*mantlev1.ChatMessage{user("hi")}, Tools: []*mantlev1.Tool{
			{Type: "function", Name: "f", Parameters: `{"type":"object"}`}, {Type: "custom", Parameters: "[1]"}},
			ToolChoice: "function"},
			wantFields: []string{"request.tools[1].type", "request.tools[1].function.name", "request.tools[1].function.parameters", "request.tool_choice_function"}},
		{name: "tool_choice_function without function", req: &routerv1.Request{Model: "chat", Messages: []*mantlev1.ChatMessage{user("hi")}, ToolChoice: "auto", ToolChoiceFunction: "f"},
			wantFields: []string{"request.tool_choice"}},
		{name: "extra_body not an object", req: &routerv1.Request{Model: "chat", Messages: []*mantlev1.ChatMessage{user("hi")}, ExtraBody: `[1]`},
			wantFields: []string{"request.extra_body"}},
		{name: "empty part", req: &routerv1.Request{Model: "chat", Messages: []*mantlev1.ChatMessage{{Role: "user", Parts: []*mantlev1.ContentPart{{}}}}},
			wantFields: []string{"request.messages[0].parts[0]"}},
		{name: "content and parts", req: &routerv1.Request{Model: "chat", Messages: []*mantlev1.ChatMessage{{Role: "user", Content: "x", Parts: []*mantlev1.ContentPart{
			{Part: &mantlev1.ContentPart_Text{Text: "y"}}}}}},
			wantFields: []string{"request.messages[0].content"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rt, err := r.validate(t.Context(), tt.req)
			switch {
			case tt.wantRoute != "":
				if err != nil || rt.name != tt.wantRoute {
					t.Fatalf("validate = %v, %v; want route %s", rt, err, tt.wantRoute)
				}
			case tt.wantFields == nil:
				var unknown *unknownRouteError
				if !errors.As(err, &unknown) || unknown.name != tt.req.Model {
					t.Fatalf("validate = %v, want unknownRouteError for %q", err, tt.req.Model)
				}
			default:
				var v *rpc.ValidationError
				if !errors.As(err, &v) {
					t.Fatalf("validate = %v, want a *rpc.ValidationError", err)
				}
				var fields []string
				for _, fv := range v.Violations {
					fields = append(fields, fv.Field)
					if fv.Description == "" {
						t.Errorf("violation of %s has no description", fv.Field)
					}
				}
				if diff := cmp.Diff(tt.wantFields, fields); diff != "" {
					t.Errorf("violated fields (-want +got):\n%s", diff)
				}
			}
		})
	}
}
