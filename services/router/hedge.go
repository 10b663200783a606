package router

import (
	"context"
	"time"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
)

// hedged runs an attempt and, when it has not answered after the hedge delay
// (hedgeDelay), a second attempt on the best other candidate. The
// first answer that passes verification wins and the other is cancelled; both attempts are
// recorded. The hedge draws on the hedge budget (hedgeCandidate). Only a unary answer
// (x.sink nil) is hedged.
func (r *Router) hedged(ctx context.Context, x *exchange, s slot) outcome {
	qc, p := x.qc, x.plan
	results := make(chan outcome, 2)
	primaryCtx, cancelPrimary := context.WithCancel(ctx)
	defer cancelPrimary()
	go func() { results <- r.run(primaryCtx, x, s) }()

	timer := r.deps.Clock.NewTimer(r.hedgeDelay(x.rt, s.key))
	defer timer.Stop()
	running, cancelHedge := 1, context.CancelFunc(func() {})
	defer func() { cancelHedge() }() // the hedge's cancel is only known once it starts
	select {
	case o := <-results:
		r.record(qc, o)
		return o
	case <-timer.Chan():
		if h, release, ok := r.hedgeCandidate(p, s.c); ok {
			defer release()
			p.attempts++
			p.hedged = true
			r.deps.Metrics.hedges.Inc()
			hctx, cancel := context.WithCancel(ctx)
			cancelHedge = cancel
			go func() { results <- r.run(hctx, x, h) }()
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
		won.raced = won.att.Hedged && s.c.level == mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY && allCanceled(failed)
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
func (r *Router) extraAttempt(p *plan, c *candidate, allow func(key *upstreamKey) bool) (s slot, release func(), ok, denied bool) {
	key, permit, _ := r.acquire(c.u, p.breakerScenario, p.avoid)
	if key == nil {
		return slot{}, nil, false, false
	}
	release, ok = c.u.bulkhead.TryAcquire()
	if !ok {
		permit.Cancel()
		return slot{}, nil, false, false
	}
	if !allow(key) {
		permit.Cancel()
		release()
		return slot{}, nil, false, true
	}
	return slot{c: c, key: key, permit: permit}, release, true, false
}

// hedgeCandidate reserves a key and a bulkhead slot on the best other candidate, if the
// hedge budget allows one. Hedges ask only this replica's hedge budget, never the retry
// budgets (here or shared in quota): those stay for failovers after real failures. Each
// replica's hedges are a share of its own requests, so the ratio holds mesh-wide too.
func (r *Router) hedgeCandidate(p *plan, primary *candidate) (slot, func(), bool) {
	// Asked before any key is acquired, so a refusal takes no half-open probe place;
	// extraAttempt spends it last. Refusals are not audited (the first attempt is running
	// and reads qc): the metric is their trace.
	if !r.hedgeBudget.Allowed(false) {
		r.deps.Metrics.hedgeBudgetDenied.Inc()
		return slot{}, nil, false
	}
	spend := func(*upstreamKey) bool { return r.hedgeBudget.TryRetry(false) }
	for _, c := range p.cands {
		if c == primary || c.exhausted || c.fast {
			// The fast-answer rung answers a different, simplified request: it is the
			// ladder's last model, never a race against a slow first choice.
			continue
		}
		s, release, ok, denied := r.extraAttempt(p, c, spend)
		if denied {
			r.deps.Metrics.hedgeBudgetDenied.Inc()
			break
		}
		if ok {
			s.hedged = true
			return s, release, true
		}
	}
	return slot{}, nil, false
}

// hedgeShare is the share of a key's calls that hedging aims at: those still unanswered
// when all the others have answered (its p95 while none time out).
const hedgeShare = 0.05

// hedgeDelay is the time by which all but hedgeShare of the key's recent calls had
// answered, bounded by the route's limits. A call that timed out never answered, so while
// some of the key's calls time out the delay is earlier than the p95 of those that
// answered, and once hedgeShare of them do, the request's own call is as likely to be one
// of them as to be merely slow, and the hedge goes at the route's min_delay: waiting
// longer only delays the answer of a call that will time out. (mantle drill,
// seed-incident: with the p95 of answered calls, the requests over the 1.2 s target were
// mostly calls to a primary whose calls timed out 30% of the time, hedged at 0.8 to
// 0.9 s and answered by the backup 0.4 to 0.8 s later.)
func (r *Router) hedgeDelay(rt *route, key *upstreamKey) time.Duration {
	lo, hi := rt.hedge.MinDelay, rt.hedge.MaxDelay
	if lo <= 0 {
		lo = 200 * time.Millisecond
	}
	if hi <= 0 {
		hi = 3 * time.Second
	}
	snap := key.stats.snapshot()
	switch {
	case snap.timeoutShare >= hedgeShare:
		return lo
	case snap.p95 == 0:
		return hi // no answer yet to learn from
	}
	// Of all recent calls, (1-share)*F(t) had answered by t, F being the answered calls'
	// distribution: the delay is F's (1-hedgeShare)/(1-share) quantile.
	d := key.stats.latency.Quantile((1 - hedgeShare) / (1 - snap.timeoutShare))
	return min(max(d, lo), hi)
}
