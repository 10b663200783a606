package drill

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/httpbody"
	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/pkg/provider/openai"
	"github.com/mantle-mesh/mantle/services/router"
)

// result is what one request came to on one side.
type result struct {
	// due is when the request was due, since the side started; latency runs from then to
	// the answer or the failure (open loop: a late start counts against the latency).
	due     time.Duration
	latency time.Duration
	sent    bool // false when the generator shed it
	// answered: the caller got an answer (from a model or, marked, from the ladder).
	answered bool
	// correct: the answer is the one a healthy model gives.
	correct bool
	// level is the ladder level of the answer (0 primary ... 3 template), -1 without one.
	level int
	// verified: mantle's verifier passed the answer.
	verified bool
	// marked: a degraded answer that says so (fallback level and a notice for the user).
	marked bool
	// failure says why there was no answer.
	failure string
	// flagged: a wrong answer whose QualityContext says it failed verification (mantle
	// verifies streamed answers after they were delivered, and says so in the last chunk).
	flagged bool
	// reason is mantle's degradation reason for answers below L0, condensed.
	reason string
	// trail is mantle's audit trail of the request, condensed (see condense).
	trail string
	// overhead and waited are mantle's own time on the request and the time it held the
	// request on purpose (QualityContext), wall clock; timed says mantle reported them.
	overhead, waited time.Duration
	timed            bool
}

// client sends one request of the load.
type client interface {
	do(ctx context.Context, r request) result
}

func newTransport() *http.Transport {
	return &http.Transport{
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 4096,
		IdleConnTimeout:     90 * time.Second,
	}
}

// mantleClient calls mantle's OpenAI-compatible front door, once per request: mantle is
// what retries, hedges and degrades, so its client does not.
type mantleClient struct {
	url    string
	route  string
	apiKey string
	runID  string
	http   *http.Client
	// timeout bounds a request on the client side, well past the route's budget, so a
	// mantle that overran its budget is seen as slow rather than hanging the drill.
	timeout time.Duration
}

type chatBody struct {
	Model          string            `json:"model"`
	Messages       []chatBodyMessage `json:"messages"`
	Stream         bool              `json:"stream,omitempty"`
	ResponseFormat *struct {
		Type string `json:"type"`
	} `json:"response_format,omitempty"`
}

type chatBodyMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

func (c *mantleClient) do(ctx context.Context, r request) result {
	res := result{level: -1, sent: true}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	body := chatBody{Model: c.route, Messages: []chatBodyMessage{{Role: "user", Content: r.prompt}}, Stream: r.stream}
	if r.json {
		body.ResponseFormat = &struct {
			Type string `json:"type"`
		}{"json_object"}
	}
	payload, _ := json.Marshal(body) // plain strings and bools: cannot fail
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(payload))
	if err != nil {
		res.failure = "client: " + err.Error()
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-request-id", fmt.Sprintf("drill-%s-%d", c.runID, r.index))
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	if r.session != "" {
		req.Header.Set(router.HeaderSession, r.session)
		req.Header.Set(router.HeaderStep, r.step)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		res.failure = transportFailure(ctx, err)
		return res
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		res.failure = httpFailure(resp)
		return res
	}
	var content string
	var qc *mantlev1.QualityContext
	if r.stream {
		content, qc, res.failure = readMantleStream(ctx, resp.Body)
	} else {
		content, qc, res.failure = readMantleCompletion(ctx, resp)
	}
	if res.failure != "" {
		return res
	}
	res.answered = true
	res.correct = content == expectedAnswer(r)
	res.level = levelOf(qc.GetFallbackLevel())
	if res.level < 0 {
		res.level = levelFromHeader(resp.Header.Get(router.HeaderFallbackLevel))
	}
	res.verified = qc.GetVerification().GetL1Passed()
	res.marked = res.level >= 2 && qc.GetUserNotice() != ""
	res.flagged = !res.correct && qc.GetVerification() != nil && !qc.GetVerification().GetL1Passed()
	if res.level > 0 {
		res.reason = reasonKind(qc.GetDegradationReason())
	}
	res.trail = condense(qc)
	if qc.GetOverhead() != nil {
		res.overhead, res.waited, res.timed = qc.GetOverhead().AsDuration(), qc.GetWaited().AsDuration(), true
	}
	return res
}

// reasonKind keeps the kind of a degradation reason and drops its details ("retry budget
// exhausted (tried primary): provider: timeout" becomes "retry budget exhausted"), so
// reasons can be counted.
func reasonKind(reason string) string {
	if reason == "" {
		return "unspecified"
	}
	for _, sep := range []string{" (tried", ": "} {
		if i := strings.Index(reason, sep); i > 0 {
			reason = reason[:i]
		}
	}
	return reason
}

// condense summarises a QualityContext's audit trail on one line, each step with its offset
// from the first and its duration, so the report can show where the slowest requests spent
// their time.
func condense(qc *mantlev1.QualityContext) string {
	steps := qc.GetAudit()
	if len(steps) == 0 {
		return ""
	}
	t0 := steps[0].GetAt().AsTime()
	parts := make([]string, 0, len(steps))
	for _, st := range steps {
		parts = append(parts, fmt.Sprintf("+%s %s %s (%s)", st.GetAt().AsTime().Sub(t0).Round(100*time.Microsecond),
			st.GetStep(), st.GetDetail(), st.GetDuration().AsDuration().Round(100*time.Microsecond)))
	}
	return strings.Join(parts, "; ")
}

