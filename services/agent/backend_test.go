package agent

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestHTTPBackend calls a real HTTP server and checks how each answer is classified.
func TestHTTPBackend(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	var got http.Header
	var gotBody string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/ok":
			got, gotBody = r.Header.Clone(), string(body)
			_, _ = io.WriteString(w, `{"temp":21}`)
		case "/text":
			_, _ = io.WriteString(w, "sunny")
		case "/big":
			_, _ = io.WriteString(w, `"`+strings.Repeat("x", 100)+`"`)
		case "/hang":
			select {
			case <-r.Context().Done():
			case <-release:
			}
		case "/redirect":
			http.Redirect(w, r, "/ok", http.StatusFound)
		default: // /<status>
			code := 0
			for _, c := range strings.TrimPrefix(r.URL.Path, "/") {
				code = code*10 + int(c-'0')
			}
			if code == http.StatusBadRequest {
				w.WriteHeader(code)
				_, _ = io.WriteString(w, "no such city")
				return
			}
			w.WriteHeader(code)
		}
	}))
	t.Cleanup(srv.Close)
	closed := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		return "http://" + addr + "/x"
	}()

	tests := []struct {
		url     string
		result  string
		isError bool
		failure failure
		outcome string
	}{
		{url: srv.URL + "/ok", result: `{"temp":21}`},
		{url: srv.URL + "/400", result: `"no such city"`, isError: true},
		{url: srv.URL + "/404", result: `""`, isError: true},
		{url: srv.URL + "/text", failure: failBadResponse, outcome: "bad_response"},
		{url: srv.URL + "/big", failure: failBadResponse, outcome: "bad_response"},
		{url: srv.URL + "/429", failure: failRefused, outcome: "rate_limited"},
		{url: srv.URL + "/503", failure: failRefused, outcome: "unavailable"},
		{url: srv.URL + "/redirect", failure: failRefused, outcome: "unavailable"},
		{url: srv.URL + "/500", failure: failUnknown, outcome: "unavailable"},
		{url: srv.URL + "/502", failure: failUnknown, outcome: "unavailable"},
		{url: srv.URL + "/408", failure: failUnknown, outcome: "timeout"},
		{url: srv.URL + "/hang", failure: failUnknown, outcome: "timeout"},
		{url: closed, failure: failRefused, outcome: "unavailable"},
	}
	getenv := func(name string) string { return map[string]string{"TOOL_TOKEN": "Bearer t0k"}[name] }
	for _, tc := range tests {
		b := newHTTPBackend(BackendConfig{URL: tc.url, HeadersEnv: map[string]string{"Authorization": "TOOL_TOKEN"}}, getenv, toolHTTPClient(time.Second), 64)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		res, err := b.call(ctx, backendCall{args: []byte(`{"city":"Oslo"}`), idempotencyKey: "mantle-abc", requestID: "req-1"})
		cancel()
		b.close()
		var ce *callError
		switch {
		case tc.failure == failNone:
			if err != nil || res.result != tc.result || res.isError != tc.isError {
				t.Errorf("%s = %+v, %v; want %s (is_error %t)", tc.url, res, err, tc.result, tc.isError)
			}
		case !errors.As(err, &ce) || ce.failure != tc.failure || ce.outcome != tc.outcome:
			t.Errorf("%s = %+v, %v; want %s/%s", tc.url, res, err, tc.failure, tc.outcome)
		}
	}
	if got.Get("Idempotency-Key") != "mantle-abc" || got.Get("X-Request-Id") != "req-1" || got.Get("Authorization") != "Bearer t0k" ||
		got.Get("Content-Type") != "application/json" || gotBody != `{"city":"Oslo"}` {
		t.Errorf("the backend got headers %v and body %q", got, gotBody)
	}
}

func TestEndpointOf(t *testing.T) {
	t.Parallel()
	if got := endpointOf(BackendConfig{Type: BackendMCP, URL: "https://u:p@shop.example/mcp?token=x", Tool: "order"}); got != "https://shop.example/mcp#order" {
		t.Errorf("endpointOf = %q", got)
	}
}
