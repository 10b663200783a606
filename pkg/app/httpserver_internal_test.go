package app

import (
	"net/http"
	"testing"
)

func TestErrorShapeOfPath(t *testing.T) {
	t.Parallel()
	var s errorShapes
	s.add("/v1/messages", ErrorShapeAnthropic)
	s.add("/v1/messages/batches/", ErrorShapeOpenAI) // a longer prefix wins
	for _, tt := range []struct {
		path string
		want ErrorShape
	}{
		{"/v1/messages", ErrorShapeAnthropic},
		{"/v1/messages/count_tokens", ErrorShapeAnthropic},
		{"/v1/messages/../x", ErrorShapeAnthropic},
		{"/v1/messagesx", ErrorShapeOpenAI},
		{"/v1/messages/batches", ErrorShapeOpenAI},
		{"/v1/chat/completions", ErrorShapeOpenAI},
		{"/", ErrorShapeOpenAI},
	} {
		if got := s.of(tt.path); got != tt.want {
			t.Errorf("of(%q) = %v, want %v", tt.path, got, tt.want)
		}
	}
}

func TestAnthropicErrorType(t *testing.T) {
	t.Parallel()
	for code, want := range map[int]string{
		http.StatusBadRequest: "invalid_request_error", http.StatusUnauthorized: "authentication_error",
		http.StatusForbidden: "permission_error", http.StatusNotFound: "not_found_error",
		http.StatusMethodNotAllowed: "invalid_request_error", http.StatusRequestEntityTooLarge: "request_too_large",
		http.StatusRequestHeaderFieldsTooLarge: "invalid_request_error", http.StatusTooManyRequests: "rate_limit_error",
		529: "overloaded_error", http.StatusInternalServerError: "api_error", http.StatusNotImplemented: "api_error",
	} {
		if got := anthropicErrorType(code); got != want {
			t.Errorf("anthropicErrorType(%d) = %q, want %q", code, got, want)
		}
	}
}
