package anthropic

import (
	"encoding/json"
	"testing"

	"github.com/mantle-mesh/mantle/pkg/provider"
)

func TestUnsupported(t *testing.T) {
	t.Parallel()
	one, yes := 1, true
	seed := int64(1)
	user := []provider.Message{{Role: "user", Content: "hi"}}
	tests := []struct {
		name string
		req  provider.Request
		want string
	}{
		{name: "plain text", req: provider.Request{Messages: user, JSON: true}},
		{name: "n of 1", req: provider.Request{Messages: user, N: &one}},
		{name: "image", req: provider.Request{Messages: []provider.Message{{Role: "user", Parts: []provider.Part{{Type: provider.PartImage, ImageURL: "https://x"}}}}}, want: "messages[].content (content parts)"},
		{name: "tool turn", req: provider.Request{Messages: append(user, provider.Message{Role: "tool", ToolCallID: "c", Content: "x"})}, want: "messages[].tool_call_id"},
		{name: "name", req: provider.Request{Messages: []provider.Message{{Role: "user", Content: "hi", Name: "ann"}}}, want: "messages[].name"},
		{name: "tools", req: provider.Request{Messages: user, Tools: []provider.Tool{{Type: "function", Name: "f"}}}, want: "tools"},
		{name: "stop", req: provider.Request{Messages: user, Stop: []string{"x"}}, want: "stop"},
		{name: "seed", req: provider.Request{Messages: user, Seed: &seed}, want: "seed"},
		{name: "logprobs", req: provider.Request{Messages: user, Logprobs: &yes}, want: "logprobs"},
		{name: "extra_body", req: provider.Request{Messages: user, ExtraBody: json.RawMessage(`{}`)}, want: "extra_body"},
	}
	c := New(Config{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := c.Unsupported(tt.req); got != tt.want {
				t.Errorf("Unsupported = %q, want %q", got, tt.want)
			}
		})
	}
}
