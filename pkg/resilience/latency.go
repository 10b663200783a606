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

	mu      sync.Mutex
	samples []sample // ring buffer
	next    int
	full    bool

	// sorted caches the recent values in order. The router asks for a quantile on every
	// attempt (and again for a hedge delay); sorting the whole window each time was a
	// measurable share of its CPU. The cache is rebuilt once stale observations pile up
	// (see staleAfter) or its oldest value ages out.
	sorted       []time.Duration
	sortedOldest time.Time // time of the oldest value in sorted
	pending      int       // observations since sorted was built
	valid        bool
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
	l.samples[l.next] = sample{at: now, d: d}
	l.next++
	if l.next == len(l.samples) {
		l.next, l.full = 0, true
	}
	l.pending++
	l.mu.Unlock()
}

// staleAfter is how many observations the cached order may miss: a 32nd of the values it
// holds (8 of 256), so a quantile lags the newest few calls at most, and is exact while
// there are few values.
func (l *Latency) staleAfter() int { return len(l.sorted) / 32 }

// Quantile returns the nearest-rank q-quantile (q in [0, 1]) of the recent observations, or
// 0 when there are none (check Count to tell "no data" from "fast"). It may leave out the
// newest n/32 of n observations (see staleAfter).
func (l *Latency) Quantile(q float64) time.Duration {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	return nearestRank(l.sortedLocked(now), q)
}

// Quantiles is Quantile for several q at once, from one consistent view: out[i] becomes
// the qs[i]-quantile. The caller owns out, so the per-attempt path does not allocate.
func (l *Latency) Quantiles(out []time.Duration, qs ...float64) {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	sorted := l.sortedLocked(now)
	for i, q := range qs[:min(len(qs), len(out))] {
		out[i] = nearestRank(sorted, q)
	}
}

// sortedLocked returns the recent values in order, rebuilding the cache when it misses too
// many observations or holds one that has aged out.
func (l *Latency) sortedLocked(now time.Time) []time.Duration {
	fresh := l.valid && l.pending <= l.staleAfter() &&
		(l.maxAge <= 0 || len(l.sorted) == 0 || now.Sub(l.sortedOldest) <= l.maxAge)
	if fresh {
		return l.sorted
	}
	l.sorted = l.sorted[:0]
	l.sortedOldest = time.Time{}
	for _, s := range l.recentLocked() {
		if l.maxAge <= 0 || now.Sub(s.at) <= l.maxAge {
			l.sorted = append(l.sorted, s.d)
			if l.sortedOldest.IsZero() || s.at.Before(l.sortedOldest) {
				l.sortedOldest = s.at
			}
		}
	}
	slices.Sort(l.sorted)
	l.pending, l.valid = 0, true
	return l.sorted
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
	n := 0
	for _, s := range l.recentLocked() {
		if l.maxAge <= 0 || now.Sub(s.at) <= l.maxAge {
			n++
		}
	}
	return n
}

// recentLocked is the filled part of the ring, in no particular order.
func (l *Latency) recentLocked() []sample {
	if l.full {
		return l.samples
	}
	return l.samples[:l.next]
}
