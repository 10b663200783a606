package openai

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
	"sync/atomic"
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
	return New(Config{BaseURL: srv.URL, APIKey: "sk-test", HTTPClient: srv.Client(), Now: func() time.Time { return testNow }})
}

var testRequest = provider.Request{
	Model:    "gpt-test",
	Messages: []provider.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}},
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
		w.Header().Set("X-Request-Id", "req-123")
		w.WriteHeader(status)
		io.WriteString(w, body)
	}
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
		w.Header().Set("X-Request-Id", "req-abc")
		w.Header().Set("X-Ratelimit-Remaining-Requests", "59")
		w.Header().Set("X-Ratelimit-Reset-Requests", "1s")
		w.Header().Set("X-Ratelimit-Remaining-Tokens", "1000")
		w.Header().Set("X-Ratelimit-Reset-Tokens", "6m0s")
		io.WriteString(w, `{"id":"chatcmpl-1","model":"gpt-test-0613","choices":[{"index":0,"message":{"role":"assistant","content":"{\"ok\":true}"},"finish_reason":"length"}],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}`)
	}))
	c.headers = map[string]string{"OpenAI-Project": "proj-1"}

	temp := 0.2
	req := testRequest
	req.MaxTokens, req.Temperature, req.JSON, req.User, req.IdempotencyKey = 64, &temp, true, "user-9", "idem-1"
	resp, err := c.Complete(context.Background(), req)
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	want := provider.Response{
		Content:      `{"ok":true}`,
		FinishReason: "length", // not an error: the verifier judges truncation
		Usage:        provider.Usage{InputTokens: 12, OutputTokens: 5},
		Model:        "gpt-test-0613",
		RequestID:    "req-abc",
		RateLimit: provider.RateLimit{RemainingRequests: 59, RemainingTokens: 1000,
			ResetRequests: time.Second, ResetTokens: 6 * time.Minute, Known: true},
	}
	if resp != want {
		t.Errorf("response = %+v\nwant       %+v", resp, want)
	}

	s := <-got
	if s.path != "/chat/completions" {
		t.Errorf("path = %q", s.path)
	}
	for name, value := range map[string]string{
		"Authorization":   "Bearer sk-test",
		"Idempotency-Key": "idem-1",
		"Content-Type":    "application/json",
		"OpenAI-Project":  "proj-1",
	} {
		if s.header.Get(name) != value {
			t.Errorf("header %s = %q, want %q", name, s.header.Get(name), value)
		}
	}
	wantBody := map[string]any{
		"model":           "gpt-test",
		"messages":        []any{map[string]any{"role": "system", "content": "be brief"}, map[string]any{"role": "user", "content": "hi"}},
		"max_tokens":      float64(64),
		"temperature":     0.2,
		"user":            "user-9",
		"response_format": map[string]any{"type": "json_object"},
	}
	if fmt.Sprint(s.body) != fmt.Sprint(wantBody) {
		t.Errorf("body = %v\nwant   %v", s.body, wantBody)
	}
}

func TestCompleteOmitsUnsetOptions(t *testing.T) {
	got := make(chan *http.Request, 1)
	bodies := make(chan map[string]any, 1)
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		json.NewDecoder(r.Body).Decode(&body)
		got <- r
		bodies <- body
		io.WriteString(w, `{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}]}`)
	}))
	resp, err := c.Complete(context.Background(), testRequest)
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if resp.Content != "hi" || resp.FinishReason != "stop" || resp.RateLimit.Known {
		t.Errorf("response = %+v", resp)
	}
	r, body := <-got, <-bodies
	if r.Header.Get("Idempotency-Key") != "" {
		t.Error("Idempotency-Key sent without a key")
	}
	for _, field := range []string{"user", "response_format", "stream", "stream_options", "max_tokens", "temperature"} {
		if _, ok := body[field]; ok {
			t.Errorf("body has %q though the request did not set it", field)
		}
	}
}

