package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	quotav1 "github.com/mantle-mesh/mantle/pkg/api/mantle/quota/v1"
	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/pkg/formatcheck"
	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/services/router/internal/resilience"
)

// The attempt loop. One request walks its route's candidates (and the ladder's smaller
// models) until an answer passes verification. Every decision is made from the error class
// of the last attempt, never from a status code:
//
//   - rate limited: the key cools down for the provider's hint; another key of the same
//     model is tried at once, or the hint is waited for when it fits in the budget;
//   - overloaded, transient, error in a 200: retried on the same model with full-jitter
//     backoff, at most retry.max_retries times, then the next candidate;
//   - timeout: the silent key is not tried again for this request;
//   - malformed output, refusal, truncation: the most format-stable candidate is next;
//     a failed business or semantic check: the freshest;
//   - context length exceeded: only a candidate with a larger context window;
//   - bad request, content filter: no other attempt (another model cannot fix the request).
//
// Every attempt after the first draws on the retry budget, except a hedge, which draws on
// the hedge budget, and a failover to another model whose breaker is closed, which adds no
// load to the upstream in trouble (see plan.isFailover); a refused retry ends the loop and
// the request goes down the ladder instead. Breakers, cooldowns and bulkheads decide which keys may be called at all; a
// candidate with none is skipped without a call.

// candidate is one model in a request's plan.
type candidate struct {
	u         *upstream
	level     mantlev1.FallbackLevel
	order     int
	retries   int  // attempts after the first on this candidate
	exhausted bool // no further attempt on it for this request
	deferred  bool // retry it only when no other candidate is left
	lastClass mantlev1.ErrorClass
	retryWait time.Duration // a provider hint to honour before the next attempt
}

// plan is the mutable state of one request's attempt loop. Only the loop's goroutine
// touches it.
type plan struct {
	cands      []*candidate
	current    *candidate
	attempts   int
	prefer     mantlev1.ErrorClass // the class that picks the next candidate
	minContext int                 // > 0 after a context overflow
	avoid      map[*upstreamKey]bool
	lastErr    error
	failed     []string
	denied     bool // the retry budget refused a retry
	// sharedKey names the request to quota's shared retry budget: the key quota counted it
	// under at admission (route.admissionKeyID), whose requests its extra attempts are
	// weighed against. Naming the key of the first attempt instead (the backup's, while the
	// primary's breaker is open) asked a budget that had counted no requests, so past its
	// floor it refused every failover (found by mantle drill, seed-incident).
	sharedKey string
	// last is the candidate of the latest attempt.
	last *candidate
	// breakerScenario keys the breakers this request consults (breakerScenario).
	breakerScenario string
}

func (r *Router) newPlan(rt *route, scenario string) *plan {
	p := &plan{avoid: map[*upstreamKey]bool{}, sharedKey: rt.admissionKeyID(), breakerScenario: r.breakerScenario(rt, scenario)}
	for i, u := range rt.candidates {
		p.cands = append(p.cands, &candidate{u: u, level: levelOf(i), order: len(p.cands)})
	}
	for _, u := range rt.smaller {
		p.cands = append(p.cands, &candidate{u: u, level: mantlev1.FallbackLevel_FALLBACK_LEVEL_BACKUP_MODEL, order: len(p.cands)})
	}
	return p
}

// budgetKey is the key whose own retry budget pays for an extra attempt on key of c, or
// nil when only the overall budget does. A retry on the model that just failed adds load
// to that model, so the key it goes to pays, and a key in trouble refuses a retry storm on
// itself. A failover to another model adds no load to the failing one, and the overall
// budget bounds the amplification. (mantle drill found both other choices wrong:
// charged to the key they go to, failovers emptied a backup's budget, which counts only
// the requests that start on it; charged to the failing key, they emptied the primary's,
// which counts few requests while its breaker is open, and its half-open probes' slow
// calls went down the ladder.)
func (p *plan) budgetKey(c *candidate, key *upstreamKey) *upstreamKey {
	if c == p.last {
		return key
	}
	return nil
}

// isFailover reports whether an attempt on c, admitted by permit, is a failover to a
// healthy upstream: another model than the last attempt's, whose breaker is closed. Such an
// attempt needs no retry budget. The budget exists to keep retries from multiplying the
// load on an upstream in trouble; a failover adds no load to the failing upstream, and the
// one it goes to is healthy by its breaker's account. What bounds it is the failing
// upstream's breaker (a request fails over only until it opens, after which requests go
// to the fallback first), the route's length and the fallback's bulkhead. At low traffic
// a budget of a share of requests refused exactly these failovers: with most requests
// failing over, the failovers were most of the traffic. Retries on the same model, and
// attempts that probe or scout a breaker that is not closed, still ask the budget.
func (p *plan) isFailover(c *candidate, permit resilience.Permit) bool {
	return p.last != nil && c != p.last && c.u != p.last.u && !permit.Trial()
}

// next picks the candidate for the next attempt: the current one while it may be retried,
// otherwise the best remaining one for the failure class that ended the current one.
func (p *plan) next() *candidate {
	if c := p.current; c != nil && !c.exhausted {
		return c
	}
	var best *candidate
	for _, c := range p.cands {
		if c.exhausted || (p.minContext > 0 && c.u.model.ContextWindow < p.minContext) {
			continue
		}
		if best == nil || (best.deferred && !c.deferred) || (best.deferred == c.deferred && p.better(c, best)) {
			best = c
		}
	}
	if best != nil {
		best.deferred = false
	}
	p.current = best
	return best
}

func (p *plan) better(c, than *candidate) bool {
	switch {
	case isFormatClass(p.prefer) && c.u.model.FormatStability != than.u.model.FormatStability:
		return c.u.model.FormatStability > than.u.model.FormatStability
	case p.prefer == mantlev1.ErrorClass_ERROR_CLASS_VERIFICATION_FAILED && c.u.model.Freshness != than.u.model.Freshness:
		return c.u.model.Freshness > than.u.model.Freshness
	}
	return c.order < than.order
}

func isFormatClass(c mantlev1.ErrorClass) bool {
	switch c {
	case mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT, mantlev1.ErrorClass_ERROR_CLASS_REFUSAL, mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED:
		return true
	}
	return false
}

