package router

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// postMessages sends body to the Messages door with the version header, and headers.
func postMessages(f *frontDoor, body string, headers map[string]string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(body))
	req.Header.Set(HeaderAnthropicVersion, "2023-06-01")
	for k, v := range headers {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	w := httptest.NewRecorder()
	f.messages(w, req)
	return w
}

// TestMessagesDoor: a Messages API request reaches the provider as the router request the
// chat door would build, and the answer comes back in Anthropic's shape.
func TestMessagesDoor(t *testing.T) {
	t.Parallel()
	calls := []provider.ToolCall{{ID: "call_a", Type: "function", Name: "get_weather", Arguments: `{"city":"Paris"}`}}
	tests := []struct {
		name   string
		body   string
		answer result
		// check looks at what the provider received.
		check func(t *testing.T, got provider.Request)
		want  string // the answer, as JSON (its id and the mantle member aside)
	}{
		{
			name:   "text",
			body:   `{"model":"chat","max_tokens":50,"system":"be brief","temperature":0.2,"stop_sequences":["END"],"metadata":{"user_id":"u-1"},"messages":[{"role":"user","content":"hi"}]}`,
			answer: reply("hello", 7, 3),
			check: func(t *testing.T, got provider.Request) {
				want := []provider.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}}
				if diff := cmp.Diff(want, got.Messages); diff != "" {
					t.Errorf("messages (-want +got):\n%s", diff)
				}
				if got.MaxTokens != 50 || *got.Temperature != 0.2 || got.User != "u-1" || !cmp.Equal(got.Stop, []string{"END"}) {
					t.Errorf("max_tokens %d, temperature %v, user %q, stop %v", got.MaxTokens, *got.Temperature, got.User, got.Stop)
				}
			},
			want: `{"type":"message","role":"assistant","model":"a","content":[{"type":"text","text":"hello"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":7,"output_tokens":3}}`,
		},
		{
			name: "tools, tool turns and an image",
			body: `{"model":"chat","max_tokens":50,"tools":[{"name":"get_weather","description":"d","input_schema":{"type":"object"}}],"tool_choice":{"type":"any","disable_parallel_tool_use":true},` +
				`"messages":[{"role":"user","content":[{"type":"text","text":"weather here?"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}}]},` +
				`{"role":"assistant","content":[{"type":"tool_use","id":"call_0","name":"get_weather","input":{"city":"Rome"}}]},` +
				`{"role":"user","content":[{"type":"tool_result","tool_use_id":"call_0","content":"sunny"}]}]}`,
			answer: result{res: provider.Response{ToolCalls: calls, FinishReason: "tool_calls", Usage: provider.Usage{InputTokens: 9, OutputTokens: 4}}},
			check: func(t *testing.T, got provider.Request) {
				want := []provider.Message{
					{Role: "user", Parts: []provider.Part{{Type: provider.PartText, Text: "weather here?"}, {Type: provider.PartImage, ImageURL: "data:image/png;base64,iVBORw0KGgo="}}},
					{Role: "assistant", ContentNull: true, ToolCalls: []provider.ToolCall{{ID: "call_0", Type: "function", Name: "get_weather", Arguments: `{"city":"Rome"}`}}},
					{Role: "tool", ToolCallID: "call_0", Content: "sunny"},
				}
				if diff := cmp.Diff(want, got.Messages); diff != "" {
					t.Errorf("messages (-want +got):\n%s", diff)
				}
				wantTools := []provider.Tool{{Type: "function", Name: "get_weather", Description: "d", Parameters: json.RawMessage(`{"type":"object"}`)}}
				if diff := cmp.Diff(wantTools, got.Tools); diff != "" {
					t.Errorf("tools (-want +got):\n%s", diff)
				}
				if got.ToolChoice != "required" || got.ParallelToolCalls == nil || *got.ParallelToolCalls {
					t.Errorf("tool_choice %q, parallel_tool_calls %v; want required, false", got.ToolChoice, got.ParallelToolCalls)
				}
			},
			want: `{"type":"message","role":"assistant","model":"a","content":[{"type":"tool_use","id":"call_a","name":"get_weather","input":{"city":"Paris"}}],"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":9,"output_tokens":4}}`,
		},
		{
			name:   "top_k and thinking reach the provider",
			body:   `{"model":"chat","max_tokens":3000,"top_k":40,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[{"role":"user","content":"hi"}]}`,
			answer: result{res: provider.Response{Content: "cut", FinishReason: "length"}},
			check: func(t *testing.T, got provider.Request) {
				if got.TopK == nil || *got.TopK != 40 || got.Thinking == nil || *got.Thinking != (provider.Thinking{Type: "enabled", BudgetTokens: 1024}) {
					t.Errorf("top_k %v, thinking %v", got.TopK, got.Thinking)
				}
			},
			want: `{"type":"message","role":"assistant","model":"a","content":[{"type":"text","text":"cut"}],"stop_reason":"max_tokens","stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}}`,
		},
		{
			name:   "a stop sequence the provider names",
			body:   `{"model":"chat","max_tokens":5,"stop_sequences":["END"],"messages":[{"role":"user","content":"hi"}]}`,
			answer: result{res: provider.Response{Content: "a", FinishReason: "stop", StopSequence: "END"}},
			want:   `{"type":"message","role":"assistant","model":"a","content":[{"type":"text","text":"a"}],"stop_reason":"stop_sequence","stop_sequence":"END","usage":{"input_tokens":0,"output_tokens":0}}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, testConfig(), &harness{providers: map[string]*fakeProvider{"a": newFakeProvider(tt.answer)}})
			w := postMessages(&frontDoor{router: h.router}, tt.body, nil)
			if w.Code != http.StatusOK {
				t.Fatalf("HTTP %d: %s", w.Code, w.Body)
			}
			if tt.check != nil {
				tt.check(t, h.providers["a"].requests()[0])
			}
			var got map[string]json.RawMessage
			if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			if id := string(got["id"]); !strings.HasPrefix(id, `"msg_`) {
				t.Errorf("id %s, want msg_...", id)
			}
			if _, ok := got["mantle"]; !ok {
				t.Error("the answer has no mantle quality context")
			}
			if w.Header().Get(HeaderFallbackLevel) == "" || w.Header().Get(HeaderQuality) == "" {
				t.Errorf("quality headers missing: %v", w.Header())
			}
			delete(got, "id")
			delete(got, "mantle")
			b, _ := json.Marshal(got)
			var x, y any
			_ = json.Unmarshal(b, &x)
			_ = json.Unmarshal([]byte(tt.want), &y)
			if diff := cmp.Diff(y, x); diff != "" {
				t.Errorf("answer (-want +got):\n%s", diff)
			}
		})
	}
}

