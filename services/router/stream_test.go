package router

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
)

// recorder is a Sink that keeps the deltas and announces each one on got.
type recorder struct {
	got    chan Delta
	mu     sync.Mutex
	deltas []Delta
}

func newRecorder() *recorder { return &recorder{got: make(chan Delta, 64)} }

func (r *recorder) sink(d Delta) error {
	r.mu.Lock()
	r.deltas = append(r.deltas, d)
	r.mu.Unlock()
	r.got <- d
	return nil
}

func (r *recorder) text() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, d := range r.deltas {
		b.WriteString(d.Content)
	}
	return b.String()
}

func (r *recorder) models() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, d := range r.deltas {
		out = append(out, d.Model)
	}
	return out
}

// startStream runs Stream in the background.
func (h *harness) startStream(req *routerv1.Request, rec *recorder) <-chan done {
	ch := make(chan done, 1)
	go func() {
		resp, err := h.router.Stream(context.Background(), req, rec.sink)
		ch <- done{resp, err}
	}()
	return ch
}

// streamLimits sets route chat's first-token limit to 2 s and its stall limit to 3 s, and
// gives it a template, so that a test can see the ladder is not used after a partial answer.
func streamLimits(c *Config) {
	c.Routes[0].FirstTokenTimeout = 2 * time.Second
	c.Routes[0].StallTimeout = 3 * time.Second
	c.Routes[0].Ladder.Template = "later"
}

func streamOf(parts ...string) result {
	var steps []chunk
	for _, p := range parts {
		steps = append(steps, chunk{content: p})
	}
	steps = append(steps, chunk{finish: "stop", usage: &provider.Usage{InputTokens: 5, OutputTokens: int64(len(parts))}})
	return result{stream: steps}
}

func TestStreamWatchdog(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		a    result
		// afterFirst: the test waits for the first delta before advancing (stall cases).
		afterFirst bool
		advance    time.Duration
		wantCode   codes.Code
		wantText   string
		wantModels []string
		attempts   []string
		callsB     int
	}{
		{
			name:     "no first token in time: cancelled, the next candidate streams the whole answer",
			a:        result{stream: []chunk{{hang: true}}},
			advance:  2 * time.Second,
			wantText: "Hello from b", wantModels: []string{"b", "b", "b"},
			attempts: []string{"a:timeout", "b:none"}, callsB: 1,
		},
		{
			name:     "no response headers in time: the same",
			a:        hang(),
			advance:  2 * time.Second,
			wantText: "Hello from b", wantModels: []string{"b", "b", "b"},
			attempts: []string{"a:timeout", "b:none"}, callsB: 1,
		},
		{
			name:       "stall after the first token: cancelled, and b's restart finishes it (never a stop after a cut)",
			a:          result{stream: []chunk{{content: "Hel"}, {hang: true}}},
			afterFirst: true,
			advance:    3 * time.Second,
			wantText:   "Hello from b", wantModels: []string{"a", "b", "b", "b"},
			attempts: []string{"a:timeout", "b:none"}, callsB: 1,
		},
		{
			name:       "cut after the first token: b's restart finishes it",
			a:          result{stream: []chunk{{content: "Hel"}, {err: &provider.Error{Class: mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED, Message: "stream ended before [DONE]"}}}},
			afterFirst: true,
			wantText:   "Hello from b", wantModels: []string{"a", "b", "b", "b"},
			attempts: []string{"a:truncated", "b:none"}, callsB: 1,
		},
		{
			name:     "failure before the first token fails over",
			a:        failure(classOverloaded, "busy"),
			wantText: "Hello from b", wantModels: []string{"b", "b", "b"},
			attempts: []string{"a:overloaded", "b:none"}, callsB: 1,
		},
		{
			name:     "a healthy stream within its limits",
			a:        streamOf("Hello ", "from ", "a"),
			wantText: "Hello from a", wantModels: []string{"a", "a", "a"},
			attempts: []string{"a:none"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig()
			streamLimits(&cfg)
			h := newHarness(t, cfg, &harness{providers: map[string]*fakeProvider{
				"a": newFakeProvider(tt.a),
				"b": newFakeProvider(streamOf("Hello ", "from ", "b")),
			}})
			rec := newRecorder()
			ch := h.startStream(ask("chat"), rec)
			if tt.afterFirst {
				<-rec.got // the watchdog now guards the gap to the next chunk
			}
			if tt.advance > 0 {
				if !tt.afterFirst {
					h.blockUntil(t, 1) // the first-token watchdog
				}
				h.clock.Advance(tt.advance - time.Millisecond)
				select {
				case d := <-ch:
					t.Fatalf("the stream ended before its limit: %v %v", d.resp, d.err)
				default:
				}
				h.clock.Advance(time.Millisecond)
			}
			d := await(t, ch)

			if got := status.Code(toStatus(d.err)); got != tt.wantCode {
				t.Fatalf("code = %v (%v), want %v", got, d.err, tt.wantCode)
			}
			if rec.text() != tt.wantText {
				t.Errorf("the caller received %q, want %q", rec.text(), tt.wantText)
			}
			if diff := cmp.Diff(tt.wantModels, rec.models()); diff != "" {
				t.Errorf("delta models (-want +got):\n%s", diff)
			}
			var qc *mantlev1.QualityContext
			if d.err == nil {
				qc = d.resp.Quality
				if d.resp.FinishReason != "stop" || d.resp.Message.Content != tt.wantText {
					t.Errorf("final %q finish %q, want the whole answer with stop", d.resp.Message.Content, d.resp.FinishReason)
				}
			} else {
				qc = FailedQuality(d.err)
				if d.resp != nil {
					t.Errorf("a cut stream returned a final message %v; it must be an error", d.resp)
				}
			}
			if diff := cmp.Diff(tt.attempts, attemptsOf(qc)); diff != "" {
				t.Errorf("attempts (-want +got):\n%s", diff)
			}
			if n := h.calls("b"); n != tt.callsB {
				t.Errorf("b called %d times, want %d", n, tt.callsB)
			}
		})
	}
}

