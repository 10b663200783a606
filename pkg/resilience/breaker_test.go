package resilience

import (
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jonboulle/clockwork"
)

// harness is a breaker on a fake clock with a fixed jitter draw that records transitions.
type harness struct {
	t     *testing.T
	clock *clockwork.FakeClock
	b     *Breaker
	mu    sync.Mutex
	trans []Transition
}

// noJitter makes every open period exactly its base.
const noJitter = 0.5

func newHarness(t *testing.T, cfg BreakerConfig, r float64) *harness {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("test config: %v", err)
	}
	h := &harness{t: t, clock: clockwork.NewFakeClock()}
	h.b = NewBreaker(cfg, h.clock, func() float64 { return r }, func(tr Transition) {
		h.mu.Lock()
		h.trans = append(h.trans, tr)
		h.mu.Unlock()
	})
	return h
}

func (h *harness) transitions() []Transition {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Transition(nil), h.trans...)
}

// run makes one admitted call per letter: S success, F failure, L slow success (40 s),
// X slow failure (40 s). Every call must be admitted.
func (h *harness) run(pattern string) {
	h.t.Helper()
	for i, c := range pattern {
		p, ok := h.b.Allow()
		if !ok {
			h.t.Fatalf("call %d (%c) of %q refused; state %s", i, c, pattern, h.b.Snapshot().State)
		}
		switch c {
		case 'S':
			p.Done(false, time.Second)
		case 'F':
			p.Done(true, time.Second)
		case 'L':
			p.Done(false, 40*time.Second)
		case 'X':
			p.Done(true, 40*time.Second)
		default:
			h.t.Fatalf("bad pattern letter %c", c)
		}
	}
}

// trip opens a closed breaker with five failures in a row.
func (h *harness) trip() {
	h.t.Helper()
	h.run("FFFFF")
	if s := h.b.Snapshot().State; s != StateOpen {
		h.t.Fatalf("after FFFFF: state %s, want open", s)
	}
}

func TestStateString(t *testing.T) {
	for s, want := range map[State]string{StateClosed: "closed", StateOpen: "open", StateHalfOpen: "half_open", State(9): "State(9)"} {
		if got := s.String(); got != want {
			t.Errorf("State(%d).String() = %q, want %q", int(s), got, want)
		}
	}
}

func TestBreakerConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*BreakerConfig)
		wantKey string // "" means valid
	}{
		{"defaults", func(*BreakerConfig) {}, ""},
		{"slow calls and fast trip disabled", func(c *BreakerConfig) { c.SlowCall, c.ConsecutiveFailures = 0, 0 }, ""},
		{"scouting off", func(c *BreakerConfig) { c.ScoutInterval = -1 }, ""},
		{"scouting more often than the open period", func(c *BreakerConfig) { c.ScoutInterval = time.Second }, ""},
		{"window", func(c *BreakerConfig) { c.Window = -time.Second }, "window:"},
		{"buckets", func(c *BreakerConfig) { c.Buckets = -1 }, "buckets:"},
		{"buckets too many for window", func(c *BreakerConfig) { c.Window = 5 }, "buckets:"},
		{"min_calls", func(c *BreakerConfig) { c.MinCalls = 0 }, "min_calls:"},
		{"failure_rate zero", func(c *BreakerConfig) { c.FailureRate = 0 }, "failure_rate:"},
		{"failure_rate above one", func(c *BreakerConfig) { c.FailureRate = 1.5 }, "failure_rate:"},
		{"slow_call", func(c *BreakerConfig) { c.SlowCall = -time.Second }, "slow_call:"},
		{"slow_call_rate", func(c *BreakerConfig) { c.SlowCallRate = 0 }, "slow_call_rate:"},
		{"consecutive_failures", func(c *BreakerConfig) { c.ConsecutiveFailures = -1 }, "consecutive_failures:"},
		{"open_duration", func(c *BreakerConfig) { c.OpenDuration = 0 }, "open_duration:"},
		{"max_open_duration", func(c *BreakerConfig) { c.MaxOpenDuration = time.Second }, "max_open_duration:"},
		{"open_jitter", func(c *BreakerConfig) { c.OpenJitter = 1 }, "open_jitter:"},
		{"half_open_probes", func(c *BreakerConfig) { c.HalfOpenProbes = 0 }, "half_open_probes:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultBreakerConfig()
			tt.mutate(&cfg)
			err := cfg.Validate()
			switch {
			case tt.wantKey == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tt.wantKey != "" && (err == nil || !strings.HasPrefix(err.Error(), tt.wantKey)):
				t.Fatalf("Validate() = %v, want an error starting with %q", err, tt.wantKey)
			}
		})
	}
}

func TestNewBreakerZeroConfigTakesDefaults(t *testing.T) {
	b := NewBreaker(BreakerConfig{}, clockwork.NewFakeClock(), nil, nil)
	if diff := cmp.Diff(DefaultBreakerConfig(), b.cfg); diff != "" {
		t.Fatalf("config (-want +got):\n%s", diff)
	}
}

