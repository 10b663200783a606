package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/mantle-mesh/mantle/pkg/formatcheck"
)

// Status of a call's result (CallToolResponse.status).
type Status int

// Statuses of a call's result.
const (
	StatusOK Status = iota + 1
	StatusBackup
	StatusStale
	StatusReplayed
	StatusPendingConfirmation
	StatusCached
)

// CallRequest is one tool call, as the server hands it to Tools.
type CallRequest struct {
	Tenant         string
	Name           string
	Arguments      string
	IdempotencyKey string
	SessionID      string
	StepID         string
	RequestID      string
}

// CallResult is a tool call's result.
type CallResult struct {
	Result         string        `json:"result,omitempty"`
	Status         Status        `json:"status"`
	IsError        bool          `json:"is_error,omitempty"`
	StaleAge       time.Duration `json:"stale_age,omitempty"`
	Notice         string        `json:"notice,omitempty"`
	IdempotencyKey string        `json:"idempotency_key,omitempty"`
	ConfirmationID string        `json:"confirmation_id,omitempty"`
	Attempts       []Attempt     `json:"attempts,omitempty"`
	Kind           string        `json:"kind"`
	AnsweredBy     string        `json:"answered_by,omitempty"`
}

// Attempt is one backend call a tool call made (or was refused before making).
type Attempt struct {
	Tool       string        `json:"tool"`
	Outcome    string        `json:"outcome"`
	Latency    time.Duration `json:"latency,omitempty"`
	HTTPStatus int           `json:"http_status,omitempty"`
}

// Errors of a tool call the server maps to statuses.
var (
	// ErrUnknownTool: no tool of that name in the registry.
	ErrUnknownTool = errors.New("unknown tool")
	// ErrKeyReused: the idempotency key ran another call (another tool or arguments).
	ErrKeyReused = errors.New("idempotency key reused")
	// ErrActionInProgress: a call with the same key is running.
	ErrActionInProgress = errors.New("a call with this idempotency key is in progress")
	// ErrActionsUnavailable: the idempotency store cannot be reached; no action runs.
	ErrActionsUnavailable = errors.New("actions are unavailable: the idempotency store cannot be reached")
)

// UnavailableError is a call that got no result: every gear failed. Attempts says what
// each backend call did; NotRun is true for an action that certainly did not run (it may
// be called again with the same key).
type UnavailableError struct {
	Tool     string
	Attempts []Attempt
	NotRun   bool
	Cause    error
}

func (e *UnavailableError) Error() string {
	msg := fmt.Sprintf("tool %s is unavailable", e.Tool)
	if e.NotRun {
		msg += " (the action did not run)"
	}
	if e.Cause != nil {
		msg += ": " + e.Cause.Error()
	}
	return msg
}

func (e *UnavailableError) Unwrap() error { return e.Cause }

// RateLimitedError is a call refused by the tool's rate limit, with the wait it needs.
type RateLimitedError struct {
	Tool       string
	RetryAfter time.Duration
}

func (e *RateLimitedError) Error() string {
	return fmt.Sprintf("tool %s is rate limited; retry after %s", e.Tool, e.RetryAfter)
}

// Tools runs the calls of the current registry.
type Tools struct {
	reg     atomic.Pointer[registry]
	stale   *staleStore
	actions actionStore
	confirm confirmer
	checker *formatcheck.Checker
	clock   clockwork.Clock
	rand    func() float64
	log     *slog.Logger
	metrics *metrics
	deps    toolDeps

	statsMu sync.Mutex
	stats   map[string]*toolStats

	reloadMu sync.Mutex
}

// toolStats are a tool's counters since the replica started; they survive reloads.
type toolStats struct {
	calls, failures, staleAnswers atomic.Int64

	mu sync.Mutex
	// recent holds the last maxRecentOutcomes outcomes, a ring from next.
	recent []string
	next   int
}

// maxRecentOutcomes bounds the outcomes each tool keeps for its health.
const maxRecentOutcomes = 20

// record keeps a call's outcome among the recent ones.
func (s *toolStats) record(outcome string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.recent) < maxRecentOutcomes {
		s.recent = append(s.recent, outcome)
		return
	}
	s.recent[s.next] = outcome
	s.next = (s.next + 1) % maxRecentOutcomes
}