// TestStreamStallCountsFromLatestPiece: the stall limit runs from the latest piece, not
// from the first: pieces 2 s apart under a 3 s limit finish the answer although the third
// arrives 4 s after the first.
func TestStreamStallCountsFromLatestPiece(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	streamLimits(&cfg)
	second, third := make(chan struct{}), make(chan struct{})
	a := result{stream: []chunk{
		{content: "Hel"},
		{content: "lo", gate: second},
		{content: "!", gate: third},
		{finish: "stop", usage: &provider.Usage{InputTokens: 5, OutputTokens: 3}},
	}}
	// The fallbacks fail at once: a stream the watchdog cut would end in an error.
	h := newHarness(t, cfg, &harness{providers: map[string]*fakeProvider{
		"a": newFakeProvider(a),
		"b": newFakeProvider(failure(classOverloaded, "busy")),
		"c": newFakeProvider(failure(classOverloaded, "busy")),
	}})
	rec := newRecorder()
	ch := h.startStream(ask("chat"), rec)
	next := func() {
		t.Helper()
		select {
		case <-rec.got:
		case d := <-ch:
			t.Fatalf("the stream ended early: %v %v", d.resp, d.err)
		case <-time.After(10 * time.Second): // turns a hang (a bug) into a failure
			t.Fatal("no piece arrived")
		}
	}
	next()
	h.clock.Advance(2 * time.Second)
	close(second)
	next()
	h.clock.Advance(2 * time.Second) // 4 s after the first piece, 2 s after the latest
	// The watchdog re-armed at the second piece is the one waiter; one that fired at the
	// first piece's limit has cancelled the stream instead.
	armed := make(chan error, 1)
	go func() { armed <- h.clock.BlockUntilContext(t.Context(), 1) }()
	select {
	case err := <-armed:
		if err != nil {
			t.Fatal(err)
		}
	case d := <-ch:
		t.Fatalf("the stream was cut at the first piece's stall limit: %v %v", d.resp, d.err)
	}
	close(third)
	d := await(t, ch)
	if d.err != nil {
		t.Fatalf("stream failed: %v", d.err)
	}
	if rec.text() != "Hello!" || d.resp.Message.GetContent() != "Hello!" {
		t.Errorf("the caller received %q (final %q), want %q", rec.text(), d.resp.Message.GetContent(), "Hello!")
	}
	if diff := cmp.Diff([]string{"a:none"}, attemptsOf(d.resp.Quality)); diff != "" {
		t.Errorf("attempts (-want +got):\n%s", diff)
	}
}