// TestBreakerTrips covers every way out of closed, and the ways of staying in it.
func TestBreakerTrips(t *testing.T) {
	tests := []struct {
		name       string
		mutate     func(*BreakerConfig)
		pattern    string
		wantState  State
		wantReason string
		wantFR     float64 // rates carried by the trip (or the live window when closed)
		wantSR     float64
	}{
		{
			name:      "min calls not reached",
			pattern:   strings.Repeat("FFFFS", 3) + "FFFF", // 19 calls, 84% failures
			wantState: StateClosed, wantFR: 16.0 / 19,
		},
		{
			name:      "error-rate trip at min calls",
			pattern:   strings.Repeat("SFF", 6) + "SF", // call 20: 13 failures
			wantState: StateOpen, wantReason: "error rate 65% over 20 calls", wantFR: 0.65,
		},
		{
			name:      "error rate exactly at the threshold trips",
			pattern:   strings.Repeat("FS", 10),
			wantState: StateOpen, wantReason: "error rate 50% over 20 calls", wantFR: 0.5,
		},
		{
			name:      "error rate below the threshold stays closed",
			pattern:   strings.Repeat("SSF", 10),
			wantState: StateClosed, wantFR: 10.0 / 30,
		},
		{
			// A provider at P99 40 s with 0% errors: most calls take 12-40 s, none fails.
			name:      "slow-call trip with no errors",
			pattern:   strings.Repeat("SL", 9) + "LL",
			wantState: StateOpen, wantReason: "slow-call rate 55% (>10s) over 20 calls", wantSR: 0.55,
		},
		{
			name:      "slow-call tracking disabled",
			mutate:    func(c *BreakerConfig) { c.SlowCall = 0 },
			pattern:   strings.Repeat("L", 30),
			wantState: StateClosed,
		},
		{
			name:      "slow calls below the rate stay closed",
			pattern:   strings.Repeat("SSL", 10),
			wantState: StateClosed, wantSR: 10.0 / 30,
		},
		{
			name:      "consecutive failures trip before min calls",
			pattern:   "SFFFFF",
			wantState: StateOpen, wantReason: "5 consecutive failures", wantFR: 5.0 / 6,
		},
		{
			name:      "a success resets the streak",
			pattern:   "FFFFSFFFF",
			wantState: StateClosed, wantFR: 8.0 / 9,
		},
		{
			name:      "a slow success also resets the streak",
			pattern:   "FFFFLFFFF",
			wantState: StateClosed, wantFR: 8.0 / 9, wantSR: 1.0 / 9,
		},
		{
			name:      "fast trip disabled",
			mutate:    func(c *BreakerConfig) { c.ConsecutiveFailures = 0 },
			pattern:   strings.Repeat("F", 19),
			wantState: StateClosed, wantFR: 1,
		},
		{
			name:      "error rate is named first when both rates trip",
			mutate:    func(c *BreakerConfig) { c.ConsecutiveFailures = 0 },
			pattern:   strings.Repeat("X", 20),
			wantState: StateOpen, wantReason: "error rate 100% over 20 calls", wantFR: 1, wantSR: 1,
		},
		{
			name:      "incident tail: 30% of calls over 8 s trips with slow_call 8s, slow_call_rate 0.3",
			mutate:    func(c *BreakerConfig) { c.SlowCall, c.SlowCallRate = 8*time.Second, 0.3 },
			pattern:   strings.Repeat("SSLSLSSLSS", 2), // 6 of 20 at 40 s
			wantState: StateOpen, wantReason: "slow-call rate 30% (>8s) over 20 calls", wantSR: 0.3,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultBreakerConfig()
			if tt.mutate != nil {
				tt.mutate(&cfg)
			}
			h := newHarness(t, cfg, noJitter)
			h.run(tt.pattern)
			snap := h.b.Snapshot()
			if snap.State != tt.wantState || snap.Reason != tt.wantReason {
				t.Fatalf("state %s %q, want %s %q", snap.State, snap.Reason, tt.wantState, tt.wantReason)
			}
			if !near(snap.FailureRate, tt.wantFR) || !near(snap.SlowRate, tt.wantSR) {
				t.Errorf("rates %v/%v, want %v/%v", snap.FailureRate, snap.SlowRate, tt.wantFR, tt.wantSR)
			}
			trans := h.transitions()
			if tt.wantState == StateClosed {
				if len(trans) != 0 {
					t.Fatalf("transitions %+v, want none", trans)
				}
				if snap.Calls != len(tt.pattern) {
					t.Errorf("Calls = %d, want %d", snap.Calls, len(tt.pattern))
				}
				return
			}
			want := []Transition{{From: StateClosed, To: StateOpen, Reason: tt.wantReason, FailureRate: tt.wantFR, SlowRate: tt.wantSR, At: h.clock.Now()}}
			if diff := cmp.Diff(want, trans, cmp.Comparer(near)); diff != "" {
				t.Errorf("transitions (-want +got):\n%s", diff)
			}
			if snap.Trips != 1 || !snap.OpenUntil.Equal(h.clock.Now().Add(cfg.OpenDuration)) {
				t.Errorf("Trips %d OpenUntil %s, want 1 and now+%s", snap.Trips, snap.OpenUntil, cfg.OpenDuration)
			}
		})
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

// TestBreakerWindowSlides: failures older than the window no longer count toward a trip.
func TestBreakerWindowSlides(t *testing.T) {
	tests := []struct {
		name      string
		gap       time.Duration // between the first 19 calls and the 20th
		wantState State
		wantCalls int
	}{
		{"no gap", 0, StateOpen, 20},
		{"gap within the window", 55 * time.Second, StateOpen, 20},
		{"old calls aged out", 60 * time.Second, StateClosed, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, DefaultBreakerConfig(), noJitter)
			h.run(strings.Repeat("FFS", 6) + "F") // 19 calls, 13 failures: below min calls
			h.clock.Advance(tt.gap)
			h.run("F")
			snap := h.b.Snapshot()
			if snap.State != tt.wantState || snap.Calls != tt.wantCalls {
				t.Fatalf("state %s calls %d, want %s %d", snap.State, snap.Calls, tt.wantState, tt.wantCalls)
			}
		})
	}
}

