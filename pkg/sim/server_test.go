package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/mantle-mesh/mantle/pkg/openaiapi"
)

// harness serves a Server over real HTTP with a fake clock and reports, through channels,
// when a call's outcome is decided and when a handler returns.
type harness struct {
	t       *testing.T
	srv     *Server
	ts      *httptest.Server
	clock   *clockwork.FakeClock
	planned chan Outcome
	exited  chan struct{}
}

func newHarness(t *testing.T, cfg ServerConfig) *harness {
	t.Helper()
	h := &harness{
		t:       t,
		clock:   clockwork.NewFakeClock(),
		planned: make(chan Outcome, 1024),
		exited:  make(chan struct{}, 1024),
	}
	cfg.Clock = h.clock
	h.srv = NewServer(cfg)
	h.srv.onPlan = func(_ string, o Outcome) { signal(h.planned, o) }
	h.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer signal(h.exited, struct{}{})
		h.srv.ServeHTTP(w, r)
	}))
	t.Cleanup(h.ts.Close)
	return h
}

// signal sends v without blocking; tests that care read every value, the others may drop.
func signal[T any](ch chan T, v T) {
	select {
	case ch <- v:
	default:
	}
}

// testCtx bounds a test that waits for the server, so a bug fails it instead of hanging.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func receive[T any](ctx context.Context, t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-ctx.Done():
		t.Fatalf("timed out waiting for %s", what)
		var zero T
		return zero
	}
}

type chatParams struct {
	model        string
	prompt       string
	stream       bool
	includeUsage bool
	jsonMode     bool
	maxTokens    int
	idemKey      string
	prefill      string // a trailing assistant message to continue
}

func (p chatParams) body() []byte {
	req := map[string]any{
		"model":    cmpOr(p.model, "sim-model"),
		"messages": []map[string]any{{"role": "system", "content": "be brief"}, {"role": "user", "content": cmpOr(p.prompt, "hello world")}},
	}
	if p.prefill != "" {
		req["messages"] = append(req["messages"].([]map[string]any), map[string]any{"role": "assistant", "content": p.prefill, "prefix": true})
	}
	if p.stream {
		req["stream"] = true
	}
	if p.includeUsage {
		req["stream_options"] = map[string]any{"include_usage": true}
	}
	if p.jsonMode {
		req["response_format"] = map[string]any{"type": "json_object"}
	}
	if p.maxTokens > 0 {
		req["max_tokens"] = p.maxTokens
	}
	b, _ := json.Marshal(req)
	return b
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func (h *harness) post(ctx context.Context, p chatParams) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.ts.URL+"/v1/chat/completions", bytes.NewReader(p.body()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if p.idemKey != "" {
		req.Header.Set("Idempotency-Key", p.idemKey)
	}
	return h.ts.Client().Do(req)
}

// call posts p and reads the whole answer.
func (h *harness) call(ctx context.Context, p chatParams) (*http.Response, []byte, error) {
	resp, err := h.post(ctx, p)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, body, err
}

func only(o Outcome) ErrorMix {
	var m ErrorMix
	switch o {
	case OutcomeRateLimited:
		m.RateLimited = 1
	case OutcomeRateLimitedNoHint:
		m.RateLimitedNoHint = 1
	case OutcomeServerError:
		m.ServerError = 1
	case OutcomeOverloaded:
		m.Overloaded = 1
	case OutcomeReset:
		m.Reset = 1
	case OutcomeHang:
		m.Hang = 1
	case OutcomeErrorIn200:
		m.ErrorIn200 = 1
	case OutcomeMalformedJSON:
		m.MalformedJSON = 1
	case OutcomeRefusal:
		m.Refusal = 1
	case OutcomeTruncated:
		m.Truncated = 1
	case OutcomeStreamCut:
		m.StreamCut = 1
	case OutcomeStreamStall:
		m.StreamStall = 1
	case OutcomeContextLength:
		m.ContextLengthExceeded = 1
	case OutcomeContentFilter:
		m.ContentFilter = 1
	case OutcomeContentFilterFinish:
		m.ContentFilterFinish = 1
	case OutcomeStreamNoDone:
		m.StreamNoDone = 1
	}
	return m
}

// instant is a profile with no waits, so outcome tests need no clock advances.
func instant(o Outcome) Profile {
	return Profile{
		Name:       "test",
		Errors:     only(o),
		RetryAfter: 3 * time.Second,
		RateLimit:  RateLimit{RequestsPerMinute: 100, TokensPerMinute: 100_000},
	}
}

type messageView struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type completionView struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Choices []struct {
		Message      messageView `json:"message"`
		Delta        messageView `json:"delta"`
		FinishReason *string     `json:"finish_reason"`
	} `json:"choices"`
	Usage *openaiapi.Usage `json:"usage"`
	Error *apiError        `json:"error"`
}

func decodeCompletion(t *testing.T, body []byte) completionView {
	t.Helper()
	var v completionView
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("body is not JSON: %v\n%s", err, body)
	}
	return v
}

