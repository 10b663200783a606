package session

import (
	"sync"
	"time"
)

// Scheduler decides how many tool calls of a session may run at once. Each tool has a
// level: 0 (the configured cap), 1 (half of it) and 2 (one at a time). A window in which a
// tool's calls time out at the configured rate or more (over enough calls) takes the tool
// one level down as soon as the rate is reached; a window without timeouts takes it one
// level back up when it ends. So a tool that keeps timing out goes 4 → 2 → 1 over two
// windows, and returns 1 → 2 → 4 over two quiet windows, without a restart.
//
// The levels are this replica's view: each replica measures the calls it sees. A session's
// cap is the lowest cap of the tools it has called.
type Scheduler struct {
	cfg SchedulerConfig

	mu    sync.Mutex
	tools map[string]*toolWindow
}

// maxSchedulerTools bounds the tools the scheduler tracks. Tool names come from the
// registry, so the bound is never reached in practice; when it is, the tool seen least
// recently is forgotten (it is back at level 0).
const maxSchedulerTools = 4096

type toolWindow struct {
	level int
	// start is when the current window began; calls and timeouts are counted in it;
	// dropped records that the level went down in it already.
	start           time.Time
	calls, timeouts int
	dropped         bool
	seen            time.Time
}

// NewScheduler returns a scheduler with every tool at level 0.
func NewScheduler(cfg SchedulerConfig) *Scheduler {
	return &Scheduler{cfg: cfg, tools: map[string]*toolWindow{}}
}

// levelCap is the cap at a level.
func (s *Scheduler) levelCap(level int) int {
	switch level {
	case 0:
		return s.cfg.ParallelCap
	case 1:
		return max(s.cfg.ParallelCap/2, 1)
	}
	return 1
}

// roll ends the windows that have passed by now. A quiet window (no timeouts) that did
// not lower the level raises it by one; windows with no calls at all count as quiet.
func (s *Scheduler) roll(w *toolWindow, now time.Time) {
	for !now.Before(w.start.Add(s.cfg.Window)) {
		if w.timeouts == 0 && !w.dropped && w.level > 0 {
			w.level--
		}
		w.start = w.start.Add(s.cfg.Window)
		w.calls, w.timeouts, w.dropped = 0, 0, false
		if w.level == 0 && !now.Before(w.start.Add(s.cfg.Window)) {
			// Idle at the top: skip the empty windows at once.
			w.start = now
		}
	}
}

// Record counts one call of tool that ended at now, and whether it timed out.
func (s *Scheduler) Record(tool string, timedOut bool, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.tools[tool]
	if w == nil {
		if len(s.tools) >= maxSchedulerTools {
			s.forgetOldest()
		}
		w = &toolWindow{start: now}
		s.tools[tool] = w
	}
	s.roll(w, now)
	w.seen = now
	w.calls++
	if timedOut {
		w.timeouts++
	}
	if !w.dropped && w.level < 2 && w.calls >= s.cfg.MinCalls &&
		float64(w.timeouts) >= s.cfg.TimeoutRate*float64(w.calls) {
		w.level++
		w.dropped = true
	}
}

func (s *Scheduler) forgetOldest() {
	var oldest string
	var at time.Time
	for name, w := range s.tools {
		if oldest == "" || w.seen.Before(at) {
			oldest, at = name, w.seen
		}
	}
	delete(s.tools, oldest)
}

// Cap is the number of calls that may run at once in a session that has called tools,
// at now: the lowest cap among them.
func (s *Scheduler) Cap(now time.Time, tools ...string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	level := 0
	for _, t := range tools {
		w := s.tools[t]
		if w == nil {
			continue
		}
		s.roll(w, now)
		level = max(level, w.level)
	}
	return s.levelCap(level)
}
