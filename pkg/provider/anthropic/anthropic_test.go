package anthropic

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
)

var testNow = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

// watchdog bounds how long a test waits for something that should be prompt. It only
// fires when the code under test is broken; passing tests never wait for it.
const watchdog = 5 * time.Second

func newTestClient(t *testing.T, h http.Handler) *Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return New(Config{BaseURL: srv.URL, APIKey: "sk-ant-test", HTTPClient: srv.Client(), Now: func() time.Time { return testNow }})
}

var testRequest = provider.Request{
	Model: "claude-test",
	Messages: []provider.Message{
		{Role: "system", Content: "be brief"},
		{Role: "user", Content: "hi"},
		{Role: "assistant", Content: "hello"},
		{Role: "system", Content: "answer in English"},
		{Role: "user", Content: "how are you?"},
	},
}

// respond answers with a fixed status, headers and body.
func respond(status int, body string, kv ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i < len(kv); i += 2 {
			w.Header().Set(kv[i], kv[i+1])
		}
		if w.Header().Get("Content-Type") == "" {
			w.Header().Set("Content-Type", "application/json")
		}
		w.Header().Set("Request-Id", "req_123")
		w.WriteHeader(status)
		io.WriteString(w, body)
	}
}

// apiError is an Anthropic error body.
func apiError(typ, message string) string {
	return fmt.Sprintf(`{"type":"error","error":{"type":%q,"message":%q}}`, typ, message)
}

// hangUp takes the connection away from the server and closes it before any response;
// with reset it sends a TCP RST instead of a FIN.
func hangUp(reset bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		if tcp, ok := conn.(*net.TCPConn); ok && reset {
			tcp.SetLinger(0)
		}
		conn.Close()
	}
}

// hang blocks until the client goes away, signalling on started (when not nil) first. It
// reads the request body first because only then does the server watch the connection
// and cancel r.Context() when the client hangs up.
func hang(started chan<- struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if started != nil {
			close(started)
		}
		<-r.Context().Done()
	}
}

func asError(t *testing.T, err error) *provider.Error {
	t.Helper()
	var pe *provider.Error
	if !errors.As(err, &pe) {
		t.Fatalf("error %v (%T) is not a *provider.Error", err, err)
	}
	return pe
}

