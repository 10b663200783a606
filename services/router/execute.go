package router

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	quotav1 "github.com/mantle-mesh/mantle/pkg/api/mantle/quota/v1"
	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/pkg/resilience"
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

// exchange is one request on its way through the attempt loop: what the caller asked, the
// route it goes by, the QualityContext the loop fills in, the request as the providers get
// it, where a streamed answer goes (nil for a unary answer) and the loop's plan. An attempt
// that sends something else (a prefill, a splicer's sink) works on a copy.
type exchange struct {
	req  *routerv1.Request
	rt   *route
	qc   *mantlev1.QualityContext
	preq provider.Request
	sink Sink
	plan *plan
	// tenant is qc's, for a side scout, which outlives the loop and must not read qc.
	tenant string
	// tools assembles a streamed answer's tool calls: call sets one for each stream, shared
	// with the toolHold that keeps them from the caller, so they are assembled once.
	tools *provider.ToolCallAssembler
}

// slot is what one attempt goes out on: a candidate, one of its keys and the breaker's
// permit for that key; hedged: beside a first attempt still running.
type slot struct {
	c      *candidate
	key    *upstreamKey
	permit resilience.Permit
	hedged bool
}

// outcome is the result of one provider attempt and, for unary answers, its verification.
// It is built without touching the request's QualityContext, so hedged attempts can run
// concurrently; the loop applies it.
type outcome struct {
	slot
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
	stickyDegradation(p, qc)
	r.budget.Request()
	if sink == nil && rt.hedge.Enabled {
		// Only requests that may be hedged count, so the ratio is the share of those.
		r.hedgeBudget.Request()
	}
	x := &exchange{req: req, rt: rt, qc: qc, preq: providerRequest(req, qc), sink: sink, plan: p, tenant: qc.Tenant}
	r.skipUnable(qc, p, req, x.preq)
	if err := r.skipSmallWindows(qc, p, rt, promptTokens, int64(req.MaxTokens)); err != nil {
		// No model can hold the conversation: shorten it, if the route says how.
		if !r.compressForWindow(ctx, x, promptTokens) {
			if qc.ContextCompression != nil && r.budgetSpent(ctx, qc) {
				// The summariser was asked and the request's budget ran out on it: a longer
				// budget may succeed, which a "too long for every window" refusal would deny.
				return nil, &exhaustedError{class: mantlev1.ErrorClass_ERROR_CLASS_BUDGET_EXHAUSTED, cause: fmt.Errorf(
					"summarising the conversation, longer than every window of route %q, did not finish in time", rt.name)}
			}
			return nil, err
		}
		if err := r.skipSmallWindows(qc, p, rt, qc.ContextCompression.GetPromptTokensAfter(), int64(req.MaxTokens)); err != nil {
			return nil, err
		}
	}
	for ctx.Err() == nil {
		c := p.next()
		if c == nil && p.minContext > 0 && r.compressForWindow(ctx, x, promptTokens) {
			// A provider said the prompt overflows its window and no larger one is left.
			c = p.next()
		}
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
		s := slot{c: c, key: key, permit: permit}
		if permit.Scout() && r.conf().SideScouts && p.hasOther(c) {
			r.sideScout(x, s)
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
		// Every attempt may be hedged until one is, so a retry after a call that failed at
		// once (a 503 in a millisecond) is raced like a first attempt: that request is as far
		// from its answer as a new one, and such retries left unhedged were among
		// seed-incident's slowest requests (mantle drill). One hedge per request keeps the
		// hedge budget's ratio.
		if sink == nil && !p.hedged && rt.hedge.Enabled {
			o = r.hedged(ctx, x, s)
		} else {
			o = r.try(ctx, x, s)
		}
		release()
		if o.err == nil {
			return r.accept(ctx, x, o, ""), nil
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
				return r.continueStream(ctx, x, o)
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
func (r *Router) accept(ctx context.Context, x *exchange, o outcome, prefix string) *answer {
	qc := x.qc
	o.res.Content = prefix + o.res.Content
	verdict := o.verdict
	if x.sink != nil && !o.verified {
		v, audit, _ := r.verify(ctx, x.req, qc, o.c.answerer(), &o.res, nil)
		qc.Audit = append(qc.Audit, audit...)
		applyVerdict(qc, v)
		verdict = v
	}
	qc.CurrentModel, qc.CurrentProvider = o.c.u.model.Name, o.c.u.provider
	qc.FallbackLevel = o.c.level
	if o.c.fast {
		r.markFast(qc, x.rt, o.c.u.model.Name)
	}
	// The level says which model answered; degraded says whether that is because
	// something failed. A hedge that won a race against a healthy first choice is not.
	degraded := o.c.level != mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY && !o.raced
	if degraded {
		if qc.DegradationReason == "" {
			qc.DegradationReason = "primary unavailable"
		}
		// The route's notice goes with any degraded answer, before a business rule's notice.
		qc.UserNotice = strings.TrimSpace(x.rt.ladder.Notice + " " + qc.UserNotice)
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
		p.avoidKey(o.key)
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
		c.exhausted, c.overflow = true, true
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
	r.deps.Metrics.attempt(c.u.model.Name, shortClass(class)).Inc()
	r.audit(qc, "skip", fmt.Sprintf("%s: %s", c.u.model.Name, shortClass(class)), 0)
	if p.lastErr == nil || provider.ClassOf(p.lastErr) == mantlev1.ErrorClass_ERROR_CLASS_BREAKER_OPEN {
		p.lastErr = &provider.Error{Class: class, Message: c.u.model.Name + " skipped"}
	}
}
