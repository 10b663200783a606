package openai

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

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
)

// events answers with an event stream made of the given data payloads, flushing each.
func events(payloads ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Request-Id", "req-stream")
		for _, p := range payloads {
			fmt.Fprintf(w, "data: %s\n\n", p)
			w.(http.Flusher).Flush()
		}
	}
}

// raw answers with body as an event stream, written as is.
func raw(body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Request-Id", "req-stream")
		io.WriteString(w, body)
	}
}

// delta is a chunk carrying content.
func delta(content string) string {
	return fmt.Sprintf(`{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":%q},"finish_reason":null}]}`, content)
}

// finish is a chunk carrying a finish reason and no content.
func finish(reason string) string {
	return fmt.Sprintf(`{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":%q}]}`, reason)
}

const usageChunk = `{"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}`

// drain reads a stream to its end and returns the content, the last chunk and the error
// that ended it.
func drain(t *testing.T, s provider.Stream) (content string, last provider.Chunk, err error) {
	t.Helper()
	var b strings.Builder
	for range 1000 {
		c, err := s.Recv()
		if err != nil {
			return b.String(), last, err
		}
		b.WriteString(c.Content)
		last = c
	}
	t.Fatal("stream did not end")
	return
}

func TestStreamSuccess(t *testing.T) {
	bodies := make(chan map[string]any, 1)
	headers := make(chan http.Header, 1)
	send := events(delta("Hel"), delta("lo"), finish("stop"), usageChunk, "[DONE]")
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		json.NewDecoder(r.Body).Decode(&body)
		bodies <- body
		headers <- r.Header.Clone()
		send(w, r)
	}))

	s, err := c.Stream(context.Background(), testRequest)
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	defer s.Close()
	if s.RequestID() != "req-stream" {
		t.Errorf("RequestID = %q", s.RequestID())
	}
	var chunks []provider.Chunk
	for {
		c, err := s.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		chunks = append(chunks, c)
	}
	want := []provider.Chunk{
		{Content: "Hel"},
		{Content: "lo"},
		{FinishReason: "stop", Usage: &provider.Usage{InputTokens: 9, OutputTokens: 2}},
	}
	if fmt.Sprintf("%+v", deref(chunks)) != fmt.Sprintf("%+v", deref(want)) {
		t.Errorf("chunks = %+v\nwant     %+v", deref(chunks), deref(want))
	}
	if _, err := s.Recv(); err != io.EOF {
		t.Errorf("Recv after the end = %v, want io.EOF", err)
	}

	body := <-bodies
	if body["stream"] != true || fmt.Sprint(body["stream_options"]) != "map[include_usage:true]" {
		t.Errorf("body stream fields = %v, %v", body["stream"], body["stream_options"])
	}
	if h := <-headers; h.Get("Accept") != "text/event-stream" {
		t.Errorf("Accept = %q", h.Get("Accept"))
	}
}

// deref makes chunks printable with their usage values rather than pointers.
func deref(chunks []provider.Chunk) []string {
	out := make([]string, len(chunks))
	for i, c := range chunks {
		out[i] = fmt.Sprintf("{%q %q", c.Content, c.FinishReason)
		if c.Usage != nil {
			out[i] += fmt.Sprintf(" %+v", *c.Usage)
		}
		out[i] += "}"
	}
	return out
}

