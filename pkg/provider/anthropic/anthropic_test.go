package anthropic

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"testing"
	"time"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/pkg/provider/internal/httpcall"
	"github.com/mantle-mesh/mantle/pkg/provider/internal/providertest"
)

func testConfig(url string, hc *http.Client) Config {
	return Config{BaseURL: url, APIKey: "sk-ant-test", HTTPClient: hc, Now: providertest.Clock}
}

func newTestClient(t *testing.T, h http.Handler) *Client {
	t.Helper()
	srv := providertest.NewServer(t, h)
	return New(testConfig(srv.URL, srv.Client()))
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

// adapter is this package to the shared checks.
var adapter = providertest.Adapter{
	New:     func(url string, hc *http.Client) provider.Provider { return New(testConfig(url, hc)) },
	Request: testRequest,
	Answer:  `{"type":"message","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":1}}`,
	First:   eventText(messageStart, text("first")),
}

// respond answers with a fixed status, headers and body, and request id req_123.
func respond(status int, body string, kv ...string) http.HandlerFunc {
	return providertest.Respond(status, body, append(kv, "Request-Id", "req_123")...)
}

// apiError is an Anthropic error body.
func apiError(typ, message string) string {
	return fmt.Sprintf(`{"type":"error","error":{"type":%q,"message":%q}}`, typ, message)
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
		providertest.Offer(t, got, seen{r.Header.Clone(), body, r.URL.Path})
		w.Header().Set("Request-Id", "req_abc")
		w.Header().Set("Anthropic-Ratelimit-Requests-Remaining", "49")
		w.Header().Set("Anthropic-Ratelimit-Requests-Reset", providertest.Now.Add(time.Second).Format(time.RFC3339))
		w.Header().Set("Anthropic-Ratelimit-Tokens-Remaining", "39000")
		w.Header().Set("Anthropic-Ratelimit-Tokens-Reset", providertest.Now.Add(time.Minute).Format(time.RFC3339))
		io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-test-20260101",
			"content":[{"type":"thinking","thinking":"hmm"},{"type":"text","text":"Fine, "},{"type":"text","text":"thanks."}],
			"stop_reason":"end_turn","stop_sequence":null,
			"usage":{"input_tokens":20,"cache_creation_input_tokens":3,"cache_read_input_tokens":7,"output_tokens":6}}`)
	}))
	c.ep = httpcall.NewEndpoint(c.ep.URL, c.ep.Client, map[string]string{"Anthropic-Beta": "test-beta"}, c.ep.Now)

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
	if !reflect.DeepEqual(resp, want) {
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
		providertest.Offer(t, bodies, body)
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
	if got := New(Config{}).ep.URL; got != "https://api.anthropic.com/v1/messages" {
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
	providertest.CompleteErrors(t, adapter, "req_123", []providertest.CompleteError{
		{Name: "429 with retry-after",
			Handler: respond(429, apiError("rate_limit_error", "Number of requests has exceeded your rate limit"), "Retry-After", "12"),
			Class:   mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, Status: 429, RetryAfter: 12 * time.Second, Message: "exceeded your rate limit"},
		{Name: "429 with reset headers",
			Handler: respond(429, apiError("rate_limit_error", "slow down"),
				"Anthropic-Ratelimit-Requests-Remaining", "10",
				"Anthropic-Ratelimit-Requests-Reset", providertest.Now.Add(5*time.Second).Format(time.RFC3339),
				"Anthropic-Ratelimit-Output-Tokens-Remaining", "0",
				"Anthropic-Ratelimit-Output-Tokens-Reset", providertest.Now.Add(40*time.Second).Format(time.RFC3339)),
			Class: mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, Status: 429, RetryAfter: 40 * time.Second},
		{Name: "429 without retry-after",
			Handler: respond(429, apiError("rate_limit_error", "slow down")),
			Class:   mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, Status: 429, Message: "slow down"},
		{Name: "500 api_error", Handler: respond(500, apiError("api_error", "Internal server error")),
			Class: mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT, Status: 500, Message: "Internal server error"},
		{Name: "502", Handler: respond(502, `<html>bad gateway</html>`, "Content-Type", "text/html"),
			Class: mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT, Status: 502, Message: "bad gateway"},
		{Name: "503", Handler: respond(503, ``, "Retry-After", "3"),
			Class: mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, Status: 503, RetryAfter: 3 * time.Second},
		{Name: "529 overloaded_error", Handler: respond(529, apiError("overloaded_error", "Overloaded")),
			Class: mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, Status: 529, Message: "Overloaded"},
		{Name: "408", Handler: respond(408, ``), Class: mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT, Status: 408},
		{Name: "400 invalid_request_error", Handler: respond(400, apiError("invalid_request_error", "messages: roles must alternate")),
			Class: mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST, Status: 400, Message: "roles must alternate"},
		{Name: "404 not_found_error", Handler: respond(404, apiError("not_found_error", "model: claude-x")),
			Class: mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST, Status: 404, Message: "claude-x"},
		{Name: "413 request_too_large", Handler: respond(413, apiError("request_too_large", "Request exceeds the maximum allowed number of bytes.")),
			Class: mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST, Status: 413},
		{Name: "422", Handler: respond(422, `{}`), Class: mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST, Status: 422},
		{Name: "401 authentication_error", Handler: respond(401, apiError("authentication_error", "invalid x-api-key")),
			Class: mantlev1.ErrorClass_ERROR_CLASS_AUTH, Status: 401, Message: "invalid x-api-key"},
		{Name: "403 permission_error", Handler: respond(403, apiError("permission_error", "Your API key does not have permission")),
			Class: mantlev1.ErrorClass_ERROR_CLASS_AUTH, Status: 403, Message: "permission"},
		{Name: "prompt is too long",
			Handler: respond(400, apiError("invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum")),
			Class:   mantlev1.ErrorClass_ERROR_CLASS_CONTEXT_LENGTH_EXCEEDED, Status: 400, Message: "210000 tokens"},
		{Name: "input and max_tokens exceed context limit",
			Handler: respond(400, apiError("invalid_request_error", "input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000, decrease input length or `max_tokens` and try again")),
			Class:   mantlev1.ErrorClass_ERROR_CLASS_CONTEXT_LENGTH_EXCEEDED, Status: 400},
		{Name: "content policy through a gateway",
			Handler: respond(400, `{"error":{"message":"Request blocked: content_policy_violation","type":"invalid_request_error"}}`),
			Class:   mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED, Status: 400, Message: "Request blocked"},
		{Name: "refusal stop reason",
			Handler: respond(200, `{"type":"message","content":[],"stop_reason":"refusal","usage":{"input_tokens":5,"output_tokens":0}}`),
			Class:   mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED, Status: 200, Message: "refusal"},
		{Name: "200 with error body", Handler: respond(200, apiError("api_error", "something broke")),
			Class: mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR, Status: 200, Message: "something broke"},
		{Name: "200 with overloaded error keeps its class", Handler: respond(200, apiError("overloaded_error", "Overloaded")),
			Class: mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, Status: 200, Message: "Overloaded"},
		{Name: "200 malformed JSON", Handler: respond(200, `{"type":"message","content":[`),
			Class: mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT, Status: 200},
		{Name: "200 without content", Handler: respond(200, `{"type":"message","stop_reason":"end_turn"}`),
			Class: mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR, Status: 200, Message: "content"},
		{Name: "200 that is not a message", Handler: respond(200, `{"type":"completion","completion":"hi"}`),
			Class: mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR, Status: 200, Message: "completion"},
		{Name: "connection closed before headers", Handler: providertest.HangUp(false),
			Class: mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT},
		{Name: "connection reset before headers", Handler: providertest.HangUp(true),
			Class: mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT},
	})
}

func TestCompleteConnectionRefused(t *testing.T) { providertest.CompleteConnectionRefused(t, adapter) }
func TestCompleteDeadline(t *testing.T)          { providertest.CompleteDeadline(t, adapter) }
func TestCompleteHTTPClientTimeout(t *testing.T) { providertest.CompleteHTTPClientTimeout(t, adapter) }
func TestCompleteCancel(t *testing.T)            { providertest.CompleteCancel(t, adapter) }

// TestNoHiddenResend checks that a request with an Idempotency-Key that dies on a reused
// connection is not resent by net/http behind the router's back. Anthropic takes no
// idempotency key, but a gateway in front of it may, and Config.Headers can carry one.
func TestNoHiddenResend(t *testing.T) {
	a := adapter
	a.New = func(url string, hc *http.Client) provider.Provider {
		cfg := testConfig(url, hc)
		cfg.Headers = map[string]string{"Idempotency-Key": "req-1"}
		return New(cfg)
	}
	providertest.NoHiddenResend(t, a)
}

func TestPrefillIsAFinalAssistantTurn(t *testing.T) {
	bodies := make(chan []byte, 1)
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		bodies <- b
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"type":"message","content":[{"type":"text","text":" the rest."}],"stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":2}}`)
	}))
	if _, err := c.Complete(context.Background(), provider.Request{Model: "m", Messages: []provider.Message{{Role: "user", Content: "hi"}}, Prefill: "The start, \n"}); err != nil {
		t.Fatal(err)
	}
	var sent struct {
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(<-bodies, &sent); err != nil {
		t.Fatal(err)
	}
	last := sent.Messages[len(sent.Messages)-1]
	if last.Role != "assistant" || last.Content != "The start," {
		t.Errorf("last message = %+v, want the prefill without trailing white space", last)
	}
}
