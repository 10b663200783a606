package router

import (
	"slices"
	"sync"
	"time"
)

// keyStats keeps the recent latency and outcomes of one upstream key on this replica, for
// DescribeRoutes today and for breakers, hedging delays and budget checks later.
type keyStats struct {
	mu       sync.Mutex
	window   []time.Duration // ring buffer of recent successful latencies
	next     int
	calls    int64
	failures int64
	inFlight int64
}

const latencyWindow = 256

func (s *keyStats) start() {
	s.mu.Lock()
	s.inFlight++
	s.mu.Unlock()
}

func (s *keyStats) finish(latency time.Duration, failed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inFlight--
	s.calls++
	if failed {
		s.failures++
		return
	}
	if len(s.window) < latencyWindow {
		s.window = append(s.window, latency)
	} else {
		s.window[s.next] = latency
		s.next = (s.next + 1) % latencyWindow
	}
}

type statsSnapshot struct {
	p50, p95, p99             time.Duration
	calls, failures, inFlight int64
}

func (s *keyStats) snapshot() statsSnapshot {
	s.mu.Lock()
	sorted := slices.Clone(s.window)
	snap := statsSnapshot{calls: s.calls, failures: s.failures, inFlight: s.inFlight}
	s.mu.Unlock()
	slices.Sort(sorted)
	snap.p50 = percentile(sorted, 0.50)
	snap.p95 = percentile(sorted, 0.95)
	snap.p99 = percentile(sorted, 0.99)
	return snap
}

// percentile uses the nearest-rank method on sorted values.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(rank, len(sorted)-1))]
}
