package ledger

import (
	"math"
	"math/bits"
	"time"
)

// Window is the period limits are expressed in: a bucket holds at most one window's
// worth of tokens and refills one window's worth per window.
const Window = time.Minute

// MaxDebt bounds how far a bucket can be overdrawn, in time, so that absurd usage
// reports cannot overflow the arithmetic. Thirty days of refill is debt enough, and it
// keeps every duration the Redis scripts handle below 2^53 ns, where Lua's numbers (IEEE
// doubles) are still exact integers.
const MaxDebt = 30 * 24 * time.Hour

// DurationOf returns how long a bucket with the given limit takes to refill n tokens,
// rounded up to the nanosecond so a bucket never appears to hold a token it has not
// earned. It saturates at maxDebt.
func DurationOf(n, limit int64) time.Duration {
	if n <= 0 {
		return 0
	}
	// n × window overflows int64 for large n, so multiply into 128 bits.
	hi, lo := bits.Mul64(uint64(n), uint64(Window))
	if hi >= uint64(limit) { // the quotient would not fit in 64 bits
		return MaxDebt
	}
	q, r := bits.Div64(hi, lo, uint64(limit))
	if r != 0 {
		q++
	}
	return time.Duration(min(q, uint64(MaxDebt)))
}

// TokensIn returns the whole tokens a bucket with the given limit refills in d.
func TokensIn(d time.Duration, limit int64) int64 {
	if d <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(d), uint64(limit))
	if hi >= uint64(Window) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(Window))
	return int64(min(q, math.MaxInt64))
}

// ObservedDebt is the debt of a bucket that holds remaining tokens. A provider that says
// "0 left, full in reset" may refill more slowly than one window per window, so an empty
// bucket owes at least reset.
func ObservedDebt(remaining int64, reset time.Duration, limit int64) time.Duration {
	d := DurationOf(limit-remaining, limit)
	if remaining == 0 {
		d = max(d, reset)
	}
	return min(d, MaxDebt)
}

// RemainingAt is the whole tokens a bucket with the given debt holds.
func RemainingAt(debt time.Duration, limit int64) int64 {
	return TokensIn(max(Window-debt, 0), limit)
}