// TestBreakerOpenPeriod checks the jittered open period: the breaker refuses until exactly
// then and admits a probe from then on.
func TestBreakerOpenPeriod(t *testing.T) {
	tests := []struct {
		name string
		r    float64
		want time.Duration
	}{
		{"lowest draw", 0, 24 * time.Second},
		{"middle draw", 0.5, 30 * time.Second},
		{"highest draw", 0.999999, 35999988 * time.Microsecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, DefaultBreakerConfig(), tt.r)
			tripped := h.clock.Now()
			h.trip()
			if got := h.b.Snapshot().OpenUntil.Sub(tripped); got != tt.want {
				t.Fatalf("open period %s, want %s", got, tt.want)
			}
			h.clock.Advance(tt.want - time.Nanosecond)
			if _, ok := h.b.Allow(); ok {
				t.Fatal("Allow admitted a call 1ns before the open period ended")
			}
			if s := h.b.Snapshot().State; s != StateOpen {
				t.Fatalf("state %s, want open", s)
			}
			h.clock.Advance(time.Nanosecond)
			if _, ok := h.b.Allow(); !ok {
				t.Fatal("Allow refused the first probe after the open period")
			}
			if s := h.b.Snapshot().State; s != StateHalfOpen {
				t.Fatalf("state %s, want half_open", s)
			}
		})
	}
}

func TestOpenPeriodGrowsAndIsCapped(t *testing.T) {
	cfg := DefaultBreakerConfig() // 30s doubling, capped at 5m, jitter 0.2
	tests := []struct {
		trip int
		base time.Duration
	}{
		{1, 30 * time.Second},
		{2, time.Minute},
		{3, 2 * time.Minute},
		{4, 4 * time.Minute},
		{5, 5 * time.Minute},
		{6, 5 * time.Minute},
		{100, 5 * time.Minute},
	}
	for _, tt := range tests {
		lo, mid := openPeriod(cfg, tt.trip, 0), openPeriod(cfg, tt.trip, 0.5)
		hi := openPeriod(cfg, tt.trip, 0.9999999999)
		if mid != tt.base {
			t.Errorf("trip %d: unjittered period %s, want %s", tt.trip, mid, tt.base)
		}
		if want := tt.base * 8 / 10; lo != want {
			t.Errorf("trip %d: lowest period %s, want %s", tt.trip, lo, want)
		}
		if hi >= tt.base*12/10 || hi < tt.base*12/10-time.Millisecond {
			t.Errorf("trip %d: highest period %s, want just under %s", tt.trip, hi, tt.base*12/10)
		}
	}
}

// halfOpen returns a harness whose breaker just moved to half-open (first trip, no jitter).
func halfOpen(t *testing.T, cfg BreakerConfig) *harness {
	t.Helper()
	h := newHarness(t, cfg, noJitter)
	h.trip()
	h.clock.Advance(cfg.OpenDuration)
	if s := h.b.Snapshot().State; s != StateHalfOpen {
		t.Fatalf("state %s, want half_open", s)
	}
	return h
}

func TestHalfOpenAdmitsExactlyTheProbes(t *testing.T) {
	for _, probes := range []int{1, 3, 5} {
		cfg := DefaultBreakerConfig()
		cfg.HalfOpenProbes = probes
		h := halfOpen(t, cfg)
		var permits []Permit
		for i := range probes {
			p, ok := h.b.Allow()
			if !ok {
				t.Fatalf("probes=%d: probe %d refused", probes, i)
			}
			permits = append(permits, p)
		}
		if _, ok := h.b.Allow(); ok {
			t.Fatalf("probes=%d: admitted probe %d", probes, probes+1)
		}
		if probes > 1 {
			// A probe that finished still used its place: half-open admits a total, not a
			// concurrency.
			permits[0].Done(false, time.Second)
			if _, ok := h.b.Allow(); ok {
				t.Fatalf("probes=%d: admitted a probe after one succeeded", probes)
			}
		}
		// A cancelled probe taught us nothing and gives its place back.
		permits[probes-1].Cancel()
		if _, ok := h.b.Allow(); !ok {
			t.Fatalf("probes=%d: refused a probe after one was cancelled", probes)
		}
		if _, ok := h.b.Allow(); ok {
			t.Fatalf("probes=%d: admitted one probe too many after the cancel", probes)
		}
	}
}