const wantAnswer = "sim answer to: hello world"

func TestNonStreamOutcomes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		outcome         Outcome
		wantStatus      int
		wantRetryAfter  string // "" means the header must be absent
		wantLimitHeader bool
		check           func(t *testing.T, body []byte)
	}{
		{OutcomeOK, 200, "", true, func(t *testing.T, body []byte) {
			v := decodeCompletion(t, body)
			if v.Object != "chat.completion" || len(v.Choices) != 1 || v.Choices[0].Message.Content != wantAnswer ||
				*v.Choices[0].FinishReason != "stop" || v.Choices[0].Message.Role != "assistant" {
				t.Errorf("completion = %+v, want %q with finish_reason stop", v, wantAnswer)
			}
			if v.Usage == nil || v.Usage.PromptTokens == 0 || v.Usage.CompletionTokens != int64(estimateTokens(wantAnswer)) ||
				v.Usage.TotalTokens != v.Usage.PromptTokens+v.Usage.CompletionTokens {
				t.Errorf("usage = %+v", v.Usage)
			}
		}},
		{OutcomeRateLimited, 429, "3", true, func(t *testing.T, body []byte) {
			if v := decodeCompletion(t, body); v.Error == nil || *v.Error.Code != "rate_limit_exceeded" {
				t.Errorf("body = %s, want a rate_limit_exceeded error", body)
			}
		}},
		{OutcomeRateLimitedNoHint, 429, "", false, nil},
		{OutcomeServerError, 500, "", true, func(t *testing.T, body []byte) {
			if v := decodeCompletion(t, body); v.Error == nil || v.Error.Type != "server_error" {
				t.Errorf("body = %s, want a server_error", body)
			}
		}},
		{OutcomeOverloaded, 503, "", true, nil},
		{OutcomeErrorIn200, 200, "", true, func(t *testing.T, body []byte) {
			if v := decodeCompletion(t, body); v.Error == nil || len(v.Choices) != 0 {
				t.Errorf("body = %s, want an error object and no choices", body)
			}
		}},
		{OutcomeMalformedJSON, 200, "", true, func(t *testing.T, body []byte) {
			if json.Valid(body) {
				t.Errorf("body = %s, want broken JSON", body)
			}
		}},
		{OutcomeRefusal, 200, "", true, func(t *testing.T, body []byte) {
			if v := decodeCompletion(t, body); v.Choices[0].Message.Content != refusalText {
				t.Errorf("content = %q, want the refusal", v.Choices[0].Message.Content)
			}
		}},
		{OutcomeTruncated, 200, "", true, func(t *testing.T, body []byte) {
			v := decodeCompletion(t, body)
			c := v.Choices[0].Message.Content
			if *v.Choices[0].FinishReason != "length" || len(c) >= len(wantAnswer) || !strings.HasPrefix(wantAnswer, c) {
				t.Errorf("choice = %+v, want a prefix of %q with finish_reason length", v.Choices[0], wantAnswer)
			}
		}},
		{OutcomeContextLength, 400, "", true, func(t *testing.T, body []byte) {
			v := decodeCompletion(t, body)
			if v.Error == nil || *v.Error.Code != "context_length_exceeded" || !strings.Contains(v.Error.Message, "maximum context length") {
				t.Errorf("body = %s, want a context_length_exceeded error", body)
			}
		}},
		{OutcomeContentFilter, 400, "", true, func(t *testing.T, body []byte) {
			v := decodeCompletion(t, body)
			if v.Error == nil || *v.Error.Code != "content_policy_violation" || v.Error.Message == "" {
				t.Errorf("body = %s, want a content_policy_violation error with a reason", body)
			}
		}},
		{OutcomeContentFilterFinish, 200, "", true, func(t *testing.T, body []byte) {
			v := decodeCompletion(t, body)
			if *v.Choices[0].FinishReason != "content_filter" || v.Choices[0].Message.Content != "" {
				t.Errorf("choice = %+v, want no content and finish_reason content_filter", v.Choices[0])
			}
		}},
		{OutcomeStreamNoDone, 200, "", true, func(t *testing.T, body []byte) {
			if v := decodeCompletion(t, body); v.Choices[0].Message.Content != wantAnswer {
				t.Errorf("content = %q, want the normal answer", v.Choices[0].Message.Content)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(string(tt.outcome), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, ServerConfig{Default: instant(tt.outcome)})
			resp, body, err := h.call(testCtx(t), chatParams{})
			if err != nil {
				t.Fatalf("call: %v", err)
			}
			if resp.StatusCode != tt.wantStatus {
				t.Errorf("status = %d, want %d; body %s", resp.StatusCode, tt.wantStatus, body)
			}
			if got := resp.Header.Get("Retry-After"); got != tt.wantRetryAfter {
				t.Errorf("Retry-After = %q, want %q", got, tt.wantRetryAfter)
			}
			if got := resp.Header.Get("x-ratelimit-remaining-requests") != ""; got != tt.wantLimitHeader {
				t.Errorf("x-ratelimit-remaining-requests present = %v, want %v", got, tt.wantLimitHeader)
			}
			if !strings.HasPrefix(resp.Header.Get("x-request-id"), "req_sim_") {
				t.Errorf("x-request-id = %q", resp.Header.Get("x-request-id"))
			}
			if got := resp.Header.Get("x-sim-outcome"); got != string(tt.outcome) {
				t.Errorf("x-sim-outcome = %q, want %q", got, tt.outcome)
			}
			if tt.check != nil {
				tt.check(t, body)
			}
		})
	}
}

