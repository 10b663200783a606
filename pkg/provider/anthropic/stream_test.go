package anthropic

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/pkg/provider/internal/providertest"
)

// sse is one named event.
type sse struct{ name, data string }

// events answers with an event stream of the given events, flushing each.
func events(evs ...sse) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		w.Header().Set("Request-Id", "req_stream")
		for _, ev := range evs {
			io.WriteString(w, eventText(ev))
			w.(http.Flusher).Flush()
		}
	}
}

// eventText is the wire form of evs.
func eventText(evs ...sse) string {
	var b strings.Builder
	for _, ev := range evs {
		fmt.Fprintf(&b, "event: %s\ndata: %s\n\n", ev.name, ev.data)
	}
	return b.String()
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

func toolStart(index int) sse {
	return sse{"content_block_start", fmt.Sprintf(`{"type":"content_block_start","index":%d,"content_block":{"type":"tool_use","id":"toolu_%d","name":"f","input":{}}}`, index, index)}
}

func messageDelta(stopReason string, outputTokens int) sse {
	return sse{"message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":%q,"stop_sequence":null},"usage":{"output_tokens":%d}}`, stopReason, outputTokens)}
}

func errorEvent(typ, message string) sse {
	return sse{"error", apiError(typ, message)}
}

func TestStreamSuccess(t *testing.T) {
	bodies := make(chan map[string]any, 1)
	send := events(messageStart, blockStart, ping, text("Hello"), text(" there"),
		blockStop, messageDelta("end_turn", 15), messageStop)
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		json.NewDecoder(r.Body).Decode(&body)
		providertest.Offer(t, bodies, body)
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
	chunks := providertest.Collect(t, s)
	if len(chunks) != 3 || chunks[0].Content != "Hello" || chunks[1].Content != " there" {
		t.Fatalf("chunks = %+v", chunks)
	}
	final := chunks[2]
	if final.Content != "" || final.FinishReason != "stop" || final.Usage == nil ||
		*final.Usage != (provider.Usage{InputTokens: 30, OutputTokens: 15}) {
		t.Errorf("final chunk = %+v (usage %+v)", final, final.Usage)
	}
	if _, err := s.Recv(); !errors.Is(err, io.EOF) {
		t.Errorf("Recv after the end = %v, want io.EOF", err)
	}
	if body := <-bodies; body["stream"] != true || body["system"] != "be brief\n\nanswer in English" {
		t.Errorf("body = %v", body)
	}
}

func TestStreamOutcomes(t *testing.T) {
	providertest.StreamOutcomes(t, adapter, "req_stream", []providertest.StreamOutcome{
		{Name: "max_tokens is length, not an error",
			Handler: events(messageStart, text("cut"), messageDelta("max_tokens", 3), messageStop),
			Content: "cut", Finish: "length"},
		{Name: "stop reason then end of body without message_stop is a clean end",
			Handler: events(messageStart, text("ok"), messageDelta("stop_sequence", 1)),
			Content: "ok", Finish: "stop"},
		{Name: "unnamed events are recognised by their type",
			Handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, "data: "+text("x").data+"\n\ndata: "+messageDelta("end_turn", 1).data+"\n\ndata: "+messageStop.data+"\n\n")
			},
			Content: "x", Finish: "stop"},
		{Name: "cut before message_stop",
			Handler: providertest.Abort(events(messageStart, text("Hel"))),
			Content: "Hel", Class: mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED},
		{Name: "clean close before message_stop",
			Handler: events(messageStart, text("Hel")),
			Content: "Hel", Class: mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED},
		{Name: "overloaded_error mid-stream",
			Handler: events(messageStart, text("Hel"), errorEvent("overloaded_error", "Overloaded")),
			Content: "Hel", Class: mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, Message: "Overloaded"},
		{Name: "rate_limit_error mid-stream",
			Handler: events(messageStart, errorEvent("rate_limit_error", "rate limited")),
			Class:   mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, Message: "rate limited"},
		{Name: "api_error mid-stream",
			Handler: events(messageStart, errorEvent("api_error", "Internal server error")),
			Class:   mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT, Message: "Internal server error"},
		{Name: "prompt too long mid-stream",
			Handler: events(errorEvent("invalid_request_error", "prompt is too long: 300000 tokens > 200000 maximum")),
			Class:   mantlev1.ErrorClass_ERROR_CLASS_CONTEXT_LENGTH_EXCEEDED, Message: "prompt is too long"},
		{Name: "unknown error type mid-stream",
			Handler: events(messageStart, errorEvent("novel_error", "something new")),
			Class:   mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR, Message: "something new"},
		{Name: "error event that is not JSON",
			Handler: events(sse{"error", "upstream exploded"}),
			Class:   mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR, Message: "upstream exploded"},
		{Name: "unparseable data line",
			Handler: events(messageStart, text("a"), sse{"content_block_delta", `{"type":"content_block_delta","delta":`}),
			Content: "a", Class: mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT},
		{Name: "input_json_delta without its tool_use block",
			Handler: events(messageStart, text("a"), sse{"content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{"}}`}),
			Content: "a", Class: mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT, Message: "not a tool_use block"},
		{Name: "a tool_use block started twice",
			Handler: events(messageStart, toolStart(1), toolStart(1)),
			Class:   mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT, Message: "started twice"},
		{Name: "refusal",
			Handler: events(messageStart, text("I"), messageDelta("refusal", 1), messageStop),
			Content: "I", Class: mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED, Message: "refusal"},
	})
}

func TestStreamHTTPErrors(t *testing.T) {
	providertest.StreamHTTPErrors(t, adapter, []providertest.StreamHTTPError{
		{Name: "429", Handler: respond(429, apiError("rate_limit_error", "slow down"), "Retry-After", "4"),
			Class: mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, RetryAfter: 4 * time.Second},
		{Name: "529", Handler: respond(529, apiError("overloaded_error", "Overloaded")), Class: mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED},
		{Name: "401", Handler: respond(401, apiError("authentication_error", "bad key")), Class: mantlev1.ErrorClass_ERROR_CLASS_AUTH},
		{Name: "200 JSON error instead of a stream", Handler: respond(200, apiError("api_error", "oops")),
			Class: mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR},
		{Name: "connection reset before headers", Handler: providertest.HangUp(true), Class: mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT},
	})
}

func TestStreamStall(t *testing.T)           { providertest.StreamStall(t, adapter) }
func TestStreamStallDeadline(t *testing.T)   { providertest.StreamStallDeadline(t, adapter) }
func TestStreamConnectionReset(t *testing.T) { providertest.StreamConnectionReset(t, adapter) }