// recentOutcomes returns the recent outcomes, oldest first.
func (s *toolStats) recentOutcomes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.recent))
	out = append(out, s.recent[s.next:]...)
	return append(out, s.recent[:s.next]...)
}

func (t *Tools) statsOf(name string) *toolStats {
	t.statsMu.Lock()
	defer t.statsMu.Unlock()
	s, ok := t.stats[name]
	if !ok {
		s = &toolStats{}
		t.stats[name] = s
	}
	return s
}

// Call runs one tool call.
func (t *Tools) Call(ctx context.Context, req CallRequest) (CallResult, error) {
	reg := t.reg.Load()
	tl, ok := reg.tools[req.Name]
	if !ok {
		return CallResult{}, fmt.Errorf("%w %q (the registry has %s)", ErrUnknownTool, req.Name, reg.toolNames())
	}
	args, canonical, err := parseArguments(req.Arguments, reg.limits)
	if err != nil {
		return CallResult{}, err
	}
	if tl.inputSchema != "" {
		findings, err := t.checker.ValidateValue(ctx, tl.inputSchema, args)
		if err != nil {
			return CallResult{}, fmt.Errorf("tool %s: input schema: %w", tl.cfg.Name, err)
		}
		if len(findings) > 0 {
			return CallResult{}, &argError{Path: findings[0].Path, Reason: findingsText(findings)}
		}
	}
	tl.stats.calls.Add(1)
	t.metrics.calls.WithLabelValues(tl.cfg.Name, tl.cfg.Kind).Inc()
	var res CallResult
	if tl.cfg.Kind == KindAction {
		res, err = t.callAction(ctx, reg, tl, req, []byte(argsText(req.Arguments)), canonical)
	} else {
		res, err = t.callQuery(ctx, reg, tl, req, []byte(argsText(req.Arguments)), canonical)
	}
	t.observe(tl, res, err)
	return res, err
}

// argsText is the arguments as sent to the backend: the caller's text, {} for none.
func argsText(s string) string {
	for _, c := range s {
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return s
		}
	}
	return "{}"
}

// findingsText joins schema findings into one reason.
func findingsText(findings []formatcheck.Finding) string {
	msg := ""
	for i, f := range findings {
		if i > 0 {
			msg += "; "
		}
		msg += f.Message
	}
	return "do not match the tool's input schema: " + msg
}