func TestRateLimitedHeaders(t *testing.T) {
	t.Parallel()
	h := newHarness(t, ServerConfig{Default: instant(OutcomeRateLimited)})
	resp, _, err := h.call(testCtx(t), chatParams{})
	if err != nil {
		t.Fatalf("call: %v", err)
	}
	for header, want := range map[string]string{
		"Retry-After":                    "3",
		"retry-after-ms":                 "3000",
		"x-ratelimit-remaining-requests": "0",
		"x-ratelimit-limit-requests":     "100",
		"x-ratelimit-reset-requests":     "1m0s",
	} {
		if got := resp.Header.Get(header); got != want {
			t.Errorf("%s = %q, want %q", header, got, want)
		}
	}
}

func TestConnectionFaults(t *testing.T) {
	t.Parallel()
	tests := []struct {
		outcome Outcome
		stream  bool
	}{
		{OutcomeReset, false},
		{OutcomeReset, true},
		{OutcomeStreamCut, false}, // a non-streamed body announced in full, then cut
	}
	for _, tt := range tests {
		name := string(tt.outcome)
		if tt.stream {
			name += "/stream"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, ServerConfig{Default: instant(tt.outcome)})
			resp, body, err := h.call(testCtx(t), chatParams{stream: tt.stream})
			if err == nil {
				t.Fatalf("call succeeded with status %d and body %q, want a connection error", resp.StatusCode, body)
			}
			if tt.outcome == OutcomeReset && resp != nil {
				t.Errorf("got a response (status %d) before the reset, want none", resp.StatusCode)
			}
			if tt.outcome == OutcomeStreamCut && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("reading the cut body: %v, want unexpected EOF", err)
			}
		})
	}
}

// sseEvent is one decoded data line of a stream.
type sseEvent struct {
	raw string
	completionView
	valid bool
}

// readSSE reads a stream to its end and reports its data events, whether [DONE] came,
// and the read error (nil for a clean end).
func readSSE(body io.Reader) (events []sseEvent, done bool, err error) {
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		ev := sseEvent{raw: data}
		ev.valid = json.Unmarshal([]byte(data), &ev.completionView) == nil
		events = append(events, ev)
	}
	return events, done, sc.Err()
}

// content joins the deltas of the events.
func content(events []sseEvent) string {
	var b strings.Builder
	for _, ev := range events {
		for _, c := range ev.Choices {
			b.WriteString(c.Delta.Content)
		}
	}
	return b.String()
}

func finishReason(events []sseEvent) string {
	for _, ev := range events {
		for _, c := range ev.Choices {
			if c.FinishReason != nil {
				return *c.FinishReason
			}
		}
	}
	return ""
}

