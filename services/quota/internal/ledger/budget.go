package ledger

import "time"

// MaxUsageTokens bounds the token counts a Store works with, so that a nonsensical
// usage report cannot overflow: input and output at the highest accepted price (10^4
// dollars per million, 10^7 nano-dollars per token) stay below 2^53 together.
const MaxUsageTokens = 50_000_000

const secondsPerDay = 24 * 60 * 60

// UsageCost prices reported usage. When the provider reported only a total, the whole
// total is priced at the dearer of the two rates: the budget errs towards spending.
func UsageCost(a Actual, p NanoPrice) int64 {
	in, out := ClampUsage(a.Input), ClampUsage(a.Output)
	if in+out == 0 {
		return ClampUsage(a.Tokens) * max(p.Input, p.Output)
	}
	return in*p.Input + out*p.Output
}

func ClampUsage(n int64) int64 { return min(max(n, 0), MaxUsageTokens) }

// BudgetDay returns the budget day now falls in and how long until the next one starts.
// Days are counted from the Unix epoch at the configured offset from UTC.
func BudgetDay(now time.Time, offset time.Duration) (day int64, reset time.Duration) {
	off := int64(offset / time.Second)
	day = FloorDiv(now.Unix()+off, secondsPerDay)
	next := time.Unix((day+1)*secondsPerDay-off, 0)
	return day, next.Sub(now)
}

func FloorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}