// outcome is the result of one provider attempt and, for unary answers, its verification.
// It is built without touching the request's QualityContext, so hedged attempts can run
// concurrently; the loop applies it.
type outcome struct {
	c         *candidate
	key       *upstreamKey
	res       provider.Response
	att       *mantlev1.Attempt
	audit     []*mantlev1.AuditStep
	verdict   *verifierv1.VerifyResponse // nil when the answer was not verified
	committed bool                       // part of a stream reached the caller
	streamed  bool                       // verified after the caller has the answer
	// held are the pieces of a streamed answer that is only tool calls, kept from the
	// caller until it is checked; verified: it was, before the caller got it.
	held     []Delta
	verified bool
	err      error // the provider's or the verifier's rejection
	// raced: a hedge that answered while the route's first choice, which had not
	// failed, was still working on it. Such an answer is not degraded.
	raced bool
}

// attempt runs the loop and returns the first acceptable answer. promptTokens is the
// prompt's size as quota counted it (0 when unknown): models whose context window cannot
// hold it are not tried.
func (r *Router) attempt(ctx context.Context, req *routerv1.Request, rt *route, qc *mantlev1.QualityContext, sink Sink, promptTokens int64) (*answer, error) {
	p := r.newPlan(rt, qc.Scenario)
	r.budget.Request()
	if sink == nil && rt.hedge.Enabled {
		// Only requests that may be hedged count, so the ratio is the share of those.
		r.hedgeBudget.Request()
	}
	preq := providerRequest(req, qc)
	r.skipUnable(qc, p, req, preq)
	if err := r.skipSmallWindows(qc, p, rt, promptTokens, int64(req.MaxTokens)); err != nil {
		return nil, err
	}
	for ctx.Err() == nil {
		c := p.next()
		if c == nil {
			break
		}
		remaining := qc.Deadline.AsTime().Sub(r.deps.Clock.Now()) - r.conf().HopReserve
		if remaining <= 0 {
			break
		}
		// Wait (for the provider's hint, or the backoff) before taking a key: the key that
		// asked us to wait cools down until then and would be refused, and a breaker permit
		// or bulkhead place held through the wait would be kept from other requests.
		if wait := r.waitBefore(c); p.attempts > 0 && wait > 0 {
			if !r.budget.Allowed(isFormatClass(p.prefer)) {
				r.denyRetry(qc, p) // do not wait for a retry that will be refused
				break
			}
			if wait >= remaining {
				c.exhausted = true
				continue
			}
			slept := r.deps.Clock.Now()
			woke := r.sleep(ctx, wait)
			addWait(qc, r.deps.Clock.Since(slept))
			if !woke {
				c.exhausted = true
				continue
			}
			remaining = qc.Deadline.AsTime().Sub(r.deps.Clock.Now()) - r.conf().HopReserve
		}
		key, permit, skip := r.acquire(c.u, p.breakerScenario, p.avoid)
		if key == nil {
			r.skipCandidate(qc, p, c, skip)
			continue
		}
		if permit.Scout() && r.conf().SideScouts && p.hasOther(c) {
			r.sideScout(rt, c, key, permit, preq, qc)
			continue
		}
		release, ok := c.u.bulkhead.TryAcquire()
		if !ok {
			permit.Cancel()
			r.skipCandidate(qc, p, c, mantlev1.ErrorClass_ERROR_CLASS_BULKHEAD_FULL)
			continue
		}
		// A key whose typical answer takes longer than what is left will not make it; a
		// faster candidate (or the ladder) might.
		if p50 := key.stats.snapshot().p50; p50 > 0 && remaining < p50 {
			permit.Cancel()
			release()
			r.skipCandidate(qc, p, c, mantlev1.ErrorClass_ERROR_CLASS_BUDGET_EXHAUSTED)
			continue
		}
		if p.attempts > 0 && !p.isFailover(c, permit) && !r.allowRetry(ctx, qc, p.budgetKey(c, key), p.sharedKey, isFormatClass(p.prefer)) {
			permit.Cancel()
			release()
			r.denyRetry(qc, p)
			break
		}
		if p.attempts > 0 {
			// p.prefer is the class of the failure this attempt answers.
			r.deps.Metrics.retries.WithLabelValues(c.u.model.Name, shortClass(p.prefer)).Inc()
		}
		if p.attempts == 0 {
			key.budget.Request()
		}
		p.attempts++
		p.last = c
		var o outcome
		if sink == nil && p.attempts == 1 && rt.hedge.Enabled {
			o = r.hedged(ctx, req, rt, qc, p, c, key, permit, preq)
		} else {
			o = r.try(ctx, req, rt, qc, c, key, permit, preq, sink, false)
		}
		release()
		if o.err == nil {
			return r.accept(ctx, req, rt, qc, o, sink, ""), nil
		}
		class := provider.ClassOf(o.err)
		p.lastErr = o.err
		p.failed = append(p.failed, o.c.u.model.Name)
		qc.DegradationReason = fmt.Sprintf("%s failed: %s", o.c.u.model.Name, shortClass(class))
		if o.verdict.GetDegrade() {
			qc.DegradationReason = reasonRuleDegrade
			break
		}
		if o.committed || ctx.Err() != nil {
			// Part of the answer is with the caller: another model cannot take over without
			// a prefill-capable fallback (see continueStream); a cut answer is never a success.
			if o.committed && ctx.Err() == nil {
				return r.continueStream(ctx, req, rt, qc, p, o, sink)
			}
			break
		}
		if !failsOver(class) {
			return nil, &rejectedError{class: class, cause: o.err}
		}
		r.afterFailure(p, o)
	}
	return nil, r.exhausted(ctx, qc, p)
}

// failsOver reports whether another candidate may succeed where this attempt failed. A
// failed business or semantic check is the verifier's verdict on one model's answer, not a
// provider failure (pkg/provider does not know the class): a fresher model may pass it.
func failsOver(class mantlev1.ErrorClass) bool {
	return class == mantlev1.ErrorClass_ERROR_CLASS_VERIFICATION_FAILED || provider.FailsOver(class)
}

