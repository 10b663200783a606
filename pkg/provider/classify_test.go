package provider

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"syscall"
	"testing"
	"time"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

var testNow = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

func fixedNow() time.Time { return testNow }

func header(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

func TestParseAPIError(t *testing.T) {
	tests := []struct {
		name string
		body string
		want APIError
		ok   bool
	}{
		{"openai", `{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":"context_length_exceeded"}}`,
			APIError{Type: "invalid_request_error", Code: "context_length_exceeded", Message: "bad"}, true},
		{"anthropic", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`,
			APIError{Type: "overloaded_error", Message: "Overloaded"}, true},
		{"ollama string", `{"error":"model not found"}`, APIError{Message: "model not found"}, true},
		{"vllm top level", `{"object":"error","message":"too long","type":"BadRequestError","param":null,"code":400}`,
			APIError{Type: "BadRequestError", Code: "400", Message: "too long"}, true},
		{"numeric code", `{"error":{"message":"m","code":429}}`, APIError{Code: "429", Message: "m"}, true},
		{"null error", `{"error":null,"choices":[]}`, APIError{}, false},
		{"success", `{"choices":[{"message":{"content":"hi"}}]}`, APIError{}, false},
		{"anthropic message", `{"type":"message","content":[]}`, APIError{}, false},
		{"not json", `<html>bad gateway</html>`, APIError{}, false},
		{"empty", ``, APIError{}, false},
		{"escaped key", `{"\u0065rror":{"message":"hidden"}}`, APIError{Message: "hidden"}, true},
		{"escaped value", `{"object":"\u0065rror","message":"m"}`, APIError{Message: "m"}, true},
		{"capitalised key", `{"Error":{"Message":"proxy failed"}}`, APIError{Message: "proxy failed"}, true},
		{"upper-case key", `{"ERROR":"down"}`, APIError{Message: "down"}, true},
		{"the word in an answer", `{"choices":[{"message":{"content":"no error here"}}]}`, APIError{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := ParseAPIError([]byte(tt.body))
			if got != tt.want || ok != tt.ok {
				t.Errorf("ParseAPIError = %+v, %v; want %+v, %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestClassifyHTTP(t *testing.T) {
	tests := []struct {
		name       string
		status     int
		header     http.Header
		body       string
		class      Class
		retryAfter time.Duration
		message    string
	}{
		{name: "429 retry-after seconds", status: 429, header: header("Retry-After", "7"),
			class: mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, retryAfter: 7 * time.Second},
		{name: "429 retry-after date", status: 429,
			header: header("Retry-After", testNow.Add(30*time.Second).Format(http.TimeFormat)),
			class:  mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, retryAfter: 30 * time.Second},
		{name: "429 retry-after in the past", status: 429,
			header: header("Retry-After", testNow.Add(-time.Minute).Format(http.TimeFormat)),
			class:  mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED},
		{name: "429 retry-after-ms wins", status: 429, header: header("Retry-After-Ms", "250", "Retry-After", "1"),
			class: mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, retryAfter: 250 * time.Millisecond},
		{name: "429 openai resets prefer the exhausted limit", status: 429,
			header: header("X-Ratelimit-Remaining-Requests", "10", "X-Ratelimit-Reset-Requests", "6m0s",
				"X-Ratelimit-Remaining-Tokens", "0", "X-Ratelimit-Reset-Tokens", "20ms"),
			class: mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, retryAfter: 20 * time.Millisecond},
		{name: "429 openai resets without an exhausted limit take the longest", status: 429,
			header: header("X-Ratelimit-Reset-Requests", "1s", "X-Ratelimit-Reset-Tokens", "1m30.5s"),
			class:  mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, retryAfter: 90*time.Second + 500*time.Millisecond},
		{name: "429 anthropic reset time", status: 429,
			header: header("Anthropic-Ratelimit-Requests-Remaining", "0",
				"Anthropic-Ratelimit-Requests-Reset", testNow.Add(40*time.Second).Format(time.RFC3339)),
			class: mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, retryAfter: 40 * time.Second},
		{name: "429 without hints", status: 429, class: mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED},
		{name: "429 insufficient quota is the key's problem", status: 429,
			body:  `{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}`,
			class: mantlev1.ErrorClass_ERROR_CLASS_AUTH, message: "You exceeded your current quota"},
		{name: "500", status: 500, class: mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT},
		{name: "502 html", status: 502, body: "<html>Bad Gateway</html>",
			class: mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT, message: "<html>Bad Gateway</html>"},
		{name: "503 with retry-after", status: 503, header: header("Retry-After", "2"),
			class: mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, retryAfter: 2 * time.Second},
		{name: "503 ignores reset headers", status: 503, header: header("X-Ratelimit-Reset-Requests", "6m0s"),
			class: mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED},
		{name: "529", status: 529, class: mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED},
		{name: "408", status: 408, class: mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT},
		{name: "400", status: 400, body: `{"error":{"message":"temperature too high","type":"invalid_request_error"}}`,
			class: mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST, message: "temperature too high"},
		{name: "404", status: 404, class: mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST},
		{name: "422", status: 422, class: mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST},
		{name: "413", status: 413, class: mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST},
		{name: "401", status: 401, class: mantlev1.ErrorClass_ERROR_CLASS_AUTH},
		{name: "402", status: 402, class: mantlev1.ErrorClass_ERROR_CLASS_AUTH},
		{name: "403", status: 403, class: mantlev1.ErrorClass_ERROR_CLASS_AUTH},
		{name: "context length code", status: 400,
			body:  `{"error":{"message":"too many tokens","type":"invalid_request_error","code":"context_length_exceeded"}}`,
			class: mantlev1.ErrorClass_ERROR_CLASS_CONTEXT_LENGTH_EXCEEDED, message: "too many tokens"},
		{name: "context length vllm message", status: 400,
			body:  `{"object":"error","message":"This model's maximum context length is 4096 tokens.","type":"BadRequestError","code":400}`,
			class: mantlev1.ErrorClass_ERROR_CLASS_CONTEXT_LENGTH_EXCEEDED},
		{name: "context length anthropic", status: 400,
			body:  `{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}`,
			class: mantlev1.ErrorClass_ERROR_CLASS_CONTEXT_LENGTH_EXCEEDED},
		{name: "content filter azure", status: 400,
			body:    `{"error":{"message":"The response was filtered due to the prompt triggering Azure OpenAI's content management policy.","code":"content_filter"}}`,
			class:   mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED,
			message: "The response was filtered due to the prompt triggering Azure OpenAI's content management policy."},
		{name: "content policy violation", status: 400,
			body:  `{"error":{"message":"rejected","type":"invalid_request_error","code":"content_policy_violation"}}`,
			class: mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED, message: "rejected"},
		{name: "content filter qwen", status: 400,
			body:  `{"error":{"code":"data_inspection_failed","message":"Input data may contain inappropriate content.","type":"data_inspection_failed"}}`,
			class: mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED, message: "Input data may contain inappropriate content."},
		{name: "redirect left unfollowed", status: 302, class: mantlev1.ErrorClass_ERROR_CLASS_UNKNOWN,
			message: "provider redirected (HTTP 302) to no Location; redirects are not followed, set the provider's base_url to the address that answers"},
		{name: "redirect names its target without secrets", status: 308,
			header: header("Location", "https://user:pw@api.example.com/v2/chat/completions?sig=secret#frag"),
			body:   "<html>Permanent Redirect</html>", class: mantlev1.ErrorClass_ERROR_CLASS_UNKNOWN,
			message: "provider redirected (HTTP 308) to https://api.example.com/v2/chat/completions; redirects are not followed, set the provider's base_url to the address that answers"},
		{name: "redirect to a relative path", status: 301, header: header("Location", "/v1/chat/completions"),
			class:   mantlev1.ErrorClass_ERROR_CLASS_UNKNOWN,
			message: "provider redirected (HTTP 301) to /v1/chat/completions; redirects are not followed, set the provider's base_url to the address that answers"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := tt.header
			if h == nil {
				h = http.Header{}
			}
			h.Set("X-Request-Id", "req-1")
			e := ClassifyHTTP(tt.status, h, []byte(tt.body), fixedNow)
			if e.Class != tt.class {
				t.Errorf("class = %v, want %v (%v)", e.Class, tt.class, e)
			}
			if e.RetryAfter != tt.retryAfter {
				t.Errorf("RetryAfter = %v, want %v", e.RetryAfter, tt.retryAfter)
			}
			if tt.message != "" && e.Message != tt.message {
				t.Errorf("Message = %q, want %q", e.Message, tt.message)
			}
			if e.StatusCode != tt.status || e.RequestID != "req-1" {
				t.Errorf("StatusCode, RequestID = %d, %q; want %d, req-1", e.StatusCode, e.RequestID, tt.status)
			}
		})
	}
	if e := ClassifyHTTP(200, nil, nil, nil); e != nil {
		t.Errorf("ClassifyHTTP(200) = %v, want nil", e)
	}
}

func TestClassifyEmbedded(t *testing.T) {
	tests := []struct {
		name string
		err  APIError
		want Class
	}{
		{"generic", APIError{Type: "server_error", Message: "oops"}, mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR},
		{"untyped", APIError{Message: "oops"}, mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR},
		{"bad request stays hidden", APIError{Type: "invalid_request_error"}, mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR},
		{"content filter", APIError{Code: "content_filter", Message: "filtered"}, mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED},
		{"context", APIError{Message: "This model's maximum context length is 8192 tokens"}, mantlev1.ErrorClass_ERROR_CLASS_CONTEXT_LENGTH_EXCEEDED},
		{"rate limit", APIError{Code: "rate_limit_exceeded"}, mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED},
		{"overloaded", APIError{Type: "overloaded_error"}, mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED},
		{"auth", APIError{Type: "invalid_request_error", Code: "invalid_api_key"}, mantlev1.ErrorClass_ERROR_CLASS_AUTH},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := ClassifyEmbedded(tt.err)
			if e.Class != tt.want {
				t.Errorf("class = %v, want %v", e.Class, tt.want)
			}
			if e.Message == "" {
				t.Error("Message is empty")
			}
		})
	}
}

func TestClassifyTransport(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), testNow)
	defer cancel2()
	live := context.Background()
	urlErr := func(err error) error { return &url.Error{Op: "Post", URL: "http://x", Err: err} }
	opErr := func(err error) error {
		return &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", err)}
	}

	tests := []struct {
		name string
		ctx  context.Context
		err  error
		want Class
	}{
		{"canceled", canceled, urlErr(context.Canceled), mantlev1.ErrorClass_ERROR_CLASS_CANCELED},
		{"canceled ctx decides over transport symptom", canceled, urlErr(io.EOF), mantlev1.ErrorClass_ERROR_CLASS_CANCELED},
		{"deadline", expired, urlErr(context.DeadlineExceeded), mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT},
		{"expired ctx decides over transport symptom", expired, errors.New("use of closed connection"), mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT},
		{"client timeout", live, urlErr(timeoutError{}), mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT},
		{"eof before headers", live, urlErr(io.EOF), mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT},
		{"connection reset", live, urlErr(opErr(syscall.ECONNRESET)), mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT},
		{"connection refused", live, urlErr(opErr(syscall.ECONNREFUSED)), mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT},
		{"dns", live, urlErr(&net.DNSError{Err: "no such host", Name: "x"}), mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT},
		{"unknown", live, urlErr(errors.New("unsupported protocol scheme")), mantlev1.ErrorClass_ERROR_CLASS_UNKNOWN},
		{"already classified", live, fmt.Errorf("wrapped: %w", &Error{Class: mantlev1.ErrorClass_ERROR_CLASS_AUTH}), mantlev1.ErrorClass_ERROR_CLASS_AUTH},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := ClassifyTransport(tt.ctx, tt.err)
			if e.Class != tt.want {
				t.Errorf("class = %v, want %v (%v)", e.Class, tt.want, e)
			}
			if ClassOf(e) != tt.want {
				t.Errorf("ClassOf = %v, want %v", ClassOf(e), tt.want)
			}
		})
	}
}

type timeoutError struct{}

func (timeoutError) Error() string   { return "Client.Timeout exceeded" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

func TestParseRateLimit(t *testing.T) {
	tests := []struct {
		name   string
		header http.Header
		want   RateLimit
	}{
		{"none", http.Header{}, RateLimit{RemainingRequests: -1, RemainingTokens: -1}},
		{"openai", header(
			"X-Ratelimit-Remaining-Requests", "59", "X-Ratelimit-Reset-Requests", "1s",
			"X-Ratelimit-Remaining-Tokens", "149984", "X-Ratelimit-Reset-Tokens", "6m0s"),
			RateLimit{RemainingRequests: 59, RemainingTokens: 149984, ResetRequests: time.Second, ResetTokens: 6 * time.Minute, Known: true}},
		{"openai tokens only", header("X-Ratelimit-Remaining-Tokens", "100", "X-Ratelimit-Reset-Tokens", "20ms"),
			RateLimit{RemainingRequests: -1, RemainingTokens: 100, ResetTokens: 20 * time.Millisecond, Known: true}},
		{"anthropic", header(
			"Anthropic-Ratelimit-Requests-Remaining", "49",
			"Anthropic-Ratelimit-Requests-Reset", testNow.Add(10*time.Second).Format(time.RFC3339),
			"Anthropic-Ratelimit-Tokens-Remaining", "39000",
			"Anthropic-Ratelimit-Tokens-Reset", testNow.Add(time.Minute).Format(time.RFC3339)),
			RateLimit{RemainingRequests: 49, RemainingTokens: 39000, ResetRequests: 10 * time.Second, ResetTokens: time.Minute, Known: true}},
		{"anthropic input and output take the tighter", header(
			"Anthropic-Ratelimit-Input-Tokens-Remaining", "5000",
			"Anthropic-Ratelimit-Input-Tokens-Reset", testNow.Add(20*time.Second).Format(time.RFC3339),
			"Anthropic-Ratelimit-Output-Tokens-Remaining", "800",
			"Anthropic-Ratelimit-Output-Tokens-Reset", testNow.Add(5*time.Second).Format(time.RFC3339)),
			RateLimit{RemainingRequests: -1, RemainingTokens: 800, ResetTokens: 5 * time.Second, Known: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ParseRateLimit(tt.header, fixedNow); got != tt.want {
				t.Errorf("ParseRateLimit = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestRetryAfterIgnoresGarbage(t *testing.T) {
	h := header("Retry-After", "soon", "X-Ratelimit-Reset-Requests", "later")
	if got := RetryAfter(h, fixedNow); got != 0 {
		t.Errorf("RetryAfter = %v, want 0", got)
	}
}

func TestErrorMessageIsBounded(t *testing.T) {
	body := make([]byte, 10_000)
	for i := range body {
		body[i] = 'x'
	}
	e := ClassifyHTTP(500, nil, body, nil)
	if len(e.Message) > 300 {
		t.Errorf("message length = %d, want it bounded", len(e.Message))
	}
}