// anthropicErrorBody decodes an Anthropic error answer.
func anthropicErrorBody(t *testing.T, b []byte) (typ, msg string) {
	t.Helper()
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &e); err != nil || e.Type != "error" {
		t.Fatalf("not an Anthropic error: %s (%v)", b, err)
	}
	return e.Error.Type, e.Error.Message
}

// TestMessagesDoorRefuses: headers, auth and fields the door cannot take are refused in
// Anthropic's error shape, naming what was wrong, before any provider is called.
func TestMessagesDoorRefuses(t *testing.T) {
	t.Parallel()
	auth, err := rpc.NewAuthenticator([]rpc.TenantKey{{ID: "acme", KeySHA256: rpc.HashKey("sk-acme")}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	const ok = `{"model":"chat","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
	tests := []struct {
		name    string
		body    string
		headers map[string]string
		status  int
		typ     string
		names   string // the message must contain it
	}{
		{"missing version", ok, map[string]string{HeaderAnthropicVersion: ""}, 400, "invalid_request_error", "anthropic-version"},
		{"version not a date", ok, map[string]string{HeaderAnthropicVersion: "latest"}, 400, "invalid_request_error", "anthropic-version"},
		{"beta header", ok, map[string]string{HeaderAnthropicBeta: "prompt-caching-2024-07-31"}, 400, "invalid_request_error", "anthropic-beta"},
		{"no key", ok, map[string]string{HeaderAPIKey: ""}, 401, "authentication_error", "send x-api-key"},
		{"wrong key", ok, map[string]string{HeaderAPIKey: "sk-other"}, 401, "authentication_error", "invalid API key"},
		{"two different keys", ok, map[string]string{"Authorization": "Bearer sk-other"}, 401, "authentication_error", "send one"},
		{"unknown field", `{"model":"chat","max_tokens":5,"mood":"sad","messages":[{"role":"user","content":"hi"}]}`, nil, 400, "invalid_request_error", "mood"},
		{"cache_control", `{"model":"chat","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}]}`, nil, 400, "invalid_request_error", "messages[0].content[0].cache_control"},
		{"not JSON", `{"model":`, nil, 400, "invalid_request_error", "not valid JSON"},
		{"trailing bytes", ok + `x`, nil, 400, "invalid_request_error", "not valid JSON"},
		{"invalid UTF-8", "{\"model\":\"chat\xff\"}", nil, 400, "invalid_request_error", "UTF-8"},
		{"unknown route", `{"model":"nope","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, nil, 404, "not_found_error", "nope"},
		{"bad budget header", ok, map[string]string{HeaderBudget: "soon"}, 400, "invalid_request_error", HeaderBudget},
		{"bad priority header", ok, map[string]string{HeaderPriority: "urgent"}, 400, "invalid_request_error", HeaderPriority},
		{"too large", `{"model":"chat","max_tokens":5,"messages":[{"role":"user","content":"` + strings.Repeat("x", 200<<10) + `"}]}`, nil, 413, "request_too_large", "exceeds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig()
			cfg.MaxPromptBytes = 64 << 10
			h := newHarness(t, cfg, nil)
			headers := map[string]string{HeaderAPIKey: "sk-acme"}
			for k, v := range tt.headers {
				headers[k] = v
			}
			w := postMessages(&frontDoor{router: h.router, auth: auth}, tt.body, headers)
			typ, msg := anthropicErrorBody(t, w.Body.Bytes())
			if w.Code != tt.status || typ != tt.typ || !strings.Contains(msg, tt.names) {
				t.Errorf("HTTP %d %s %q; want %d %s naming %q", w.Code, typ, msg, tt.status, tt.typ, tt.names)
			}
			if n := h.calls("a"); n != 0 {
				t.Errorf("the provider was called %d times", n)
			}
		})
	}
	t.Run("Bearer alone and both headers with one key are accepted", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, testConfig(), nil)
		f := &frontDoor{router: h.router, auth: auth}
		for _, hd := range []map[string]string{
			{"Authorization": "Bearer sk-acme"},
			{"Authorization": "Bearer sk-acme", HeaderAPIKey: "sk-acme"},
		} {
			if w := postMessages(f, ok, hd); w.Code != http.StatusOK {
				t.Errorf("%v: HTTP %d %s", hd, w.Code, w.Body)
			}
		}
	})
}

// TestErrorShapes: one table gives both doors their statuses; only overload differs
// (Anthropic's 529), and Retry-After is set on both.
func TestErrorShapes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		err        error
		status     int
		typ        string
		retryAfter string
	}{
		{"invalid", rpc.InvalidArgument(errorDomain, rpc.Invalid("request.top_k", "bad")), 400, "invalid_request_error", ""},
		{"idempotency key reused", rpc.Status(codes.FailedPrecondition, errorDomain, ReasonIdempotencyKeyReused, "other body"), 422, "invalid_request_error", ""},
		{"unauthenticated", rpc.Status(codes.Unauthenticated, "auth.mantle", rpc.ReasonUnauthenticated, "invalid API key"), 401, "authentication_error", ""},
		{"permission", status.Error(codes.PermissionDenied, "no"), 403, "permission_error", ""},
		{"unknown route", rpc.Status(codes.NotFound, errorDomain, ReasonUnknownRoute, "x"), 404, "not_found_error", ""},
		{"quota", rpc.ResourceExhausted("quota.mantle", "tenant:a", "over TPM", 1500*time.Millisecond), 429, "rate_limit_error", "2"},
		{"all candidates failed", rpc.Status(codes.Unavailable, errorDomain, ReasonAllCandidatesFailed, "none"), 503, "api_error", ""},
		{"overloaded", errOverloaded, 529, "overloaded_error", "1"},
		{"deadline", status.Error(codes.DeadlineExceeded, "late"), 504, "api_error", ""},
		{"internal", errors.New("boom"), 500, "api_error", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w := httptest.NewRecorder()
			writeAnthropicError(w, tt.err)
			typ, msg := anthropicErrorBody(t, w.Body.Bytes())
			if w.Code != tt.status || typ != tt.typ || w.Header().Get("Retry-After") != tt.retryAfter {
				t.Errorf("HTTP %d %s Retry-After %q; want %d %s %q", w.Code, typ, w.Header().Get("Retry-After"), tt.status, tt.typ, tt.retryAfter)
			}
			if msg != status.Convert(tt.err).Message() {
				t.Errorf("message %q, want the status's", msg)
			}
			o := httptest.NewRecorder()
			writeError(o, tt.err)
			if tt.status != 529 && o.Code != w.Code {
				t.Errorf("the chat door answers %d, the Messages door %d", o.Code, w.Code)
			}
			if o.Header().Get("Retry-After") != tt.retryAfter {
				t.Errorf("the chat door's Retry-After %q, want %q", o.Header().Get("Retry-After"), tt.retryAfter)
			}
		})
	}
}

// sseEvent is one server-sent event: its name and data.
type sseEvent struct {
	name string
	data map[string]any
}

func parseSSE(t *testing.T, body string) []sseEvent {
	t.Helper()
	var out []sseEvent
	for _, block := range strings.Split(strings.TrimSpace(body), "\n\n") {
		var ev sseEvent
		for _, line := range strings.Split(block, "\n") {
			if v, ok := strings.CutPrefix(line, "event: "); ok {
				ev.name = v
			} else if v, ok := strings.CutPrefix(line, "data: "); ok {
				if err := json.Unmarshal([]byte(v), &ev.data); err != nil {
					t.Fatalf("data %s: %v", v, err)
				}
			}
		}
		if ev.data["type"] != ev.name {
			t.Errorf("event %q carries type %v", ev.name, ev.data["type"])
		}
		out = append(out, ev)
	}
	return out
}

// summary is an event in short: its name, with the block index, block type and delta.
func summary(ev sseEvent) string {
	s := ev.name
	if i, ok := ev.data["index"]; ok {
		s += " " + strings.TrimSuffix(strings.TrimSuffix(jsonString(i), ".0"), "")
	}
	if b, ok := ev.data["content_block"].(map[string]any); ok {
		s += " " + b["type"].(string)
		if id, ok := b["id"]; ok {
			s += " " + id.(string) + " " + b["name"].(string)
		}
	}
	if d, ok := ev.data["delta"].(map[string]any); ok {
		switch {
		case d["text"] != nil:
			s += " " + d["text"].(string)
		case d["partial_json"] != nil:
			s += " " + d["partial_json"].(string)
		case ev.name == "message_delta":
			s += " " + jsonString(d["stop_reason"])
		}
	}
	if e, ok := ev.data["error"].(map[string]any); ok {
		s += " " + e["type"].(string)
	}
	return s
}

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return strings.Trim(string(b), `"`)
}

// TestMessagesStream: a streamed answer is Anthropic's event sequence. Interleaved pieces
// of parallel tool calls (as OpenAI-type providers may send them) become one block at a
// time, none of the pieces lost; a failure after the start is an error event.
func TestMessagesStream(t *testing.T) {
	t.Parallel()
	usage := &provider.Usage{InputTokens: 5, OutputTokens: 6}
	tc := func(i int, id, name, args string) []provider.ToolCallDelta {
		return []provider.ToolCallDelta{{Index: i, ID: id, Type: "function", Name: name, Arguments: args}}
	}
	tests := []struct {
		name   string
		stream []chunk
		want   []string
	}{
		{
			name:   "text",
			stream: []chunk{{content: "Hel"}, {content: "lo"}, {finish: "stop", usage: usage}},
			want: []string{"message_start", "content_block_start 0 text", "content_block_delta 0 Hel", "content_block_delta 0 lo",
				"content_block_stop 0", "message_delta end_turn", "message_stop"},
		},
		{
			name: "text then interleaved tool calls",
			stream: []chunk{
				{content: "Checking."},
				{tools: tc(0, "call_a", "get_weather", "")},
				{tools: tc(0, "", "", `{"city":`)},
				{tools: tc(1, "call_b", "get_time", `{"tz":`)},
				{tools: tc(0, "", "", `"Paris"}`)},
				{tools: tc(1, "", "", `"CET"}`)},
				{finish: "tool_calls", usage: usage},
			},
			want: []string{"message_start",
				"content_block_start 0 text", "content_block_delta 0 Checking.", "content_block_stop 0",
				"content_block_start 1 tool_use call_a get_weather", `content_block_delta 1 {"city":`, `content_block_delta 1 "Paris"}`, "content_block_stop 1",
				"content_block_start 2 tool_use call_b get_time", `content_block_delta 2 {"tz":"CET"}`, "content_block_stop 2",
				"message_delta tool_use", "message_stop"},
		},
		{
			name:   "max tokens",
			stream: []chunk{{content: "cut"}, {finish: "length", usage: usage}},
			want:   []string{"message_start", "content_block_start 0 text", "content_block_delta 0 cut", "content_block_stop 0", "message_delta max_tokens", "message_stop"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, testConfig(), &harness{providers: map[string]*fakeProvider{"a": newFakeProvider(result{stream: tt.stream})}})
			w := postMessages(&frontDoor{router: h.router}, `{"model":"chat","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
			if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "text/event-stream" {
				t.Fatalf("HTTP %d %s: %s", w.Code, w.Header().Get("Content-Type"), w.Body)
			}
			events := parseSSE(t, w.Body.String())
			var got []string
			for _, ev := range events {
				got = append(got, summary(ev))
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
			start := events[0].data["message"].(map[string]any)
			if start["model"] != "a" || !strings.HasPrefix(start["id"].(string), "msg_") || start["role"] != "assistant" {
				t.Errorf("message_start %v", start)
			}
			md := events[len(events)-2].data
			if u := md["usage"].(map[string]any); u["output_tokens"] != 6.0 || u["input_tokens"] != 5.0 {
				t.Errorf("message_delta usage %v", u)
			}
			if _, ok := md["mantle"]; !ok {
				t.Error("message_delta carries no quality context")
			}
		})
	}

	t.Run("failure after the start is an error event", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig()
		cfg.Routes = []RouteConfig{{Name: "chat", Candidates: []string{"a"}}}
		broken := result{stream: []chunk{{content: "Hel"}, {err: &provider.Error{Class: mantlev1.ErrorClass_ERROR_CLASS_AUTH, StatusCode: 401, Message: "key revoked"}}}}
		h := newHarness(t, cfg, &harness{providers: map[string]*fakeProvider{"a": newFakeProvider(broken)}})
		w := postMessages(&frontDoor{router: h.router}, `{"model":"chat","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
		events := parseSSE(t, w.Body.String())
		last := events[len(events)-1]
		if last.name != "error" || events[0].name != "message_start" {
			t.Fatalf("events %v, want message_start ... error", events)
		}
		for _, ev := range events {
			if ev.name == "message_stop" {
				t.Error("a failed stream ended with message_stop")
			}
		}
	})

	t.Run("failure before the start is an error answer", func(t *testing.T) {
		t.Parallel()
		w := postMessages(&frontDoor{router: newHarness(t, testConfig(), nil).router}, `{"model":"nope","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
		if typ, _ := anthropicErrorBody(t, w.Body.Bytes()); w.Code != 404 || typ != "not_found_error" {
			t.Errorf("HTTP %d %s", w.Code, typ)
		}
	})
}
