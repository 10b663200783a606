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

// TestTopKAndThinkingReachAnthropic: the Messages API's top_k and thinking, which the
// router carries from /v1/messages, are sent as Anthropic names them.
func TestTopKAndThinkingReachAnthropic(t *testing.T) {
	t.Parallel()
	got := make(chan map[string]json.RawMessage, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var body map[string]json.RawMessage
		_ = json.Unmarshal(b, &body)
		got <- body
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"type":"message","model":"m","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":1}}`)
	}))
	t.Cleanup(srv.Close)
	k := 40
	req := provider.Request{Model: "m", MaxTokens: 2048, TopK: &k, Thinking: &provider.Thinking{Type: "enabled", BudgetTokens: 1024},
		Messages: []provider.Message{{Role: "user", Content: "hi"}}}
	if _, err := New(Config{BaseURL: srv.URL}).Complete(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	body := <-got
	if string(body["top_k"]) != `40` || string(body["thinking"]) != `{"type":"enabled","budget_tokens":1024}` {
		t.Errorf("top_k %s, thinking %s", body["top_k"], body["thinking"])
	}
}