// TestStreamContinuation: a stream that breaks after part of the answer reached the caller is
// finished by a fallback that accepts a prefill (it gets the partial answer and only the rest
// is streamed) or, failing that, by one that restarts the answer: what repeats the caller's
// text is held back and only what extends it is streamed. Either way the caller receives one
// complete answer, never repeated text. When nothing can finish it, or every restart says
// something else, the caller gets an error, never a stop.
func TestStreamContinuation(t *testing.T) {
	t.Parallel()
	truncated := &provider.Error{Class: mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED, Message: "stream ended before [DONE]"}
	cutAfterHello := result{stream: []chunk{{content: "Hello "}, {err: truncated}}}
	tests := []struct {
		name     string
		prefill  []int // indexes of the models that accept a prefill
		a, b, c  result
		stall    bool // a stalls after its first chunk: the test drives the watchdog
		wantCode codes.Code
		wantText string
		wantErr  string // in the error's message
		model    string
		reason   string // in the degradation reason
		attempts []string
		prefills map[string]string // the Prefill each model was sent
	}{
		{
			name:     "cut mid-answer: the prefill-capable fallback finishes it",
			prefill:  []int{1},
			a:        cutAfterHello,
			b:        streamOf("from ", "b"),
			wantText: "Hello from b", model: "b", reason: "b finished it",
			attempts: []string{"a:truncated", "b:none"},
			prefills: map[string]string{"a": "", "b": "Hello "},
		},
		{
			name:     "stalled mid-answer: cancelled, and a fallback that accepts a prefill goes before one that restarts",
			prefill:  []int{2},
			a:        result{stream: []chunk{{content: "Hello "}, {hang: true}}},
			c:        streamOf("from ", "c"),
			stall:    true,
			wantText: "Hello from c", model: "c", reason: "c finished it",
			attempts: []string{"a:timeout", "c:none"},
			prefills: map[string]string{"a": "", "c": "Hello "},
		},
		{
			name:     "no fallback accepts a prefill: b restarts, and only what extends the caller's text is streamed",
			a:        cutAfterHello,
			b:        streamOf("Hel", "lo", " from", " b"),
			wantText: "Hello from b", model: "b", reason: "b restarted and finished it",
			attempts: []string{"a:truncated", "b:none"},
			prefills: map[string]string{"a": "", "b": ""},
		},
		{
			name:     "a restart spaced differently still splices, without doubling the space",
			a:        result{stream: []chunk{{content: "Hello,\n"}, {content: "world "}, {err: truncated}}},
			b:        streamOf("Hello, ", " world   and", " more"),
			wantText: "Hello,\nworld and more", model: "b", reason: "restarted",
			attempts: []string{"a:truncated", "b:none"},
			prefills: map[string]string{"a": "", "b": ""},
		},
		{
			name:     "a restart that diverges is cut off, and the next one splices",
			a:        cutAfterHello,
			b:        streamOf("Hi", " there"),
			c:        streamOf("Hello", " from c"),
			wantText: "Hello from c", model: "c", reason: "c restarted",
			attempts: []string{"a:truncated", "b:truncated", "c:none"},
			prefills: map[string]string{"a": "", "b": "", "c": ""},
		},
		{
			name:     "every restart diverges or ends early: a clear error, nothing repeated",
			a:        cutAfterHello,
			b:        streamOf("Goodbye"),
			c:        streamOf("Hel"),
			wantCode: codes.Unavailable, wantText: "Hello ", wantErr: "diverged",
			attempts: []string{"a:truncated", "b:truncated", "c:truncated"},
			prefills: map[string]string{"a": "", "b": "", "c": ""},
		},
		{
			name:     "a restart answering with a tool call instead of the text diverges",
			a:        cutAfterHello,
			b:        result{stream: []chunk{{tools: []provider.ToolCallDelta{{Index: 0, ID: "call_1", Name: "f"}}}, {finish: "tool_calls"}}},
			c:        streamOf("Goodbye"),
			wantCode: codes.Unavailable, wantText: "Hello ", wantErr: "diverged",
			attempts: []string{"a:truncated", "b:truncated", "c:truncated"},
			prefills: map[string]string{"a": "", "b": "", "c": ""},
		},
		{
			name:     "a cut answer with tool calls is not restarted",
			a:        result{stream: []chunk{{content: "Hello "}, {tools: []provider.ToolCallDelta{{Index: 0, ID: "call_1", Name: "f"}}}, {err: truncated}}},
			b:        streamOf("Hello ", "from b"),
			wantCode: codes.Unavailable, wantText: "Hello ",
			attempts: []string{"a:truncated"},
			prefills: map[string]string{"a": ""},
		},
		{
			name:     "the continuation breaks too, and the restart diverges: an error",
			prefill:  []int{1},
			a:        cutAfterHello,
			b:        result{stream: []chunk{{content: "from "}, {err: truncated}}},
			c:        streamOf("Goodbye"),
			wantCode: codes.Unavailable, wantText: "Hello from ", wantErr: "diverged",
			attempts: []string{"a:truncated", "b:truncated", "c:truncated"},
			prefills: map[string]string{"a": "", "b": "Hello ", "c": ""},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig()
			streamLimits(&cfg)
			for _, i := range tt.prefill {
				cfg.Models[i].AcceptsPrefill = true
			}
			providers := map[string]*fakeProvider{"a": newFakeProvider(tt.a)}
			if tt.b.stream != nil {
				providers["b"] = newFakeProvider(tt.b)
			}
			if tt.c.stream != nil {
				providers["c"] = newFakeProvider(tt.c)
			}
			h := newHarness(t, cfg, &harness{providers: providers})
			rec := newRecorder()
			ch := h.startStream(ask("chat"), rec)
			if tt.stall {
				<-rec.got
				h.clock.Advance(3 * time.Second)
			}
			d := await(t, ch)

			if got := status.Code(toStatus(d.err)); got != tt.wantCode {
				t.Fatalf("code = %v (%v), want %v", got, d.err, tt.wantCode)
			}
			if rec.text() != tt.wantText {
				t.Errorf("the caller received %q, want %q", rec.text(), tt.wantText)
			}
			qc := FailedQuality(d.err)
			if d.err == nil {
				qc = d.resp.Quality
				if d.resp.Model != tt.model || d.resp.Message.Content != tt.wantText || d.resp.FinishReason != "stop" {
					t.Errorf("final: %s %q %q, want %s, the whole answer and stop", d.resp.Model, d.resp.Message.Content, d.resp.FinishReason, tt.model)
				}
				if !strings.Contains(qc.DegradationReason, "broke mid-answer") || !strings.Contains(qc.DegradationReason, tt.reason) {
					t.Errorf("degradation reason = %q, want the continuation explained (%q)", qc.DegradationReason, tt.reason)
				}
			} else if d.resp != nil {
				t.Errorf("a broken stream returned a final message %v", d.resp)
			} else if !strings.Contains(d.err.Error(), tt.wantErr) {
				t.Errorf("error %q does not say %q", d.err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.attempts, attemptsOf(qc)); diff != "" {
				t.Errorf("attempts (-want +got):\n%s", diff)
			}
			got := map[string]string{}
			for name, p := range h.providers {
				for _, req := range p.requests() {
					got[name] = req.Prefill
				}
			}
			if diff := cmp.Diff(tt.prefills, got); diff != "" {
				t.Errorf("prefill sent per model (-want +got):\n%s", diff)
			}
		})
	}
}

