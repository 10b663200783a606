package resilience

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"pgregory.net/rapid"
)

// breakerModel drives a breaker with random interleavings of Allow, Done, Cancel and clock
// advances, and checks after every step what must always hold.
type breakerModel struct {
	cfg     BreakerConfig
	clock   *clockwork.FakeClock
	b       *Breaker
	trans   []Transition
	checked int // transitions already checked
	permits []*modelPermit
	// successes[i] counts successful probes finished in the period that starts with
	// transition i-1 (period 0 is the initial closed period).
	successes map[int]int
}

type modelPermit struct {
	p         Permit
	period    int // len(trans) when admitted: which period it belongs to
	finished  bool
	cancelled bool
}

func newBreakerModel(t *rapid.T) *breakerModel {
	open := time.Duration(rapid.IntRange(1, 60).Draw(t, "open_s")) * time.Second
	cfg := BreakerConfig{
		Window:              time.Duration(rapid.IntRange(1, 120).Draw(t, "window_s")) * time.Second,
		Buckets:             rapid.IntRange(1, 12).Draw(t, "buckets"),
		MinCalls:            rapid.IntRange(1, 10).Draw(t, "min_calls"),
		FailureRate:         rapid.Float64Range(0.05, 1).Draw(t, "failure_rate"),
		SlowCall:            time.Duration(rapid.IntRange(0, 20).Draw(t, "slow_call_s")) * time.Second,
		SlowCallRate:        rapid.Float64Range(0.05, 1).Draw(t, "slow_call_rate"),
		ConsecutiveFailures: rapid.IntRange(0, 6).Draw(t, "consecutive_failures"),
		OpenDuration:        open,
		MaxOpenDuration:     open * time.Duration(rapid.IntRange(1, 16).Draw(t, "max_open_factor")),
		OpenJitter:          rapid.Float64Range(0, 0.5).Draw(t, "open_jitter"),
		HalfOpenProbes:      rapid.IntRange(1, 5).Draw(t, "half_open_probes"),
	}
	rng := rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "seed"), 1))
	m := &breakerModel{cfg: cfg, clock: clockwork.NewFakeClock(), successes: map[int]int{}}
	m.b = NewBreaker(cfg, m.clock, rng.Float64, func(tr Transition) { m.trans = append(m.trans, tr) })
	return m
}

func (m *breakerModel) state() State {
	if len(m.trans) == 0 {
		return StateClosed
	}
	return m.trans[len(m.trans)-1].To
}

func (m *breakerModel) pick(t *rapid.T) *modelPermit {
	var open []*modelPermit
	for _, p := range m.permits {
		if !p.finished || rapid.IntRange(0, 9).Draw(t, "refinish") == 0 {
			open = append(open, p) // occasionally finish one twice: it must be a no-op
		}
	}
	if len(open) == 0 {
		t.Skip("no permit to finish")
	}
	return rapid.SampledFrom(open).Draw(t, "permit")
}

func (m *breakerModel) actions() map[string]func(*rapid.T) {
	return map[string]func(*rapid.T){
		"allow": func(t *rapid.T) {
			p, ok := m.b.Allow()
			st := m.state() // after any lazy open -> half-open
			switch {
			case ok && st == StateOpen:
				t.Fatalf("Allow admitted a call while open")
			case !ok && st == StateClosed:
				t.Fatalf("Allow refused a call while closed")
			}
			if ok {
				m.permits = append(m.permits, &modelPermit{p: p, period: len(m.trans)})
			}
		},
		"done": func(t *rapid.T) {
			mp := m.pick(t)
			failure := rapid.Bool().Draw(t, "failure")
			latency := time.Duration(rapid.IntRange(0, 40).Draw(t, "latency_s")) * time.Second
			slow := m.cfg.SlowCall > 0 && latency > m.cfg.SlowCall
			before, stateBefore := len(m.trans), m.state()
			mp.p.Done(failure, latency)
			if mp.finished {
				if len(m.trans) != before {
					t.Fatalf("a second Done caused a transition")
				}
				return
			}
			mp.finished = true
			if mp.period == before && stateBefore == StateHalfOpen && !failure && !slow {
				m.successes[mp.period]++
			}
		},
		"cancel": func(t *rapid.T) {
			mp := m.pick(t)
			before := len(m.trans)
			mp.p.Cancel()
			if len(m.trans) != before {
				t.Fatalf("Cancel caused a transition")
			}
			if !mp.finished {
				mp.finished, mp.cancelled = true, true
			}
		},
		"advance": func(t *rapid.T) {
			m.clock.Advance(time.Duration(rapid.Int64Range(0, int64(3*m.cfg.MaxOpenDuration)).Draw(t, "advance")))
		},
		"": m.check,
	}
}