func TestProbeFailureReopensWithDoubledPeriod(t *testing.T) {
	tests := []struct {
		name       string
		failure    bool
		latency    time.Duration
		wantReason string
	}{
		{"failed probe", true, time.Second, "probe failed"},
		{"slow probe", false, 40 * time.Second, "probe slow (40s > 10s)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultBreakerConfig()
			h := halfOpen(t, cfg)
			wantPeriods := []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 5 * time.Minute, 5 * time.Minute}
			for i, want := range wantPeriods {
				p, ok := h.b.Allow()
				if !ok {
					t.Fatalf("re-trip %d: probe refused", i)
				}
				p.Done(tt.failure, tt.latency)
				snap := h.b.Snapshot()
				if snap.State != StateOpen || snap.Reason != tt.wantReason {
					t.Fatalf("re-trip %d: state %s %q, want open %q", i, snap.State, snap.Reason, tt.wantReason)
				}
				if snap.Trips != i+2 {
					t.Fatalf("re-trip %d: Trips %d, want %d", i, snap.Trips, i+2)
				}
				if got := snap.OpenUntil.Sub(h.clock.Now()); got != want {
					t.Fatalf("re-trip %d: open period %s, want %s", i, got, want)
				}
				h.clock.Advance(want)
			}
		})
	}
}

func TestProbesSucceedCloseAndResetTheWindow(t *testing.T) {
	cfg := DefaultBreakerConfig()
	h := halfOpen(t, cfg)
	// One re-trip first, so we can see Trips and the open period reset.
	p, _ := h.b.Allow()
	p.Done(true, time.Second)
	h.clock.Advance(time.Minute)
	var permits []Permit
	for range cfg.HalfOpenProbes {
		p, ok := h.b.Allow()
		if !ok {
			t.Fatal("probe refused")
		}
		permits = append(permits, p)
	}
	for i, p := range permits {
		if s := h.b.Snapshot().State; s != StateHalfOpen {
			t.Fatalf("after %d successes: state %s, want half_open", i, s)
		}
		p.Done(false, 2*time.Second)
	}
	snap := h.b.Snapshot()
	want := BreakerSnapshot{State: StateClosed, Reason: "probes succeeded"}
	if diff := cmp.Diff(want, snap); diff != "" {
		t.Fatalf("snapshot after probes (-want +got):\n%s", diff)
	}
	// The window starts empty: 19 failures (no five in a row) do not trip, and a trip once
	// max_open_duration has passed since the close is a first trip again (a trip sooner is
	// a flap: TestFlappingBreaker).
	h.clock.Advance(cfg.MaxOpenDuration)
	h.run(strings.Repeat("FFS", 6) + "F")
	if s := h.b.Snapshot().State; s != StateClosed {
		t.Fatalf("state %s, want closed (window was reset)", s)
	}
	h.run("F")
	snap = h.b.Snapshot()
	if snap.State != StateOpen || snap.Trips != 1 || snap.OpenUntil.Sub(h.clock.Now()) != cfg.OpenDuration {
		t.Fatalf("next trip: %+v, want open, Trips 1, period %s", snap, cfg.OpenDuration)
	}
}

// A breaker that trips again soon after closing is flapping: its open period doubles on
// from the episode before instead of starting over, its reason says so, and it sends no
// scouts until the doubled period is over. Once it has stayed closed for
// max_open_duration, a trip starts over.
func TestFlappingBreaker(t *testing.T) {
	cfg := DefaultBreakerConfig()
	cfg.HalfOpenProbes = 1
	h := halfOpen(t, cfg) // trip 1 of the episode
	closeIt := func() {
		t.Helper()
		p, ok := h.b.Allow()
		if !ok {
			t.Fatal("probe refused")
		}
		p.Done(false, time.Second)
		if s := h.b.Snapshot(); s.State != StateClosed || s.Trips != 0 {
			t.Fatalf("after a good probe: %+v, want closed with Trips 0", s)
		}
	}
	closeIt()

	steps := []struct {
		name        string
		closedFor   time.Duration // before the trip
		wantTrips   int
		wantPeriod  time.Duration
		wantFlapped bool
	}{
		{"tripped 10s after closing: the period doubles", 10 * time.Second, 2, 2 * cfg.OpenDuration, true},
		{"again, just inside max_open_duration: doubles again", cfg.MaxOpenDuration - time.Second, 3, 4 * cfg.OpenDuration, true},
		{"closed for max_open_duration: a first trip", cfg.MaxOpenDuration, 1, cfg.OpenDuration, false},
	}
	for _, st := range steps {
		h.clock.Advance(st.closedFor)
		h.trip()
		snap := h.b.Snapshot()
		if snap.Trips != st.wantTrips || snap.OpenUntil.Sub(h.clock.Now()) != st.wantPeriod {
			t.Fatalf("%s: Trips %d, period %s; want %d and %s", st.name, snap.Trips, snap.OpenUntil.Sub(h.clock.Now()), st.wantTrips, st.wantPeriod)
		}
		if got := strings.Contains(snap.Reason, "flapping: "+st.closedFor.String()+" after closing"); got != st.wantFlapped {
			t.Errorf("%s: reason %q, want the flap named: %t", st.name, snap.Reason, st.wantFlapped)
		}
		// A flapping breaker sends no scout, although its period is longer than the scout
		// interval (open_duration); a steadily open one would (TestScouting).
		if st.wantFlapped && !snap.NextScout.IsZero() {
			t.Errorf("%s: next scout at %v, want none while flapping", st.name, snap.NextScout)
		}
		h.clock.Advance(st.wantPeriod)
		closeIt()
	}
}