func TestStreamOutcomes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		outcome      Outcome
		includeUsage bool
		wantDone     bool
		wantErr      error
		check        func(t *testing.T, events []sseEvent)
	}{
		{OutcomeOK, true, true, nil, func(t *testing.T, events []sseEvent) {
			if got := content(events); got != wantAnswer {
				t.Errorf("content = %q, want %q", got, wantAnswer)
			}
			if events[0].Choices[0].Delta.Role != "assistant" {
				t.Errorf("first event = %s, want the assistant role", events[0].raw)
			}
			if got := finishReason(events); got != "stop" {
				t.Errorf("finish_reason = %q, want stop", got)
			}
			last := events[len(events)-1]
			if last.Usage == nil || len(last.Choices) != 0 || last.Usage.CompletionTokens != int64(estimateTokens(wantAnswer)) {
				t.Errorf("last event = %s, want the usage chunk with no choices", last.raw)
			}
			for _, ev := range events {
				if ev.Object != "chat.completion.chunk" || !ev.valid {
					t.Errorf("event %s is not a chat.completion.chunk", ev.raw)
				}
			}
		}},
		{OutcomeOK, false, true, nil, func(t *testing.T, events []sseEvent) {
			for _, ev := range events {
				if ev.Usage != nil {
					t.Errorf("event %s carries usage, which was not asked for", ev.raw)
				}
			}
		}},
		{OutcomeTruncated, true, true, nil, func(t *testing.T, events []sseEvent) {
			if got := finishReason(events); got != "length" {
				t.Errorf("finish_reason = %q, want length", got)
			}
			if got := content(events); len(got) >= len(wantAnswer) || !strings.HasPrefix(wantAnswer, got) {
				t.Errorf("content = %q, want a strict prefix of %q", got, wantAnswer)
			}
		}},
		{OutcomeRefusal, false, true, nil, func(t *testing.T, events []sseEvent) {
			if got := content(events); got != refusalText {
				t.Errorf("content = %q, want the refusal", got)
			}
		}},
		{OutcomeErrorIn200, false, false, nil, func(t *testing.T, events []sseEvent) {
			if len(events) != 1 || events[0].Error == nil {
				t.Errorf("events = %+v, want one error event", events)
			}
		}},
		{OutcomeMalformedJSON, false, true, nil, func(t *testing.T, events []sseEvent) {
			if !slices.ContainsFunc(events, func(ev sseEvent) bool { return !ev.valid }) {
				t.Errorf("every event is valid JSON, want a broken one")
			}
		}},
		{OutcomeContentFilterFinish, false, true, nil, func(t *testing.T, events []sseEvent) {
			if got := content(events); got != "" || finishReason(events) != "content_filter" {
				t.Errorf("content = %q, finish_reason %q; want none and content_filter", got, finishReason(events))
			}
		}},
		{OutcomeStreamNoDone, true, false, nil, func(t *testing.T, events []sseEvent) {
			if got := content(events); got != wantAnswer || finishReason(events) != "stop" {
				t.Errorf("content = %q, finish_reason %q; want the whole answer and stop", got, finishReason(events))
			}
			if last := events[len(events)-1]; last.Usage == nil {
				t.Errorf("last event = %s, want the usage chunk", last.raw)
			}
		}},
		{OutcomeStreamCut, true, false, io.ErrUnexpectedEOF, func(t *testing.T, events []sseEvent) {
			got := content(events)
			if got == "" || len(got) >= len(wantAnswer) || finishReason(events) != "" {
				t.Errorf("content = %q, finish_reason %q; want part of the answer and no finish", got, finishReason(events))
			}
		}},
	}
	for _, tt := range tests {
		t.Run(string(tt.outcome), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, ServerConfig{Default: instant(tt.outcome)})
			resp, err := h.post(testCtx(t), chatParams{stream: true, includeUsage: tt.includeUsage})
			if err != nil {
				t.Fatalf("post: %v", err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("status %d, Content-Type %q; want a 200 event stream", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			events, done, err := readSSE(resp.Body)
			if !errors.Is(err, tt.wantErr) {
				t.Errorf("reading the stream: %v, want %v", err, tt.wantErr)
			}
			if done != tt.wantDone {
				t.Errorf("[DONE] received = %v, want %v", done, tt.wantDone)
			}
			if len(events) == 0 {
				t.Fatal("no events")
			}
			tt.check(t, events)
		})
	}
}

func TestJSONMode(t *testing.T) {
	t.Parallel()
	tests := []struct {
		outcome   Outcome
		wantValid bool
	}{
		{OutcomeOK, true},
		{OutcomeMalformedJSON, false}, // the envelope is fine, the model's JSON is not
	}
	for _, tt := range tests {
		t.Run(string(tt.outcome), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, ServerConfig{Default: instant(tt.outcome)})
			_, body, err := h.call(testCtx(t), chatParams{jsonMode: true})
			if err != nil {
				t.Fatalf("call: %v", err)
			}
			c := decodeCompletion(t, body).Choices[0].Message.Content
			var obj struct {
				Answer     string  `json:"answer"`
				Confidence float64 `json:"confidence"`
			}
			err = json.Unmarshal([]byte(c), &obj)
			if valid := err == nil; valid != tt.wantValid {
				t.Fatalf("content %q parses = %v, want %v", c, valid, tt.wantValid)
			}
			if tt.wantValid && (obj.Answer != wantAnswer || obj.Confidence != 0.9) {
				t.Errorf("content = %+v, want answer %q and confidence 0.9", obj, wantAnswer)
			}
		})
	}
}

func TestMaxTokensTruncates(t *testing.T) {
	t.Parallel()
	h := newHarness(t, ServerConfig{})
	_, body, err := h.call(testCtx(t), chatParams{maxTokens: 3})
	if err != nil {
		t.Fatalf("call: %v", err)
	}
	v := decodeCompletion(t, body)
	if c := v.Choices[0].Message.Content; *v.Choices[0].FinishReason != "length" || len(c) > 12 || !strings.HasPrefix(wantAnswer, c) {
		t.Errorf("choice = %q (%s), want at most 3 tokens of the answer and finish_reason length", c, *v.Choices[0].FinishReason)
	}
}

