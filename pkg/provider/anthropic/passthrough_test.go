package anthropic

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/mantle-mesh/mantle/pkg/provider"
)

// TestMessagesDoorFieldsReachAnthropic: the Messages API's own fields, which the router
// carries from /v1/messages (top_k, thinking, a tool_result's is_error), are sent as
// Anthropic names them, the combinations Anthropic refuses are named instead of sent, and
// the stop sequence that ended an answer comes back.
func TestMessagesDoorFieldsReachAnthropic(t *testing.T) {
	t.Parallel()
	k := 40
	user := provider.Message{Role: "user", Content: "hi"}
	toolTurns := []provider.Message{user,
		{Role: "assistant", ToolCalls: []provider.ToolCall{{ID: "t1", Type: "function", Name: "f", Arguments: "{}"}}},
		{Role: "tool", ToolCallID: "t1", Content: "boom", ToolError: true}}
	tools := []provider.Tool{{Name: "f"}}
	tests := []struct {
		name       string
		req        provider.Request
		want       map[string]string // members of the body, as JSON
		wantRefuse string
	}{
		{name: "top_k", req: provider.Request{TopK: &k, Messages: []provider.Message{user}},
			want: map[string]string{"top_k": `40`}},
		{name: "thinking enabled, sent as it is", req: provider.Request{MaxTokens: 4096, Thinking: &provider.Thinking{Type: "enabled", BudgetTokens: 1024}, Messages: []provider.Message{user}},
			want: map[string]string{"thinking": `{"type":"enabled","budget_tokens":1024}`, "max_tokens": `4096`}},
		{name: "thinking disabled", req: provider.Request{Thinking: &provider.Thinking{Type: "disabled"}, Messages: []provider.Message{user}},
			want: map[string]string{"thinking": `{"type":"disabled"}`}},
		{name: "a failed tool's result is_error", req: provider.Request{Tools: tools, Messages: toolTurns},
			want: map[string]string{"messages": `[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"boom","is_error":true}]}]`}},
		{name: "thinking with top_k: refused (Anthropic does not take both)", req: provider.Request{MaxTokens: 4096, TopK: &k, Thinking: &provider.Thinking{Type: "enabled", BudgetTokens: 1024}, Messages: []provider.Message{user}},
			wantRefuse: "thinking (with top_k)"},
		{name: "thinking and reasoning_effort: refused, one or the other", req: provider.Request{ReasoningEffort: "low", Thinking: &provider.Thinking{Type: "enabled", BudgetTokens: 2048}, Messages: []provider.Message{user}},
			wantRefuse: "thinking (with reasoning_effort)"},
		{name: "a budget below Anthropic's minimum", req: provider.Request{Thinking: &provider.Thinking{Type: "enabled", BudgetTokens: 100}, Messages: []provider.Message{user}},
			wantRefuse: "thinking.budget_tokens"},
		{name: "a budget not below max_tokens", req: provider.Request{MaxTokens: 2048, Thinking: &provider.Thinking{Type: "enabled", BudgetTokens: 2048}, Messages: []provider.Message{user}},
			wantRefuse: "thinking.budget_tokens"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := make(chan map[string]json.RawMessage, 1)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				var body map[string]json.RawMessage
				_ = json.Unmarshal(b, &body)
				got <- body
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, `{"type":"message","model":"m","content":[{"type":"text","text":"ok"}],"stop_reason":"stop_sequence","stop_sequence":"END","usage":{"input_tokens":1,"output_tokens":1}}`)
			}))
			t.Cleanup(srv.Close)
			c := New(Config{BaseURL: srv.URL})
			tt.req.Model = "m"
			if f := c.Unsupported(tt.req); f != tt.wantRefuse {
				t.Fatalf("Unsupported = %q, want %q", f, tt.wantRefuse)
			}
			if tt.wantRefuse != "" {
				return
			}
			res, err := c.Complete(context.Background(), tt.req)
			if err != nil {
				t.Fatal(err)
			}
			body := <-got
			for k, v := range tt.want {
				if string(body[k]) != v {
					t.Errorf("%s = %s, want %s", k, body[k], v)
				}
			}
			if res.StopSequence != "END" || res.FinishReason != "stop" {
				t.Errorf("stop sequence %q finish %q, want END and stop", res.StopSequence, res.FinishReason)
			}
		})
	}
}