func TestOutcomesCountOnce(t *testing.T) {
	tests := []struct {
		name      string
		act       func(p Permit)
		wantCalls int
		wantFR    float64
	}{
		{"cancel records nothing", func(p Permit) { p.Cancel() }, 0, 0},
		{"done twice counts once", func(p Permit) { p.Done(true, time.Second); p.Done(true, time.Second) }, 1, 1},
		{"cancel after done is a no-op", func(p Permit) { p.Done(false, time.Second); p.Cancel() }, 1, 0},
		{"done after cancel is a no-op", func(p Permit) { p.Cancel(); p.Done(true, time.Second) }, 0, 0},
		{"copies share the permit", func(p Permit) { q := p; q.Done(true, time.Second); p.Done(true, time.Second) }, 1, 1},
		{"abandon records nothing", func(p Permit) { p.Abandon() }, 0, 0},
		{"done after abandon is a no-op", func(p Permit) { p.Abandon(); p.Done(true, time.Second) }, 0, 0},
		{"abandon after done is a no-op", func(p Permit) { p.Done(true, time.Second); p.Abandon() }, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultBreakerConfig()
			cfg.ConsecutiveFailures = 2 // a double-counted failure would trip
			h := newHarness(t, cfg, noJitter)
			p, ok := h.b.Allow()
			if !ok {
				t.Fatal("Allow refused")
			}
			tt.act(p)
			snap := h.b.Snapshot()
			if snap.State != StateClosed || snap.Calls != tt.wantCalls || snap.FailureRate != tt.wantFR {
				t.Fatalf("snapshot %+v, want closed with %d calls at %v", snap, tt.wantCalls, tt.wantFR)
			}
		})
	}
}

func TestCancelledCallsNeverTrip(t *testing.T) {
	h := newHarness(t, DefaultBreakerConfig(), noJitter)
	for range 100 {
		p, ok := h.b.Allow()
		if !ok {
			t.Fatal("Allow refused")
		}
		p.Cancel() // e.g. 429s: the key cools down, the breaker does not hear of it
	}
	if snap := h.b.Snapshot(); snap.State != StateClosed || snap.Calls != 0 {
		t.Fatalf("snapshot %+v, want closed with no calls", snap)
	}
}

func TestZeroPermitIsInert(t *testing.T) {
	var p Permit
	p.Done(true, time.Second)
	p.Abandon()
	p.Cancel()
}

// TestStaleOutcomesAreIgnored: an outcome counts only in the period it was admitted in.
func TestStaleOutcomesAreIgnored(t *testing.T) {
	cfg := DefaultBreakerConfig()
	h := newHarness(t, cfg, noJitter)
	late, _ := h.b.Allow() // admitted while closed, finishes after the trip
	h.trip()
	late.Done(false, time.Second)
	h.clock.Advance(cfg.OpenDuration)
	probe1, _ := h.b.Allow()
	probe2, _ := h.b.Allow()
	probe1.Done(true, time.Second) // re-opens
	probe2.Done(false, time.Second)
	h.clock.Advance(2 * cfg.OpenDuration)
	snap := h.b.Snapshot()
	if snap.State != StateHalfOpen || snap.Trips != 2 {
		t.Fatalf("snapshot %+v, want half_open after 2 trips", snap)
	}
	late.Done(true, time.Second) // already finished; also stale
	var got []string
	for _, tr := range h.transitions() {
		got = append(got, tr.From.String()+">"+tr.To.String())
	}
	want := []string{"closed>open", "open>half_open", "half_open>open", "open>half_open"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("transitions (-want +got):\n%s", diff)
	}
}

func TestOnTransitionSequence(t *testing.T) {
	cfg := DefaultBreakerConfig()
	h := newHarness(t, cfg, noJitter)
	start := h.clock.Now()
	h.trip()
	h.clock.Advance(cfg.OpenDuration) // Allow moves it to half-open
	p, _ := h.b.Allow()
	p.Done(true, time.Second)
	h.clock.Advance(2 * cfg.OpenDuration) // Snapshot moves it to half-open
	h.b.Snapshot()
	for range cfg.HalfOpenProbes {
		p, _ := h.b.Allow()
		p.Done(false, time.Second)
	}
	want := []Transition{
		{From: StateClosed, To: StateOpen, Reason: "5 consecutive failures", FailureRate: 1, At: start},
		{From: StateOpen, To: StateHalfOpen, Reason: "open period elapsed", At: start.Add(30 * time.Second)},
		{From: StateHalfOpen, To: StateOpen, Reason: "probe failed", FailureRate: 1, At: start.Add(30 * time.Second)},
		{From: StateOpen, To: StateHalfOpen, Reason: "open period elapsed", At: start.Add(90 * time.Second)},
		{From: StateHalfOpen, To: StateClosed, Reason: "probes succeeded", At: start.Add(90 * time.Second)},
	}
	if diff := cmp.Diff(want, h.transitions()); diff != "" {
		t.Fatalf("transitions (-want +got):\n%s", diff)
	}
}