// callQuery runs a query or external tool: fresh cache, then the gears.
func (t *Tools) callQuery(ctx context.Context, reg *registry, tl *tool, req CallRequest, args, canonical []byte) (CallResult, error) {
	key := staleKey{tenant: req.Tenant, tool: tl.cfg.Name, args: digest(canonical)}
	keep := tl.cfg.Cache.TTL > 0 || tl.cfg.Cache.MaxStaleness > 0
	if tl.cfg.Cache.TTL > 0 {
		if result, stored, ok := t.stale.get(key); ok && t.clock.Since(stored) < tl.cfg.Cache.TTL {
			return CallResult{Result: result, Status: StatusCached, Kind: tl.cfg.Kind, AnsweredBy: tl.cfg.Name}, nil
		}
	}
	tl.budget.Request()
	call := backendCall{args: args, requestID: req.RequestID}
	var attempts []Attempt
	current, retries := tl, 0
	var lastFailure failure
	for {
		res, at, err := t.attempt(ctx, current, call)
		attempts = append(attempts, at)
		if err == nil {
			status := StatusOK
			if current != tl {
				status = StatusBackup
			}
			if keep && !res.isError {
				t.stale.put(key, res.result, t.clock.Now())
			}
			return CallResult{Result: res.result, Status: status, IsError: res.isError, Attempts: attempts, Kind: tl.cfg.Kind, AnsweredBy: current.cfg.Name}, nil
		}
		var ce *callError
		if !errors.As(err, &ce) {
			return CallResult{}, err // the caller's context ended
		}
		lastFailure = ce.failure
		s := situation{
			kind: tl.cfg.Kind, failure: ce.failure, retries: retries, maxRetries: current.cfg.Retry.MaxRetries,
			delay: t.backoff(current.cfg.Retry, retries), left: timeLeft(ctx),
			budget: tl.budget.Allowed(false), backup: current.cfg.Backup != "" && reg.tools[current.cfg.Backup] != nil,
		}
		var staleResult string
		if result, stored, ok := t.stale.get(key); ok && tl.cfg.Cache.MaxStaleness > 0 {
			s.staleAge = t.clock.Since(stored)
			s.stale = s.staleAge <= tl.cfg.Cache.MaxStaleness
			staleResult = result
		}
		switch g := nextGear(s); g {
		case gearRetry:
			if !tl.budget.TryRetry(false) {
				continue // another call took the last retry; the table decides again
			}
			if err := t.wait(ctx, s.delay); err != nil {
				return CallResult{}, err
			}
			retries++
		case gearBackup:
			if ce.failure != failNotCalled && !tl.budget.TryRetry(false) {
				continue
			}
			current, retries = reg.tools[current.cfg.Backup], 0
		case gearStale:
			tl.stats.staleAnswers.Add(1)
			return CallResult{
				Result: staleResult, Status: StatusStale, StaleAge: s.staleAge, Kind: tl.cfg.Kind, AnsweredBy: tl.cfg.Name,
				Notice: staleNotice(s.staleAge), Attempts: attempts,
			}, nil
		default: // gearGiveUp; actions never reach this loop
			if limited := rateLimitedOnly(tl, attempts); limited != nil {
				return CallResult{}, limited
			}
			return CallResult{}, &UnavailableError{Tool: tl.cfg.Name, Attempts: attempts, Cause: fmt.Errorf("last failure: %s", lastFailure)}
		}
	}
}

// rateLimitedOnly is the rate-limit refusal of a call whose every attempt was refused by
// its tool's own rate limit: the caller can wait and call again.
func rateLimitedOnly(tl *tool, attempts []Attempt) *RateLimitedError {
	for _, a := range attempts {
		if a.Outcome != "throttled" {
			return nil
		}
	}
	wait := time.Second
	if r := tl.cfg.RateLimit.PerSecond; r > 0 {
		wait = time.Duration(float64(time.Second) / r)
	}
	return &RateLimitedError{Tool: tl.cfg.Name, RetryAfter: wait}
}

// staleNotice is the sentence a stale result carries.
func staleNotice(age time.Duration) string {
	minutes := int(math.Round(age.Minutes()))
	if minutes < 1 {
		return "may be out of date (less than a minute old)"
	}
	return fmt.Sprintf("may be out of date (%d min old)", minutes)
}

// backoff is retry n's delay: uniform in [d/2, d], d = min(base * multiplier^n, max_delay).
func (t *Tools) backoff(r RetryConfig, n int) time.Duration {
	d := float64(r.Base) * math.Pow(r.Multiplier, float64(n))
	d = min(d, float64(r.MaxDelay))
	return time.Duration(d/2 + t.rand()*d/2)
}

// wait waits d on the clock, or until ctx ends.
func (t *Tools) wait(ctx context.Context, d time.Duration) error {
	timer := t.clock.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.Chan():
		return nil
	}
}

// timeLeft is what remains of ctx's deadline; a long time without one. Deadlines are
// the transport's, on the wall clock, whatever clock runs the backoff.
func timeLeft(ctx context.Context) time.Duration {
	dl, ok := ctx.Deadline()
	if !ok {
		return 24 * time.Hour
	}
	return time.Until(dl)
}