// TestNeverEndingFaultsEndWithTheClient checks that hangs and stalls hold the call open
// until the client goes away, and that the handler then returns.
func TestNeverEndingFaultsEndWithTheClient(t *testing.T) {
	t.Parallel()
	tests := []struct {
		outcome Outcome
		stream  bool
	}{
		{OutcomeHang, false},
		{OutcomeHang, true},
		{OutcomeStreamStall, true},
		{OutcomeStreamStall, false},
	}
	for _, tt := range tests {
		name := string(tt.outcome)
		if tt.stream {
			name += "/stream"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, ServerConfig{Default: instant(tt.outcome)})
			ctx := testCtx(t)
			clientCtx, leave := context.WithCancel(ctx)
			defer leave()

			type result struct {
				resp *http.Response
				err  error
			}
			results := make(chan result, 1)
			go func() {
				resp, err := h.post(clientCtx, chatParams{stream: tt.stream})
				results <- result{resp, err}
			}()
			if got := receive(ctx, t, h.planned, "the call's outcome"); got != tt.outcome {
				t.Fatalf("outcome = %q, want %q", got, tt.outcome)
			}

			if tt.outcome == OutcomeStreamStall {
				// The headers and part of the answer arrive, then nothing more.
				r := receive(ctx, t, results, "the response headers")
				if r.err != nil {
					t.Fatalf("post: %v", r.err)
				}
				defer r.resp.Body.Close()
				if tt.stream {
					parts := pieces(wantAnswer)
					want := parts[:len(parts)/2]
					br := bufio.NewReader(r.resp.Body)
					var got []string
					for len(got) < len(want) {
						line, err := br.ReadString('\n')
						if err != nil {
							t.Fatalf("reading the stream after %q: %v", got, err)
						}
						var ev completionView
						if data, ok := strings.CutPrefix(strings.TrimSpace(line), "data: "); ok &&
							json.Unmarshal([]byte(data), &ev) == nil && ev.Choices[0].Delta.Content != "" {
							got = append(got, ev.Choices[0].Delta.Content)
						}
					}
					if !slices.Equal(got, want) {
						t.Errorf("stream before the stall = %q, want %q", got, want)
					}
				}
			}
			select {
			case <-h.exited:
				t.Fatal("the handler returned while the client was still waiting")
			default:
			}

			leave()
			receive(ctx, t, h.exited, "the handler to return after the client left")
			if tt.outcome == OutcomeHang {
				if r := receive(ctx, t, results, "the client's error"); !errors.Is(r.err, context.Canceled) {
					t.Errorf("client error = %v, want context.Canceled", r.err)
				}
			}
			if n := h.srv.Stats().Models["sim-model"].InFlight; n != 0 {
				t.Errorf("InFlight = %d after the handler returned, want 0", n)
			}
		})
	}
}

func fixed(d time.Duration) Latency {
	return Latency{Min: d, P50: d, P95: d, P99: d, Max: d}
}

func TestLatencyRunsOnTheClock(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		timeScale float64
		wantWait  time.Duration
	}{
		{"real time", 0, 2 * time.Second},
		{"time scale 0.1", 0.1, 200 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, ServerConfig{Default: Profile{Latency: fixed(2 * time.Second), TimeScale: tt.timeScale}})
			ctx := testCtx(t)
			type result struct {
				body []byte
				err  error
			}
			results := make(chan result, 1)
			go func() {
				_, body, err := h.call(ctx, chatParams{})
				results <- result{body, err}
			}()
			if err := h.clock.BlockUntilContext(ctx, 1); err != nil {
				t.Fatalf("waiting for the latency timer: %v", err)
			}
			h.clock.Advance(tt.wantWait - time.Millisecond)
			// Still one timer pending: the call has not answered a millisecond early.
			if err := h.clock.BlockUntilContext(ctx, 1); err != nil {
				t.Fatalf("the latency timer is gone before its time: %v", err)
			}
			h.clock.Advance(time.Millisecond)
			r := receive(ctx, t, results, "the answer")
			if r.err != nil {
				t.Fatalf("call: %v", r.err)
			}
			if got := decodeCompletion(t, r.body).Choices[0].Message.Content; got != wantAnswer {
				t.Errorf("content = %q, want %q", got, wantAnswer)
			}
		})
	}
}

func TestClientLeavingEndsLatencyWait(t *testing.T) {
	t.Parallel()
	h := newHarness(t, ServerConfig{Default: Profile{Latency: fixed(time.Hour)}})
	ctx := testCtx(t)
	clientCtx, leave := context.WithCancel(ctx)
	errs := make(chan error, 1)
	go func() {
		_, _, err := h.call(clientCtx, chatParams{})
		errs <- err
	}()
	if err := h.clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatalf("waiting for the latency timer: %v", err)
	}
	leave()
	receive(ctx, t, h.exited, "the handler to return")
	if err := h.clock.BlockUntilContext(ctx, 0); err != nil {
		t.Fatalf("the latency timer was not stopped: %v", err)
	}
	if err := receive(ctx, t, errs, "the client's error"); !errors.Is(err, context.Canceled) {
		t.Errorf("client error = %v, want context.Canceled", err)
	}
}

