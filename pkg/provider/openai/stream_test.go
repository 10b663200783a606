package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/pkg/provider/internal/providertest"
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

func TestStreamSuccess(t *testing.T) {
	bodies := make(chan map[string]any, 1)
	headers := make(chan http.Header, 1)
	send := events(delta("Hel"), delta("lo"), finish("stop"), usageChunk, "[DONE]")
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		json.NewDecoder(r.Body).Decode(&body)
		providertest.Offer(t, bodies, body)
		providertest.Offer(t, headers, r.Header.Clone())
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
	chunks := providertest.Collect(t, s)
	want := []provider.Chunk{
		{Content: "Hel"},
		{Content: "lo"},
		{FinishReason: "stop", Usage: &provider.Usage{InputTokens: 9, OutputTokens: 2}},
	}
	if fmt.Sprintf("%+v", deref(chunks)) != fmt.Sprintf("%+v", deref(want)) {
		t.Errorf("chunks = %+v\nwant     %+v", deref(chunks), deref(want))
	}
	if _, err := s.Recv(); !errors.Is(err, io.EOF) {
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
	providertest.StreamOutcomes(t, adapter, "req-stream", []providertest.StreamOutcome{
		{Name: "length is a finish reason, not an error",
			Handler: events(delta("partial"), finish("length"), usageChunk, "[DONE]"),
			Content: "partial", Finish: "length"},
		{Name: "content and finish in one chunk",
			Handler: events(`{"choices":[{"delta":{"content":"all"},"finish_reason":"stop"}]}`, "[DONE]"),
			Content: "all", Finish: "stop"},
		{Name: "finish reason then end of body without [DONE] is a clean end",
			Handler: events(delta("ok"), finish("stop")),
			Content: "ok", Finish: "stop"},
		{Name: "comments and blank keep-alives are ignored",
			Handler: raw(": OPENROUTER PROCESSING\n\n\n" + "data: " + delta("x") + "\n\ndata: " + finish("stop") + "\n\ndata: [DONE]\n\n"),
			Content: "x", Finish: "stop"},
		{Name: "cut before [DONE]",
			Handler: providertest.Abort(events(delta("Hel"))),
			Content: "Hel", Class: mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED},
		{Name: "clean close before [DONE] and finish",
			Handler: events(delta("Hel")),
			Content: "Hel", Class: mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED},
		{Name: "cut in the middle of a line",
			Handler: raw("data: " + delta("a") + "\n\ndata: {\"choices\":[{\"de"),
			Content: "a", Class: mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED},
		{Name: "error object mid-stream",
			Handler: events(delta("Hel"), `{"error":{"message":"The server had an error while processing your request.","type":"server_error"}}`),
			Content: "Hel", Class: mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR, Message: "server had an error"},
		{Name: "error event with its own class",
			Handler: raw("data: " + delta("a") + "\n\nevent: error\ndata: {\"error\":{\"message\":\"Rate limit exceeded\",\"code\":\"rate_limit_exceeded\"}}\n\n"),
			Content: "a", Class: mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, Message: "Rate limit exceeded"},
		{Name: "error event that is not JSON",
			Handler: raw("event: error\ndata: upstream exploded\n\n"),
			Class:   mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR, Message: "upstream exploded"},
		{Name: "unparseable data line",
			Handler: events(delta("a"), `{"choices":[{"delta":`+"oops", "[DONE]"),
			Content: "a", Class: mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT},
		{Name: "content filter finish",
			Handler: events(delta("a"), finish("content_filter"), "[DONE]"),
			Content: "a", Class: mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED, Message: "content_filter"},
		{Name: "refusal",
			Handler: events(`{"choices":[{"delta":{"refusal":"I can't "}}]}`, `{"choices":[{"delta":{"refusal":"help."},"finish_reason":"stop"}]}`, "[DONE]"),
			Class:   mantlev1.ErrorClass_ERROR_CLASS_REFUSAL, Message: "I can't help."},
		{Name: "a refusal longer than an answer may be",
			Handler: events(slices.Repeat([]string{`{"choices":[{"delta":{"refusal":"` + strings.Repeat("x", 1<<20) + `"}}]}`}, provider.MaxAnswerBytes>>20+1)...),
			Class:   mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT, Message: "streamed refusal longer than 16777216 bytes"},
	})
}

func TestStreamHTTPErrors(t *testing.T) {
	providertest.StreamHTTPErrors(t, adapter, []providertest.StreamHTTPError{
		{Name: "429", Handler: respond(429, `{"error":{"message":"slow down"}}`, "Retry-After", "4"),
			Class: mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, RetryAfter: 4 * time.Second},
		{Name: "529", Handler: respond(529, ``), Class: mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED},
		{Name: "401", Handler: respond(401, `{}`), Class: mantlev1.ErrorClass_ERROR_CLASS_AUTH},
		{Name: "200 JSON error instead of a stream", Handler: respond(200, `{"error":{"message":"stream failed"}}`),
			Class: mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR},
		{Name: "200 JSON that is not an error", Handler: respond(200, `{"choices":[]}`),
			Class: mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT},
		{Name: "connection reset before headers", Handler: providertest.HangUp(true), Class: mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT},
	})
}

func TestStreamStall(t *testing.T)           { providertest.StreamStall(t, adapter) }
func TestStreamStallDeadline(t *testing.T)   { providertest.StreamStallDeadline(t, adapter) }
func TestStreamConnectionReset(t *testing.T) { providertest.StreamConnectionReset(t, adapter) }

// burstBody is a response body that gives its bursts one Read each, the second only once
// released; a Read for it before then is an error, which the stream reports.
type burstBody struct {
	bursts   []string
	released chan struct{}
}

func (b *burstBody) Read(p []byte) (int, error) {
	if len(b.bursts) == 0 {
		return 0, io.EOF
	}
	if len(b.bursts) == 1 {
		select {
		case <-b.released:
		default:
			return 0, errors.New("read of the second burst before it was sent")
		}
	}
	n := copy(p, b.bursts[0])
	b.bursts[0] = b.bursts[0][n:]
	if b.bursts[0] == "" {
		b.bursts = b.bursts[1:]
	}
	return n, nil
}

func (b *burstBody) Close() error { return nil }

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestStreamMore: a chunk says More when the next Recv has another piece without reading
// (the events that arrived with it), and not when the next must wait for the network, nor
// when what follows is the end.
func TestStreamMore(t *testing.T) {
	sse := func(payloads ...string) string {
		var b strings.Builder
		for _, p := range payloads {
			fmt.Fprintf(&b, "data: %s\n\n", p)
		}
		return b.String()
	}
	body := &burstBody{
		bursts:   []string{sse(delta("a"), delta("b"), delta("c")), sse(delta("d"), finish("stop"), usageChunk, "[DONE]")},
		released: make(chan struct{}),
	}
	hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: body, Request: r}, nil
	})}
	s, err := New(testConfig("http://upstream.test", hc)).Stream(context.Background(), testRequest)
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	defer s.Close()
	for i, want := range []provider.Chunk{
		{Content: "a", More: true},
		{Content: "b", More: true},
		{Content: "c", More: false}, // the second burst is not sent yet: the next Recv waits
		{Content: "d", More: false}, // the rest came with it, but only the end follows
		{FinishReason: "stop", Usage: &provider.Usage{InputTokens: 9, OutputTokens: 2}, More: false},
	} {
		if i == 3 {
			close(body.released)
		}
		got, err := s.Recv()
		if err != nil {
			t.Fatalf("Recv %d: %v", i, err)
		}
		if g, w := deref([]provider.Chunk{got})[0], deref([]provider.Chunk{want})[0]; g != w || got.More != want.More {
			t.Errorf("Recv %d = %s More=%t, want %s More=%t", i, g, got.More, w, want.More)
		}
	}
	if _, err := s.Recv(); !errors.Is(err, io.EOF) {
		t.Errorf("after the last chunk: %v, want io.EOF", err)
	}
}