// accept makes o's answer the request's. A streamed answer is verified now that the caller
// has it: the verdict annotates it and keeps a failed one out of the cache. prefix is the
// part of a streamed answer that an earlier model sent before it broke.
func (r *Router) accept(ctx context.Context, req *routerv1.Request, rt *route, qc *mantlev1.QualityContext, o outcome, sink Sink, prefix string) *answer {
	o.res.Content = prefix + o.res.Content
	verdict := o.verdict
	if sink != nil && !o.verified {
		v, audit, _ := r.verify(ctx, req, qc, o.c.answerer(), &o.res, nil)
		qc.Audit = append(qc.Audit, audit...)
		applyVerdict(qc, v)
		verdict = v
	}
	qc.CurrentModel, qc.CurrentProvider = o.c.u.model.Name, o.c.u.provider
	qc.FallbackLevel = o.c.level
	// The level says which model answered; degraded says whether that is because
	// something failed. A hedge that won a race against a healthy first choice is not.
	degraded := o.c.level != mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY && !o.raced
	if degraded {
		if qc.DegradationReason == "" {
			qc.DegradationReason = "primary unavailable"
		}
		// The route's notice goes with any degraded answer, before a business rule's notice.
		qc.UserNotice = strings.TrimSpace(rt.ladder.Notice + " " + qc.UserNotice)
	} else if o.raced {
		r.audit(qc, "hedge", fmt.Sprintf("%s answered first; %s had not failed: not degraded", o.c.u.model.Name, qc.Attempts[0].GetModel()), 0)
	}
	return &answer{Response: o.res, model: o.c.u.model.Name, verdict: verdict, degraded: degraded}
}

// exhausted explains why the loop ended without an answer.
func (r *Router) exhausted(ctx context.Context, qc *mantlev1.QualityContext, p *plan) error {
	class := provider.ClassOf(p.lastErr)
	switch {
	case errors.Is(ctx.Err(), context.Canceled):
		class = mantlev1.ErrorClass_ERROR_CLASS_CANCELED
	case ctx.Err() != nil, qc.Deadline.AsTime().Sub(r.deps.Clock.Now()) <= r.conf().HopReserve:
		class = mantlev1.ErrorClass_ERROR_CLASS_BUDGET_EXHAUSTED
	case p.lastErr == nil:
		// Nothing was called: every candidate was skipped (breakers open, bulkheads full).
		class = mantlev1.ErrorClass_ERROR_CLASS_BREAKER_OPEN
	}
	// A refused retry keeps the last attempt's class: BUDGET_EXHAUSTED means the caller's
	// deadline, and a spent retry budget must not be reported as one.
	e := &exhaustedError{class: class, cause: p.lastErr, tried: p.failed, retryDenied: p.denied}
	if ctx.Err() == nil && class != mantlev1.ErrorClass_ERROR_CLASS_BUDGET_EXHAUSTED {
		e.throttledFor, e.throttled = p.throttledFor()
	}
	return e
}

// throttledFor reports whether every candidate of the plan ended on its keys' rate limits
// (a 429, or every key cooling down from one), and if so the soonest any of their keys is
// free again: the caller is then told to come back (429 and Retry-After), not that the
// providers failed. A candidate that ended any other way (an error, an open breaker, a
// full bulkhead, never tried) makes it an ordinary failure.
func (p *plan) throttledFor() (time.Duration, bool) {
	soonest := time.Duration(0)
	for _, c := range p.cands {
		if c.lastClass != mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED {
			return 0, false
		}
		for _, key := range c.u.keys {
			if d := key.cooldown.Remaining(); soonest == 0 || d < soonest {
				soonest = d
			}
		}
	}
	return soonest, len(p.cands) > 0
}

// afterFailure updates the plan from a failed attempt's class.
func (r *Router) afterFailure(p *plan, o outcome) {
	c, class := o.c, provider.ClassOf(o.err)
	c.lastClass = class
	c.retryWait = 0
	p.prefer = class
	retryable := func() {
		c.retries++
		if c.retries > r.conf().Retry.MaxRetries {
			c.exhausted = true
		}
	}
	switch class {
	case mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED:
		// The key cools down (in try); another key of this model may answer at once. With
		// none, wait for the hint if it is short enough, else move on.
		retryable()
		if !r.hasUsableKey(c.u, p.avoid) {
			hint := retryAfter(o.err)
			if hint <= 0 || hint > r.conf().Retry.MaxRetryAfter {
				c.exhausted = true
			}
			c.retryWait = hint
		}
	case mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT, mantlev1.ErrorClass_ERROR_CLASS_AUTH:
		// A key that did not answer in its share of the budget, or refused our credentials,
		// is not asked again in this request.
		p.avoid[o.key] = true
		retryable()
		if !r.hasUsableKey(c.u, p.avoid) {
			c.exhausted = true
		}
	case mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED:
		// An overloaded provider is not helped by another request from us: fail over at once,
		// and come back to it (with backoff) only when nothing else is left.
		retryable()
		c.deferred = true
		p.current = nil
	case mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT, mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR, mantlev1.ErrorClass_ERROR_CLASS_UNKNOWN:
		// A one-off failure: the same model, after a backoff, is the best next try.
		retryable()
	case mantlev1.ErrorClass_ERROR_CLASS_CONTEXT_LENGTH_EXCEEDED:
		c.exhausted = true
		p.minContext = max(p.minContext, c.u.model.ContextWindow+1)
	default:
		// Format, refusal, truncation and verification failures: this model gave its answer;
		// another model is asked (chosen by p.prefer).
		c.exhausted = true
	}
}

// waitBefore is how long to wait before retrying c: the provider's hint when it gave one,
// otherwise full-jitter exponential backoff; nothing when moving to another candidate.
func (r *Router) waitBefore(c *candidate) time.Duration {
	if c.retries == 0 {
		return 0
	}
	if c.retryWait > 0 {
		return c.retryWait
	}
	if c.lastClass == mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED || c.lastClass == mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT {
		return 0 // another key is free
	}
	return resilience.Backoff(c.retries-1, r.conf().Retry.BackoffBase, r.conf().Retry.BackoffCap, r.deps.Rand)
}

// sleep waits d on the injected clock; false when ctx ended first.
func (r *Router) sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-r.deps.Clock.After(d):
		return true
	case <-ctx.Done():
		return false
	}
}

// denyRetry ends the loop because the retry budget refused the next attempt; the request
// goes down the ladder.
func (r *Router) denyRetry(qc *mantlev1.QualityContext, p *plan) {
	p.denied = true
	r.deps.Metrics.budgetDenied.Inc()
	r.audit(qc, "retry", "retry budget exhausted: going down the ladder", 0)
}

