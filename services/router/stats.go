package router

import (
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/mantle-mesh/mantle/pkg/resilience"
)

// keyStats keeps the recent latency and outcomes of one upstream key on this replica: the
// p50 decides whether an attempt still fits the remaining deadline, the latency and the
// share of recent calls that timed out set the hedge delay, and DescribeRoutes shows all
// of it.
type keyStats struct {
	latency *resilience.Latency // successful calls only

	mu       sync.Mutex
	calls    int64
	failures int64
	inFlight int64
	// recent rings the last timeoutWindow calls' endings (true: timed out); recentTimeouts
	// counts the true ones.
	recent         [timeoutWindow]bool
	recentNext     int
	recentFull     bool
	recentTimeouts int
}

const (
	latencyWindow = 256
	// latencyMaxAge forgets latencies older than this: a key that was slow during an
	// incident and has been quiet since is not skipped for that incident.
	latencyMaxAge = 5 * time.Minute
	// timeoutWindow is how many of a key's latest calls its timeout share is taken over:
	// at the 1% a healthy key's tail times out, four of 64 happen by chance about once in
	// 250 windows, while a key whose calls time out 30% of the time shows it within a
	// dozen calls.
	timeoutWindow = 64
)

func newKeyStats(clock clockwork.Clock) *keyStats {
	return &keyStats{latency: resilience.NewLatency(latencyWindow, latencyMaxAge, clock)}
}

func (s *keyStats) start() {
	s.mu.Lock()
	s.inFlight++
	s.mu.Unlock()
}

// finish books a call that ended; timedOut says it ran out of its time without an answer.
func (s *keyStats) finish(latency time.Duration, failed, timedOut bool) {
	s.mu.Lock()
	s.inFlight--
	s.calls++
	if failed {
		s.failures++
	}
	if s.recent[s.recentNext] {
		s.recentTimeouts--
	}
	s.recent[s.recentNext] = timedOut
	if timedOut {
		s.recentTimeouts++
	}
	s.recentNext++
	if s.recentNext == timeoutWindow {
		s.recentNext, s.recentFull = 0, true
	}
	s.mu.Unlock()
	if !failed {
		s.latency.Observe(latency)
	}
}

type statsSnapshot struct {
	p50, p95, p99             time.Duration
	calls, failures, inFlight int64
	// timeoutShare is the share of the key's last timeoutWindow calls (fewer while it has
	// made fewer) that timed out.
	timeoutShare float64
}

func (s *keyStats) snapshot() statsSnapshot {
	s.mu.Lock()
	snap := statsSnapshot{calls: s.calls, failures: s.failures, inFlight: s.inFlight}
	if n := s.recentLen(); n > 0 {
		snap.timeoutShare = float64(s.recentTimeouts) / float64(n)
	}
	s.mu.Unlock()
	var q [3]time.Duration
	s.latency.Quantiles(q[:], 0.50, 0.95, 0.99)
	snap.p50, snap.p95, snap.p99 = q[0], q[1], q[2]
	return snap
}

// recentLen is how many endings the ring holds; s.mu must be held.
func (s *keyStats) recentLen() int {
	if s.recentFull {
		return timeoutWindow
	}
	return s.recentNext
}