// TestStreamLimitsLeaveRoomToRescue: first-token and stall limits that would take the whole
// budget are clamped (with a warning naming the route) to leave stream_rescue_share of it
// for a fallback, so a stall just under the budget ends in a rescue, not an error.
func TestStreamLimitsLeaveRoomToRescue(t *testing.T) {
	t.Parallel()
	// 100 s budgets keep the clamp (about 70 s) far from the checks at 60 s and 71 s: the
	// ceiling also counts the few real milliseconds the test takes.
	const budget = 100 * time.Second
	tests := []struct {
		name        string
		share       float64
		firstToken  bool // a never sends a first token (else it stalls after one)
		quietUntil  time.Duration
		cutBy       time.Duration
		wantWarning string
		wantError   bool // nothing is left for b: the caller gets an error
		// callerBudget is a shorter deadline of the caller's; the route's budget and limits
		// are then ten times longer, so only the attempt's own ceiling can cut in time.
		callerBudget time.Duration
	}{
		{name: "a stall limit equal to the budget is clamped: the stall is cut in time for b to restart", share: 0.3,
			quietUntil: 60 * time.Second, cutBy: 71 * time.Second, wantWarning: "stall_timeout"},
		{name: "a first-token limit equal to the budget is clamped: b streams the whole answer in time", share: 0.3, firstToken: true,
			quietUntil: 60 * time.Second, cutBy: 71 * time.Second, wantWarning: "first_token_timeout"},
		{name: "share 0 keeps the configured stall limit, which leaves nothing for b: an error", share: 0,
			quietUntil: 99 * time.Second, cutBy: 100 * time.Second, wantError: true},
		{name: "a caller's shorter budget: the attempt's limits leave the share of it", share: 0.3, callerBudget: budget,
			quietUntil: 60 * time.Second, cutBy: 71 * time.Second, wantWarning: "stall_timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig()
			cfg.Providers[0].Timeout = 2 * budget // the per-try timeout must not be what cuts it
			cfg.StreamRescueShare = tt.share
			routeBudget := budget
			if tt.callerBudget > 0 {
				routeBudget = 10 * budget
				cfg.Providers[0].Timeout = 2 * routeBudget
			}
			cfg.Routes[0].Budget = routeBudget
			cfg.Routes[0].FirstTokenTimeout, cfg.Routes[0].StallTimeout = routeBudget, routeBudget
			a := result{stream: []chunk{{content: "Hel"}, {hang: true}}}
			if tt.firstToken {
				a = result{stream: []chunk{{hang: true}}}
			}
			var logged bytes.Buffer
			h := newHarness(t, cfg, &harness{log: slog.NewTextHandler(&logged, nil), providers: map[string]*fakeProvider{
				"a": newFakeProvider(a),
				"b": newFakeProvider(streamOf("Hello ", "from ", "b")),
			}})
			if tt.wantWarning != "" && (!strings.Contains(logged.String(), "clamped") || !strings.Contains(logged.String(), "limit="+tt.wantWarning) || !strings.Contains(logged.String(), "route=chat")) {
				t.Errorf("no warning naming route chat and %s:\n%s", tt.wantWarning, logged.String())
			}
			if tt.wantWarning == "" && strings.Contains(logged.String(), "clamped") {
				t.Errorf("share 0 clamped a limit:\n%s", logged.String())
			}
			rec := newRecorder()
			ctx := context.Background()
			if tt.callerBudget > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.callerBudget)
				defer cancel()
			}
			ch := make(chan done, 1)
			go func() {
				resp, err := h.router.Stream(ctx, ask("chat"), rec.sink)
				ch <- done{resp, err}
			}()
			if tt.firstToken {
				h.blockUntil(t, 1)
			} else {
				<-rec.got
			}
			h.clock.Advance(tt.quietUntil)
			select {
			case d := <-ch:
				t.Fatalf("the stream was cut before %s: %v %v", tt.quietUntil, d.resp, d.err)
			default:
			}
			h.clock.Advance(tt.cutBy - tt.quietUntil)
			d := await(t, ch)
			if tt.wantError {
				if d.err == nil || rec.text() != "Hel" || h.calls("b") != 0 {
					t.Fatalf("the caller received %q (%v), b called %d times; want an error after a's part", rec.text(), d.err, h.calls("b"))
				}
				return
			}
			if d.err != nil || rec.text() != "Hello from b" {
				t.Fatalf("the caller received %q (%v), want b's rescue", rec.text(), d.err)
			}
		})
	}
}