// allowRetry asks this replica's overall retry budget and key's (when key is not nil, see
// plan.budgetKey), then the quota service's shared one under sharedKeyID, so the budget
// holds across router replicas. When quota cannot be reached the local budgets decide
// alone.
func (r *Router) allowRetry(ctx context.Context, qc *mantlev1.QualityContext, key *upstreamKey, sharedKeyID string, format bool) bool {
	if !r.budget.Allowed(format) || (key != nil && !key.budget.Allowed(format)) {
		return false
	}
	if !r.budget.TryRetry(format) {
		return false
	}
	if key != nil && !key.budget.TryRetry(format) {
		return false
	}
	if r.deps.Quota == nil {
		return true // no shared budget: the local ones decided
	}
	ctx, cancel := context.WithTimeout(ctx, sideCallTimeout)
	defer cancel()
	res, err := r.deps.Quota.AcquireRetry(ctx, &quotav1.AcquireRetryRequest{
		Quality: &mantlev1.QualityContext{RequestId: qc.RequestId, Tenant: qc.Tenant}, UpstreamKeyId: sharedKeyID, FormatRetry: format,
	})
	if err != nil {
		r.deps.Log.DebugContext(ctx, "shared retry budget unavailable; the local budget decided", "err", err)
		return true
	}
	return res.Granted
}

// sideCallTimeout bounds calls that only inform another service (rate-limit headers,
// retry budget): they must never hold a request up for long.
const sideCallTimeout = 100 * time.Millisecond

// observe passes a provider's rate-limit headers to quota, which slows admissions down
// before the provider starts returning 429s.
func (r *Router) observe(ctx context.Context, tenant string, key *upstreamKey, rl provider.RateLimit) {
	if !rl.Known || r.deps.Quota == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sideCallTimeout)
	defer cancel()
	_, err := r.deps.Quota.ObserveUpstream(ctx, &quotav1.ObserveUpstreamRequest{
		Quality:           &mantlev1.QualityContext{Tenant: tenant},
		UpstreamKeyId:     key.id,
		RemainingRequests: rl.RemainingRequests,
		RemainingTokens:   rl.RemainingTokens,
		ResetRequests:     durationpb.New(rl.ResetRequests),
		ResetTokens:       durationpb.New(rl.ResetTokens),
	})
	if err != nil {
		r.deps.Log.DebugContext(ctx, "rate-limit headers not passed to quota", "err", err)
	}
}

func retryAfter(err error) time.Duration {
	var pe *provider.Error
	if errors.As(err, &pe) {
		return pe.RetryAfter
	}
	return 0
}

// skipCandidate records a candidate that could not be called at all.
func (r *Router) skipCandidate(qc *mantlev1.QualityContext, p *plan, c *candidate, class mantlev1.ErrorClass) {
	c.exhausted = true
	c.lastClass = class
	r.deps.Metrics.attempts.WithLabelValues(c.u.model.Name, shortClass(class)).Inc()
	r.audit(qc, "skip", fmt.Sprintf("%s: %s", c.u.model.Name, shortClass(class)), 0)
	if p.lastErr == nil || provider.ClassOf(p.lastErr) == mantlev1.ErrorClass_ERROR_CLASS_BREAKER_OPEN {
		p.lastErr = &provider.Error{Class: class, Message: c.u.model.Name + " skipped"}
	}
}

// try makes one attempt: the provider call, the breaker and cooldown bookkeeping, and for
// unary answers the verification. It does not touch qc (hedges run concurrently); the
// caller applies the outcome with record.
func (r *Router) try(ctx context.Context, req *routerv1.Request, rt *route, qc *mantlev1.QualityContext, c *candidate, key *upstreamKey, permit resilience.Permit, preq provider.Request, sink Sink, hedged bool) outcome {
	o := r.run(ctx, req, rt, qc, c, key, permit, preq, sink, hedged)
	r.record(qc, o)
	return o
}

// run is try without recording, safe to call concurrently for hedges.
func (r *Router) run(ctx context.Context, req *routerv1.Request, rt *route, qc *mantlev1.QualityContext, c *candidate, key *upstreamKey, permit resilience.Permit, preq provider.Request, sink Sink, hedged bool) outcome {
	actx, span := r.startAttempt(ctx, qc, c, key, hedged)
	o := r.call(actx, rt, c, key, permit, preq, sink, hedged, qc.Tenant)
	defer func() { r.endAttempt(span, o) }() // after verification: its verdict is the attempt's outcome
	o.streamed = sink != nil
	if o.err == nil && sink != nil && len(o.held) > 0 {
		// An answer that is only tool calls was held back whole: it is checked like a unary
		// answer before the caller gets any of it, so a bad call fails over instead.
		o.verdict, o.audit, o.err = r.verify(ctx, req, qc, c.answerer(), &o.res, o.audit)
		if o.err != nil {
			o.att.ErrorClass = provider.ClassOf(o.err)
			o.att.ErrorMessage = o.err.Error()
			return o
		}
		o.verified = true
		for _, d := range o.held {
			if err := sink(d); err != nil {
				o.err = err
				o.att.ErrorClass, o.att.ErrorMessage = provider.ClassOf(err), err.Error()
				break
			}
		}
		o.committed = true
	}
	if o.err == nil && sink == nil {
		o.verdict, o.audit, o.err = r.verify(ctx, req, qc, c.answerer(), &o.res, o.audit)
		if o.err != nil {
			o.att.ErrorClass = provider.ClassOf(o.err)
			o.att.ErrorMessage = o.err.Error()
		}
	}
	return o
}

// hedged runs the first attempt and, when it has not answered after the hedge delay (the
// key's live p95, bounded by the route), a second attempt on the best other candidate. The
// first answer that passes verification wins and the other is cancelled; both attempts are
// recorded. The hedge draws on the hedge budget (hedgeCandidate).
func (r *Router) hedged(ctx context.Context, req *routerv1.Request, rt *route, qc *mantlev1.QualityContext, p *plan, c *candidate, key *upstreamKey, permit resilience.Permit, preq provider.Request) outcome {
	results := make(chan outcome, 2)
	primaryCtx, cancelPrimary := context.WithCancel(ctx)
	defer cancelPrimary()
	go func() { results <- r.run(primaryCtx, req, rt, qc, c, key, permit, preq, nil, false) }()

	timer := r.deps.Clock.NewTimer(r.hedgeDelay(rt, key))
	defer timer.Stop()
	running, cancelHedge := 1, context.CancelFunc(func() {})
	defer func() { cancelHedge() }() // the hedge's cancel is only known once it starts
	select {
	case o := <-results:
		r.record(qc, o)
		return o
	case <-timer.Chan():
		if h, hkey, hpermit, release, ok := r.hedgeCandidate(qc, p, c); ok {
			defer release()
			p.attempts++
			r.deps.Metrics.hedges.Inc()
			hctx, cancel := context.WithCancel(ctx)
			cancelHedge = cancel
			go func() { results <- r.run(hctx, req, rt, qc, h, hkey, hpermit, preq, nil, true) }()
			running++
		}
	case <-ctx.Done():
	}
	// Outcomes are recorded only once neither attempt runs: a running attempt's verification
	// reads qc. The first answer wins and the other attempt is cancelled (it ends promptly).
	var failed []outcome
	var won *outcome
	for ; running > 0; running-- {
		o := <-results
		if o.err == nil && won == nil {
			won = &o
			cancelPrimary()
			cancelHedge()
			continue
		}
		failed = append(failed, o)
	}
	for _, o := range failed {
		r.record(qc, o)
	}
	if won != nil {
		r.record(qc, *won) // last, so that qc keeps the answer's verdict
		// The hedge won a race, and nothing failed, when the first choice was the route's
		// primary and its attempt ended only because the hedge's answer made it moot.
		won.raced = won.att.Hedged && c.level == mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY && allCanceled(failed)
		return *won
	}
	// Both failed: the plan learns from each; the caller applies the last one.
	for _, o := range failed[:len(failed)-1] {
		p.failed = append(p.failed, o.c.u.model.Name)
		r.afterFailure(p, o)
	}
	return failed[len(failed)-1]
}

