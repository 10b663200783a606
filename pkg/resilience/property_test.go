package resilience

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"pgregory.net/rapid"
)

// breakerModel drives a breaker with random interleavings of Allow, Done, Abandon, Cancel
// and clock advances, and checks after every step what must always hold.
type breakerModel struct {
	cfg     BreakerConfig
	clock   *clockwork.FakeClock
	b       *Breaker
	trans   []Transition
	checked int // transitions already checked
	permits []*modelPermit
	// successes[i] counts successful probes finished in the period that starts with
	// transition i-1 (period 0 is the initial closed period); a scout that ended an open
	// period counts in the half-open period it started. abandoned[i] counts the probes of
	// period i that ended without a verdict.
	successes, abandoned map[int]int
}

type modelPermit struct {
	p         Permit
	period    int // len(trans) when admitted: which period it belongs to
	at        time.Time
	scout     bool // admitted while open
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
		// -1 s: no scouting; 0: every open_duration; else up to open_duration, so that
		// scouts happen before the open period ends.
		ScoutInterval: time.Duration(rapid.IntRange(-1, int(open/time.Second)).Draw(t, "scout_interval_s")) * time.Second,
	}
	rng := rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "seed"), 1))
	m := &breakerModel{cfg: cfg, clock: clockwork.NewFakeClock(), successes: map[int]int{}, abandoned: map[int]int{}}
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
				m.checkScout(t)
			case !ok && st == StateClosed:
				t.Fatalf("Allow refused a call while closed")
			}
			if ok {
				m.permits = append(m.permits, &modelPermit{p: p, period: len(m.trans), at: m.clock.Now(), scout: st == StateOpen})
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
			switch {
			case mp.period != before || failure || slow:
			case stateBefore == StateHalfOpen:
				m.successes[mp.period]++
			case stateBefore == StateOpen && mp.scout:
				m.successes[mp.period+1]++ // it moved the breaker to half-open
				if len(m.trans) == before || m.trans[before].Reason != "scout succeeded" {
					t.Fatalf("a successful scout did not end the open period")
				}
			}
		},
		"abandon": func(t *rapid.T) {
			mp := m.pick(t)
			before, stateBefore := len(m.trans), m.state()
			mp.p.Abandon()
			if mp.finished {
				if len(m.trans) != before {
					t.Fatalf("Abandon after the end caused a transition")
				}
				return
			}
			mp.finished = true
			if mp.period == before && stateBefore == StateHalfOpen {
				m.abandoned[mp.period]++
			} else if len(m.trans) != before {
				t.Fatalf("Abandon outside the current half-open period caused a transition")
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
			// Mostly steps within an open period, so that scouts and late probes happen in it.
			limit := []time.Duration{m.cfg.OpenDuration / 4, m.cfg.OpenDuration, 3 * m.cfg.MaxOpenDuration}[rapid.IntRange(0, 2).Draw(t, "scale")]
			m.clock.Advance(time.Duration(rapid.Int64Range(0, int64(limit)).Draw(t, "advance")))
		},
		"to_scout": func(t *rapid.T) {
			// Jump to when the next scout is due: random advances rarely land between it and
			// the end of the open period.
			snap := m.b.Snapshot()
			if snap.State != StateOpen || snap.NextScout.IsZero() {
				t.Skip("no scout due")
			}
			m.clock.Advance(snap.NextScout.Sub(m.clock.Now()))
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
		switch {
		case tr.From == StateHalfOpen && tr.To == StateClosed:
			// Every place used, none failed, most succeeded.
			if ok, ab := m.successes[i], m.abandoned[i]; ok*2 <= m.cfg.HalfOpenProbes || ok+ab != m.cfg.HalfOpenProbes {
				t.Fatalf("closed after %d successful and %d abandoned probes, want %d in all, most successful", ok, ab, m.cfg.HalfOpenProbes)
			}
		case tr.From == StateHalfOpen && tr.To == StateOpen && strings.HasPrefix(tr.Reason, ReasonNoVerdict):
			if ok, ab := m.successes[i], m.abandoned[i]; ok*2 > m.cfg.HalfOpenProbes || ok+ab != m.cfg.HalfOpenProbes {
				t.Fatalf("no-verdict re-open after %d successful and %d abandoned probes", ok, ab)
			}
		case tr.From == StateClosed && tr.To == StateOpen:
			// A trip soon after a close is a flap, and says so; any other starts over.
			_, want := m.episode(i)
			if got := strings.Contains(tr.Reason, "; flapping: "); got != want {
				t.Fatalf("trip %q after transitions %v: flapping %t, want %t", tr.Reason, m.trans[:i], got, want)
			}
		}
	}
	m.checked = len(m.trans)
	// Half-open never has more probes out, finished or abandoned than it may admit; a scout
	// that opened the trial is one of them.
	if snap.State == StateHalfOpen {
		cur, probes := len(m.trans), 0
		if m.trans[cur-1].Reason == "scout succeeded" {
			probes++
		}
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
		if want, _ := m.episode(len(m.trans) - 1); snap.Trips != want {
			t.Fatalf("Trips %d, transitions say %d", snap.Trips, want)
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

// episode replays transitions 0..i: the trips of the episode after transition i, and
// whether that episode began with a flap. A trip from closed within MaxOpenDuration of the
// close before it counts on from the trips before the close (a flap); any other trip from
// closed starts over at 1; a no-verdict re-open is not a trip.
func (m *breakerModel) episode(i int) (trips int, flapping bool) {
	var closedAt time.Time
	for _, tr := range m.trans[:i+1] {
		switch {
		case tr.To == StateOpen && strings.HasPrefix(tr.Reason, ReasonNoVerdict):
			// not a trip: the period is the previous one's
		case tr.To == StateOpen && tr.From == StateClosed:
			flapping = trips > 0 && tr.At.Sub(closedAt) < m.cfg.MaxOpenDuration
			if !flapping {
				trips = 0
			}
			trips++
		case tr.To == StateOpen:
			trips++
		case tr.To == StateClosed:
			closedAt = tr.At
		}
	}
	return trips, flapping
}

// checkScout checks a call admitted while open: scouting is on, no other scout of this
// period is out, and the last scout that was sent (or the period's start) is at least one
// ScoutInterval (less its jitter) ago.
func (m *breakerModel) checkScout(t *rapid.T) {
	iv := m.cfg.scoutInterval()
	if iv <= 0 {
		t.Fatalf("Allow admitted a call while open with scouting off")
	}
	cur := len(m.trans)
	if _, flapping := m.episode(cur - 1); flapping {
		t.Fatalf("a scout while flapping")
	}
	last := m.trans[cur-1].At
	for _, p := range m.permits {
		if p.period != cur || p.cancelled {
			continue
		}
		if !p.finished {
			t.Fatalf("a second scout while one is out")
		}
		last = p.at
	}
	if gap, lo := m.clock.Now().Sub(last), time.Duration(float64(iv)*(1-m.cfg.OpenJitter))-1; gap < lo {
		t.Fatalf("scout %s after the last, want at least %s", gap, lo)
	}
	if !m.clock.Now().Before(m.b.Snapshot().OpenUntil) {
		t.Fatalf("scout admitted after the open period ended")
	}
}

// TestBreakerProperties: for any interleaving of Allow, Done, Abandon, Cancel and clock
// advances, only legal transitions happen, half-open admissions (abandoned probes and the
// scout that opened the trial included) never exceed the probe count, closing takes every
// probe place with at least one success and no failure, an open breaker admits at most one
// scout per interval, and open periods grow within their bounds.
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
