package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/mantle-mesh/mantle/pkg/openaiapi"
)

// exchange carries out one planned call: it waits, then writes what the plan says a client
// should see. It lives for one request on the request's goroutine.
type exchange struct {
	s    *Server
	w    http.ResponseWriter
	r    *http.Request
	req  *chatRequest
	call call
	id   string
}

func (x *exchange) run() {
	x.setHeaders()
	switch x.call.outcome {
	case OutcomeReset:
		// Rejections and resets are immediate: they happen at the provider's front door,
		// before any generation time is spent.
		abort(x.w, true)
	case OutcomeHang:
		x.hold()
	case OutcomeRateLimited:
		writeJSON(x.w, http.StatusTooManyRequests,
			newError("Rate limit reached for requests. Please try again later.", "requests", "rate_limit_exceeded"))
	case OutcomeRateLimitedNoHint:
		writeJSON(x.w, http.StatusTooManyRequests,
			newError("Rate limit reached for requests.", "requests", "rate_limit_exceeded"))
	case OutcomeServerError:
		writeJSON(x.w, http.StatusInternalServerError,
			newError("The server had an error while processing your request. Sorry about that!", "server_error", ""))
	case OutcomeOverloaded:
		writeJSON(x.w, http.StatusServiceUnavailable,
			newError("The engine is currently overloaded, please try again later.", "server_error", "overloaded"))
	case OutcomeContextLength:
		writeJSON(x.w, http.StatusBadRequest, newError(fmt.Sprintf(
			"This model's maximum context length is %d tokens. However, your messages resulted in %d tokens. Please reduce the length of the messages.",
			x.req.promptTokens()/2, x.req.promptTokens()), "invalid_request_error", "context_length_exceeded"))
	case OutcomeContentFilter:
		writeJSON(x.w, http.StatusBadRequest, newError(
			"Your request was rejected as a result of our safety system.", "invalid_request_error", "content_policy_violation"))
	default:
		if x.req.Stream {
			x.stream()
		} else {
			x.complete()
		}
	}
}

// setHeaders sets what every answer carries: the simulator's own diagnostics and the
// provider-style rate-limit headers. A 429 without a hint must carry no hint at all, so
// neither Retry-After nor the x-ratelimit-* headers (whose reset values are hints too).
func (x *exchange) setHeaders() {
	h := x.w.Header()
	h.Set("x-sim-outcome", string(x.call.outcome))
	if x.call.profile != "" {
		h.Set("x-sim-profile", x.call.profile)
	}
	if x.call.phase != "" {
		h.Set("x-sim-phase", x.call.phase)
	}
	switch x.call.outcome {
	case OutcomeRateLimitedNoHint:
		return
	case OutcomeRateLimited:
		ra := x.call.retryAfter
		h.Set("Retry-After", strconv.Itoa(int(math.Ceil(ra.Seconds()))))
		h.Set("retry-after-ms", strconv.FormatInt(ra.Milliseconds(), 10))
		if !x.call.limits.known {
			return
		}
		l := x.call.limits
		l.remainingRequests, l.reset = 0, max(l.reset, ra)
		setLimitHeaders(h, l)
		return
	}
	if x.call.limits.known {
		setLimitHeaders(h, x.call.limits)
	}
}

func setLimitHeaders(h http.Header, l limitHeaders) {
	reset := l.reset.Round(time.Millisecond).String()
	if l.limitRequests > 0 {
		h.Set("x-ratelimit-limit-requests", strconv.FormatInt(l.limitRequests, 10))
		h.Set("x-ratelimit-remaining-requests", strconv.FormatInt(l.remainingRequests, 10))
		h.Set("x-ratelimit-reset-requests", reset)
	}
	if l.limitTokens > 0 {
		h.Set("x-ratelimit-limit-tokens", strconv.FormatInt(l.limitTokens, 10))
		h.Set("x-ratelimit-remaining-tokens", strconv.FormatInt(l.remainingTokens, 10))
		h.Set("x-ratelimit-reset-tokens", reset)
	}
}

