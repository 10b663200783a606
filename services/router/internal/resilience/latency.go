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
	scratch []time.Duration // reused by Quantile so it does not allocate
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
	return &Latency{clock: clock, maxAge: maxAge, samples: make([]sample, size), scratch: make([]time.Duration, 0, size)}
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
	l.mu.Unlock()
}

// Quantile returns the nearest-rank q-quantile (q in [0, 1]) of the recent observations, or
// 0 when there are none (check Count to tell "no data" from "fast").
func (l *Latency) Quantile(q float64) time.Duration {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.scratch = l.scratch[:0]
	for _, s := range l.recentLocked() {
		if l.maxAge <= 0 || now.Sub(s.at) <= l.maxAge {
			l.scratch = append(l.scratch, s.d)
		}
	}
	if len(l.scratch) == 0 {
		return 0
	}
	slices.Sort(l.scratch)
	q = min(max(q, 0), 1)
	// Nearest rank: the smallest value with at least q of the samples at or below it.
	rank := int(q*float64(len(l.scratch))+0.999999) - 1
	return l.scratch[max(0, min(rank, len(l.scratch)-1))]
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