func (m *breakerModel) check(t *rapid.T) {
	snap := m.b.Snapshot() // may move open -> half-open; delivered before it returns
	checkChain(t, m.trans)
	if snap.State != m.state() {
		t.Fatalf("Snapshot state %s, last transition to %s", snap.State, m.state())
	}
	// Every transition since the last check follows its rules.
	for i := m.checked; i < len(m.trans); i++ {
		tr := m.trans[i]
		prevTrips := 0
		if i > 0 {
			prevTrips = m.tripsAfter(i - 1)
		}
		switch {
		case tr.From == StateHalfOpen && tr.To == StateClosed:
			if got := m.successes[i]; got != m.cfg.HalfOpenProbes {
				t.Fatalf("closed after %d successful probes, want %d", got, m.cfg.HalfOpenProbes)
			}
		case tr.From == StateClosed && tr.To == StateOpen && prevTrips != 0:
			t.Fatalf("trip from closed with %d trips on record", prevTrips)
		}
	}
	m.checked = len(m.trans)
	// Half-open never has more probes out or succeeded than it may admit.
	if snap.State == StateHalfOpen {
		cur, probes := len(m.trans), 0
		for _, p := range m.permits {
			if p.period == cur && !p.cancelled {
				probes++
			}
		}
		if probes > m.cfg.HalfOpenProbes {
			t.Fatalf("half-open admitted %d probes, limit %d", probes, m.cfg.HalfOpenProbes)
		}
	}
	// Trips and the open period.
	switch snap.State {
	case StateClosed:
		if snap.Trips != 0 || !snap.OpenUntil.IsZero() {
			t.Fatalf("closed with Trips %d OpenUntil %s", snap.Trips, snap.OpenUntil)
		}
	case StateHalfOpen:
		if snap.Trips < 1 || !snap.OpenUntil.IsZero() {
			t.Fatalf("half-open with Trips %d OpenUntil %s", snap.Trips, snap.OpenUntil)
		}
	case StateOpen:
		if snap.Trips != m.tripsAfter(len(m.trans)-1) {
			t.Fatalf("Trips %d, transitions say %d", snap.Trips, m.tripsAfter(len(m.trans)-1))
		}
		if !snap.OpenUntil.After(m.clock.Now()) {
			t.Fatalf("open until %s, which is not after now %s", snap.OpenUntil, m.clock.Now())
		}
		base := m.cfg.OpenDuration
		for i := 1; i < snap.Trips && base < m.cfg.MaxOpenDuration; i++ {
			base *= 2
		}
		base = min(base, m.cfg.MaxOpenDuration)
		period := snap.OpenUntil.Sub(m.trans[len(m.trans)-1].At)
		lo := time.Duration(float64(base)*(1-m.cfg.OpenJitter)) - 1
		hi := time.Duration(float64(base)*(1+m.cfg.OpenJitter)) + 1
		if period < lo || period > hi {
			t.Fatalf("open period %s after trip %d, want within [%s, %s]", period, snap.Trips, lo, hi)
		}
	}
}

// tripsAfter replays the transitions up to and including i and returns the trip count.
func (m *breakerModel) tripsAfter(i int) int {
	trips := 0
	for _, tr := range m.trans[:i+1] {
		switch tr.To {
		case StateOpen:
			trips++
		case StateClosed:
			trips = 0
		}
	}
	return trips
}

// TestBreakerProperties: for any interleaving of Allow, Done, Cancel and clock advances,
// only legal transitions happen, half-open admissions never exceed the probe count, closing
// takes exactly HalfOpenProbes successful probes, and open periods grow within their bounds.
func TestBreakerProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := newBreakerModel(t)
		t.Repeat(m.actions())
	})
}

// TestBudgetProperties: for any sequence of requests, retries and clock advances, TryRetry
// follows the documented rule, and at the moment a retry is admitted the window never holds
// more than max(Floor, Ratio*requests) retries.
func TestBudgetProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		width := time.Duration(rapid.IntRange(1, 10).Draw(t, "width_s")) * time.Second
		cfg := BudgetConfig{
			Ratio:           rapid.Float64Range(0, 1).Draw(t, "ratio"),
			Floor:           rapid.IntRange(0, 10).Draw(t, "floor"),
			Buckets:         rapid.IntRange(1, 12).Draw(t, "buckets"),
			FormatOnlyAbove: rapid.Float64Range(0, 1).Draw(t, "format_only_above"),
		}
		cfg.Window = width * time.Duration(cfg.Buckets)
		clock := clockwork.NewFakeClock()
		origin := clock.Now()
		b := NewBudget(cfg, clock)
		epoch := func() int64 { return int64(clock.Since(origin) / width) }
		var reqEpochs, retryEpochs []int64
		inWindow := func(es []int64) int {
			n := 0
			for _, e := range es {
				if e > epoch()-int64(cfg.Buckets) {
					n++
				}
			}
			return n
		}
		t.Repeat(map[string]func(*rapid.T){
			"requests": func(t *rapid.T) {
				for range rapid.IntRange(1, 20).Draw(t, "n") {
					b.Request()
					reqEpochs = append(reqEpochs, epoch())
				}
			},
			"retry": func(t *rapid.T) {
				format := rapid.Bool().Draw(t, "format")
				req, ret := inWindow(reqEpochs), inWindow(retryEpochs)
				rate := float64(ret) / float64(max(req, 1))
				want := ret < cfg.Floor ||
					((format || rate <= cfg.FormatOnlyAbove) && float64(ret+1) <= cfg.Ratio*float64(req))
				if got := b.TryRetry(format); got != want {
					t.Fatalf("TryRetry(%v) = %v with %d requests %d retries, rule says %v", format, got, req, ret, want)
				}
				if !want {
					return
				}
				retryEpochs = append(retryEpochs, epoch())
				if ret+1 > max(cfg.Floor, int(cfg.Ratio*float64(req)+1e-9)) {
					t.Fatalf("admitted retry %d with %d requests: over max(floor %d, ratio %v)", ret+1, req, cfg.Floor, cfg.Ratio)
				}
			},
			"advance": func(t *rapid.T) {
				clock.Advance(time.Duration(rapid.Int64Range(0, int64(cfg.Window)).Draw(t, "advance")))
			},
			"": func(t *rapid.T) {
				req, ret, _ := b.Snapshot()
				if req != inWindow(reqEpochs) || ret != inWindow(retryEpochs) {
					t.Fatalf("Snapshot %d/%d, model %d/%d", req, ret, inWindow(reqEpochs), inWindow(retryEpochs))
				}
			},
		})
	})
}
