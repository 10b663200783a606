package router

import (
	"time"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/resilience"
)

// candidate is one model in a request's plan.
type candidate struct {
	u         *upstream
	level     mantlev1.FallbackLevel
	order     int
	retries   int  // attempts after the first on this candidate
	exhausted bool // no further attempt on it for this request
	deferred  bool // retry it only when no other candidate is left
	fast      bool // the fast-answer rung: asked with the route's short prompt (fastRequest)
	overflow  bool // exhausted because the prompt does not fit its context window
	lastClass mantlev1.ErrorClass
	retryWait time.Duration // a provider hint to honour before the next attempt
}

// plan is the mutable state of one request's attempt loop. Only the loop's goroutine
// touches it.
type plan struct {
	cands      []*candidate
	current    *candidate
	attempts   int
	prefer     mantlev1.ErrorClass   // the class that picks the next candidate
	minContext int                   // > 0 after a context overflow
	avoid      map[*upstreamKey]bool // nil until avoidKey
	lastErr    error
	failed     []string
	denied     bool // the retry budget refused a retry
	// hedged: an attempt of this request has been raced by a hedge (at most one is).
	hedged bool
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
	// Every request makes a plan: its candidates are made in one allocation and the
	// keys to avoid only once there is one (avoidKey).
	p := &plan{sharedKey: rt.admissionKeyID(), breakerScenario: r.breakerScenario(rt, scenario)}
	n := len(rt.candidates) + len(rt.smaller)
	cands := make([]candidate, 0, n)
	p.cands = make([]*candidate, 0, n+1) // and the fast answer's
	add := func(c candidate) {
		c.order = len(p.cands)
		cands = append(cands, c)
		p.cands = append(p.cands, &cands[len(cands)-1])
	}
	for i, u := range rt.candidates {
		add(candidate{u: u, level: levelOf(i)})
	}
	for _, u := range rt.smaller {
		add(candidate{u: u, level: mantlev1.FallbackLevel_FALLBACK_LEVEL_BACKUP_MODEL})
	}
	if c := fastCandidate(rt, len(p.cands)); c != nil {
		p.cands = append(p.cands, c)
	}
	return p
}

// avoidKey keeps key from being asked again in this request.
func (p *plan) avoidKey(key *upstreamKey) {
	if p.avoid == nil {
		p.avoid = map[*upstreamKey]bool{}
	}
	p.avoid[key] = true
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

// hasOther reports whether a candidate other than c may still be tried.
func (p *plan) hasOther(c *candidate) bool {
	for _, o := range p.cands {
		if o != c && !o.exhausted {
			return true
		}
	}
	return false
}

// reopenOverflowed makes the candidates that the prompt overflowed eligible again, once the
// prompt was compressed.
func (p *plan) reopenOverflowed() {
	for _, c := range p.cands {
		if c.overflow {
			c.overflow, c.exhausted = false, false
		}
	}
	p.minContext, p.current = 0, nil
}
