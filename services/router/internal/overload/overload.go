// Package overload sheds a share of new requests while the router's process is short of
// CPU, so that the requests it admits keep their latency instead of every request
// queueing until all of them miss their deadlines.
//
// The signal is the Go scheduler's own: how long runnable goroutines waited for a CPU
// (SchedulingDelay). Unlike request latency, it does not rise when a provider is slow,
// which is the router's job to absorb, not a reason to refuse work. The P90 rather than
// the P99 tells a standing queue from a burst, as CoDel does for packets: a burst (a
// collection, a new connection's first requests) delays a few wake-ups; a process with
// more work than CPUs delays most of them. The limit is low (20 ms by default) because a
// process short of CPU queues requests where the scheduler does not see them too: behind
// locks and connections whose holders wait for a CPU, where they wait for seconds while
// the P90 wait for a CPU is still tens of milliseconds
// (docs/design/010-shed-on-a-short-cpu-wait.md).
//
// Every Interval the shed share grows while the delay's P90 is over the limit and falls by
// StepDown once it is under half of it, or while fewer requests are in flight than could
// be shed; in between it holds, so that the share settles instead of swinging. Growing, it
// takes at least StepUp and at once the excess the process's CPU showed: the CPU it got in
// the interval, divided by what a request cost while the process kept up, is how many
// requests it can serve, and the share is what arrived beyond nine tenths of that, so that
// the queue drains. A request is shed with the share of its priority: critical never, high
// at half the share, batch at twice it.
package overload

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// Control constants: a quarter second reacts within a few hundred milliseconds of an
// overload, and reads enough scheduler events at any load worth shedding at.
const (
	Interval = 250 * time.Millisecond
	StepUp   = 0.1
	StepDown = 0.05
)

// What a request costs is learnt from the last calmIntervals intervals in which nothing
// was shed and the wait was short: the busiest of them with at least minCostRequests
// requests, because a request costs less CPU the more come per second (caches stay warm)
// and an overload comes at the highest rates; a cost too low errs towards shedding too
// little, which StepUp then makes up. (Requests that do not pass Admit, from callers in
// this process, count in the CPU but not in the requests: they make the cost err high,
// and the share then falls by StepDown once the overload is over.) drain is the share of
// that capacity admitted while over the limit, so that requests queued for the CPU are
// served before new ones pile up.
const (
	calmIntervals   = 32
	minCostRequests = 16
	drain           = 0.9
)

// calmInterval is one calm interval: the CPU the process used in it and the requests that
// arrived.
type calmInterval struct {
	cpu      time.Duration
	requests int64
}

// Signals are what a shedder reads every Interval.
type Signals struct {
	// Delay is the wait of runnable goroutines for a CPU since its previous call (a
	// SchedulingDelay's Read, in production); the overload signal.
	Delay func() time.Duration
	// CPU is the CPU time the process has used so far (user and system) and whether it
	// was measured (procusage.CPU, in production); nil or not measured: the share grows by
	// StepUp alone.
	CPU func() (time.Duration, bool)
}

// Config is the router's overload block.
type Config struct {
	// MaxSchedulingDelay: the router sheds a share of new requests while the P90 wait of its
	// goroutines for a CPU is over this; 0s turns shedding off.
	MaxSchedulingDelay time.Duration `yaml:"max_scheduling_delay"`
	// MinInFlight: with fewer requests in flight on this replica nothing is shed, so that
	// a process slowed by something else (a neighbour, a debugger) does not refuse the few
	// requests it has.
	MinInFlight int `yaml:"min_in_flight"`
	// MaxShare is the largest share of normal-priority requests shed (batch: twice it, up
	// to all; high: half; critical: none), so that some traffic always gets through and
	// shows when the overload is over.
	MaxShare float64 `yaml:"max_share"`
}

// Validate checks the block; messages name the keys.
func (c Config) Validate() error {
	var errs []error
	switch {
	case c.MaxSchedulingDelay == 0:
		return nil // off: the rest is never used
	case c.MaxSchedulingDelay < time.Millisecond:
		// Below a millisecond, ordinary scheduling would read as overload.
		errs = append(errs, fmt.Errorf("max_scheduling_delay: want 0 (off) or at least 1ms, got %s", c.MaxSchedulingDelay))
	}
	if c.MinInFlight < 0 {
		errs = append(errs, fmt.Errorf("min_in_flight: must not be negative, got %d", c.MinInFlight))
	}
	if !(c.MaxShare > 0 && c.MaxShare < 1) { // NaN too: it would shed everything, for ever
		errs = append(errs, fmt.Errorf("max_share: want a share in (0, 1), got %g", c.MaxShare))
	}
	return errors.Join(errs...)
}

// Change is a shedder's move into or out of shedding.
type Change struct {
	Shedding bool
	// Delay is the P90 scheduling delay of the interval that caused the change.
	Delay time.Duration
}

// Shedder admits or sheds requests. Admit and Done are safe for concurrent use; Run
// adjusts the share.
type Shedder struct {
	cfg      Config
	delay    func() time.Duration
	cpu      func() (time.Duration, bool)
	clock    clockwork.Clock
	random   func() float64
	onChange func(context.Context, Change)

	share     atomic.Uint64 // math.Float64bits of the share of normal requests shed
	lastDelay atomic.Int64  // the last interval's P90, in nanoseconds
	inFlight  atomic.Int64
	arrived   atomic.Int64 // Admit calls since the last interval
	cost      atomic.Int64 // what a request costs in CPU, in nanoseconds; 0: not known yet

	// Run's goroutine only: the CPU reading at the last interval, and the last calm
	// intervals (a ring; next is where the next one goes).
	lastCPU time.Duration
	calm    [calmIntervals]calmInterval
	next    int
}

