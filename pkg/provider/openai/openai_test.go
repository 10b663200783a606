package openai

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
	return Config{BaseURL: url, APIKey: "sk-test", HTTPClient: hc, Now: providertest.Clock}
}

func newTestClient(t *testing.T, h http.Handler) *Client {
	t.Helper()
	srv := providertest.NewServer(t, h)
	return New(testConfig(srv.URL, srv.Client()))
}

var testRequest = provider.Request{
	Model:    "gpt-test",
	Messages: []provider.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}},
}

// adapter is this package to the shared checks.
var adapter = providertest.Adapter{
	New:     func(url string, hc *http.Client) provider.Provider { return New(testConfig(url, hc)) },
	Request: testRequest,
	Answer:  `{"choices":[{"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`,
	First:   "data: " + delta("first") + "\n\n",
}

// respond answers with a fixed status, headers and body, and request id req-123.
func respond(status int, body string, kv ...string) http.HandlerFunc {
	return providertest.Respond(status, body, append(kv, "X-Request-Id", "req-123")...)
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
		w.Header().Set("X-Request-Id", "req-abc")
		w.Header().Set("X-Ratelimit-Remaining-Requests", "59")
		w.Header().Set("X-Ratelimit-Reset-Requests", "1s")
		w.Header().Set("X-Ratelimit-Remaining-Tokens", "1000")
		w.Header().Set("X-Ratelimit-Reset-Tokens", "6m0s")
		io.WriteString(w, `{"id":"chatcmpl-1","model":"gpt-test-0613","choices":[{"index":0,"message":{"role":"assistant","content":"{\"ok\":true}"},"finish_reason":"length"}],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}`)
	}))
	c.ep = httpcall.NewEndpoint(c.ep.URL, c.ep.Client, map[string]string{"OpenAI-Project": "proj-1"}, c.ep.Now)

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
	if !reflect.DeepEqual(resp, want) {
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
	got := make(chan http.Header, 1)
	bodies := make(chan map[string]any, 1)
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		json.NewDecoder(r.Body).Decode(&body)
		providertest.Offer(t, got, r.Header.Clone())
		providertest.Offer(t, bodies, body)
		io.WriteString(w, `{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}]}`)
	}))
	resp, err := c.Complete(context.Background(), testRequest)
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if resp.Content != "hi" || resp.FinishReason != "stop" || resp.RateLimit.Known {
		t.Errorf("response = %+v", resp)
	}
	h, body := <-got, <-bodies
	if h.Get("Idempotency-Key") != "" {
		t.Error("Idempotency-Key sent without a key")
	}
	for _, field := range []string{"user", "response_format", "stream", "stream_options", "max_tokens", "temperature"} {
		if _, ok := body[field]; ok {
			t.Errorf("body has %q though the request did not set it", field)
		}
	}
}

func TestCompleteDefaultBaseURL(t *testing.T) {
	if got := New(Config{}).ep.URL; got != "https://api.openai.com/v1/chat/completions" {
		t.Errorf("url = %q", got)
	}
	if got := New(Config{BaseURL: "http://localhost:11434/v1/"}).ep.URL; got != "http://localhost:11434/v1/chat/completions" {
		t.Errorf("url = %q", got)
	}
}