// complete answers a non-streamed request after the sampled latency.
func (x *exchange) complete() {
	if !x.wait(x.call.latency) {
		return
	}
	if x.call.outcome == OutcomeErrorIn200 {
		writeJSON(x.w, http.StatusOK,
			newError("The server had an error processing your request.", "server_error", "internal_error"))
		return
	}
	answer, finish := x.req.content(x.call.outcome)
	body, _ := json.Marshal(openaiapi.ChatCompletion{
		ID:      "chatcmpl-" + x.id,
		Object:  "chat.completion",
		Created: x.call.created,
		Model:   x.req.Model,
		Choices: []openaiapi.Choice{{Message: &openaiapi.Message{Role: "assistant", Content: text(answer)}, FinishReason: &finish}},
		Usage:   openaiapi.NewUsage(int64(x.req.promptTokens()), int64(estimateTokens(answer))),
	})
	h := x.w.Header()
	h.Set("Content-Type", "application/json")
	switch x.call.outcome {
	case OutcomeMalformedJSON:
		if !x.req.jsonMode() {
			// A complete HTTP response whose JSON stops two thirds of the way in, as when
			// a gateway in front of the model gives up mid-body.
			body = body[:len(body)*2/3]
		}
	case OutcomeStreamCut, OutcomeStreamStall:
		// The body is announced in full and then only half of it arrives.
		h.Set("Content-Length", strconv.Itoa(len(body)))
		x.w.WriteHeader(http.StatusOK)
		if !x.send(body[:len(body)/2]) {
			return
		}
		if x.call.outcome == OutcomeStreamCut {
			abort(x.w, false)
			return
		}
		x.hold()
		return
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	x.w.WriteHeader(http.StatusOK)
	_, _ = x.w.Write(body)
}

// stream answers with OpenAI server-sent events: headers at once (the provider accepted the
// request), the first content after the sampled TTFT, one word per chunk after that, then a
// chunk with the finish reason, the usage chunk when asked for, and [DONE].
func (x *exchange) stream() {
	h := x.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	x.w.WriteHeader(http.StatusOK)
	if !x.send(nil) || !x.wait(x.call.ttft) {
		return
	}
	if x.call.outcome == OutcomeErrorIn200 {
		// Providers report failures inside an open stream as an error event; the stream
		// then ends without [DONE].
		x.event(newError("The server had an error processing your request.", "server_error", "internal_error"))
		return
	}

	answer, finish := x.req.content(x.call.outcome)
	parts := pieces(answer)
	stop := len(parts)
	if x.call.outcome == OutcomeStreamCut || x.call.outcome == OutcomeStreamStall {
		stop = max(1, len(parts)/2)
	}
	broken := -1
	if x.call.outcome == OutcomeMalformedJSON && !x.req.jsonMode() {
		broken = len(parts) / 2
	}

	if !x.event(x.chunk(&openaiapi.Message{Role: "assistant"}, nil)) {
		return
	}
	sent := ""
	for i, part := range parts {
		if i == stop {
			break
		}
		if i > 0 && !x.wait(x.call.tokenDelay) {
			return
		}
		if i == broken {
			b, _ := json.Marshal(x.chunk(&openaiapi.Message{Content: text(part)}, nil))
			if !x.send(fmt.Appendf(nil, "data: %s\n\n", b[:len(b)*2/3])) {
				return
			}
		}
		if !x.event(x.chunk(&openaiapi.Message{Content: text(part)}, nil)) {
			return
		}
		sent += part
	}
	switch x.call.outcome {
	case OutcomeStreamCut:
		abort(x.w, false)
		return
	case OutcomeStreamStall:
		x.hold()
		return
	}
	if !x.event(x.chunk(&openaiapi.Message{}, &finish)) {
		return
	}
	if x.req.includeUsage() {
		u := x.chunk(nil, nil)
		u.Choices = []openaiapi.Choice{}
		u.Usage = openaiapi.NewUsage(int64(x.req.promptTokens()), int64(estimateTokens(sent)))
		if !x.event(u) {
			return
		}
	}
	if x.call.outcome == OutcomeStreamNoDone {
		return // the body ends cleanly, without the marker
	}
	x.send([]byte("data: [DONE]\n\n"))
}

func (x *exchange) chunk(delta *openaiapi.Message, finish *string) openaiapi.ChatCompletion {
	c := openaiapi.ChatCompletion{
		ID:      "chatcmpl-" + x.id,
		Object:  "chat.completion.chunk",
		Created: x.call.created,
		Model:   x.req.Model,
	}
	if delta != nil {
		c.Choices = []openaiapi.Choice{{Delta: delta, FinishReason: finish}}
	}
	return c
}

// event writes one SSE data line holding v and reports whether the client still listens.
func (x *exchange) event(v any) bool {
	b, err := json.Marshal(v)
	if err != nil {
		return false
	}
	return x.send(fmt.Appendf(nil, "data: %s\n\n", b))
}

// send writes b and flushes it to the client at once, since timing is what the simulator
// simulates. It reports whether the client still listens.
func (x *exchange) send(b []byte) bool {
	if len(b) > 0 {
		if _, err := x.w.Write(b); err != nil {
			return false
		}
	}
	return http.NewResponseController(x.w).Flush() == nil
}

// wait pauses for d on the server's clock and reports whether the call should go on; it
// returns false as soon as the client goes away.
func (x *exchange) wait(d time.Duration) bool {
	ctx := x.r.Context()
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := x.s.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.Chan():
		return true
	case <-ctx.Done():
		return false
	}
}

// hold sends nothing more: it is the hang fault before any byte was sent and the stall
// fault after part of the answer. It ends when the client goes away or, so that shutdown
// is not held up by calls that would never finish, when the listener drains; then the
// connection is dropped rather than the response completed, since a provider that hangs
// does not end with a tidy empty 200 either.
func (x *exchange) hold() {
	if waitForever(x.r.Context()) {
		abort(x.w, false)
	}
}

// waitForever blocks until ctx is done (false) or the listener drains (true).
func waitForever(ctx context.Context) (drained bool) {
	select {
	case <-ctx.Done():
		return false
	case <-drainSignal(ctx):
		return true
	}
}

// abort drops the client's connection without completing the response, which is how a
// reset or a cut stream looks from the client: no status (if nothing was sent yet) or no
// end of body, and no [DONE]. With rst the close sends a TCP RST ("connection reset by
// peer") instead of a FIN.
func abort(w http.ResponseWriter, rst bool) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// Connections that cannot be hijacked (HTTP/2) are aborted the way net/http
		// provides for exactly this: the server resets the stream and logs nothing.
		panic(http.ErrAbortHandler) //nolint:forbidigo // net/http's way to abort a response
	}
	if tcp, ok := conn.(*net.TCPConn); ok && rst {
		_ = tcp.SetLinger(0)
	}
	_ = conn.Close()
}