// allCanceled reports whether every outcome ended because it was cancelled.
func allCanceled(os []outcome) bool {
	for _, o := range os {
		if provider.ClassOf(o.err) != mantlev1.ErrorClass_ERROR_CLASS_CANCELED {
			return false
		}
	}
	return true
}

// extraAttempt reserves what an attempt beyond the plan's own needs on c: a key its
// breaker admits, a bulkhead place and, last, the consent of the budget that pays for it
// (allow, which spends when it consents). When c cannot take one, ok is false; when the
// budget refused, denied is true and no other candidate will do.
func (r *Router) extraAttempt(qc *mantlev1.QualityContext, p *plan, c *candidate, allow func(key *upstreamKey) bool) (key *upstreamKey, permit resilience.Permit, release func(), ok, denied bool) {
	key, permit, _ = r.acquire(c.u, p.breakerScenario, p.avoid)
	if key == nil {
		return nil, permit, nil, false, false
	}
	release, ok = c.u.bulkhead.TryAcquire()
	if !ok {
		permit.Cancel()
		return nil, permit, nil, false, false
	}
	if !allow(key) {
		permit.Cancel()
		release()
		return nil, permit, nil, false, true
	}
	return key, permit, release, true, false
}

// hedgeCandidate reserves a key and a bulkhead slot on the best other candidate, if the
// hedge budget allows one. Hedges ask only this replica's hedge budget, never the retry
// budgets (here or shared in quota): those stay for failovers after real failures. Each
// replica's hedges are a share of its own requests, so the ratio holds mesh-wide too.
func (r *Router) hedgeCandidate(qc *mantlev1.QualityContext, p *plan, primary *candidate) (*candidate, *upstreamKey, resilience.Permit, func(), bool) {
	// Asked before any key is acquired, so a refusal takes no half-open probe place;
	// extraAttempt spends it last. Refusals are not audited (the first attempt is running
	// and reads qc): the metric is their trace.
	if !r.hedgeBudget.Allowed(false) {
		r.deps.Metrics.hedgeBudgetDenied.Inc()
		return nil, nil, resilience.Permit{}, nil, false
	}
	spend := func(*upstreamKey) bool { return r.hedgeBudget.TryRetry(false) }
	for _, c := range p.cands {
		if c == primary || c.exhausted {
			continue
		}
		key, permit, release, ok, denied := r.extraAttempt(qc, p, c, spend)
		if denied {
			r.deps.Metrics.hedgeBudgetDenied.Inc()
			break
		}
		if ok {
			return c, key, permit, release, true
		}
	}
	return nil, nil, resilience.Permit{}, nil, false
}

// hedgeDelay is the key's live p95, bounded by the route's limits.
func (r *Router) hedgeDelay(rt *route, key *upstreamKey) time.Duration {
	lo, hi := rt.hedge.MinDelay, rt.hedge.MaxDelay
	if lo <= 0 {
		lo = 200 * time.Millisecond
	}
	if hi <= 0 {
		hi = 3 * time.Second
	}
	p95 := key.stats.snapshot().p95
	if p95 == 0 {
		return hi
	}
	return min(max(p95, lo), hi)
}

