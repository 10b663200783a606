package load

import (
	"math"
	"slices"
	"time"
)

// Percentiles summarises a set of latencies.
type Percentiles struct {
	Count              int
	P50, P90, P95, P99 time.Duration
	Max                time.Duration
	Mean               time.Duration
}

// Summarize computes the percentiles of ds (nearest rank); it sorts ds in place.
func Summarize(ds []time.Duration) Percentiles {
	if len(ds) == 0 {
		return Percentiles{}
	}
	slices.Sort(ds)
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return Percentiles{
		Count: len(ds),
		P50:   Quantile(ds, 0.50),
		P90:   Quantile(ds, 0.90),
		P95:   Quantile(ds, 0.95),
		P99:   Quantile(ds, 0.99),
		Max:   ds[len(ds)-1],
		Mean:  sum / time.Duration(len(ds)),
	}
}

// Quantile returns the q-quantile of sorted by the nearest-rank method: the smallest value
// with at least q of the values at or below it.
func Quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	// The epsilon keeps float error (0.99*100 = 99.00000000000001) from moving a rank up.
	rank := int(math.Ceil(q*float64(len(sorted))-1e-9)) - 1
	return sorted[max(0, min(rank, len(sorted)-1))]
}
