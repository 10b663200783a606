package quota

import (
	"math"

	"github.com/mantle-mesh/mantle/services/quota/internal/ledger"
)

// Money is kept in integer nano-dollars: exact to add and compare, and a million dollars
// (maxBudgetUSD) is 10^15, well inside the 2^53 that Redis's Lua numbers hold exactly.
const nanoPerDollar = 1_000_000_000

// nanoPriceOf converts dollars per million tokens to nano-dollars per token, rounding up
// so that a budget is never undercharged.
func nanoPriceOf(p Price) ledger.NanoPrice {
	return ledger.NanoPrice{
		Input:  int64(math.Ceil(p.InputPerMillion * nanoPerDollar / 1e6)),
		Output: int64(math.Ceil(p.OutputPerMillion * nanoPerDollar / 1e6)),
	}
}

func dollarsToNano(usd float64) int64 { return int64(math.Round(usd * nanoPerDollar)) }

func nanoToDollars(n int64) float64 { return float64(n) / nanoPerDollar }