// attempt makes one backend call under the tool's rate limit, breaker, bulkhead and
// timeout, and checks the result against the output schema. Its error is a *callError, or
// ctx's error when the caller went away.
func (t *Tools) attempt(ctx context.Context, tl *tool, c backendCall) (backendResult, Attempt, error) {
	at := Attempt{Tool: tl.cfg.Name}
	notCalled := func(outcome string) (backendResult, Attempt, error) {
		at.Outcome = outcome
		return backendResult{}, at, &callError{failure: failNotCalled, outcome: outcome, err: errors.New(outcome)}
	}
	if err := ctx.Err(); err != nil {
		return backendResult{}, at, err
	}
	if tl.limiter != nil && !tl.limiter.AllowN(t.clock.Now(), 1) {
		return notCalled("throttled")
	}
	permit, ok := tl.breaker.Allow()
	if !ok {
		return notCalled("breaker_open")
	}
	release, ok := tl.bulkhead.TryAcquire()
	if !ok {
		permit.Cancel()
		return notCalled("bulkhead_full")
	}
	defer release()
	callCtx, cancel := context.WithTimeout(ctx, tl.cfg.Timeout)
	defer cancel()
	start := t.clock.Now()
	res, err := tl.backend.call(callCtx, c)
	at.Latency = t.clock.Since(start)
	if err == nil && tl.outputSchema != "" && !res.isError {
		err = t.checkOutput(ctx, tl, res)
	}
	var ce *callError
	switch {
	case err == nil:
		at.Outcome, at.HTTPStatus = "ok", res.httpStatus
		if res.isError {
			at.Outcome = "tool_error"
		}
		// A tool's error answer is the tool working: not a breaker failure.
		permit.Done(false, at.Latency)
		return res, at, nil
	case ctx.Err() != nil:
		// The caller went away: nothing to learn about the tool.
		permit.Abandon()
		at.Outcome = "cancelled"
		return backendResult{}, at, ctx.Err()
	case errors.As(err, &ce):
		at.Outcome, at.HTTPStatus = ce.outcome, ce.httpStatus
		permit.Done(true, at.Latency)
		tl.stats.failures.Add(1)
		return backendResult{}, at, ce
	default:
		permit.Done(true, at.Latency)
		tl.stats.failures.Add(1)
		at.Outcome = "unavailable"
		return backendResult{}, at, &callError{failure: failUnknown, outcome: "unavailable", err: err}
	}
}

// checkOutput validates a result against the tool's output schema. The result is bounded
// by max_result_bytes, and encoding/json bounds its nesting.
func (t *Tools) checkOutput(ctx context.Context, tl *tool, res backendResult) error {
	var value any
	if err := json.Unmarshal([]byte(res.result), &value); err != nil {
		return &callError{failure: failBadResponse, outcome: "bad_response", httpStatus: res.httpStatus, err: err}
	}
	findings, err := t.checker.ValidateValue(ctx, tl.outputSchema, value)
	if err != nil {
		return &callError{failure: failBadResponse, outcome: "bad_response", httpStatus: res.httpStatus, err: err}
	}
	if len(findings) > 0 {
		return &callError{failure: failBadResponse, outcome: "bad_response", httpStatus: res.httpStatus,
			err: errors.New("the result does not match the output schema: " + findings[0].Message)}
	}
	return nil
}

// observe counts a call's outcome.
func (t *Tools) observe(tl *tool, res CallResult, err error) {
	outcome := "error"
	switch {
	case err == nil:
		outcome = statusName(res.Status)
	case errors.As(err, new(*UnavailableError)):
		outcome = "unavailable"
	case errors.As(err, new(*argError)):
		outcome = "invalid_arguments"
	}
	t.metrics.results.WithLabelValues(tl.cfg.Name, tl.cfg.Kind, outcome).Inc()
	recent := outcome
	switch {
	case err == nil && res.IsError:
		recent = "tool_error"
	case errors.As(err, new(*RateLimitedError)):
		recent = "rate_limited"
	}
	tl.stats.record(recent)
	for _, a := range res.Attempts {
		t.metrics.attempts.WithLabelValues(a.Tool, a.Outcome).Inc()
	}
	var ue *UnavailableError
	if errors.As(err, &ue) {
		for _, a := range ue.Attempts {
			t.metrics.attempts.WithLabelValues(a.Tool, a.Outcome).Inc()
		}
	}
}

// statusName is a status as metrics and events name it.
func statusName(s Status) string {
	switch s {
	case StatusOK:
		return "ok"
	case StatusBackup:
		return "backup"
	case StatusStale:
		return "stale"
	case StatusReplayed:
		return "replayed"
	case StatusPendingConfirmation:
		return "pending_confirmation"
	case StatusCached:
		return "cached"
	}
	return "unknown"
}