// TestOnTransitionMayUseTheBreaker: the callback runs outside the lock, so it can read the
// snapshot and even make calls; a transition it causes is delivered after it returns.
func TestOnTransitionMayUseTheBreaker(t *testing.T) {
	clock := clockwork.NewFakeClock()
	cfg := DefaultBreakerConfig()
	cfg.HalfOpenProbes = 1
	var b *Breaker
	var got []string
	b = NewBreaker(cfg, clock, func() float64 { return noJitter }, func(tr Transition) {
		snap := b.Snapshot()
		got = append(got, tr.To.String()+"/"+snap.State.String())
		if tr.To == StateHalfOpen {
			p, ok := b.Allow() // the probe, from inside the callback
			if !ok {
				t.Error("probe refused inside the callback")
			}
			p.Done(false, time.Second)
		}
	})
	for range 5 {
		p, _ := b.Allow()
		p.Done(true, time.Second)
	}
	clock.Advance(cfg.OpenDuration)
	b.Snapshot()
	want := []string{"open/open", "half_open/half_open", "closed/closed"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("callbacks (-want +got):\n%s", diff)
	}
}

// TestBreakerConcurrentUse hammers one breaker from many goroutines (run with -race) and
// checks that transitions still arrive one at a time and chain.
func TestBreakerConcurrentUse(t *testing.T) {
	clock := clockwork.NewFakeClock()
	cfg := DefaultBreakerConfig()
	cfg.MinCalls = 5
	var (
		inside atomic.Int32 // callbacks running right now
		trans  []Transition // appended only by the one running callback
	)
	b := NewBreaker(cfg, clock, nil, func(tr Transition) {
		if inside.Add(1) != 1 {
			t.Error("onTransition called concurrently")
		}
		trans = append(trans, tr)
		runtime.Gosched() // widen the window for an overlapping call to show up
		inside.Add(-1)
	})
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 2000 {
				if g == 0 && i%50 == 0 {
					clock.Advance(10 * time.Second)
				}
				p, ok := b.Allow()
				if !ok {
					continue
				}
				switch i % 4 {
				case 0:
					p.Cancel()
				case 1, 2:
					p.Done(true, time.Second)
				default:
					p.Done(false, time.Duration(i%20)*time.Second)
				}
			}
		})
	}
	wg.Wait()
	if len(trans) == 0 {
		t.Fatal("no transitions; the test exercised nothing")
	}
	checkChain(t, trans)
}

// checkChain asserts that transitions are legal, chain from closed, and are in time order.
func checkChain(t interface {
	Helper()
	Fatalf(string, ...any)
}, trans []Transition) {
	t.Helper()
	legal := map[[2]State]bool{
		{StateClosed, StateOpen}:     true,
		{StateOpen, StateHalfOpen}:   true,
		{StateHalfOpen, StateOpen}:   true,
		{StateHalfOpen, StateClosed}: true,
	}
	prev := Transition{To: StateClosed}
	for i, tr := range trans {
		if !legal[[2]State{tr.From, tr.To}] {
			t.Fatalf("transition %d: illegal %s -> %s", i, tr.From, tr.To)
		}
		if tr.From != prev.To {
			t.Fatalf("transition %d: from %s, but the previous one went to %s", i, tr.From, prev.To)
		}
		if tr.At.Before(prev.At) {
			t.Fatalf("transition %d: at %s, before the previous one at %s", i, tr.At, prev.At)
		}
		if tr.Reason == "" {
			t.Fatalf("transition %d: no reason", i)
		}
		prev = tr
	}
}

// TestAbandonedProbeStaysSpent: a probe that was sent but ended without a verdict (a hedge
// that lost, a caller that left) keeps its place, so half_open_probes bounds the calls a
// recovering upstream receives in one period; a probe never sent (Cancel) gives it back.
func TestAbandonedProbeStaysSpent(t *testing.T) {
	tests := []struct {
		name     string
		end      func(Permit)
		wantFree bool // a place is free again afterwards
	}{
		{"abandoned", Permit.Abandon, false},
		{"cancelled", Permit.Cancel, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultBreakerConfig()
			h := halfOpen(t, cfg)
			var permits []Permit
			for range cfg.HalfOpenProbes {
				p, ok := h.b.Allow()
				if !ok {
					t.Fatal("probe refused")
				}
				permits = append(permits, p)
			}
			tt.end(permits[0])
			if _, ok := h.b.Allow(); ok != tt.wantFree {
				t.Fatalf("Allow after the probe ended: admitted %v, want %v", ok, tt.wantFree)
			}
			if s := h.b.Snapshot().State; s != StateHalfOpen {
				t.Fatalf("state %s, want half_open: the other probes are still out", s)
			}
		})
	}
}