var qcJSON = protojson.UnmarshalOptions{DiscardUnknown: true}

// maxCompletionBody bounds the answer a drill client reads: far more than any drill asks for.
const maxCompletionBody = 8 << 20

func readMantleCompletion(ctx context.Context, resp *http.Response) (string, *mantlev1.QualityContext, string) {
	var out struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
		Mantle json.RawMessage `json:"mantle"`
	}
	data, err := httpbody.Response(resp, maxCompletionBody)
	if err != nil {
		return "", nil, transportFailure(ctx, err)
	}
	if err := json.Unmarshal(data, &out); err != nil || len(out.Choices) == 0 {
		return "", nil, "malformed_response"
	}
	qc := &mantlev1.QualityContext{}
	if len(out.Mantle) > 0 {
		if err := qcJSON.Unmarshal(out.Mantle, qc); err != nil {
			return "", nil, "malformed_quality_context"
		}
	}
	return out.Choices[0].Message.Content, qc, ""
}

// readMantleStream reads mantle's server-sent events: content deltas, a last chunk that
// carries the QualityContext, then [DONE]. A stream that ends otherwise, or carries an
// error event, delivered no complete answer.
func readMantleStream(ctx context.Context, body io.Reader) (string, *mantlev1.QualityContext, string) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var content strings.Builder
	qc := &mantlev1.QualityContext{}
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			return content.String(), qc, ""
		}
		var ev struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Mantle json.RawMessage `json:"mantle"`
			Error  *struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			return "", nil, "malformed_stream"
		}
		if ev.Error != nil {
			return "", nil, "stream_error: " + orUnknown(ev.Error.Code)
		}
		for _, ch := range ev.Choices {
			content.WriteString(ch.Delta.Content)
		}
		if len(ev.Mantle) > 0 {
			if err := qcJSON.Unmarshal(ev.Mantle, qc); err != nil {
				return "", nil, "malformed_quality_context"
			}
		}
	}
	if err := sc.Err(); err != nil {
		return "", nil, transportFailure(ctx, err)
	}
	return "", nil, "stream_cut"
}

func levelFromHeader(h string) int {
	for l := mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY; l <= mantlev1.FallbackLevel_FALLBACK_LEVEL_TEMPLATE; l++ {
		if router.ShortLevel(l) == h {
			return levelOf(l)
		}
	}
	return -1
}

// httpFailure names a non-200 answer by its OpenAI error code, or its status.
func httpFailure(resp *http.Response) string {
	var body struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	data, _ := httpbody.Response(resp, 64<<10)
	if json.Unmarshal(data, &body) == nil && body.Error.Code != "" {
		return body.Error.Code
	}
	return fmt.Sprintf("http_%d", resp.StatusCode)
}

func transportFailure(ctx context.Context, err error) string {
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return "client_timeout"
	case ctx.Err() != nil:
		return "canceled"
	}
	return "transport"
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// naiveClient is the baseline the seeds' incident began with: it calls one model directly
// with a static per-call timeout, and on any error waits a fixed delay and tries again, a
// fixed number of times. No deadline, breaker, budget, backoff, failover or idempotency;
// and it believes any answer that comes with a 200.
//
// It tags each request with an Idempotency-Key header although it has no idempotency of its
// own: the simulator, like most LLM APIs, does not deduplicate by it, so the tag changes
// nothing about what is billed; it only lets the simulator count the duplicate bills.
type naiveClient struct {
	p       provider.Provider
	model   string
	runID   string
	timeout time.Duration
	retries int
	delay   time.Duration
}

func newNaiveClient(baseURL, model, runID string, timeout time.Duration, retries int, delay time.Duration) *naiveClient {
	hc := &http.Client{Transport: newTransport()}
	return &naiveClient{
		p:     openai.New(openai.Config{BaseURL: baseURL, HTTPClient: hc}),
		model: model, runID: runID, timeout: timeout, retries: retries, delay: delay,
	}
}

func (c *naiveClient) do(ctx context.Context, r request) result {
	res := result{level: -1, sent: true}
	preq := provider.Request{
		Model:          c.model,
		Messages:       []provider.Message{{Role: "user", Content: r.prompt}},
		JSON:           r.json,
		IdempotencyKey: fmt.Sprintf("naive-%s-%d", c.runID, r.index),
	}
	var last error
	for try := 0; try <= c.retries; try++ {
		if try > 0 && !pause(ctx, c.delay) {
			break
		}
		content, err := c.once(ctx, preq, r.stream)
		if err == nil {
			res.answered, res.level = true, 0
			res.correct = content == expectedAnswer(r)
			return res
		}
		last = err
		if ctx.Err() != nil {
			break
		}
	}
	res.failure = naiveFailure(last)
	return res
}

func (c *naiveClient) once(ctx context.Context, preq provider.Request, stream bool) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	if !stream {
		resp, err := c.p.Complete(ctx, preq)
		return resp.Content, err
	}
	s, err := c.p.Stream(ctx, preq)
	if err != nil {
		return "", err
	}
	defer s.Close()
	var content strings.Builder
	for {
		ch, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return content.String(), nil
		}
		if err != nil {
			return "", err
		}
		content.WriteString(ch.Content)
	}
}

func naiveFailure(err error) string {
	if err == nil {
		return "canceled"
	}
	return strings.ToLower(strings.TrimPrefix(provider.ClassOf(err).String(), "ERROR_CLASS_"))
}

// pause waits d unless ctx ends first.
func pause(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