func TestCompleteErrors(t *testing.T) {
	providertest.CompleteErrors(t, adapter, "req-123", []providertest.CompleteError{
		{Name: "429 with Retry-After",
			Handler: respond(429, `{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`, "Retry-After", "7"),
			Class:   mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, Status: 429, RetryAfter: 7 * time.Second, Message: "Rate limit reached"},
		{Name: "429 with Retry-After date",
			Handler: respond(429, `{}`, "Retry-After", providertest.Now.Add(3*time.Second).Format(http.TimeFormat)),
			Class:   mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, Status: 429, RetryAfter: 3 * time.Second},
		{Name: "429 with reset headers",
			Handler: respond(429, `{}`, "X-Ratelimit-Remaining-Requests", "0", "X-Ratelimit-Reset-Requests", "6m0s",
				"X-Ratelimit-Remaining-Tokens", "500", "X-Ratelimit-Reset-Tokens", "20ms"),
			Class: mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, Status: 429, RetryAfter: 6 * time.Minute},
		{Name: "429 without Retry-After",
			Handler: respond(429, `{"error":{"message":"slow down"}}`),
			Class:   mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, Status: 429, Message: "slow down"},
		{Name: "429 insufficient quota",
			Handler: respond(429, `{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}`),
			Class:   mantlev1.ErrorClass_ERROR_CLASS_AUTH, Status: 429, Message: "current quota"},
		{Name: "500", Handler: respond(500, `{"error":{"message":"The server had an error","type":"server_error"}}`),
			Class: mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT, Status: 500, Message: "The server had an error"},
		{Name: "502 html", Handler: respond(502, `<html>502 Bad Gateway</html>`, "Content-Type", "text/html"),
			Class: mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT, Status: 502, Message: "502 Bad Gateway"},
		{Name: "503", Handler: respond(503, `{"error":{"message":"engine overloaded"}}`, "Retry-After", "2"),
			Class: mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, Status: 503, RetryAfter: 2 * time.Second, Message: "engine overloaded"},
		{Name: "529", Handler: respond(529, `{}`),
			Class: mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, Status: 529},
		{Name: "408", Handler: respond(408, ``),
			Class: mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT, Status: 408},
		{Name: "400", Handler: respond(400, `{"error":{"message":"Invalid value for temperature","type":"invalid_request_error","param":"temperature","code":null}}`),
			Class: mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST, Status: 400, Message: "Invalid value for temperature"},
		{Name: "404 unknown model", Handler: respond(404, `{"error":{"message":"The model gpt-x does not exist","type":"invalid_request_error","code":"model_not_found"}}`),
			Class: mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST, Status: 404, Message: "does not exist"},
		{Name: "422", Handler: respond(422, `{"detail":"unprocessable"}`),
			Class: mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST, Status: 422},
		{Name: "401", Handler: respond(401, `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}`),
			Class: mantlev1.ErrorClass_ERROR_CLASS_AUTH, Status: 401, Message: "Incorrect API key"},
		{Name: "403", Handler: respond(403, `{"error":{"message":"region not supported"}}`),
			Class: mantlev1.ErrorClass_ERROR_CLASS_AUTH, Status: 403, Message: "region not supported"},
		{Name: "context length exceeded",
			Handler: respond(400, `{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`),
			Class:   mantlev1.ErrorClass_ERROR_CLASS_CONTEXT_LENGTH_EXCEEDED, Status: 400, Message: "maximum context length is 8192"},
		{Name: "context length exceeded, vLLM",
			Handler: respond(400, `{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.","type":"BadRequestError","param":null,"code":400}`),
			Class:   mantlev1.ErrorClass_ERROR_CLASS_CONTEXT_LENGTH_EXCEEDED, Status: 400, Message: "4096"},
		{Name: "content filter",
			Handler: respond(400, `{"error":{"message":"The response was filtered due to the prompt triggering Azure OpenAI's content management policy.","type":null,"param":"prompt","code":"content_filter","status":400}}`),
			Class:   mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED, Status: 400, Message: "content management policy"},
		{Name: "content filter, Qwen",
			Handler: respond(400, `{"error":{"code":"data_inspection_failed","param":null,"message":"Input data may contain inappropriate content.","type":"data_inspection_failed"}}`),
			Class:   mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED, Status: 400, Message: "inappropriate content"},
		{Name: "200 with error object",
			Handler: respond(200, `{"error":{"message":"upstream model crashed","type":"server_error"}}`),
			Class:   mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR, Status: 200, Message: "upstream model crashed"},
		{Name: "200 with error string (Ollama)",
			Handler: respond(200, `{"error":"model runner stopped"}`),
			Class:   mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR, Status: 200, Message: "model runner stopped"},
		{Name: "200 with a context length error keeps its class",
			Handler: respond(200, `{"error":{"message":"maximum context length is 4096 tokens"}}`),
			Class:   mantlev1.ErrorClass_ERROR_CLASS_CONTEXT_LENGTH_EXCEEDED, Status: 200},
		{Name: "200 malformed JSON", Handler: respond(200, `{"choices":[{"message":`),
			Class: mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT, Status: 200},
		{Name: "200 html", Handler: respond(200, `<html>maintenance</html>`, "Content-Type", "text/html"),
			Class: mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT, Status: 200},
		{Name: "200 without choices", Handler: respond(200, `{"id":"x","choices":[]}`),
			Class: mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR, Status: 200, Message: "no choices"},
		{Name: "200 with null choices", Handler: respond(200, `{"id":"x"}`),
			Class: mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR, Status: 200},
		{Name: "finish_reason content_filter",
			Handler: respond(200, `{"choices":[{"message":{"content":null},"finish_reason":"content_filter"}]}`),
			Class:   mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED, Status: 200, Message: "content_filter"},
		{Name: "refusal",
			Handler: respond(200, `{"choices":[{"message":{"content":null,"refusal":"I can't help with that."},"finish_reason":"stop"}]}`),
			Class:   mantlev1.ErrorClass_ERROR_CLASS_REFUSAL, Status: 200, Message: "I can't help with that."},
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
// connection is not resent by net/http behind the router's back.
func TestNoHiddenResend(t *testing.T) {
	a := adapter
	a.Request.IdempotencyKey = "req-1"
	providertest.NoHiddenResend(t, a)
}

func TestPrefillIsSentAsAPrefixAssistantTurn(t *testing.T) {
	bodies := make(chan []byte, 1)
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		bodies <- b
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"message":{"role":"assistant","content":" the rest."},"finish_reason":"stop"}]}`)
	}))
	res, err := c.Complete(context.Background(), provider.Request{Model: "m", Messages: []provider.Message{{Role: "user", Content: "hi"}}, Prefill: "The start,"})
	if err != nil || res.Content != " the rest." {
		t.Fatalf("Complete = %q, %v", res.Content, err)
	}
	var sent struct {
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
			Prefix  bool   `json:"prefix"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(<-bodies, &sent); err != nil {
		t.Fatal(err)
	}
	last := sent.Messages[len(sent.Messages)-1]
	if len(sent.Messages) != 2 || last.Role != "assistant" || last.Content != "The start," || !last.Prefix {
		t.Errorf("messages sent = %+v, want the user turn then the prefill as a prefix assistant turn", sent.Messages)
	}
}
