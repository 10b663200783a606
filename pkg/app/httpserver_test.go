package app_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mantle-mesh/mantle/pkg/app"
)

// bodyReader is a module whose POST /read reads the whole body and reports how that ended.
func bodyReader(b *blocker, results chan<- error) app.Module {
	return app.Module{Name: "blocker", New: func(_ context.Context, env app.Env) (app.Runnable, error) {
		env.GRPC.RegisterService(b.desc(), b)
		env.HTTP.HandleFunc("POST /read", func(w http.ResponseWriter, r *http.Request) {
			_, err := io.ReadAll(r.Body)
			results <- err
			if err != nil {
				w.WriteHeader(http.StatusRequestTimeout)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintln(w, `{"ok":true}`)
		})
		env.HTTP.HandleFunc("GET /json-error", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTeapot)
			fmt.Fprintln(w, `{"error":{"message":"mine"}}`)
		})
		return nil, nil
	}}
}

// TestSlowBodyIsCutAtTheReadTimeout: a client that sends half its body and stops holds the
// connection only until the body read timeout; the server then closes it. Nothing here
// sleeps: the client waits for the server to act, bounded by waitLimit.
func TestSlowBodyIsCutAtTheReadTimeout(t *testing.T) {
	t.Parallel()
	results := make(chan error, 2)
	cfg := testConfig("blocker")
	cfg.HTTP = app.HTTPLimits{BodyReadTimeout: 50 * time.Millisecond}
	r := start(t, cfg, []app.Module{bodyReader(newBlocker(), results)})

	conn := dialHTTP(t, r.app.HTTPAddr())
	fmt.Fprintf(conn, "POST /read HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n%s", strings.Repeat("x", 10))
	select {
	case err := <-results:
		var nerr net.Error
		if !errors.As(err, &nerr) || !nerr.Timeout() {
			t.Fatalf("reading the slow body ended with %v, want a timeout", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("the slow body was never cut")
	}
	// The server closes the connection: the client sees the end of the stream (after the
	// handler's answer, when it got through), not its own deadline.
	rest, err := io.ReadAll(conn)
	if err != nil {
		t.Fatalf("reading until the server closes: %v (got %q)", err, rest)
	}

	// A body that arrives in time is read whole, on a connection that stays usable.
	res, err := http.Post("http://"+r.app.HTTPAddr()+"/read", "application/json", strings.NewReader(`{"a":1}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK || <-results != nil {
		t.Fatalf("a prompt body: status %d", res.StatusCode)
	}
}

func TestIdleConnectionIsClosed(t *testing.T) {
	t.Parallel()
	cfg := testConfig("blocker")
	cfg.HTTP = app.HTTPLimits{IdleTimeout: 50 * time.Millisecond}
	r := start(t, cfg, []app.Module{bodyReader(newBlocker(), make(chan error, 1))})
	conn := dialHTTP(t, r.app.HTTPAddr())
	fmt.Fprintf(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	// Keep-alive, and then nothing: the server closes the connection.
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("idle keep-alive connection: read %v, want EOF from the server closing it", err)
	}
}

// TestOversizedHeadersAreRefused: headers over server.max_header_bytes, counted as they
// are on the wire, get 431 in OpenAI's error shape naming the limit; at the limit they
// pass. Only headers past four times the limit meet net/http's own plain 431, before any
// handler runs.
func TestOversizedHeadersAreRefused(t *testing.T) {
	t.Parallel()
	const limit = 4 << 10
	cfg := testConfig("blocker")
	cfg.HTTP = app.HTTPLimits{MaxHeaderBytes: limit}
	r := start(t, cfg, []app.Module{bodyReader(newBlocker(), make(chan error, 1))})
	// request returns a GET whose request line and headers are exactly size bytes.
	request := func(size int) string {
		head := "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Pad: "
		tail := "\r\n\r\n"
		return head + strings.Repeat("p", size-len(head)-len(tail)) + tail
	}
	tests := []struct {
		name       string
		size       int
		wantStatus int
		wantJSON   bool
	}{
		{"at the limit", limit, http.StatusOK, false},
		{"one byte over", limit + 1, http.StatusRequestHeaderFieldsTooLarge, true},
		{"four times over", 4 * limit, http.StatusRequestHeaderFieldsTooLarge, true},
		{"past net/http's own limit", 6 * limit, http.StatusRequestHeaderFieldsTooLarge, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			conn := dialHTTP(t, r.app.HTTPAddr())
			if _, err := io.WriteString(conn, request(tt.size)); err != nil {
				t.Fatal(err)
			}
			res, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			body, _ := io.ReadAll(res.Body)
			if res.StatusCode != tt.wantStatus {
				t.Fatalf("status %d, want %d; body %s", res.StatusCode, tt.wantStatus, body)
			}
			isJSON := strings.Contains(res.Header.Get("Content-Type"), "json")
			if isJSON != tt.wantJSON {
				t.Fatalf("Content-Type %q, want JSON %v; body %s", res.Header.Get("Content-Type"), tt.wantJSON, body)
			}
			if tt.wantJSON {
				var e struct {
					Error struct{ Message, Type, Code string } `json:"error"`
				}
				want := fmt.Sprintf("request headers are %d bytes, over the limit of %d (server.max_header_bytes)", tt.size, limit)
				if err := json.Unmarshal(body, &e); err != nil || e.Error.Code != "request_header_fields_too_large" || e.Error.Message != want || e.Error.Type != "invalid_request_error" {
					t.Errorf("body %s, want code request_header_fields_too_large and message %q", body, want)
				}
			}
		})
	}
}

// TestEveryPathAnswersOpenAIErrors: what the mux answers by itself (unknown path, wrong
// method, a path it would clean and redirect) is OpenAI error JSON; handlers' own JSON and
// non-error answers pass untouched.
func TestEveryPathAnswersOpenAIErrors(t *testing.T) {
	t.Parallel()
	r := start(t, testConfig("blocker"), []app.Module{bodyReader(newBlocker(), make(chan error, 4))})
	tests := []struct {
		method, path string
		wantStatus   int
		wantCode     string // "" means the answer is not an error
		wantMessage  string
	}{
		{"GET", "/nope", http.StatusNotFound, "not_found", `unknown path "/nope"`},
		{"GET", "/read", http.StatusMethodNotAllowed, "method_not_allowed", "use POST"},
		{"POST", "//read", http.StatusNotFound, "not_found", `unknown path "//read"`},
		{"POST", "/x/../read", http.StatusNotFound, "not_found", "not cleaned"},
		{"GET", "/json-error", http.StatusTeapot, "", ""},
		{"GET", "/healthz", http.StatusOK, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			t.Parallel()
			conn := dialHTTP(t, r.app.HTTPAddr())
			// Written by hand: net/http's client would clean the path itself.
			fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}", tt.method, tt.path)
			res, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			body, _ := io.ReadAll(res.Body)
			if res.StatusCode != tt.wantStatus || res.Header.Get("Location") != "" {
				t.Fatalf("status %d (Location %q), want %d; body %s", res.StatusCode, res.Header.Get("Location"), tt.wantStatus, body)
			}
			if tt.wantCode == "" {
				return
			}
			var e struct {
				Error struct{ Message, Type, Code string } `json:"error"`
			}
			if err := json.Unmarshal(body, &e); err != nil || res.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("body %q (%s) is not OpenAI error JSON: %v", body, res.Header.Get("Content-Type"), err)
			}
			if e.Error.Code != tt.wantCode || e.Error.Type != "invalid_request_error" || !strings.Contains(e.Error.Message, tt.wantMessage) {
				t.Fatalf("error %+v, want code %s and a message containing %q", e.Error, tt.wantCode, tt.wantMessage)
			}
		})
	}
}

// dialHTTP opens a raw connection to addr for the test, every read and write bounded by
// waitLimit so that a server that never answers fails the test instead of hanging it.
func dialHTTP(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := conn.SetDeadline(time.Now().Add(waitLimit)); err != nil {
		t.Fatal(err)
	}
	return conn
}

// TestWhatNetHTTPAnswersItself pins the answers net/http writes before any handler runs,
// in plain text, which docs/security.md lists: they cannot be given OpenAI's shape without
// parsing HTTP ourselves. A change here (a Go release that hands them to handlers) is a
// chance to answer them in JSON.
func TestWhatNetHTTPAnswersItself(t *testing.T) {
	t.Parallel()
	r := start(t, testConfig("blocker"), []app.Module{bodyReader(newBlocker(), make(chan error, 4))})
	tests := []struct {
		name, request string
		wantStatus    int
	}{
		{"malformed request line", "GET\r\n\r\n", http.StatusBadRequest},
		{"malformed header", "GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n", http.StatusBadRequest},
		{"no Host", "GET /healthz HTTP/1.1\r\n\r\n", http.StatusBadRequest},
		{"unknown transfer encoding", "POST /read HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", http.StatusNotImplemented},
		{"unknown expectation", "GET /healthz HTTP/1.1\r\nHost: x\r\nExpect: teapot\r\n\r\n", http.StatusExpectationFailed},
		{"unsupported version", "GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n", http.StatusHTTPVersionNotSupported},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			conn := dialHTTP(t, r.app.HTTPAddr())
			if _, err := io.WriteString(conn, tt.request); err != nil {
				t.Fatal(err)
			}
			res, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != tt.wantStatus || strings.Contains(res.Header.Get("Content-Type"), "json") {
				t.Errorf("status %d, Content-Type %q; want net/http's own plain %d", res.StatusCode, res.Header.Get("Content-Type"), tt.wantStatus)
			}
		})
	}
}
