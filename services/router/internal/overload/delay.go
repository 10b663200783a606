package overload

import (
	"math"
	"runtime/metrics"
	"time"
)

// schedLatencies is the runtime's histogram of how long goroutines waited, runnable, for a
// CPU: it grows when the process has more work than GOMAXPROCS can run, whatever the
// work waits on otherwise (a slow provider does not move it).
const schedLatencies = "/sched/latencies:seconds"

// SchedulingDelay reads a quantile of the scheduler's waits since its previous read.
// It is not safe for concurrent use; the shedder's loop owns it.
type SchedulingDelay struct {
	quantile float64
	sample   []metrics.Sample
	prev     []uint64
}

// NewSchedulingDelay returns a reader of the given quantile (0.9: the P90).
func NewSchedulingDelay(quantile float64) *SchedulingDelay {
	s := &SchedulingDelay{quantile: quantile, sample: []metrics.Sample{{Name: schedLatencies}}}
	s.Read() // the first read only sets where the next one counts from
	return s
}

// Read returns the quantile of the waits since the previous Read (0 when there were none).
func (s *SchedulingDelay) Read() time.Duration {
	metrics.Read(s.sample)
	if s.sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return 0 // a runtime without the metric: never a reason to shed
	}
	h := s.sample[0].Value.Float64Histogram()
	d := quantileSince(h.Counts, s.prev, h.Buckets, s.quantile)
	s.prev = append(s.prev[:0], h.Counts...)
	return d
}

// quantileSince is the quantile of counts-prev (cumulative histograms; prev may be
// empty), given bucket boundaries as runtime/metrics gives them (len(counts)+1 of them),
// answered with the upper boundary of the bucket it falls in.
func quantileSince(counts, prev []uint64, buckets []float64, q float64) time.Duration {
	var total uint64
	for i, c := range counts {
		total += c - at(prev, i)
	}
	if total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(total)))
	var seen uint64
	for i, c := range counts {
		seen += c - at(prev, i)
		if seen >= rank {
			upper := buckets[i+1]
			if math.IsInf(upper, 1) {
				upper = buckets[i]
			}
			return time.Duration(upper * float64(time.Second))
		}
	}
	return 0
}

func at(s []uint64, i int) uint64 {
	if i < len(s) {
		return s[i]
	}
	return 0
}