// call makes the provider call and keeps the breaker, cooldown and statistics of the key.
func (r *Router) call(ctx context.Context, rt *route, c *candidate, key *upstreamKey, permit resilience.Permit, preq provider.Request, sink Sink, hedged bool, tenant string) outcome {
	u := c.u
	preq.Model = u.upstreamModel()
	remaining := max(time.Until(deadlineOf(ctx))-r.conf().HopReserve, time.Millisecond)
	// The per-try timeout bounds a unary call. A stream is bounded by it only until its first
	// token (see stream): a healthy long answer must not be cut, and the stall limit guards
	// the rest.
	limit := min(u.timeout, remaining)
	if sink != nil {
		limit = remaining
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	start := r.deps.Clock.Now()
	o := outcome{c: c, key: key, att: &mantlev1.Attempt{
		Model: u.model.Name, Provider: u.provider, KeyId: key.id, StartedAt: timestamppb.New(start), Hedged: hedged,
	}}
	key.stats.start()
	if sink == nil {
		o.res, o.err = key.client.Complete(ctx, preq)
	} else {
		hold := &toolHold{next: sink}
		o.res, o.committed, o.err = r.stream(ctx, rt, c, key, preq, hold.sink, o.att, start)
		if !hold.passing {
			// Only tool calls so far, and the caller has none of them: not committed.
			o.committed, o.held = false, hold.held
		}
	}
	r.finishCall(ctx, &o, permit, start, hedged, tenant)
	return o
}

// finishCall books a provider call that ended: the key's statistics, cooldown and
// breaker, the attempt's record, metrics and audit step.
func (r *Router) finishCall(ctx context.Context, o *outcome, permit resilience.Permit, start time.Time, hedged bool, tenant string) {
	u, key := o.c.u, o.key
	latency := r.deps.Clock.Since(start)
	class := provider.ClassOf(o.err)
	key.stats.finish(latency, o.err != nil)
	r.observe(ctx, tenant, key, o.res.RateLimit)
	switch {
	case class == mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED:
		// A 429 is the key's quota, not the provider's health: cool the key, spare the breaker.
		hint := retryAfter(o.err)
		if hint <= 0 {
			hint = r.conf().Retry.BackoffCap
		}
		key.cooldown.Set(hint)
		permit.Abandon() // it reached the provider: a half-open place stays spent
	case class == mantlev1.ErrorClass_ERROR_CLASS_CANCELED, o.err != nil && errors.Is(ctx.Err(), context.Canceled):
		// The call was sent and then we stopped listening: a hedge that lost, or a caller
		// that went away (mid-stream the error is the caller's, not the provider's). No
		// verdict on the provider, but the call did reach it, so a probe stays spent: Cancel
		// would let the next request probe again (mantle drill: 4-9 calls per half-open
		// period reached a recovering primary with hedging on; the cap is 3).
		permit.Abandon()
	default:
		permit.Done(breakerFailure(class), latency)
	}
	o.att.Latency = durationpb.New(latency)
	o.att.ErrorClass = class
	o.att.Usage = usageProto(o.res.Usage)
	o.att.ProviderRequestId = o.res.RequestID
	if o.err != nil {
		o.att.ErrorMessage = o.err.Error()
		var pe *provider.Error
		if errors.As(o.err, &pe) && pe.RequestID != "" {
			o.att.ProviderRequestId = pe.RequestID
		}
	}
	r.deps.Metrics.providerLatency.WithLabelValues(u.model.Name, shortClass(class)).Observe(latency.Seconds())
	o.audit = append(o.audit, r.step("attempt", fmt.Sprintf("%s/%s key=%s class=%s%s", u.provider, u.model.Name, key.id, shortClass(class), hedgeNote(hedged)), latency))
}

func hedgeNote(hedged bool) string {
	if hedged {
		return " (hedge)"
	}
	return ""
}

// breakerFailure says which classes count against a provider's health. Request problems
// (bad request, context length, content filter) and answers that failed our own checks do
// not: the provider answered.
func breakerFailure(c mantlev1.ErrorClass) bool {
	switch c {
	case mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT,
		mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT, mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR,
		mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT, mantlev1.ErrorClass_ERROR_CLASS_UNKNOWN,
		mantlev1.ErrorClass_ERROR_CLASS_AUTH:
		return true
	}
	return false
}

func deadlineOf(ctx context.Context) time.Time {
	if dl, ok := ctx.Deadline(); ok {
		return dl
	}
	return time.Now().Add(time.Hour)
}

// record applies an outcome to the request's QualityContext.
func (r *Router) record(qc *mantlev1.QualityContext, o outcome) {
	o.att.Number = int32(len(qc.Attempts) + 1)
	qc.Attempts = append(qc.Attempts, o.att)
	if len(qc.Attempts) > 1 {
		qc.RetryCount++
	}
	r.addUsage(qc, o.c.u, o.res.Usage)
	qc.Audit = append(qc.Audit, o.audit...)
	if o.verdict != nil || (o.err == nil && !o.streamed) {
		applyVerdict(qc, o.verdict)
	}
	r.deps.Metrics.attempts.WithLabelValues(o.c.u.model.Name, shortClass(o.att.ErrorClass)).Inc()
}

// applyVerdict records the verifier's verdict on the answer going out; nil means nobody
// could check it, and an earlier candidate's verdict must not stick to it.
func applyVerdict(qc *mantlev1.QualityContext, v *verifierv1.VerifyResponse) {
	if v == nil {
		qc.Verification, qc.QualityGrade, qc.RiskScore = nil, mantlev1.QualityGrade_QUALITY_GRADE_UNSPECIFIED, 0
		if !slices.Contains(qc.SkippedSteps, "verify") {
			qc.SkippedSteps = append(qc.SkippedSteps, "verify")
		}
		return
	}
	qc.Verification = v.GetQuality().GetVerification()
	if qc.Verification == nil {
		qc.Verification = &mantlev1.Verification{L1Passed: v.Passed, FailureClass: v.FailureClass}
	}
	qc.QualityGrade, qc.RiskScore = v.Grade, v.RiskScore
	if v.Passed && v.UserNotice != "" {
		// A business rule's notice for the user (for example "this is not medical advice").
		qc.UserNotice = strings.TrimSpace(qc.UserNotice + " " + v.UserNotice)
	}
}

// answerer is who gave an answer being verified: a candidate's model, or the cache.
type answerer struct {
	model, provider string
	// level is the ladder level the answer would go out at.
	level mantlev1.FallbackLevel
	// cached: the answer comes from the cache (stale: past its time to live).
	cached, stale bool
}

func (c *candidate) answerer() answerer {
	return answerer{model: c.u.model.Name, provider: c.u.provider, level: c.level}
}

// verify asks the verifier about res. A verifier that cannot be reached does not fail the
// request: the router runs L1 itself (deps.Checker, the library the verifier serves L1
// from), so a malformed answer still fails over, and an answer that passes goes out
// unverified and says so (verdict nil): L2 rules and L3 did not run.
func (r *Router) verify(ctx context.Context, req *routerv1.Request, qc *mantlev1.QualityContext, who answerer, res *provider.Response, audit []*mantlev1.AuditStep) (*verifierv1.VerifyResponse, []*mantlev1.AuditStep, error) {
	start := r.deps.Clock.Now()
	if r.deps.Verifier == nil {
		audit, err := r.checkLocally(ctx, req, who.level, res, audit, "verifier off", start)
		return nil, audit, err
	}
	hop, cancel := r.hopContext(ctx)
	defer cancel()
	// The verifier reads the QualityContext as it is now; a clone keeps concurrent hedges
	// from racing on the request's copy.
	snapshot := hopQuality(qc)
	// The verifier judges a fallback model by that model's own thresholds: tell it the
	// level this answer would go out at, and which model gave it.
	snapshot.FallbackLevel, snapshot.CurrentModel, snapshot.CurrentProvider = who.level, who.model, who.provider
	// The verifier knows a cached answer by cache_hit (it was checked in depth when first
	// given, so L3 does not run again); its rules run all the same.
	snapshot.CacheHit, snapshot.CacheStale = who.cached, who.stale
	v, err := r.deps.Verifier.Verify(hop, &verifierv1.VerifyRequest{
		Quality:        snapshot,
		Messages:       req.Messages,
		Content:        res.Content,
		FinishReason:   res.FinishReason,
		ResponseFormat: req.ResponseFormat,
		ToolCalls:      toolCallsProto(res.ToolCalls),
		Tools:          req.Tools,
		// tool_choice none forbids calls, required and function demand one: L1 checks it.
		ToolChoice:         req.ToolChoice,
		ToolChoiceFunction: req.ToolChoiceFunction,
		Model:              who.model,
		SessionId:          req.User,
	})
	if status.Code(err) == codes.InvalidArgument {
		// The verifier refuses to judge this answer (an oversized answer, or a schema the
		// router's own compile accepted under other limits): that is no outage, and the
		// answer must not go out unverified with rules and review skipped.
		audit = append(audit, r.step("verify", "refused by the verifier: "+status.Convert(err).Message(), r.deps.Clock.Since(start)))
		return nil, audit, &provider.Error{Class: mantlev1.ErrorClass_ERROR_CLASS_VERIFICATION_FAILED, Message: "the verifier refused the answer: " + status.Convert(err).Message()}
	}
	if err != nil {
		r.deps.Log.WarnContext(ctx, "verifier unavailable; checking L1 in the router", "err", err)
		audit, err := r.checkLocally(ctx, req, who.level, res, audit, "verifier unavailable ("+status.Code(err).String()+")", start)
		return nil, audit, err
	}
	audit = append(audit, addedSteps(snapshot, v.GetQuality())...)
	audit = append(audit, r.step("verify", fmt.Sprintf("passed=%t grade=%s", v.Passed, shortGrade(v.Grade)), r.deps.Clock.Since(start)))
	if v.Degrade {
		// A business rule says this kind of answer must not come from a model now: no other
		// candidate is asked, the ladder answers.
		return v, audit, &provider.Error{Class: mantlev1.ErrorClass_ERROR_CLASS_VERIFICATION_FAILED, Message: "a business rule asks to degrade: " + findingCodes(v.Findings)}
	}
	if !v.Passed {
		return v, audit, &provider.Error{Class: v.FailureClass, Message: "verification failed: " + findingCodes(v.Findings)}
	}
	res.Content = v.Content
	return v, audit, nil
}

// checkLocally runs the L1 format checks in the router, for an answer the verifier does
// not see (why says why, for the audit). An answer that fails them is an error like a
// failed verification; without a checker it goes out unchecked.
func (r *Router) checkLocally(ctx context.Context, req *routerv1.Request, level mantlev1.FallbackLevel, res *provider.Response, audit []*mantlev1.AuditStep, why string, start time.Time) ([]*mantlev1.AuditStep, error) {
	if r.deps.Checker == nil {
		return append(audit, r.step("verify", why+"; not checked", r.deps.Clock.Since(start))), nil
	}
	format, _ := formatcheck.FormatFromProto(req.ResponseFormat) // an unknown type is checked as text
	l1 := r.deps.Checker.Check(formatcheck.Answer{
		Content: res.Content, FinishReason: res.FinishReason, Format: format,
		ToolCalls: formatcheck.ToolCallsFromProto(toolCallsProto(res.ToolCalls)), Tools: formatcheck.ToolsFromProto(req.Tools),
		ToolChoice: formatcheck.ToolChoiceOf(req.ToolChoice, req.ToolChoiceFunction),
		// As the verifier would judge it from the same QualityContext.
		Degraded: level != mantlev1.FallbackLevel_FALLBACK_LEVEL_UNSPECIFIED && level != mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY,
	})
	if !l1.Passed {
		codes := strings.Join(l1.FailedCodes(), ",")
		for _, f := range l1.Findings {
			if f.Blocking && f.Path != "" {
				codes += " (at " + f.Path + ")" // as findingCodes says it for the verifier's verdict
				break
			}
		}
		r.deps.Log.DebugContext(ctx, "local L1 check failed", "codes", codes)
		audit = append(audit, r.step("verify", fmt.Sprintf("%s; local L1 failed: %s (%s)", why, codes, shortClass(l1.Class)), r.deps.Clock.Since(start)))
		return audit, &provider.Error{Class: l1.Class, Message: "verification failed: " + codes}
	}
	res.Content = l1.Content // unwrapped from a markdown fence, as the verifier delivers it
	return append(audit, r.step("verify", why+"; local L1 passed", r.deps.Clock.Since(start))), nil
}

// stream relays a provider stream. Nothing is sent to the caller until the first chunk
// arrived, so a candidate that fails before its first token can still be replaced. The
// route's first-token and stall limits cancel a stream that keeps the caller waiting.
func (r *Router) stream(ctx context.Context, rt *route, c *candidate, key *upstreamKey, preq provider.Request, sink Sink, att *mantlev1.Attempt, start time.Time) (provider.Response, bool, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// Whatever the route says (the caller may have shortened the budget), an attempt that
	// never starts or stalls leaves a share of the time left for a fallback to continue or
	// restart it.
	ceiling := rescueCeiling(time.Until(deadlineOf(ctx)), r.conf().StreamRescueShare)
	firstToken, stall := min(rt.firstTokenTimeout, c.u.timeout, ceiling), min(rt.stallTimeout, ceiling)
	watchdog := r.deps.Clock.AfterFunc(firstToken, func() {
		cancel(&provider.Error{Class: mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT, Message: fmt.Sprintf("no first token within %s", firstToken)})
	})
	defer func() { watchdog.Stop() }() // the watchdog in force at the end, not the first one

	s, err := key.client.Stream(ctx, preq)
	if err != nil {
		return provider.Response{}, false, streamCause(ctx, err)
	}
	defer s.Close()
	var res provider.Response
	var content strings.Builder
	committed := false
	for {
		chunk, err := s.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			res.Content, res.RequestID = content.String(), s.RequestID()
			return res, committed, streamCause(ctx, err)
		}
		if chunk.Usage != nil {
			res.Usage = *chunk.Usage
		}
		if chunk.FinishReason != "" {
			res.FinishReason = chunk.FinishReason
		}
		if chunk.Empty() {
			continue
		}
		watchdog.Stop()
		watchdog = r.deps.Clock.AfterFunc(stall, func() {
			cancel(&provider.Error{Class: mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT, Message: fmt.Sprintf("stream stalled for %s", stall)})
		})
		if !committed {
			ttft := r.deps.Clock.Since(start)
			att.Ttft = durationpb.New(ttft)
			r.deps.Metrics.ttft.WithLabelValues(c.u.model.Name).Observe(ttft.Seconds())
			committed = true
		}
		content.WriteString(chunk.Content)
		// Reassembled for verification, the idempotency record and the final message.
		res.ToolCalls = provider.AssembleToolCalls(res.ToolCalls, chunk.ToolCalls)
		if err := sink(Delta{Content: chunk.Content, Model: c.u.model.Name, Level: c.level, ToolCalls: chunk.ToolCalls, Logprobs: chunk.Logprobs}); err != nil {
			return res, true, err
		}
	}
	res.Content, res.RequestID, res.Model = content.String(), s.RequestID(), preq.Model
	return res, committed, nil
}