func TestCompleteDefaultBaseURL(t *testing.T) {
	if got := New(Config{}).url; got != "https://api.openai.com/v1/chat/completions" {
		t.Errorf("url = %q", got)
	}
	if got := New(Config{BaseURL: "http://localhost:11434/v1/"}).url; got != "http://localhost:11434/v1/chat/completions" {
		t.Errorf("url = %q", got)
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
		{name: "429 with Retry-After",
			handler: respond(429, `{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`, "Retry-After", "7"),
			class:   mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, status: 429, retryAfter: 7 * time.Second, message: "Rate limit reached"},
		{name: "429 with Retry-After date",
			handler: respond(429, `{}`, "Retry-After", testNow.Add(3*time.Second).Format(http.TimeFormat)),
			class:   mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, status: 429, retryAfter: 3 * time.Second},
		{name: "429 with reset headers",
			handler: respond(429, `{}`, "X-Ratelimit-Remaining-Requests", "0", "X-Ratelimit-Reset-Requests", "6m0s",
				"X-Ratelimit-Remaining-Tokens", "500", "X-Ratelimit-Reset-Tokens", "20ms"),
			class: mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, status: 429, retryAfter: 6 * time.Minute},
		{name: "429 without Retry-After",
			handler: respond(429, `{"error":{"message":"slow down"}}`),
			class:   mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, status: 429, message: "slow down"},
		{name: "429 insufficient quota",
			handler: respond(429, `{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}`),
			class:   mantlev1.ErrorClass_ERROR_CLASS_AUTH, status: 429, message: "current quota"},
		{name: "500", handler: respond(500, `{"error":{"message":"The server had an error","type":"server_error"}}`),
			class: mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT, status: 500, message: "The server had an error"},
		{name: "502 html", handler: respond(502, `<html>502 Bad Gateway</html>`, "Content-Type", "text/html"),
			class: mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT, status: 502, message: "502 Bad Gateway"},
		{name: "503", handler: respond(503, `{"error":{"message":"engine overloaded"}}`, "Retry-After", "2"),
			class: mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, status: 503, retryAfter: 2 * time.Second, message: "engine overloaded"},
		{name: "529", handler: respond(529, `{}`),
			class: mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, status: 529},
		{name: "408", handler: respond(408, ``),
			class: mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT, status: 408},
		{name: "400", handler: respond(400, `{"error":{"message":"Invalid value for temperature","type":"invalid_request_error","param":"temperature","code":null}}`),
			class: mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST, status: 400, message: "Invalid value for temperature"},
		{name: "404 unknown model", handler: respond(404, `{"error":{"message":"The model gpt-x does not exist","type":"invalid_request_error","code":"model_not_found"}}`),
			class: mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST, status: 404, message: "does not exist"},
		{name: "422", handler: respond(422, `{"detail":"unprocessable"}`),
			class: mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST, status: 422},
		{name: "401", handler: respond(401, `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}`),
			class: mantlev1.ErrorClass_ERROR_CLASS_AUTH, status: 401, message: "Incorrect API key"},
		{name: "403", handler: respond(403, `{"error":{"message":"region not supported"}}`),
			class: mantlev1.ErrorClass_ERROR_CLASS_AUTH, status: 403, message: "region not supported"},
		{name: "context length exceeded",
			handler: respond(400, `{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`),
			class:   mantlev1.ErrorClass_ERROR_CLASS_CONTEXT_LENGTH_EXCEEDED, status: 400, message: "maximum context length is 8192"},
		{name: "context length exceeded, vLLM",
			handler: respond(400, `{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.","type":"BadRequestError","param":null,"code":400}`),
			class:   mantlev1.ErrorClass_ERROR_CLASS_CONTEXT_LENGTH_EXCEEDED, status: 400, message: "4096"},
		{name: "content filter",
			handler: respond(400, `{"error":{"message":"The response was filtered due to the prompt triggering Azure OpenAI's content management policy.","type":null,"param":"prompt","code":"content_filter","status":400}}`),
			class:   mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED, status: 400, message: "content management policy"},
		{name: "content filter, Qwen",
			handler: respond(400, `{"error":{"code":"data_inspection_failed","param":null,"message":"Input data may contain inappropriate content.","type":"data_inspection_failed"}}`),
			class:   mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED, status: 400, message: "inappropriate content"},
		{name: "200 with error object",
			handler: respond(200, `{"error":{"message":"upstream model crashed","type":"server_error"}}`),
			class:   mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR, status: 200, message: "upstream model crashed"},
		{name: "200 with error string (Ollama)",
			handler: respond(200, `{"error":"model runner stopped"}`),
			class:   mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR, status: 200, message: "model runner stopped"},
		{name: "200 with a context length error keeps its class",
			handler: respond(200, `{"error":{"message":"maximum context length is 4096 tokens"}}`),
			class:   mantlev1.ErrorClass_ERROR_CLASS_CONTEXT_LENGTH_EXCEEDED, status: 200},
		{name: "200 malformed JSON", handler: respond(200, `{"choices":[{"message":`),
			class: mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT, status: 200},
		{name: "200 html", handler: respond(200, `<html>maintenance</html>`, "Content-Type", "text/html"),
			class: mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT, status: 200},
		{name: "200 without choices", handler: respond(200, `{"id":"x","choices":[]}`),
			class: mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR, status: 200, message: "no choices"},
		{name: "200 with null choices", handler: respond(200, `{"id":"x"}`),
			class: mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR, status: 200},
		{name: "finish_reason content_filter",
			handler: respond(200, `{"choices":[{"message":{"content":null},"finish_reason":"content_filter"}]}`),
			class:   mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED, status: 200, message: "content_filter"},
		{name: "refusal",
			handler: respond(200, `{"choices":[{"message":{"content":null,"refusal":"I can't help with that."},"finish_reason":"stop"}]}`),
			class:   mantlev1.ErrorClass_ERROR_CLASS_REFUSAL, status: 200, message: "I can't help with that."},
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
			if tt.status != 0 && e.RequestID != "req-123" {
				t.Errorf("RequestID = %q, want req-123", e.RequestID)
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

func TestCompleteHTTPClientTimeout(t *testing.T) {
	srv := httptest.NewServer(hang(nil))
	t.Cleanup(srv.Close)
	hc := srv.Client()
	hc.Timeout = 50 * time.Millisecond
	_, err := New(Config{BaseURL: srv.URL, HTTPClient: hc}).Complete(context.Background(), testRequest)
	if got := provider.ClassOf(err); got != mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT {
		t.Errorf("class = %v, want TIMEOUT (%v)", got, err)
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
		if !errors.Is(err, context.Canceled) {
			t.Errorf("error %v does not wrap context.Canceled", err)
		}
	case <-time.After(watchdog):
		t.Fatal("Complete did not return after cancel")
	}
}

// TestNoHiddenResend checks that a request with an Idempotency-Key that dies on a reused
// connection is not resent by net/http behind the router's back.
func TestNoHiddenResend(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if calls.Add(1) == 1 {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"choices":[{"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)
			return
		}
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		conn.Close() // the reused connection dies before any response
	}))
	defer srv.Close()
	c := New(Config{BaseURL: srv.URL, HTTPClient: srv.Client()})
	req := provider.Request{Model: "m", Messages: []provider.Message{{Role: "user", Content: "hi"}}, IdempotencyKey: "req-1"}
	if _, err := c.Complete(context.Background(), req); err != nil {
		t.Fatalf("first call: %v", err)
	}
	_, err := c.Complete(context.Background(), req)
	if provider.ClassOf(err) != mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT {
		t.Errorf("second call: %v, want TRANSIENT", err)
	}
	if got := calls.Load(); got != 2 {
		t.Errorf("server saw %d calls, want 2 (no hidden resend)", got)
	}
}