// TestTrialWithAbandonedProbes: how a half-open trial ends when some probes return no
// verdict. Letters per probe, in the order they end: S success, F failure, A abandoned,
// and "-" leaves it in flight.
func TestTrialWithAbandonedProbes(t *testing.T) {
	tests := []struct {
		name       string
		probes     string
		wantState  State
		wantReason string
		wantTrips  int
		wantPeriod time.Duration // open period from now, when open
	}{
		{"all succeed", "SSS", StateClosed, "probes succeeded", 0, 0},
		{"one abandoned, the rest succeed", "SAS", StateClosed, "probes succeeded (1 of 3 without a verdict)", 0, 0},
		{"one success is not enough when the rest have no verdict", "AAS", StateOpen, ReasonNoVerdict + " (2 of 3 probes abandoned)", 1, 30 * time.Second},
		{"no verdict at all: re-open for the same period, no trip", "AAA", StateOpen, ReasonNoVerdict + " (3 probes abandoned)", 1, 30 * time.Second},
		{"a failure decides at once", "AAF", StateOpen, "probe failed", 2, time.Minute},
		{"a failure after a success", "SAF", StateOpen, "probe failed", 2, time.Minute},
		{"a probe still in flight keeps the trial open", "SA-", StateHalfOpen, "open period elapsed", 1, 0},
		{"abandoned probes still in flight", "AA-", StateHalfOpen, "open period elapsed", 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultBreakerConfig()
			h := halfOpen(t, cfg)
			var permits []Permit
			for range tt.probes {
				p, ok := h.b.Allow()
				if !ok {
					t.Fatal("probe refused")
				}
				permits = append(permits, p)
			}
			for i, c := range tt.probes {
				switch c {
				case 'S':
					permits[i].Done(false, time.Second)
				case 'F':
					permits[i].Done(true, time.Second)
				case 'A':
					permits[i].Abandon()
				}
			}
			snap := h.b.Snapshot()
			if snap.State != tt.wantState || snap.Reason != tt.wantReason || snap.Trips != tt.wantTrips {
				t.Fatalf("state %s %q Trips %d, want %s %q Trips %d", snap.State, snap.Reason, snap.Trips, tt.wantState, tt.wantReason, tt.wantTrips)
			}
			if got := snap.OpenUntil.Sub(h.clock.Now()); tt.wantState == StateOpen && got != tt.wantPeriod {
				t.Errorf("open period %s, want %s", got, tt.wantPeriod)
			}
		})
	}
}

// reopened returns a harness whose breaker failed its first trial: open for 60 s (no
// jitter), with scouts due every cfg's scout interval from now.
func reopened(t *testing.T, cfg BreakerConfig) *harness {
	t.Helper()
	h := halfOpen(t, cfg)
	p, ok := h.b.Allow()
	if !ok {
		t.Fatal("probe refused")
	}
	p.Done(true, time.Second)
	if snap := h.b.Snapshot(); snap.State != StateOpen || snap.OpenUntil.Sub(h.clock.Now()) != 2*cfg.OpenDuration {
		t.Fatalf("after the failed probe: %+v, want open for %s", snap, 2*cfg.OpenDuration)
	}
	return h
}

// TestScouting: an open breaker admits one call (a scout) per scout interval; a scout that
// succeeds ends the open period and counts as the trial's first probe, one that fails
// changes nothing, and one that was never sent gives its turn back.
func TestScouting(t *testing.T) {
	const interval = 20 * time.Second // the open period is 60 s: scouts at 20 s and 40 s
	type step struct {
		advance time.Duration
		admit   bool   // whether Allow admits
		end     string // how an admitted call ends: S, F, L (slow), A (abandon), C (cancel), "" (stays out)
		state   State  // afterwards
	}
	tests := []struct {
		name   string
		scout  time.Duration // BreakerConfig.ScoutInterval
		probes int           // BreakerConfig.HalfOpenProbes; 0 keeps 3
		steps  []step
		reason string // the breaker's reason at the end
	}{
		{
			name: "no scout before the interval, one at it", scout: interval,
			steps: []step{
				{interval - time.Nanosecond, false, "", StateOpen},
				{time.Nanosecond, true, "", StateOpen},
				{0, false, "", StateOpen}, // one scout at a time
			},
			reason: "probe failed",
		},
		{
			name: "a good scout ends the open period and is the first probe", scout: interval,
			steps: []step{
				{interval, true, "S", StateHalfOpen},
				{0, true, "S", StateHalfOpen},
				{0, true, "", StateHalfOpen},
				{0, false, "", StateHalfOpen}, // the scout took a place: 3 in all
			},
			reason: "scout succeeded",
		},
		{
			name: "scout, then the rest of the trial closes it", scout: interval,
			steps: []step{
				{interval, true, "S", StateHalfOpen},
				{0, true, "S", StateHalfOpen},
				{0, true, "S", StateClosed},
			},
			reason: "probes succeeded",
		},
		{
			name: "with one probe a good scout closes at once", scout: interval, probes: 1,
			steps: []step{
				{interval, true, "S", StateClosed},
			},
			reason: "probes succeeded",
		},
		{
			name: "a failed scout changes nothing; the next waits an interval", scout: interval,
			steps: []step{
				{interval, true, "F", StateOpen},
				{interval - time.Nanosecond, false, "", StateOpen},
				{time.Nanosecond, true, "S", StateHalfOpen},
			},
			reason: "scout succeeded",
		},
		{
			name: "a slow scout counts as a failed one", scout: interval,
			steps: []step{
				{interval, true, "L", StateOpen},
				{0, false, "", StateOpen},
			},
			reason: "probe failed",
		},
		{
			name: "an abandoned scout is spent", scout: interval,
			steps: []step{
				{interval, true, "A", StateOpen},
				{interval - time.Nanosecond, false, "", StateOpen},
				{time.Nanosecond, true, "", StateOpen},
			},
			reason: "probe failed",
		},
		{
			name: "a cancelled scout gives its turn back", scout: interval,
			steps: []step{
				{interval, true, "C", StateOpen},
				{0, true, "S", StateHalfOpen},
			},
			reason: "scout succeeded",
		},
		{
			name: "the open period's end comes first: a full trial, no scout", scout: interval,
			steps: []step{
				{interval, true, "F", StateOpen},
				{interval, true, "F", StateOpen},
				{interval - time.Nanosecond, false, "", StateOpen},
				{time.Nanosecond, true, "", StateHalfOpen},
				{0, true, "", StateHalfOpen},
				{0, true, "", StateHalfOpen},
				{0, false, "", StateHalfOpen},
			},
			reason: "open period elapsed",
		},
		{
			name: "0 means every open_duration", scout: 0,
			steps: []step{
				{30*time.Second - time.Nanosecond, false, "", StateOpen},
				{time.Nanosecond, true, "S", StateHalfOpen},
			},
			reason: "scout succeeded",
		},
		{
			name: "negative turns scouting off", scout: -1,
			steps: []step{
				{time.Minute - time.Nanosecond, false, "", StateOpen},
				{time.Nanosecond, true, "", StateHalfOpen},
			},
			reason: "open period elapsed",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultBreakerConfig()
			cfg.ScoutInterval = tt.scout
			if tt.probes > 0 {
				cfg.HalfOpenProbes = tt.probes
			}
			h := reopened(t, cfg)
			openUntil := h.b.Snapshot().OpenUntil
			for i, st := range tt.steps {
				h.clock.Advance(st.advance)
				p, ok := h.b.Allow()
				if ok != st.admit {
					t.Fatalf("step %d: Allow admitted %v, want %v (%+v)", i, ok, st.admit, h.b.Snapshot())
				}
				switch st.end {
				case "S":
					p.Done(false, time.Second)
				case "F":
					p.Done(true, time.Second)
				case "L":
					p.Done(false, 40*time.Second)
				case "A":
					p.Abandon()
				case "C":
					p.Cancel()
				}
				snap := h.b.Snapshot()
				if snap.State != st.state {
					t.Fatalf("step %d: state %s, want %s", i, snap.State, st.state)
				}
				if snap.State == StateOpen && (!snap.OpenUntil.Equal(openUntil) || snap.Trips != 2) {
					t.Fatalf("step %d: open until %s with Trips %d, want %s and 2: scouts never change the backoff", i, snap.OpenUntil, snap.Trips, openUntil)
				}
			}
			if got := h.b.Snapshot().Reason; got != tt.reason {
				t.Errorf("reason %q, want %q", got, tt.reason)
			}
		})
	}
}