// streamCause prefers the watchdog's reason over the bare cancellation it caused.
func streamCause(ctx context.Context, err error) error {
	var pe *provider.Error
	if cause := context.Cause(ctx); cause != nil && errors.As(cause, &pe) {
		return pe
	}
	return err
}

// continueStream finishes a stream that broke after part of the answer reached the caller.
// A candidate that accepts a prefill gets the partial answer and continues it; failing
// that, a candidate restarts the answer from the beginning and a splicer passes on only
// what extends the caller's text. Either way only the rest is streamed, so the caller
// receives one complete answer. Without such a candidate (or budget), or when every
// restart diverged, the caller gets a clear error: a cut answer is never reported as
// complete, and text is never repeated.
func (r *Router) continueStream(ctx context.Context, req *routerv1.Request, rt *route, qc *mantlev1.QualityContext, p *plan, o outcome, sink Sink) (*answer, error) {
	partial := o.res.Content
	r.afterFailure(p, o)
	o.c.exhausted = true
	diverged := false
	// Restarting cannot reproduce streamed tool calls piece by piece; only text is spliced.
	restartable := len(o.res.ToolCalls) == 0
	for _, prefill := range []bool{true, false} {
		for _, c := range p.cands {
			if c.exhausted || c.u.model.AcceptsPrefill != prefill || ctx.Err() != nil {
				continue
			}
			if !prefill && !restartable {
				break
			}
			if qc.Deadline.AsTime().Sub(r.deps.Clock.Now()) <= r.conf().HopReserve {
				break
			}
			key, permit, release, ok, denied := r.extraAttempt(qc, p, c, func(key *upstreamKey) bool {
				return r.allowRetry(ctx, qc, p.budgetKey(c, key), p.sharedKey, false)
			})
			if denied {
				r.deps.Metrics.budgetDenied.Inc()
				return nil, r.cutStream(qc, o, p, diverged)
			}
			if !ok {
				continue
			}
			preq := providerRequest(req, qc)
			p.attempts++
			r.deps.Metrics.retries.WithLabelValues(c.u.model.Name, shortClass(provider.ClassOf(o.err))).Inc()
			var next outcome
			if prefill {
				preq.Prefill = partial
				r.audit(qc, "stream", fmt.Sprintf("continuing the answer on %s after %d bytes", c.u.model.Name, len(partial)), 0)
				next = r.try(ctx, req, rt, qc, c, key, permit, preq, sink, false)
			} else {
				r.audit(qc, "stream", fmt.Sprintf("restarting the answer on %s, to splice after %d bytes", c.u.model.Name, len(partial)), 0)
				sp := newSplicer(partial, sink)
				next = r.try(ctx, req, rt, qc, c, key, permit, preq, sp.sink, false)
				if next.err == nil && !sp.spliced {
					// It ended before repeating everything the caller has: not an answer.
					next.err = errRestartDiverged
					next.att.ErrorClass, next.att.ErrorMessage = errRestartDiverged.Class, errRestartDiverged.Error()
				}
				next.res.Content = string(sp.rest)
				diverged = diverged || errors.Is(next.err, errRestartDiverged)
			}
			release()
			if next.err == nil {
				how := "finished it"
				if !prefill {
					how = "restarted and finished it"
				}
				qc.DegradationReason = fmt.Sprintf("%s broke mid-answer (%s); %s %s", o.c.u.model.Name, shortClass(provider.ClassOf(o.err)), c.u.model.Name, how)
				return r.accept(ctx, req, rt, qc, next, sink, partial), nil
			}
			partial += next.res.Content // it may have added some before breaking too
			c.exhausted = true
		}
	}
	return nil, r.cutStream(qc, o, p, diverged)
}

