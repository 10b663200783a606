package router

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mantle-mesh/mantle/pkg/provider"
)

// flushRecorder records what had been written at each flush.
type flushRecorder struct {
	*httptest.ResponseRecorder
	flushed []string
}

func (f *flushRecorder) Flush() {
	f.flushed = append(f.flushed, f.Body.String())
	f.ResponseRecorder.Flush()
}

// TestStreamFlushesPerArrival: both doors write the pieces that arrived together (a chunk
// with More) in one flush, and flush each piece that the stream must wait after at once,
// so a caller reading the stream gets what the provider sent as soon as it came, in as few
// writes as it came in.
func TestStreamFlushesPerArrival(t *testing.T) {
	t.Parallel()
	usage := &provider.Usage{InputTokens: 5, OutputTokens: 6}
	doors := []struct {
		name  string
		serve func(f *frontDoor, w http.ResponseWriter)
	}{
		{"chat", func(f *frontDoor, w http.ResponseWriter) {
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"chat","stream":true,"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]}`))
			f.chatCompletions(w, r)
		}},
		{"messages", func(f *frontDoor, w http.ResponseWriter) {
			r := httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(`{"model":"chat","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"get_weather","input_schema":{"type":"object"}}]}`))
			r.Header.Set(HeaderAnthropicVersion, "2023-06-01")
			f.messages(w, r)
		}},
	}
	for _, door := range doors {
		for _, tt := range []struct {
			name   string
			stream []chunk
			// first is what the first flush carries, and next what it must not (what came
			// later, as each door writes it).
			first, next []string
		}{
			{"together", []chunk{{content: "Alpha", more: true}, {content: "Bravo", more: true}, {content: "Charlie"}, {content: "Delta"}, {finish: "stop", usage: usage}},
				[]string{"Alpha", "Bravo", "Charlie"}, []string{"Delta"}},
			{"one by one", []chunk{{content: "Alpha"}, {content: "Bravo"}, {finish: "stop", usage: usage}},
				[]string{"Alpha"}, []string{"Bravo"}},
			// A tool call is held whole until checked; the one delta it then goes out as
			// is flushed at once, whatever company its first piece had.
			{"held tool call", []chunk{
				{tools: []provider.ToolCallDelta{{Index: 0, ID: "call_1", Type: "function", Name: "get_weather"}}, more: true},
				{tools: []provider.ToolCallDelta{{Index: 0, Arguments: `{"city":"Lisbon"}`}}},
				{finish: "tool_calls", usage: usage}},
				[]string{"get_weather", "Lisbon"}, []string{`"finish_reason":"tool_calls"`, "message_delta"}},
		} {
			t.Run(door.name+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				h := newHarness(t, testConfig(), &harness{providers: map[string]*fakeProvider{"a": newFakeProvider(result{stream: tt.stream})}})
				w := &flushRecorder{ResponseRecorder: httptest.NewRecorder()}
				door.serve(&frontDoor{router: h.router}, w)
				if w.Code != http.StatusOK || len(w.flushed) == 0 {
					t.Fatalf("HTTP %d, %d flushes: %s", w.Code, len(w.flushed), w.Body)
				}
				for _, piece := range tt.first {
					if !strings.Contains(w.flushed[0], piece) {
						t.Errorf("first flush lacks %q:\n%s", piece, w.flushed[0])
					}
				}
				for _, later := range tt.next {
					if strings.Contains(w.flushed[0], later) {
						t.Errorf("first flush already holds %q, which came later:\n%s", later, w.flushed[0])
					}
				}
				if last := w.flushed[len(w.flushed)-1]; last != w.Body.String() {
					t.Errorf("the stream's end was not flushed: %d bytes written after the last flush", len(w.Body.String())-len(last))
				}
			})
		}
	}
}