func TestStreamOutcomes(t *testing.T) {
	abort := func(payloads ...string) http.HandlerFunc {
		send := events(payloads...)
		return func(w http.ResponseWriter, r *http.Request) {
			send(w, r)
			// Abort the response: the server closes the connection without the final
			// chunk of the chunked encoding, as a dying upstream would.
			panic(http.ErrAbortHandler)
		}
	}
	tests := []struct {
		name    string
		handler http.HandlerFunc
		content string
		finish  string // of the last chunk, for clean ends
		class   provider.Class
		message string
	}{
		{name: "length is a finish reason, not an error",
			handler: events(delta("partial"), finish("length"), usageChunk, "[DONE]"),
			content: "partial", finish: "length"},
		{name: "content and finish in one chunk",
			handler: events(`{"choices":[{"delta":{"content":"all"},"finish_reason":"stop"}]}`, "[DONE]"),
			content: "all", finish: "stop"},
		{name: "finish reason then end of body without [DONE] is a clean end",
			handler: events(delta("ok"), finish("stop")),
			content: "ok", finish: "stop"},
		{name: "comments and blank keep-alives are ignored",
			handler: raw(": OPENROUTER PROCESSING\n\n\n" + "data: " + delta("x") + "\n\ndata: " + finish("stop") + "\n\ndata: [DONE]\n\n"),
			content: "x", finish: "stop"},
		{name: "cut before [DONE]",
			handler: abort(delta("Hel")),
			content: "Hel", class: mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED},
		{name: "clean close before [DONE] and finish",
			handler: events(delta("Hel")),
			content: "Hel", class: mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED},
		{name: "cut in the middle of a line",
			handler: raw("data: " + delta("a") + "\n\ndata: {\"choices\":[{\"de"),
			content: "a", class: mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED},
		{name: "error object mid-stream",
			handler: events(delta("Hel"), `{"error":{"message":"The server had an error while processing your request.","type":"server_error"}}`),
			content: "Hel", class: mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR, message: "server had an error"},
		{name: "error event with its own class",
			handler: raw("data: " + delta("a") + "\n\nevent: error\ndata: {\"error\":{\"message\":\"Rate limit exceeded\",\"code\":\"rate_limit_exceeded\"}}\n\n"),
			content: "a", class: mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, message: "Rate limit exceeded"},
		{name: "error event that is not JSON",
			handler: raw("event: error\ndata: upstream exploded\n\n"),
			class:   mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR, message: "upstream exploded"},
		{name: "unparseable data line",
			handler: events(delta("a"), `{"choices":[{"delta":`+"oops", "[DONE]"),
			content: "a", class: mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT},
		{name: "content filter finish",
			handler: events(delta("a"), finish("content_filter"), "[DONE]"),
			content: "a", class: mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED, message: "content_filter"},
		{name: "refusal",
			handler: events(`{"choices":[{"delta":{"refusal":"I can't "}}]}`, `{"choices":[{"delta":{"refusal":"help."},"finish_reason":"stop"}]}`, "[DONE]"),
			class:   mantlev1.ErrorClass_ERROR_CLASS_REFUSAL, message: "I can't help."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestClient(t, tt.handler)
			s, err := c.Stream(context.Background(), testRequest)
			if err != nil {
				t.Fatalf("Stream: %v", err)
			}
			defer s.Close()
			content, last, err := drain(t, s)
			if content != tt.content {
				t.Errorf("content = %q, want %q", content, tt.content)
			}
			if tt.class == mantlev1.ErrorClass_ERROR_CLASS_UNSPECIFIED {
				if err != io.EOF {
					t.Fatalf("stream ended with %v, want io.EOF", err)
				}
				if last.FinishReason != tt.finish {
					t.Errorf("finish reason = %q, want %q", last.FinishReason, tt.finish)
				}
				return
			}
			t.Logf("error: %v", err)
			e := asError(t, err)
			if e.Class != tt.class {
				t.Errorf("class = %v, want %v (%v)", e.Class, tt.class, e)
			}
			if !strings.Contains(e.Message, tt.message) {
				t.Errorf("Message = %q, want it to contain %q", e.Message, tt.message)
			}
			if e.RequestID != "req-stream" {
				t.Errorf("RequestID = %q, want req-stream", e.RequestID)
			}
			if _, again := s.Recv(); again != err {
				t.Errorf("Recv after the error = %v, want the same error %v", again, err)
			}
		})
	}
}

func TestStreamHTTPErrors(t *testing.T) {
	tests := []struct {
		name       string
		handler    http.HandlerFunc
		class      provider.Class
		retryAfter time.Duration
	}{
		{"429", respond(429, `{"error":{"message":"slow down"}}`, "Retry-After", "4"),
			mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, 4 * time.Second},
		{"529", respond(529, ``), mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, 0},
		{"401", respond(401, `{}`), mantlev1.ErrorClass_ERROR_CLASS_AUTH, 0},
		{"200 JSON error instead of a stream", respond(200, `{"error":{"message":"stream failed"}}`),
			mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR, 0},
		{"200 JSON that is not an error", respond(200, `{"choices":[]}`),
			mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT, 0},
		{"connection reset before headers", hangUp(true), mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := newTestClient(t, tt.handler).Stream(context.Background(), testRequest)
			if s != nil {
				t.Fatal("Stream returned a stream and an error")
			}
			t.Logf("error: %v", err)
			e := asError(t, err)
			if e.Class != tt.class || e.RetryAfter != tt.retryAfter {
				t.Errorf("class, RetryAfter = %v, %v; want %v, %v (%v)", e.Class, e.RetryAfter, tt.class, tt.retryAfter, e)
			}
		})
	}
}

