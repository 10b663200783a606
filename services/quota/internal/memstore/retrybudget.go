package memstore

import (
	"time"

	"github.com/mantle-mesh/mantle/services/quota/internal/ledger"
)

// The retry budget counts requests and retries per window and estimates the last
// window's worth as a sliding window: the current fixed window plus the previous one
// weighted by how much of it still overlaps (the "sliding window counter" of Cloudflare's
// rate limiter). Two counters per budget are cheap to keep in one Redis hash, and the
// estimate is within a few percent of an exact sliding log.
//
// The rule is the router's (pkg/resilience.Budget), so the two can
// be swapped: with requests and retries estimated over the window,
//
//  1. retries < Floor: allowed, whatever the kind;
//  2. otherwise, if retries/requests > FormatOnlyAbove and it is not a format retry:
//     refused;
//  3. otherwise allowed when retries+1 <= Ratio*requests;
//  4. and, for a retry made for a tenant, when that tenant's retries+1 <= TenantShare *
//     max(Floor, Ratio*requests) (allowTenantRetry).
//
// The Redis script implements the same arithmetic; the shared test suite holds them to it.

// retryWindow is one budget's counters.
type retryWindow struct {
	win             int64 // index of the current fixed window
	requests, tries float64
	prevRequests    float64
	prevTries       float64
}

// roll moves the counters to window win.
func (w *retryWindow) roll(win int64) {
	switch {
	case w.win == win:
	case w.win == win-1:
		w.prevRequests, w.prevTries = w.requests, w.tries
		w.requests, w.tries = 0, 0
	default:
		*w = retryWindow{}
	}
	w.win = win
}

// estimate returns requests and retries over the sliding window; elapsed is the share of
// the current fixed window that has passed.
func (w *retryWindow) estimate(elapsed float64) (requests, retries float64) {
	return w.requests + w.prevRequests*(1-elapsed), w.tries + w.prevTries*(1-elapsed)
}

// retryWindowAt returns the fixed window now falls in and how much of it has passed.
// Windows are whole seconds (RetryBudgetConfig.Validate), so Lua can compute the same
// index from Redis TIME without 64-bit nanoseconds.
func retryWindowAt(now time.Time, window time.Duration) (win int64, elapsed float64) {
	ws := int64(window / time.Second)
	s := now.Unix()
	win = ledger.FloorDiv(s, ws)
	off := (s-win*ws)*int64(time.Second) + int64(now.Nanosecond())
	return win, float64(off) / float64(window)
}

// allowRetry applies the rule to one budget's estimates.
func allowRetry(cfg ledger.RetryBudget, requests, retries float64, format bool) bool {
	if retries < float64(cfg.Floor) {
		return true
	}
	if retries/max(requests, 1) > cfg.FormatOnlyAbove && !format {
		return false
	}
	return retries+1 <= cfg.Ratio*requests
}

// allowTenantRetry applies a tenant's share: its retries over the window may not pass
// TenantShare of what the whole budget allows at the overall request estimate, so that
// one tenant's failures (or a loop of them) cannot use up the retries every other
// tenant's requests need. The share is counted where the budget is (in Redis with the
// redis backend, so it holds across quota replicas); only retries are counted per tenant.
func allowTenantRetry(cfg ledger.RetryBudget, requests, retries float64) bool {
	return retries+1 <= cfg.TenantShare*max(float64(cfg.Floor), cfg.Ratio*requests)
}