// TestScoutOutlivingItsPeriodIsIgnored: a scout still out when the open period ends belongs
// to a finished period; its success does not count in the trial that followed.
func TestScoutOutlivingItsPeriodIsIgnored(t *testing.T) {
	cfg := DefaultBreakerConfig()
	cfg.ScoutInterval = 20 * time.Second
	h := reopened(t, cfg)
	h.clock.Advance(40 * time.Second)
	scout, ok := h.b.Allow()
	if !ok {
		t.Fatal("scout refused")
	}
	h.clock.Advance(20 * time.Second) // the open period ends while the scout is out
	for range cfg.HalfOpenProbes {
		if _, ok := h.b.Allow(); !ok {
			t.Fatal("probe refused")
		}
	}
	scout.Done(false, time.Second)
	if snap := h.b.Snapshot(); snap.State != StateHalfOpen || snap.Reason != "open period elapsed" {
		t.Fatalf("snapshot %+v, want still half-open: the late scout does not count", snap)
	}
}

// TestLongOutageRecovery replays a ten-minute outage at one call a second and measures how
// late the breaker closes after the upstream is back, and how many calls reached it while
// it was down. Scouting must bring the breaker back within one scout interval (plus the
// trial), where doubling alone waits for the capped open period, and must not cost the dead
// upstream more than one call per interval on top of the trials.
func TestLongOutageRecovery(t *testing.T) {
	const outage = 10 * time.Minute
	tests := []struct {
		name           string
		scout          time.Duration
		maxLate        time.Duration
		minLate        time.Duration
		maxOutageCalls int
	}{
		// Defaults: open 30 s doubling to 5 m, scouts every 30 s, 3 probes.
		{"scouting (default)", 0, 30*time.Second + 2*time.Second, 0, int(outage/(30*time.Second)) + 5},
		{"doubling alone", -1, 5 * time.Minute, 2 * time.Minute, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultBreakerConfig()
			cfg.ScoutInterval = tt.scout
			h := newHarness(t, cfg, noJitter)
			start := h.clock.Now()
			back := start.Add(outage)
			outageCalls, closedAt := 0, time.Time{}
			for i := 0; closedAt.IsZero() && i < 3600; i++ {
				now := h.clock.Now()
				if p, ok := h.b.Allow(); ok {
					down := now.Before(back)
					if down {
						outageCalls++
					}
					p.Done(down, time.Second)
				}
				if now.After(back) && h.b.Snapshot().State == StateClosed {
					closedAt = now
				}
				h.clock.Advance(time.Second)
			}
			if closedAt.IsZero() {
				t.Fatal("never closed")
			}
			late := closedAt.Sub(back)
			if late > tt.maxLate || late < tt.minLate {
				t.Errorf("closed %s after the upstream was back, want within [%s, %s]", late, tt.minLate, tt.maxLate)
			}
			// The five failures that tripped it are not probes.
			if probes := outageCalls - 5; probes > tt.maxOutageCalls {
				t.Errorf("%d probes and scouts reached the dead upstream in %s, want at most %d", probes, outage, tt.maxOutageCalls)
			}
			t.Logf("closed %s late; %d calls while down", late, outageCalls-5)
		})
	}
}