// cutStream is the error of a stream that broke after its first token and could not be
// finished.
func (r *Router) cutStream(qc *mantlev1.QualityContext, o outcome, p *plan, diverged bool) error {
	why := "no fallback could continue it"
	if diverged {
		why = "a restart on a fallback diverged from the text already sent"
	}
	r.audit(qc, "stream", "stream failed after the first token and "+why+": "+shortClass(provider.ClassOf(o.err)), 0)
	return &exhaustedError{class: mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED, cause: o.err, tried: p.failed, partial: true, diverged: diverged}
}

func (r *Router) step(step, detail string, d time.Duration) *mantlev1.AuditStep {
	return &mantlev1.AuditStep{At: timestamppb.New(r.deps.Clock.Now()), Service: "router", Step: step, Detail: detail, Duration: durationpb.New(d)}
}

// hasOther reports whether a candidate other than c may still be tried.
func (p *plan) hasOther(c *candidate) bool {
	for _, o := range p.cands {
		if o != c && !o.exhausted {
			return true
		}
	}
	return false
}

// sideScout sends the scout an open breaker let through as a call of its own, beside the
// request: its outcome is the breaker's (a success ends the open period), and the request
// goes on to its next candidate without waiting for a model that was failing a moment
// ago. The scout holds a bulkhead place and is bounded by the provider's timeout and the
// router's life.
func (r *Router) sideScout(rt *route, c *candidate, key *upstreamKey, permit resilience.Permit, preq provider.Request, qc *mantlev1.QualityContext) {
	c.exhausted = true // for this request
	release, ok := c.u.bulkhead.TryAcquire()
	if !ok {
		permit.Cancel()
		return
	}
	r.audit(qc, "route", fmt.Sprintf("%s: breaker open; a scout goes beside the request", c.u.model.Name), 0)
	r.deps.Metrics.sideScouts.WithLabelValues(c.u.model.Name).Inc()
	tenant := qc.Tenant
	r.scouts.Add(1)
	go func() {
		defer r.scouts.Done()
		defer release()
		ctx, cancel := context.WithTimeout(r.scoutCtx, c.u.timeout)
		defer cancel()
		o := r.call(ctx, rt, c, key, permit, preq, nil, false, tenant)
		r.deps.Log.Debug("side scout", "model", c.u.model.Name, "class", shortClass(provider.ClassOf(o.err)))
	}()
}

// StopScouts ends the side scouts in flight and waits for them; the router's run loop
// calls it at shutdown.
func (r *Router) StopScouts() {
	r.stopScouts()
	r.scouts.Wait()
}