// TestStreamTiming steps a stream through its TTFT and chunk delays on the fake clock.
func TestStreamTiming(t *testing.T) {
	t.Parallel()
	const ttft, delay = 300 * time.Millisecond, 50 * time.Millisecond
	h := newHarness(t, ServerConfig{Default: Profile{TTFT: fixed(ttft), TokenDelay: delay}})
	ctx := testCtx(t)
	resp, err := h.post(ctx, chatParams{stream: true})
	if err != nil {
		t.Fatalf("post: %v", err)
	}
	defer resp.Body.Close()

	// Headers came at once; events come through a reader goroutine that ends with the body.
	events := make(chan string)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				select {
				case events <- data:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	nextContent := func() string {
		t.Helper()
		for {
			data := receive(ctx, t, events, "a stream event")
			var ev completionView
			if err := json.Unmarshal([]byte(data), &ev); err != nil {
				t.Fatalf("event %q: %v", data, err)
			}
			if c := ev.Choices[0].Delta.Content; c != "" {
				return c
			}
		}
	}

	if err := h.clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatalf("waiting for the TTFT timer: %v", err)
	}
	h.clock.Advance(ttft - time.Millisecond)
	if err := h.clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatalf("TTFT timer gone early: %v", err)
	}
	h.clock.Advance(time.Millisecond)
	parts := pieces(wantAnswer)
	var got []string
	got = append(got, nextContent())
	for range parts[1:] {
		if err := h.clock.BlockUntilContext(ctx, 1); err != nil {
			t.Fatalf("waiting for a chunk delay: %v", err)
		}
		h.clock.Advance(delay)
		got = append(got, nextContent())
	}
	if !slices.Equal(got, parts) {
		t.Errorf("chunks = %q, want %q", got, parts)
	}
	var rest []string
	for data := range events {
		rest = append(rest, data)
	}
	if len(rest) == 0 || rest[len(rest)-1] != "[DONE]" {
		t.Errorf("events after the content = %q, want the finish chunk and [DONE]", rest)
	}
}

func TestPhasesFollowTheClock(t *testing.T) {
	t.Parallel()
	phases := []Phase{
		{Name: "healthy", Start: 0, Duration: time.Minute},
		{Name: "outage", Start: time.Minute, Duration: 2 * time.Minute, Errors: &ErrorMix{Overloaded: 1}},
		{Name: "recovery", Start: 3 * time.Minute},
	}
	type step struct {
		advance    time.Duration
		wantStatus int
		wantPhase  string
	}
	tests := []struct {
		name      string
		timeScale float64
		steps     []step
	}{
		{"real time", 1, []step{
			{0, 200, "healthy"},
			{59 * time.Second, 200, "healthy"},
			{time.Second, 503, "outage"},
			{119 * time.Second, 503, "outage"},
			{time.Second, 200, "recovery"},
		}},
		{"time scale 0.1", 0.1, []step{
			{0, 200, "healthy"},
			{5900 * time.Millisecond, 200, "healthy"},
			{100 * time.Millisecond, 503, "outage"},
			{12 * time.Second, 200, "recovery"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, ServerConfig{Default: Profile{Name: "phased", Phases: phases, TimeScale: tt.timeScale}})
			ctx := testCtx(t)
			for i, s := range tt.steps {
				h.clock.Advance(s.advance)
				resp, _, err := h.call(ctx, chatParams{})
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if resp.StatusCode != s.wantStatus || resp.Header.Get("x-sim-phase") != s.wantPhase {
					t.Errorf("step %d: status %d in phase %q, want %d in %q",
						i, resp.StatusCode, resp.Header.Get("x-sim-phase"), s.wantStatus, s.wantPhase)
				}
			}
		})
	}
}

// outcomes makes n sequential calls to model and returns their outcomes.
func (h *harness) outcomes(ctx context.Context, model string, n int) []string {
	h.t.Helper()
	var out []string
	for range n {
		resp, _, err := h.call(ctx, chatParams{model: model})
		if err != nil {
			h.t.Fatalf("call: %v", err)
		}
		out = append(out, resp.Header.Get("x-sim-outcome"))
	}
	return out
}

func TestSeedReproducesOutcomes(t *testing.T) {
	t.Parallel()
	mix := Profile{Errors: ErrorMix{RateLimited: 0.1, RateLimitedNoHint: 0.1, ServerError: 0.1,
		Overloaded: 0.1, ErrorIn200: 0.1, Refusal: 0.1, Truncated: 0.1}}
	ctx := testCtx(t)
	const n = 200
	run := func(seed int64, p Profile) []string {
		return newHarness(t, ServerConfig{Default: p, Seed: seed}).outcomes(ctx, "m", n)
	}
	first := run(42, mix)
	if again := run(42, mix); !slices.Equal(first, again) {
		t.Errorf("same seed, different outcomes:\n%v\n%v", first, again)
	}
	if other := run(43, mix); slices.Equal(first, other) {
		t.Error("seeds 42 and 43 gave the same outcomes")
	}
	pinned := mix
	pinned.Seed = 42
	if got := run(7, pinned); !slices.Equal(first, got) {
		t.Error("a profile's own seed did not override the server's")
	}
	if counts := countOf(first, "ok"); counts < n/5 || counts > n/2 {
		t.Errorf("%d of %d calls ok, want about 30%%", counts, n)
	}

	// Traffic to another model does not shift this model's sequence.
	h := newHarness(t, ServerConfig{Default: mix, Seed: 42})
	var interleaved []string
	for range n {
		interleaved = append(interleaved, h.outcomes(ctx, "m", 1)...)
		h.outcomes(ctx, "other", 1)
	}
	if !slices.Equal(first, interleaved) {
		t.Error("calls to another model changed this model's outcomes")
	}
}

