package resilience

import (
	"slices"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// Latency keeps an upstream key's recent latencies for its quantiles: the median decides
// whether an attempt still fits in the remaining deadline, the p95 sets the hedging delay.
// It holds the last Size observations and ignores those older than MaxAge, so a key that
// was slow an hour ago and has been quiet since is not judged by that hour. It is safe for
// concurrent use.
type Latency struct {
	clock  clockwork.Clock
	maxAge time.Duration

	mu sync.Mutex
	// samples is a ring of the n observations held, the oldest at start: they arrive in
	// time order, so those that age out are always the oldest.
	samples  []sample
	start, n int
	// sorted holds the durations of the samples held, in order, kept so by every change:
	// the router asks for a quantile on every attempt, and an observation or one that ages
	// out moves at most Size values (a few hundred nanoseconds), where sorting the window
	// again cost microseconds.
	sorted []time.Duration
}

type sample struct {
	at time.Time
	d  time.Duration
}

// NewLatency returns a tracker of the last size observations no older than maxAge
// (maxAge <= 0 keeps them regardless of age). size < 1 is taken as 1; clock defaults to
// the real clock.
func NewLatency(size int, maxAge time.Duration, clock clockwork.Clock) *Latency {
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	size = max(size, 1)
	return &Latency{clock: clock, maxAge: maxAge, samples: make([]sample, size), sorted: make([]time.Duration, 0, size)}
}

// Observe records one latency.
func (l *Latency) Observe(d time.Duration) {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n == len(l.samples) {
		l.dropOldestLocked()
	}
	l.samples[(l.start+l.n)%len(l.samples)] = sample{at: now, d: d}
	l.n++
	i, _ := slices.BinarySearch(l.sorted, d)
	l.sorted = slices.Insert(l.sorted, i, d)
}

// dropOldestLocked forgets the oldest sample held.
func (l *Latency) dropOldestLocked() {
	i, _ := slices.BinarySearch(l.sorted, l.samples[l.start].d) // any of equal values will do
	l.sorted = slices.Delete(l.sorted, i, i+1)
	l.start = (l.start + 1) % len(l.samples)
	l.n--
}

// ageLocked forgets the samples older than maxAge at now.
func (l *Latency) ageLocked(now time.Time) {
	for l.maxAge > 0 && l.n > 0 && now.Sub(l.samples[l.start].at) > l.maxAge {
		l.dropOldestLocked()
	}
}

// Quantile returns the nearest-rank q-quantile (q in [0, 1]) of the recent observations, or
// 0 when there are none (check Count to tell "no data" from "fast").
func (l *Latency) Quantile(q float64) time.Duration {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ageLocked(now)
	return nearestRank(l.sorted, q)
}

// Quantiles is Quantile for several q at once, from one consistent view: out[i] becomes
// the qs[i]-quantile. The caller owns out, so the per-attempt path does not allocate.
func (l *Latency) Quantiles(out []time.Duration, qs ...float64) {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ageLocked(now)
	for i, q := range qs[:min(len(qs), len(out))] {
		out[i] = nearestRank(l.sorted, q)
	}
}

// nearestRank is the smallest value with at least q of the sorted values at or below it.
func nearestRank(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	q = min(max(q, 0), 1)
	rank := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(rank, len(sorted)-1))]
}

// Count is how many observations Quantile would use now.
func (l *Latency) Count() int {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ageLocked(now)
	return l.n
}
