package quota

import (
	"math"
	"time"
)

// Money is kept in integer nano-dollars: exact to add and compare, and a million dollars
// (maxBudgetUSD) is 10^15, well inside the 2^53 that Redis's Lua numbers hold exactly.
const nanoPerDollar = 1_000_000_000

// maxUsageTokens bounds the token counts a Store works with, so that a nonsensical
// usage report cannot overflow: input and output at the highest accepted price (10^4
// dollars per million, 10^7 nano-dollars per token) stay below 2^53 together.
const maxUsageTokens = 50_000_000

const secondsPerDay = 24 * 60 * 60

// nanoPriceOf converts dollars per million tokens to nano-dollars per token, rounding up
// so that a budget is never undercharged.
func nanoPriceOf(p Price) NanoPrice {
	return NanoPrice{
		Input:  int64(math.Ceil(p.InputPerMillion * nanoPerDollar / 1e6)),
		Output: int64(math.Ceil(p.OutputPerMillion * nanoPerDollar / 1e6)),
	}
}

func dollarsToNano(usd float64) int64 { return int64(math.Round(usd * nanoPerDollar)) }

func nanoToDollars(n int64) float64 { return float64(n) / nanoPerDollar }

// usageCost prices reported usage. When the provider reported only a total, the whole
// total is priced at the dearer of the two rates: the budget errs towards spending.
func usageCost(a Actual, p NanoPrice) int64 {
	in, out := clampUsage(a.Input), clampUsage(a.Output)
	if in+out == 0 {
		return clampUsage(a.Tokens) * max(p.Input, p.Output)
	}
	return in*p.Input + out*p.Output
}

func clampUsage(n int64) int64 { return min(max(n, 0), maxUsageTokens) }

// budgetDay returns the budget day now falls in and how long until the next one starts.
// Days are counted from the Unix epoch at the configured offset from UTC.
func budgetDay(now time.Time, offset time.Duration) (day int64, reset time.Duration) {
	off := int64(offset / time.Second)
	day = floorDiv(now.Unix()+off, secondsPerDay)
	next := time.Unix((day+1)*secondsPerDay-off, 0)
	return day, next.Sub(now)
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// budgetState is a tenant's spending on one day.
type budgetState struct {
	day   int64
	spent int64
}

// spentOn returns what was spent on day: nothing when the state is from an earlier day.
func (b budgetState) spentOn(day int64) int64 {
	if b.day != day {
		return 0
	}
	return b.spent
}