func countOf(xs []string, x string) int {
	n := 0
	for _, v := range xs {
		if v == x {
			n++
		}
	}
	return n
}

func TestPerModelProfiles(t *testing.T) {
	t.Parallel()
	h := newHarness(t, ServerConfig{
		Models: map[string]Profile{
			"beta":  {Name: "ok"},
			"alpha": mustBuiltin(t, "down"),
		},
		Default: instant(OutcomeRefusal),
	})
	ctx := testCtx(t)
	tests := []struct {
		model      string
		wantStatus int
		wantOut    Outcome
	}{
		{"alpha", 503, OutcomeOverloaded},
		{"beta", 200, OutcomeOK},
		{"anything-else", 200, OutcomeRefusal},
	}
	for _, tt := range tests {
		resp, _, err := h.call(ctx, chatParams{model: tt.model})
		if err != nil {
			t.Fatalf("%s: %v", tt.model, err)
		}
		if resp.StatusCode != tt.wantStatus || resp.Header.Get("x-sim-outcome") != string(tt.wantOut) {
			t.Errorf("%s: status %d outcome %q, want %d %q", tt.model, resp.StatusCode,
				resp.Header.Get("x-sim-outcome"), tt.wantStatus, tt.wantOut)
		}
	}

	resp, err := h.ts.Client().Get(h.ts.URL + "/v1/models")
	if err != nil {
		t.Fatalf("GET /v1/models: %v", err)
	}
	defer resp.Body.Close()
	var list modelList
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatalf("decoding the model list: %v", err)
	}
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	if list.Object != "list" || !slices.Equal(ids, []string{"alpha", "beta"}) {
		t.Errorf("models = %+v, want alpha and beta", list)
	}
}

func TestStats(t *testing.T) {
	t.Parallel()
	h := newHarness(t, ServerConfig{Models: map[string]Profile{"down": instant(OutcomeOverloaded)}})
	ctx := testCtx(t)
	calls := []chatParams{
		{model: "m", idemKey: "a"},
		{model: "m", idemKey: "a"}, // a retry without idempotency: billed twice
		{model: "m", idemKey: "b", stream: true},
		{model: "m"},
		{model: "m"}, // no key: not tracked
		{model: "down", idemKey: "a"},
		{model: "down", idemKey: "a"}, // rejected calls are not billed
	}
	for _, p := range calls {
		if _, _, err := h.call(ctx, p); err != nil {
			t.Fatalf("call: %v", err)
		}
	}
	resp, err := h.ts.Client().Post(h.ts.URL+"/v1/chat/completions", "application/json", strings.NewReader("{"))
	if err != nil {
		t.Fatalf("bad request: %v", err)
	}
	resp.Body.Close()

	got := h.srv.Stats()
	want := map[string]ModelStats{
		"m":    {Calls: 5, Streams: 1, Outcomes: map[Outcome]int64{OutcomeOK: 5}, Billed: 5, DuplicateBilled: 1},
		"down": {Calls: 2, Outcomes: map[Outcome]int64{OutcomeOverloaded: 2}},
	}
	for model, w := range want {
		g := got.Models[model]
		if g.Calls != w.Calls || g.Streams != w.Streams || g.Billed != w.Billed ||
			g.DuplicateBilled != w.DuplicateBilled || g.InFlight != 0 || !mapsEqual(g.Outcomes, w.Outcomes) {
			t.Errorf("Stats().Models[%q] = %+v, want %+v", model, g, w)
		}
	}
	if got.BadRequests != 1 {
		t.Errorf("BadRequests = %d, want 1", got.BadRequests)
	}
}

// TestPrefillContinues: a request ending in an assistant message that starts the answer
// gets only the rest of it, streamed or not, as prefill-capable models do; the router
// relies on it to finish a stream that broke mid-answer on another model.
func TestPrefillContinues(t *testing.T) {
	t.Parallel()
	h := newHarness(t, ServerConfig{})
	ctx := testCtx(t)
	_, body, err := h.call(ctx, chatParams{prefill: "sim answer to: hello"})
	if err != nil {
		t.Fatalf("call: %v", err)
	}
	if got := decodeCompletion(t, body).Choices[0].Message.Content; got != " world" {
		t.Errorf("unary continuation = %q, want %q", got, " world")
	}
	resp, err := h.post(ctx, chatParams{prefill: "sim answer", stream: true})
	if err != nil {
		t.Fatalf("post: %v", err)
	}
	defer resp.Body.Close()
	events, done, err := readSSE(resp.Body)
	if err != nil || !done {
		t.Fatalf("stream: %v, done %t", err, done)
	}
	if got := content(events); got != " to: hello world" || finishReason(events) != "stop" {
		t.Errorf("streamed continuation = %q (finish %q), want %q and stop", got, finishReason(events), " to: hello world")
	}
	// A prefill that is not the start of the answer cannot be continued: the whole answer.
	_, body, err = h.call(ctx, chatParams{prefill: "something else"})
	if err != nil {
		t.Fatalf("call: %v", err)
	}
	if got := decodeCompletion(t, body).Choices[0].Message.Content; got != wantAnswer {
		t.Errorf("unrelated prefill answered %q, want the whole answer", got)
	}
}

