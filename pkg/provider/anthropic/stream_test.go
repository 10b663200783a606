package anthropic

import (
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

// sse is one named event.
type sse struct{ name, data string }

// events answers with an event stream of the given events, flushing each.
func events(evs ...sse) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		w.Header().Set("Request-Id", "req_stream")
		for _, ev := range evs {
			fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev.name, ev.data)
			w.(http.Flusher).Flush()
		}
	}
}

var (
	messageStart = sse{"message_start", `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-test","stop_reason":null,"usage":{"input_tokens":25,"cache_read_input_tokens":5,"output_tokens":1}}}`}
	blockStart   = sse{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`}
	ping         = sse{"ping", `{"type": "ping"}`}
	blockStop    = sse{"content_block_stop", `{"type":"content_block_stop","index":0}`}
	messageStop  = sse{"message_stop", `{"type":"message_stop"}`}
)

func text(s string) sse {
	return sse{"content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":%q}}`, s)}
}

func messageDelta(stopReason string, outputTokens int) sse {
	return sse{"message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":%q,"stop_sequence":null},"usage":{"output_tokens":%d}}`, stopReason, outputTokens)}
}

func errorEvent(typ, message string) sse {
	return sse{"error", apiError(typ, message)}
}

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
	send := events(messageStart, blockStart, ping, text("Hello"), text(" there"),
		sse{"content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{"}}`},
		blockStop, messageDelta("end_turn", 15), messageStop)
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		json.NewDecoder(r.Body).Decode(&body)
		bodies <- body
		send(w, r)
	}))
	s, err := c.Stream(context.Background(), testRequest)
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	defer s.Close()
	if s.RequestID() != "req_stream" {
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
	if len(chunks) != 3 || chunks[0].Content != "Hello" || chunks[1].Content != " there" {
		t.Fatalf("chunks = %+v", chunks)
	}
	final := chunks[2]
	if final.Content != "" || final.FinishReason != "stop" || final.Usage == nil ||
		*final.Usage != (provider.Usage{InputTokens: 30, OutputTokens: 15}) {
		t.Errorf("final chunk = %+v (usage %+v)", final, final.Usage)
	}
	if _, err := s.Recv(); err != io.EOF {
		t.Errorf("Recv after the end = %v, want io.EOF", err)
	}
	if body := <-bodies; body["stream"] != true || body["system"] != "be brief\n\nanswer in English" {
		t.Errorf("body = %v", body)
	}
}

func TestStreamOutcomes(t *testing.T) {
	abort := func(evs ...sse) http.HandlerFunc {
		send := events(evs...)
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
		{name: "max_tokens is length, not an error",
			handler: events(messageStart, text("cut"), messageDelta("max_tokens", 3), messageStop),
			content: "cut", finish: "length"},
		{name: "stop reason then end of body without message_stop is a clean end",
			handler: events(messageStart, text("ok"), messageDelta("stop_sequence", 1)),
			content: "ok", finish: "stop"},
		{name: "unnamed events are recognised by their type",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, "data: "+text("x").data+"\n\ndata: "+messageDelta("end_turn", 1).data+"\n\ndata: "+messageStop.data+"\n\n")
			},
			content: "x", finish: "stop"},
		{name: "cut before message_stop",
			handler: abort(messageStart, text("Hel")),
			content: "Hel", class: mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED},
		{name: "clean close before message_stop",
			handler: events(messageStart, text("Hel")),
			content: "Hel", class: mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED},
		{name: "overloaded_error mid-stream",
			handler: events(messageStart, text("Hel"), errorEvent("overloaded_error", "Overloaded")),
			content: "Hel", class: mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, message: "Overloaded"},
		{name: "rate_limit_error mid-stream",
			handler: events(messageStart, errorEvent("rate_limit_error", "rate limited")),
			class:   mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, message: "rate limited"},
		{name: "api_error mid-stream",
			handler: events(messageStart, errorEvent("api_error", "Internal server error")),
			class:   mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT, message: "Internal server error"},
		{name: "prompt too long mid-stream",
			handler: events(errorEvent("invalid_request_error", "prompt is too long: 300000 tokens > 200000 maximum")),
			class:   mantlev1.ErrorClass_ERROR_CLASS_CONTEXT_LENGTH_EXCEEDED, message: "prompt is too long"},
		{name: "unknown error type mid-stream",
			handler: events(messageStart, errorEvent("novel_error", "something new")),
			class:   mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR, message: "something new"},
		{name: "error event that is not JSON",
			handler: events(sse{"error", "upstream exploded"}),
			class:   mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR, message: "upstream exploded"},
		{name: "unparseable data line",
			handler: events(messageStart, text("a"), sse{"content_block_delta", `{"type":"content_block_delta","delta":`}),
			content: "a", class: mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT},
		{name: "refusal",
			handler: events(messageStart, text("I"), messageDelta("refusal", 1), messageStop),
			content: "I", class: mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED, message: "refusal"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := newTestClient(t, tt.handler).Stream(context.Background(), testRequest)
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
			if e.RequestID != "req_stream" {
				t.Errorf("RequestID = %q, want req_stream", e.RequestID)
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
		{"429", respond(429, apiError("rate_limit_error", "slow down"), "Retry-After", "4"),
			mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, 4 * time.Second},
		{"529", respond(529, apiError("overloaded_error", "Overloaded")), mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, 0},
		{"401", respond(401, apiError("authentication_error", "bad key")), mantlev1.ErrorClass_ERROR_CLASS_AUTH, 0},
		{"200 JSON error instead of a stream", respond(200, apiError("api_error", "oops")),
			mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR, 0},
		{"connection reset before headers", hangUp(true), mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := newTestClient(t, tt.handler).Stream(context.Background(), testRequest)
			if s != nil {
				t.Fatal("Stream returned a stream and an error")
			}
			e := asError(t, err)
			if e.Class != tt.class || e.RetryAfter != tt.retryAfter {
				t.Errorf("class, RetryAfter = %v, %v; want %v, %v (%v)", e.Class, e.RetryAfter, tt.class, tt.retryAfter, e)
			}
		})
	}
}

// stall sends the start of a message and then nothing, until the client goes away; gone is
// closed when the server sees that happen, which proves the connection was released.
func stall(gone chan<- struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range []sse{messageStart, text("first")} {
			fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev.name, ev.data)
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(gone)
	}
}

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
		name string
		stop func(cancel context.CancelFunc, s provider.Stream)
	}{
		{"caller cancels", func(cancel context.CancelFunc, _ provider.Stream) { cancel() }},
		{"caller closes the stream", func(_ context.CancelFunc, s provider.Stream) { s.Close() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gone := make(chan struct{})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s, err := newTestClient(t, stall(gone)).Stream(ctx, testRequest)
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
			if got := provider.ClassOf(err); got != mantlev1.ErrorClass_ERROR_CLASS_CANCELED {
				t.Errorf("class = %v, want CANCELED (%v)", got, err)
			}
			waitClosed(t, gone)
		})
	}
}

func TestStreamStallDeadline(t *testing.T) {
	gone := make(chan struct{})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	s, err := newTestClient(t, stall(gone)).Stream(ctx, testRequest)
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
		io.WriteString(buf, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
		fmt.Fprintf(buf, "event: %s\ndata: %s\n\n", text("first").name, text("first").data)
		buf.Flush()
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