// stall sends one chunk and then nothing, until the client goes away; gone is closed when
// the server sees that happen, which proves the connection was released.
func stall(gone chan<- struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: %s\n\n", delta("first"))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(gone)
	}
}

// recvAsync runs one Recv in the background.
func recvAsync(s provider.Stream) <-chan error {
	errc := make(chan error, 1)
	go func() {
		_, err := s.Recv()
		errc <- err
	}()
	return errc
}

func waitErr(t *testing.T, errc <-chan error) error {
	t.Helper()
	select {
	case err := <-errc:
		return err
	case <-time.After(watchdog):
		t.Fatal("Recv did not return")
		return nil
	}
}

func waitClosed(t *testing.T, gone <-chan struct{}) {
	t.Helper()
	select {
	case <-gone:
	case <-time.After(watchdog):
		t.Fatal("the server never saw the connection go away")
	}
}

func TestStreamStall(t *testing.T) {
	tests := []struct {
		name  string
		stop  func(cancel context.CancelFunc, s provider.Stream)
		class provider.Class
	}{
		{"caller cancels", func(cancel context.CancelFunc, _ provider.Stream) { cancel() },
			mantlev1.ErrorClass_ERROR_CLASS_CANCELED},
		{"caller closes the stream", func(_ context.CancelFunc, s provider.Stream) { s.Close() },
			mantlev1.ErrorClass_ERROR_CLASS_CANCELED},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gone := make(chan struct{})
			c := newTestClient(t, stall(gone))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s, err := c.Stream(ctx, testRequest)
			if err != nil {
				t.Fatalf("Stream: %v", err)
			}
			defer s.Close()
			if chunk, err := s.Recv(); err != nil || chunk.Content != "first" {
				t.Fatalf("first Recv = %+v, %v", chunk, err)
			}
			errc := recvAsync(s)
			tt.stop(cancel, s)
			err = waitErr(t, errc)
			if got := provider.ClassOf(err); got != tt.class {
				t.Errorf("class = %v, want %v (%v)", got, tt.class, err)
			}
			waitClosed(t, gone)
			if err := s.Close(); err != nil {
				t.Errorf("second Close = %v", err)
			}
		})
	}
}

func TestStreamStallDeadline(t *testing.T) {
	gone := make(chan struct{})
	c := newTestClient(t, stall(gone))
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	s, err := c.Stream(ctx, testRequest)
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	defer s.Close()
	if _, err := s.Recv(); err != nil {
		t.Fatalf("first Recv: %v", err)
	}
	err = waitErr(t, recvAsync(s))
	if got := provider.ClassOf(err); got != mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT {
		t.Errorf("class = %v, want TIMEOUT (%v)", got, err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v does not wrap context.DeadlineExceeded", err)
	}
	waitClosed(t, gone)
}

// TestStreamConnectionReset: a connection that dies mid-stream (RST, not a clean close) is a
// transient network failure rather than a truncated answer.
func TestStreamConnectionReset(t *testing.T) {
	proceed := make(chan struct{})
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		defer conn.Close()
		writeRawStream(buf, delta("first"))
		<-proceed
		conn.(*net.TCPConn).SetLinger(0)
	}))
	s, err := c.Stream(context.Background(), testRequest)
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	defer s.Close()
	if chunk, err := s.Recv(); err != nil || chunk.Content != "first" {
		t.Fatalf("first Recv = %+v, %v", chunk, err)
	}
	close(proceed)
	err = waitErr(t, recvAsync(s))
	if got := provider.ClassOf(err); got != mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT {
		t.Errorf("class = %v, want TRANSIENT (%v)", got, err)
	}
}

// writeRawStream writes an HTTP/1.1 event-stream response by hand, delimited by the end of
// the connection, so the test controls how that connection ends.
func writeRawStream(buf *bufio.ReadWriter, payload string) {
	io.WriteString(buf, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
	fmt.Fprintf(buf, "data: %s\n\n", payload)
	buf.Flush()
}