// TestStreamAssemblesToolCalls: a streamed tool call's arguments, in many small pieces,
// reach the final message whole; a stream that begins more than
// provider.MaxStreamedToolCalls calls, or whose text passes provider.MaxAnswerBytes, fails
// as malformed output instead of growing without bound (tool calls before the caller has
// any of them: they are held until whole).
func TestStreamAssemblesToolCalls(t *testing.T) {
	t.Parallel()
	args := `{"rows":[` + strings.Repeat(`"a row",`, 2000) + `"end"]}`
	long := []chunk{{tools: []provider.ToolCallDelta{{Index: 0, ID: "call_1", Type: "function", Name: "write_"}}}, {tools: []provider.ToolCallDelta{{Index: 0, Name: "file"}}}}
	for i := 0; i < len(args); i += 7 {
		long = append(long, chunk{tools: []provider.ToolCallDelta{{Index: 0, Arguments: args[i:min(i+7, len(args))]}}})
	}
	long = append(long, chunk{finish: "tool_calls"})
	var many []chunk
	for i := range provider.MaxStreamedToolCalls + 1 {
		many = append(many, chunk{tools: []provider.ToolCallDelta{{Index: i, ID: fmt.Sprint("call_", i), Type: "function", Name: "f", Arguments: "{}"}}})
	}
	many = append(many, chunk{finish: "tool_calls"})

	run := func(t *testing.T, stream []chunk) (resp *routerv1.CompleteResponse, pieces []provider.ToolCallDelta, text int, err error) {
		cfg := testConfig()
		cfg.Routes = []RouteConfig{{Name: "chat", Candidates: []string{"a"}}} // no fallback
		h := newHarness(t, cfg, &harness{providers: map[string]*fakeProvider{"a": newFakeProvider(result{stream: stream})}})
		resp, err = h.router.Stream(context.Background(), ask("chat"), func(d Delta) error {
			pieces = append(pieces, d.ToolCalls...)
			text += len(d.Content)
			return nil
		})
		return resp, pieces, text, err
	}
	t.Run("long arguments in small pieces", func(t *testing.T) {
		t.Parallel()
		resp, pieces, _, err := run(t, long)
		if err != nil {
			t.Fatalf("Stream: %v", err)
		}
		// Held until whole, the call reaches the caller in one piece, not 2290.
		want := []provider.ToolCallDelta{{Index: 0, ID: "call_1", Type: "function", Name: "write_file", Arguments: args}}
		if diff := cmp.Diff(want, pieces); diff != "" {
			t.Errorf("the caller's tool call pieces (-want +got):\n%s", diff)
		}
		calls := resp.GetMessage().GetToolCalls()
		if len(calls) != 1 || calls[0].GetName() != "write_file" || calls[0].GetId() != "call_1" || calls[0].GetArguments() != args {
			t.Fatalf("final tool calls: %d, the first %q %q with %d bytes of arguments, want write_file with %d", len(calls), calls[0].GetId(), calls[0].GetName(), len(calls[0].GetArguments()), len(args))
		}
	})
	t.Run("more calls than the bound", func(t *testing.T) {
		t.Parallel()
		resp, pieces, _, err := run(t, many)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("more than %d tool calls", provider.MaxStreamedToolCalls)) {
			t.Fatalf("Stream: %v (final %v), want the bound named", err, resp != nil)
		}
		if len(pieces) != 0 {
			t.Errorf("the caller got %d tool call pieces of the failed answer, want none", len(pieces))
		}
	})
	t.Run("text after held calls", func(t *testing.T) {
		t.Parallel()
		stream := []chunk{
			{tools: []provider.ToolCallDelta{{Index: 0, ID: "call_1", Type: "function", Name: "f", Arguments: `{"a":`}}},
			{tools: []provider.ToolCallDelta{{Index: 1, ID: "call_2", Type: "function", Name: "g", Arguments: `{}`}}},
			{content: "done", tools: []provider.ToolCallDelta{{Index: 0, Arguments: `1}`}}},
			{tools: []provider.ToolCallDelta{{Index: 2, ID: "call_3", Type: "function", Name: "h", Arguments: `{}`}}},
			{finish: "tool_calls"},
		}
		resp, pieces, text, err := run(t, stream)
		if err != nil {
			t.Fatalf("Stream: %v", err)
		}
		// What was held goes out joined when the text comes, with the piece that came with
		// the text (once, not again beside it); what follows, as it comes.
		want := []provider.ToolCallDelta{
			{Index: 0, ID: "call_1", Type: "function", Name: "f", Arguments: `{"a":1}`},
			{Index: 1, ID: "call_2", Type: "function", Name: "g", Arguments: `{}`},
			{Index: 2, ID: "call_3", Type: "function", Name: "h", Arguments: `{}`},
		}
		if diff := cmp.Diff(want, pieces); diff != "" || text != len("done") {
			t.Errorf("the caller's tool call pieces (-want +got):\n%s\ntext %d bytes", diff, text)
		}
		if calls := resp.GetMessage().GetToolCalls(); len(calls) != 3 || calls[0].GetArguments() != `{"a":1}` {
			t.Errorf("final tool calls %v", calls)
		}
	})
	t.Run("an answer longer than the bound", func(t *testing.T) {
		t.Parallel()
		mib := strings.Repeat("x", 1<<20)
		var huge []chunk
		for range provider.MaxAnswerBytes>>20 + 1 {
			huge = append(huge, chunk{content: mib})
		}
		huge = append(huge, chunk{finish: "stop"})
		_, _, text, err := run(t, huge)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("streamed answer longer than %d bytes", provider.MaxAnswerBytes)) {
			t.Fatalf("Stream: %v, want the bound named", err)
		}
		if text != provider.MaxAnswerBytes {
			t.Errorf("the caller got %d bytes of text, want the %d within the bound", text, provider.MaxAnswerBytes)
		}
	})
}
