package router

import (
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/mantle-mesh/mantle/services/router/internal/resilience"
)

// keyStats keeps the recent latency and outcomes of one upstream key on this replica: the
// p50 decides whether an attempt still fits the remaining deadline, the p95 sets the hedge
// delay, and DescribeRoutes shows all of it.
type keyStats struct {
	latency *resilience.Latency // successful calls only

	mu       sync.Mutex
	calls    int64
	failures int64
	inFlight int64
}

const (
	latencyWindow = 256
	// latencyMaxAge forgets latencies older than this: a key that was slow during an
	// incident and has been quiet since is not skipped for that incident.
	latencyMaxAge = 5 * time.Minute
)

func newKeyStats(clock clockwork.Clock) *keyStats {
	return &keyStats{latency: resilience.NewLatency(latencyWindow, latencyMaxAge, clock)}
}

func (s *keyStats) start() {
	s.mu.Lock()
	s.inFlight++
	s.mu.Unlock()
}

func (s *keyStats) finish(latency time.Duration, failed bool) {
	s.mu.Lock()
	s.inFlight--
	s.calls++
	if failed {
		s.failures++
	}
	s.mu.Unlock()
	if !failed {
		s.latency.Observe(latency)
	}
}

type statsSnapshot struct {
	p50, p95, p99             time.Duration
	calls, failures, inFlight int64
}

func (s *keyStats) snapshot() statsSnapshot {
	s.mu.Lock()
	snap := statsSnapshot{calls: s.calls, failures: s.failures, inFlight: s.inFlight}
	s.mu.Unlock()
	var q [3]time.Duration
	s.latency.Quantiles(q[:], 0.50, 0.95, 0.99)
	snap.p50, snap.p95, snap.p99 = q[0], q[1], q[2]
	return snap
}
