// Package load is an open-loop load generator: it starts requests at a fixed rate for a
// fixed duration whether or not earlier ones have finished, the way independent users
// arrive at a service.
//
// Open loop matters for fault drills and benchmarks alike. A closed-loop client (N workers,
// each waiting for its answer before sending the next request) slows down exactly when the
// system under test does, so it sends less load during an incident and hides the latency
// that queued users would have seen ("coordinated omission"). Here request i is due at
// start + i/rate, its latency is measured from that due time rather than from when it was
// actually sent, and a generator that falls behind sends the late requests at once.
//
// Both the rate and the duration are bounded, and so is the number of requests in flight:
// a request that would exceed MaxInFlight is shed (reported to the Shed callback, never
// sent) so that a stalled system under test cannot make the generator grow without limit.
package load

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// Limits on a run, so a typo cannot start an unbounded one.
const (
	MaxRate     = 100_000
	MaxDuration = 24 * time.Hour
	// DefaultMaxInFlight bounds concurrent requests when Config.MaxInFlight is zero.
	DefaultMaxInFlight = 10_000
)

// Config describes one run.
type Config struct {
	// Rate is requests per second of wall-clock time.
	Rate float64
	// Duration is how long requests keep starting; the run returns once the last one has
	// finished.
	Duration time.Duration
	// MaxInFlight bounds concurrent requests; 0 means DefaultMaxInFlight.
	MaxInFlight int
	// Clock paces the requests; nil means the real clock.
	Clock clockwork.Clock
}

// Requests is how many requests the run starts: Rate x Duration, rounded.
func (c Config) Requests() int {
	return int(math.Round(c.Rate * c.Duration.Seconds()))
}

// Validate reports a config that cannot run.
func (c Config) Validate() error {
	var errs []error
	if !(c.Rate > 0 && c.Rate <= MaxRate) {
		errs = append(errs, fmt.Errorf("rate: must be in (0, %d] per second, got %g", MaxRate, c.Rate))
	}
	if c.Duration <= 0 || c.Duration > MaxDuration {
		errs = append(errs, fmt.Errorf("duration: must be in (0, %s], got %s", MaxDuration, c.Duration))
	}
	if c.MaxInFlight < 0 {
		errs = append(errs, fmt.Errorf("max_in_flight: must not be negative, got %d", c.MaxInFlight))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if c.Requests() < 1 {
		return fmt.Errorf("rate %g for %s starts no request", c.Rate, c.Duration)
	}
	return nil
}

// Func sends request i, which was due at due. It runs on its own goroutine and must return
// once ctx is done.
type Func func(ctx context.Context, i int, due time.Time)

// Stats describes how the generator kept to its schedule.
type Stats struct {
	// Started is how many requests were handed to the Func; Shed how many were dropped
	// because MaxInFlight requests were already running.
	Started, Shed int
	// MaxLag is the longest delay between a request's due time and its start: how far the
	// generator itself fell behind (a busy machine, not the system under test).
	MaxLag time.Duration
	// Start is when request 0 was due; Elapsed how long the run took until the last
	// request finished.
	Start   time.Time
	Elapsed time.Duration
}

// Run starts cfg.Requests() requests at cfg.Rate and waits for all of them. When ctx ends,
// no further request starts, the running ones see ctx done, and Run returns ctx's error once
// they have returned. shed, if not nil, is called (on Run's goroutine) for each request
// dropped because MaxInFlight were running.
func Run(ctx context.Context, cfg Config, fn Func, shed func(i int, due time.Time)) (Stats, error) {
	if err := cfg.Validate(); err != nil {
		return Stats{}, fmt.Errorf("load: %w", err)
	}
	clock := cfg.Clock
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	limit := cfg.MaxInFlight
	if limit == 0 {
		limit = DefaultMaxInFlight
	}
	n := cfg.Requests()
	interval := time.Duration(float64(time.Second) / cfg.Rate)
	slots := make(chan struct{}, limit)
	var wg sync.WaitGroup
	st := Stats{Start: clock.Now()}
	timer := clock.NewTimer(time.Hour) // re-armed for every wait below
	timer.Stop()
	defer timer.Stop()

	var err error
	for i := range n {
		// Multiplying rather than adding keeps rounding from drifting over long runs.
		due := st.Start.Add(time.Duration(i) * interval)
		if wait := due.Sub(clock.Now()); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.Chan():
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			err = ctx.Err()
			break
		}
		st.MaxLag = max(st.MaxLag, clock.Since(due))
		select {
		case slots <- struct{}{}:
		default:
			st.Shed++
			if shed != nil {
				shed(i, due)
			}
			continue
		}
		st.Started++
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			fn(ctx, i, due)
		}()
	}
	wg.Wait()
	st.Elapsed = clock.Since(st.Start)
	return st, err
}
