package quota

import (
	"math"
	"math/bits"
	"time"
)

// window is the period limits are expressed in: a bucket holds at most one window's
// worth of tokens and refills one window's worth per window.
const window = time.Minute

// maxDebt bounds how far a bucket can be overdrawn, in time, so that absurd usage
// reports cannot overflow the arithmetic. Thirty days of refill is debt enough, and it
// keeps every duration the Redis scripts handle below 2^53 ns, where Lua's numbers (IEEE
// doubles) are still exact integers.
const maxDebt = 30 * 24 * time.Hour

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
	return max(b.debt(now)+durationOf(n, limit)-window, 0)
}

// take removes n tokens, or returns -n tokens when n is negative (never above
// capacity). It does not check the level: Reserve checks wait first, and Settle may
// overdraw on purpose.
func (b *bucket) take(now time.Time, n, limit int64) {
	debt := b.debt(now)
	if n >= 0 {
		debt += durationOf(n, limit)
	} else {
		debt -= durationOf(-n, limit)
	}
	b.fullAt = now.Add(min(max(debt, 0), maxDebt))
}

// remaining returns the whole tokens available now; 0 while overdrawn.
func (b bucket) remaining(now time.Time, limit int64) int64 {
	return tokensIn(max(window-b.debt(now), 0), limit)
}

// durationOf returns how long a bucket with the given limit takes to refill n tokens,
// rounded up to the nanosecond so a bucket never appears to hold a token it has not
// earned. It saturates at maxDebt.
func durationOf(n, limit int64) time.Duration {
	if n <= 0 {
		return 0
	}
	// n × window overflows int64 for large n, so multiply into 128 bits.
	hi, lo := bits.Mul64(uint64(n), uint64(window))
	if hi >= uint64(limit) { // the quotient would not fit in 64 bits
		return maxDebt
	}
	q, r := bits.Div64(hi, lo, uint64(limit))
	if r != 0 {
		q++
	}
	return time.Duration(min(q, uint64(maxDebt)))
}

// tokensIn returns the whole tokens a bucket with the given limit refills in d.
func tokensIn(d time.Duration, limit int64) int64 {
	if d <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(d), uint64(limit))
	if hi >= uint64(window) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(window))
	return int64(min(q, math.MaxInt64))
}

// lower makes the bucket hold at most remaining tokens now, as a provider reported for
// the same key; it never raises the level, because the provider's view lags and does not
// include what mantle has reserved but not yet sent.
func (b *bucket) lower(now time.Time, remaining int64, reset time.Duration, limit int64) {
	if target := observedDebt(remaining, reset, limit); b.debt(now) < target {
		b.fullAt = now.Add(target)
	}
}

// observedDebt is the debt of a bucket that holds remaining tokens. A provider that says
// "0 left, full in reset" may refill more slowly than one window per window, so an empty
// bucket owes at least reset.
func observedDebt(remaining int64, reset time.Duration, limit int64) time.Duration {
	d := durationOf(limit-remaining, limit)
	if remaining == 0 {
		d = max(d, reset)
	}
	return min(d, maxDebt)
}
