package router

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mantle-mesh/mantle/pkg/anthropicapi"
	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// FuzzFrontDoorRequest: any body and mantle headers are decoded and validated as the front
// door does before the router runs, into a request or a clear error, never a panic; what is
// accepted is UTF-8 with a bounded scenario and budget.
func FuzzFrontDoorRequest(f *testing.F) {
	for _, seed := range []string{
		`{"model":"chat","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"chat","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"}]}],"max_completion_tokens":5,"temperature":0.2,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"chat","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"object","properties":{"a":{"$ref":"#/$defs/x"}},"$defs":{"x":{"type":"string"}}}}}}`,
		`{"model":"chat","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"schema":"notaschema"}}}`,
		`{"model":"chat","messages":[]} trailing`, "{\"model\":\"\xff\"}", `{"model":`, ``,
	} {
		f.Add([]byte(seed), "support", "1500", "high")
	}
	f.Add([]byte(`{"model":"chat","messages":[{"role":"user","content":"hi"}]}`), strings.Repeat("s", 100), "9223372036854775807", "urgent")
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		f.Fatal(err)
	}
	r, err := New(testConfig(), Deps{Clock: clockwork.NewFakeClock(), Log: slog.New(slog.DiscardHandler), Metrics: m},
		func(ProviderConfig, ModelConfig, string) (provider.Provider, error) { return newFakeProvider(), nil })
	if err != nil {
		f.Fatal(err)
	}
	fd := &frontDoor{router: r}
	f.Fuzz(func(t *testing.T, body []byte, scenario, budget, priority string) {
		h := http.Header{}
		h.Set(HeaderScenario, scenario)
		h.Set(HeaderBudget, budget)
		h.Set(HeaderPriority, priority)
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(string(body)))
		cr, ok := fd.decodeChat(httptest.NewRecorder(), req, 1<<20)
		if !ok {
			return
		}
		if _, err := headerBudget(h); err != nil && rpc.BadRequestFields(toStatus(err)) == nil {
			t.Fatalf("budget %q: %v without a field", budget, err)
		}
		p, err := headerPriority(h)
		if err != nil {
			return
		}
		rreq, err := chatToProto(cr.Request, h, p)
		if err != nil {
			return
		}
		if _, err := r.validate(t.Context(), rreq); err != nil {
			return
		}
		if len(rreq.Scenario) > maxLabelBytes {
			t.Fatalf("accepted a scenario of %d bytes", len(rreq.Scenario))
		}
	})
}

// FuzzMessagesDoorRequest: any Messages API body is decoded and validated as the Messages
// door does, into a request or a clear error, never a panic.
func FuzzMessagesDoorRequest(f *testing.F) {
	for _, seed := range []string{
		`{"model":"chat","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"chat","max_tokens":5,"system":[{"type":"text","text":"s"}],"top_k":3,"thinking":{"type":"enabled","budget_tokens":9},"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA=="}}]},{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","is_error":true}]}]}`,
		`{"model":"chat","max_tokens":5,"messages":[]}`, `{"model":"chat"} x`, "{\"model\":\"\xff\"}", ``,
	} {
		f.Add([]byte(seed))
	}
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		f.Fatal(err)
	}
	r, err := New(testConfig(), Deps{Clock: clockwork.NewFakeClock(), Log: slog.New(slog.DiscardHandler), Metrics: m},
		func(ProviderConfig, ModelConfig, string) (provider.Provider, error) { return newFakeProvider(), nil })
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		mr, err := anthropicapi.DecodeMessagesRequest(body)
		if err != nil {
			if rpc.BadRequestFields(toStatus(err)) == nil {
				t.Fatalf("refused without a field: %v", err)
			}
			return
		}
		req, err := chatToProto(mr.Request, http.Header{}, 0)
		if err != nil {
			return
		}
		_, _ = r.validate(t.Context(), req)
	})
}

// FuzzMessagesStream: any sequence of streamed text and tool call pieces becomes events
// with one content block open at a time, each delta to the open block, and every piece
// delivered to its block in order (or the stream fails with an error).
func FuzzMessagesStream(f *testing.F) {
	f.Add([]byte{0, 'a', 1, '{', 2, '{', 1, '}', 2, '}', 0, 'b'})
	f.Add([]byte{1, ' ', 1, '{', 1, '}', 2, '[', 1, ' ', 0, 'x'})
	f.Fuzz(func(t *testing.T, ops []byte) {
		open := -1
		next := 0
		kind := map[int]string{}
		got := map[int]string{}
		s := &messagesStream{send: func(event string, v any) error {
			switch e := v.(type) {
			case anthropicapi.BlockStart:
				if open != -1 || e.Index != next {
					t.Fatalf("block %d started while %d is open (next %d)", e.Index, open, next)
				}
				open, next = e.Index, next+1
				kind[e.Index] = e.ContentBlock.Type
			case anthropicapi.BlockDelta:
				if e.Index != open {
					t.Fatalf("delta to block %d while %d is open", e.Index, open)
				}
				if e.Delta.Text != nil {
					got[e.Index] += *e.Delta.Text
				} else {
					got[e.Index] += *e.Delta.PartialJSON
				}
			case anthropicapi.BlockStop:
				if e.Index != open {
					t.Fatalf("block %d stopped while %d is open", e.Index, open)
				}
				open = -1
			}
			return nil
		}}
		want := map[string]string{} // "text" or the tool index -> what was sent
		for i := 0; i+1 < len(ops); i += 2 {
			piece := string(ops[i+1 : i+2])
			var err error
			if ops[i]%3 == 0 {
				want["text"] += piece
				err = s.text(piece)
			} else {
				idx := int(ops[i] % 3)
				want[fmt.Sprint(idx)] += piece
				err = s.tool(provider.ToolCallDelta{Index: idx, ID: "id", Name: "f", Arguments: piece})
			}
			if err != nil {
				return // a piece after complete arguments: the stream fails, as it should
			}
		}
		if err := s.finish(); err != nil {
			t.Fatal(err)
		}
		if open != -1 {
			t.Fatalf("block %d left open", open)
		}
		text, tools := "", map[string]string{}
		for i := 0; i < next; i++ {
			if kind[i] == "text" {
				text += got[i]
			}
		}
		for _, b := range s.blocks {
			if b.tool {
				tools[fmt.Sprint(b.index)] += got[b.wire]
			}
		}
		if text != want["text"] {
			t.Fatalf("text %q, want %q", text, want["text"])
		}
		for k, v := range want {
			if k != "text" && strings.TrimSpace(tools[k]) != strings.TrimSpace(v) {
				t.Fatalf("tool %s arguments %q, want %q", k, tools[k], v)
			}
		}
	})
}