// New returns a shedder that reads signals every Interval of clock, draws from random
// (uniform in [0, 1)), and calls onChange, from Run's goroutine and with Run's context,
// when shedding starts or stops.
func New(cfg Config, signals Signals, clock clockwork.Clock, random func() float64, onChange func(context.Context, Change)) *Shedder {
	if onChange == nil {
		onChange = func(context.Context, Change) {}
	}
	return &Shedder{cfg: cfg, delay: signals.Delay, cpu: signals.CPU, clock: clock, random: random, onChange: onChange}
}

// Run adjusts the share every Interval until ctx ends. With shedding off it returns at once.
func (s *Shedder) Run(ctx context.Context) error {
	if s.cfg.MaxSchedulingDelay == 0 {
		return nil
	}
	if s.cpu != nil {
		s.lastCPU, _ = s.cpu() // the first interval counts from here, not from the process's start
	}
	t := s.clock.NewTicker(Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.Chan():
			s.adjust(ctx)
		}
	}
}

// adjust reads one interval's delay and moves the share. With fewer requests in flight
// than could be shed, a long wait is not an overload of this router's making (a
// neighbour, a collection, the process starting): the share falls as if the wait were
// short, and no overload is announced.
func (s *Shedder) adjust(ctx context.Context) {
	d := s.delay()
	s.lastDelay.Store(int64(d))
	arrived := s.arrived.Swap(0)
	var used time.Duration // stays 0 without a measured CPU: no cost is learnt, none used
	if s.cpu != nil {
		if now, ok := s.cpu(); ok {
			used, s.lastCPU = now-s.lastCPU, now
		}
	}
	before := s.Share()
	after := before
	sheddable := s.inFlight.Load() >= int64(s.cfg.MinInFlight)
	calm := d < s.cfg.MaxSchedulingDelay/2
	switch {
	case d > s.cfg.MaxSchedulingDelay && sheddable:
		after = min(s.cfg.MaxShare, max(before+StepUp, s.excess(used, arrived)))
	case before == 0 && calm:
		s.learnCost(used, arrived)
	case calm || !sheddable:
		after = max(0, before-StepDown)
		if after < StepDown/2 { // floating-point steps down to zero
			after = 0
		}
	}
	s.share.Store(math.Float64bits(after))
	if (before == 0) != (after == 0) {
		s.onChange(ctx, Change{Shedding: after > 0, Delay: d})
	}
}

// excess is the share of arrived requests beyond what used CPU serves at the learnt cost,
// leaving a 1-drain part of that capacity to the queue; 0 while the cost is unknown.
func (s *Shedder) excess(used time.Duration, arrived int64) float64 {
	cost := s.cost.Load()
	if cost == 0 || arrived == 0 {
		return 0
	}
	capacity := drain * float64(used) / float64(cost)
	return max(0, 1-capacity/float64(arrived))
}

// learnCost keeps a calm interval's CPU and requests and sets the cost from the busiest
// interval kept.
func (s *Shedder) learnCost(used time.Duration, arrived int64) {
	if arrived < minCostRequests || used <= 0 { // without a CPU signal used is 0
		return
	}
	s.calm[s.next] = calmInterval{cpu: used, requests: arrived}
	s.next = (s.next + 1) % calmIntervals
	busiest := s.calm[0]
	for _, c := range s.calm[1:] {
		if c.requests > busiest.requests {
			busiest = c
		}
	}
	s.cost.Store(int64(busiest.cpu) / busiest.requests)
}

// Cost is what a request costs the process in CPU, as learnt while it kept up (0 until
// then, or without a CPU signal).
func (s *Shedder) Cost() time.Duration { return time.Duration(s.cost.Load()) }

// Config is the configuration the shedder runs with.
func (s *Shedder) Config() Config { return s.cfg }

// Share is the share of normal-priority requests now shed.
func (s *Shedder) Share() float64 { return math.Float64frombits(s.share.Load()) }

// Delay is the last interval's P90 scheduling delay.
func (s *Shedder) Delay() time.Duration { return time.Duration(s.lastDelay.Load()) }

// InFlight is the number of admitted requests not yet done.
func (s *Shedder) InFlight() int64 { return s.inFlight.Load() }

// Admit decides whether a request of priority p is served. An admitted request must call
// Done when it ends; a shed one must not.
func (s *Shedder) Admit(p mantlev1.Priority) bool {
	s.arrived.Add(1)
	n := s.inFlight.Add(1)
	share := s.Share()
	if share == 0 || n <= int64(s.cfg.MinInFlight) || s.random() >= ShareOf(share, p) {
		return true
	}
	s.inFlight.Add(-1)
	return false
}

// Done ends an admitted request.
func (s *Shedder) Done() { s.inFlight.Add(-1) }

// ShareOf is the share of requests of priority p shed when share of normal ones are.
func ShareOf(share float64, p mantlev1.Priority) float64 {
	switch p {
	case mantlev1.Priority_PRIORITY_CRITICAL:
		return 0
	case mantlev1.Priority_PRIORITY_HIGH:
		return share / 2
	case mantlev1.Priority_PRIORITY_BATCH:
		return min(1, 2*share)
	}
	return share
}