func TestCompleteSuccess(t *testing.T) {
	type seen struct {
		header http.Header
		body   map[string]any
		path   string
	}
	got := make(chan seen, 1)
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		json.NewDecoder(r.Body).Decode(&body)
		got <- seen{r.Header.Clone(), body, r.URL.Path}
		w.Header().Set("Request-Id", "req_abc")
		w.Header().Set("Anthropic-Ratelimit-Requests-Remaining", "49")
		w.Header().Set("Anthropic-Ratelimit-Requests-Reset", testNow.Add(time.Second).Format(time.RFC3339))
		w.Header().Set("Anthropic-Ratelimit-Tokens-Remaining", "39000")
		w.Header().Set("Anthropic-Ratelimit-Tokens-Reset", testNow.Add(time.Minute).Format(time.RFC3339))
		io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-test-20260101",
			"content":[{"type":"thinking","thinking":"hmm"},{"type":"text","text":"Fine, "},{"type":"text","text":"thanks."}],
			"stop_reason":"end_turn","stop_sequence":null,
			"usage":{"input_tokens":20,"cache_creation_input_tokens":3,"cache_read_input_tokens":7,"output_tokens":6}}`)
	}))
	c.headers = map[string]string{"Anthropic-Beta": "test-beta"}

	temp := 0.5
	req := testRequest
	req.Temperature, req.User = &temp, "user-9"
	resp, err := c.Complete(context.Background(), req)
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	want := provider.Response{
		Content:      "Fine, thanks.",
		FinishReason: "stop",
		Usage:        provider.Usage{InputTokens: 30, OutputTokens: 6},
		Model:        "claude-test-20260101",
		RequestID:    "req_abc",
		RateLimit: provider.RateLimit{RemainingRequests: 49, RemainingTokens: 39000,
			ResetRequests: time.Second, ResetTokens: time.Minute, Known: true},
	}
	if resp != want {
		t.Errorf("response = %+v\nwant       %+v", resp, want)
	}

	s := <-got
	if s.path != "/messages" {
		t.Errorf("path = %q", s.path)
	}
	for name, value := range map[string]string{
		"X-Api-Key":         "sk-ant-test",
		"Anthropic-Version": "2023-06-01",
		"Content-Type":      "application/json",
		"Anthropic-Beta":    "test-beta",
		"Authorization":     "",
	} {
		if s.header.Get(name) != value {
			t.Errorf("header %s = %q, want %q", name, s.header.Get(name), value)
		}
	}
	wantBody := map[string]any{
		"model":  "claude-test",
		"system": "be brief\n\nanswer in English",
		"messages": []any{
			map[string]any{"role": "user", "content": "hi"},
			map[string]any{"role": "assistant", "content": "hello"},
			map[string]any{"role": "user", "content": "how are you?"},
		},
		"max_tokens":  float64(DefaultMaxTokens),
		"temperature": 0.5,
		"metadata":    map[string]any{"user_id": "user-9"},
	}
	if fmt.Sprint(s.body) != fmt.Sprint(wantBody) {
		t.Errorf("body = %v\nwant   %v", s.body, wantBody)
	}
}

func TestCompleteRequestShape(t *testing.T) {
	bodies := make(chan map[string]any, 1)
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		json.NewDecoder(r.Body).Decode(&body)
		bodies <- body
		io.WriteString(w, `{"type":"message","content":[{"type":"text","text":"x"}],"stop_reason":"max_tokens","usage":{"input_tokens":1,"output_tokens":2}}`)
	}))
	req := provider.Request{Model: "m", Messages: []provider.Message{{Role: "user", Content: "q"}}, MaxTokens: 77, JSON: true, IdempotencyKey: "k"}
	resp, err := c.Complete(context.Background(), req)
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if resp.FinishReason != "length" {
		t.Errorf("finish reason = %q, want length (max_tokens is not an error)", resp.FinishReason)
	}
	body := <-bodies
	if body["max_tokens"] != float64(77) {
		t.Errorf("max_tokens = %v, want 77", body["max_tokens"])
	}
	for _, field := range []string{"system", "metadata", "stream", "temperature", "response_format"} {
		if _, ok := body[field]; ok {
			t.Errorf("body has %q though the request did not set it", field)
		}
	}
}

func TestDefaultBaseURL(t *testing.T) {
	if got := New(Config{}).url; got != "https://api.anthropic.com/v1/messages" {
		t.Errorf("url = %q", got)
	}
}

func TestFinishReason(t *testing.T) {
	for stop, want := range map[string]string{
		"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
		"model_context_window_exceeded": "length", "tool_use": "tool_calls", "pause_turn": "pause_turn",
	} {
		if got, err := finishReason(stop); got != want || err != nil {
			t.Errorf("finishReason(%q) = %q, %v; want %q", stop, got, err, want)
		}
	}
	if _, err := finishReason("refusal"); err == nil || err.Class != mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED {
		t.Errorf("finishReason(refusal) error = %v, want CONTENT_FILTERED", err)
	}
}

func TestCompleteErrors(t *testing.T) {
	tests := []struct {
		name       string
		handler    http.HandlerFunc
		class      provider.Class
		status     int
		retryAfter time.Duration
		message    string // substring of Message
	}{
		{name: "429 with retry-after",
			handler: respond(429, apiError("rate_limit_error", "Number of requests has exceeded your rate limit"), "Retry-After", "12"),
			class:   mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, status: 429, retryAfter: 12 * time.Second, message: "exceeded your rate limit"},
		{name: "429 with reset headers",
			handler: respond(429, apiError("rate_limit_error", "slow down"),
				"Anthropic-Ratelimit-Requests-Remaining", "10",
				"Anthropic-Ratelimit-Requests-Reset", testNow.Add(5*time.Second).Format(time.RFC3339),
				"Anthropic-Ratelimit-Output-Tokens-Remaining", "0",
				"Anthropic-Ratelimit-Output-Tokens-Reset", testNow.Add(40*time.Second).Format(time.RFC3339)),
			class: mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, status: 429, retryAfter: 40 * time.Second},
		{name: "429 without retry-after",
			handler: respond(429, apiError("rate_limit_error", "slow down")),
			class:   mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, status: 429, message: "slow down"},
		{name: "500 api_error", handler: respond(500, apiError("api_error", "Internal server error")),
			class: mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT, status: 500, message: "Internal server error"},
		{name: "502", handler: respond(502, `<html>bad gateway</html>`, "Content-Type", "text/html"),
			class: mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT, status: 502, message: "bad gateway"},
		{name: "503", handler: respond(503, ``, "Retry-After", "3"),
			class: mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, status: 503, retryAfter: 3 * time.Second},
		{name: "529 overloaded_error", handler: respond(529, apiError("overloaded_error", "Overloaded")),
			class: mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, status: 529, message: "Overloaded"},
		{name: "408", handler: respond(408, ``), class: mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT, status: 408},
		{name: "400 invalid_request_error", handler: respond(400, apiError("invalid_request_error", "messages: roles must alternate")),
			class: mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST, status: 400, message: "roles must alternate"},
		{name: "404 not_found_error", handler: respond(404, apiError("not_found_error", "model: claude-x")),
			class: mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST, status: 404, message: "claude-x"},
		{name: "413 request_too_large", handler: respond(413, apiError("request_too_large", "Request exceeds the maximum allowed number of bytes.")),
			class: mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST, status: 413},
		{name: "422", handler: respond(422, `{}`), class: mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST, status: 422},
		{name: "401 authentication_error", handler: respond(401, apiError("authentication_error", "invalid x-api-key")),
			class: mantlev1.ErrorClass_ERROR_CLASS_AUTH, status: 401, message: "invalid x-api-key"},
		{name: "403 permission_error", handler: respond(403, apiError("permission_error", "Your API key does not have permission")),
			class: mantlev1.ErrorClass_ERROR_CLASS_AUTH, status: 403, message: "permission"},
		{name: "prompt is too long",
			handler: respond(400, apiError("invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum")),
			class:   mantlev1.ErrorClass_ERROR_CLASS_CONTEXT_LENGTH_EXCEEDED, status: 400, message: "210000 tokens"},
		{name: "input and max_tokens exceed context limit",
			handler: respond(400, apiError("invalid_request_error", "input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000, decrease input length or `max_tokens` and try again")),
			class:   mantlev1.ErrorClass_ERROR_CLASS_CONTEXT_LENGTH_EXCEEDED, status: 400},
		{name: "content policy through a gateway",
			handler: respond(400, `{"error":{"message":"Request blocked: content_policy_violation","type":"invalid_request_error"}}`),
			class:   mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED, status: 400, message: "Request blocked"},
		{name: "refusal stop reason",
			handler: respond(200, `{"type":"message","content":[],"stop_reason":"refusal","usage":{"input_tokens":5,"output_tokens":0}}`),
			class:   mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED, status: 200, message: "refusal"},
		{name: "200 with error body", handler: respond(200, apiError("api_error", "something broke")),
			class: mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR, status: 200, message: "something broke"},
		{name: "200 with overloaded error keeps its class", handler: respond(200, apiError("overloaded_error", "Overloaded")),
			class: mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, status: 200, message: "Overloaded"},
		{name: "200 malformed JSON", handler: respond(200, `{"type":"message","content":[`),
			class: mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT, status: 200},
		{name: "200 without content", handler: respond(200, `{"type":"message","stop_reason":"end_turn"}`),
			class: mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR, status: 200, message: "content"},
		{name: "200 that is not a message", handler: respond(200, `{"type":"completion","completion":"hi"}`),
			class: mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR, status: 200, message: "completion"},
		{name: "connection closed before headers", handler: hangUp(false),
			class: mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT},
		{name: "connection reset before headers", handler: hangUp(true),
			class: mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestClient(t, tt.handler)
			_, err := c.Complete(context.Background(), testRequest)
			t.Logf("error: %v", err)
			e := asError(t, err)
			if e.Class != tt.class {
				t.Errorf("class = %v, want %v (%v)", e.Class, tt.class, e)
			}
			if e.StatusCode != tt.status {
				t.Errorf("status = %d, want %d", e.StatusCode, tt.status)
			}
			if e.RetryAfter != tt.retryAfter {
				t.Errorf("RetryAfter = %v, want %v", e.RetryAfter, tt.retryAfter)
			}
			if !strings.Contains(e.Message, tt.message) {
				t.Errorf("Message = %q, want it to contain %q", e.Message, tt.message)
			}
			if tt.status != 0 && e.RequestID != "req_123" {
				t.Errorf("RequestID = %q, want req_123", e.RequestID)
			}
		})
	}
}

func TestCompleteConnectionRefused(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	_, err := New(Config{BaseURL: url}).Complete(context.Background(), testRequest)
	if got := provider.ClassOf(err); got != mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT {
		t.Errorf("class = %v, want TRANSIENT (%v)", got, err)
	}
}

func TestCompleteDeadline(t *testing.T) {
	c := newTestClient(t, hang(nil))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := c.Complete(ctx, testRequest)
	if got := provider.ClassOf(err); got != mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT {
		t.Errorf("class = %v, want TIMEOUT (%v)", got, err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v does not wrap context.DeadlineExceeded", err)
	}
}

func TestCompleteCancel(t *testing.T) {
	started := make(chan struct{})
	c := newTestClient(t, hang(started))
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.Complete(ctx, testRequest)
		errc <- err
	}()
	<-started
	cancel()
	select {
	case err := <-errc:
		if got := provider.ClassOf(err); got != mantlev1.ErrorClass_ERROR_CLASS_CANCELED {
			t.Errorf("class = %v, want CANCELED (%v)", got, err)
		}
	case <-time.After(watchdog):
		t.Fatal("Complete did not return after cancel")
	}
}
