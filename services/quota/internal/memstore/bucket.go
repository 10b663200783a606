package memstore

import (
	"time"

	"github.com/mantle-mesh/mantle/services/quota/internal/ledger"
)

// bucket is a token bucket with a capacity of limit tokens that refills continuously at
// limit tokens per window. Instead of a level and a last-update time it stores one
// instant, fullAt: when the bucket will be full again if nothing more is taken. The
// level follows from it whenever it is needed, so nothing ticks in the background:
//
//	level(now) = limit × (1 − (fullAt − now) / window), at most limit
//
// This is the "theoretical arrival time" form of a token bucket (GCRA). Working in
// integer nanoseconds keeps decisions exact: a caller told to retry after d succeeds at
// exactly d, not a rounding error later. It is also a single number per bucket, which
// is what the Redis scripts store. The limit is passed in on every call rather than
// stored, so a changed limit applies at once, and the zero value is a full bucket.
type bucket struct {
	fullAt time.Time
}

// debt is how long the bucket needs to refill completely: zero when full, more than a
// window when overdrawn.
func (b bucket) debt(now time.Time) time.Duration {
	return max(b.fullAt.Sub(now), 0)
}

// wait returns how long until the bucket holds n tokens; zero means it holds them now.
// n tokens fit once the debt plus their refill time is at most one window.
func (b bucket) wait(now time.Time, n, limit int64) time.Duration {
	return max(b.debt(now)+ledger.DurationOf(n, limit)-ledger.Window, 0)
}

// take removes n tokens, or returns -n tokens when n is negative (never above
// capacity). It does not check the level: Reserve checks wait first, and Settle may
// overdraw on purpose.
func (b *bucket) take(now time.Time, n, limit int64) {
	debt := b.debt(now)
	if n >= 0 {
		debt += ledger.DurationOf(n, limit)
	} else {
		debt -= ledger.DurationOf(-n, limit)
	}
	b.fullAt = now.Add(min(max(debt, 0), ledger.MaxDebt))
}

// remaining returns the whole tokens available now; 0 while overdrawn.
func (b bucket) remaining(now time.Time, limit int64) int64 {
	return ledger.TokensIn(max(ledger.Window-b.debt(now), 0), limit)
}

// lower makes the bucket hold at most remaining tokens now, as a provider reported for
// the same key; it never raises the level, because the provider's view lags and does not
// include what mantle has reserved but not yet sent.
func (b *bucket) lower(now time.Time, remaining int64, reset time.Duration, limit int64) {
	if target := ledger.ObservedDebt(remaining, reset, limit); b.debt(now) < target {
		b.fullAt = now.Add(target)
	}
}