// TestScript: a script fixes a model's first outcomes in order, then the mix takes over;
// other models are not affected.
func TestScript(t *testing.T) {
	t.Parallel()
	p := instant(OutcomeOverloaded)
	p.Script = []Outcome{OutcomeServerError, OutcomeOK, OutcomeRateLimitedNoHint}
	h := newHarness(t, ServerConfig{Models: map[string]Profile{"scripted": p}})
	ctx := testCtx(t)
	var got []string
	for _, model := range []string{"scripted", "other", "scripted", "scripted", "scripted", "scripted"} {
		resp, _, err := h.call(ctx, chatParams{model: model})
		if err != nil {
			t.Fatalf("call: %v", err)
		}
		got = append(got, model+":"+resp.Header.Get("x-sim-outcome"))
	}
	want := []string{"scripted:server_error", "other:ok", "scripted:ok", "scripted:rate_limited_no_hint", "scripted:overloaded", "scripted:overloaded"}
	if !slices.Equal(got, want) {
		t.Errorf("outcomes = %v, want %v", got, want)
	}
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestRateLimitWindow(t *testing.T) {
	t.Parallel()
	h := newHarness(t, ServerConfig{Default: Profile{RateLimit: RateLimit{RequestsPerMinute: 2}, TimeScale: 0.5}})
	ctx := testCtx(t)
	type step struct {
		advance        time.Duration
		wantStatus     int
		wantRemaining  string
		wantRetryAfter string
	}
	// TimeScale 0.5 makes the window 30 s.
	steps := []step{
		{0, 200, "1", ""},
		{10 * time.Second, 200, "0", ""},
		{0, 429, "0", "20"},
		{19 * time.Second, 429, "0", "1"},
		{time.Second, 200, "1", ""},
	}
	for i, s := range steps {
		h.clock.Advance(s.advance)
		resp, _, err := h.call(ctx, chatParams{})
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if resp.StatusCode != s.wantStatus ||
			resp.Header.Get("x-ratelimit-remaining-requests") != s.wantRemaining ||
			resp.Header.Get("Retry-After") != s.wantRetryAfter {
			t.Errorf("step %d: status %d, remaining %q, Retry-After %q; want %d, %q, %q", i, resp.StatusCode,
				resp.Header.Get("x-ratelimit-remaining-requests"), resp.Header.Get("Retry-After"),
				s.wantStatus, s.wantRemaining, s.wantRetryAfter)
		}
	}
	if resp, _, _ := h.call(ctx, chatParams{}); resp.Header.Get("x-ratelimit-limit-tokens") != "" {
		t.Error("x-ratelimit-limit-tokens sent without a token limit")
	}
}

func TestBadRequests(t *testing.T) {
	t.Parallel()
	h := newHarness(t, ServerConfig{})
	tests := []struct {
		name       string
		method     string
		path       string
		body       string
		wantStatus int
	}{
		{"not JSON", http.MethodPost, "/v1/chat/completions", "{", 400},
		{"no model", http.MethodPost, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, 400},
		{"no messages", http.MethodPost, "/v1/chat/completions", `{"model":"m","messages":[]}`, 400},
		{"GET chat", http.MethodGet, "/v1/chat/completions", "", 405},
		{"POST models", http.MethodPost, "/v1/models", "", 405},
		{"embeddings", http.MethodPost, "/v1/embeddings", "{}", 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			req, err := http.NewRequestWithContext(testCtx(t), tt.method, h.ts.URL+tt.path, strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := h.ts.Client().Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", tt.method, tt.path, err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.wantStatus {
				t.Errorf("status = %d, want %d", resp.StatusCode, tt.wantStatus)
			}
			if v := decodeCompletion(t, body); v.Error == nil || v.Error.Message == "" {
				t.Errorf("body = %s, want an OpenAI error object", body)
			}
			if resp.Header.Get("x-request-id") == "" {
				t.Error("no x-request-id")
			}
		})
	}
}

func TestMessageContentParts(t *testing.T) {
	t.Parallel()
	h := newHarness(t, ServerConfig{})
	body := `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hello "},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"world"}]}]}`
	resp, err := h.ts.Client().Post(h.ts.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if got := decodeCompletion(t, b).Choices[0].Message.Content; got != wantAnswer {
		t.Errorf("content = %q, want %q", got, wantAnswer)
	}
}
