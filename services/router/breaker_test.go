package router

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/events"
	"github.com/mantle-mesh/mantle/pkg/provider"
)

const (
	breakerClosed   = mantlev1.BreakerState_BREAKER_STATE_CLOSED
	breakerOpen     = mantlev1.BreakerState_BREAKER_STATE_OPEN
	breakerHalfOpen = mantlev1.BreakerState_BREAKER_STATE_HALF_OPEN
)

// fastBreaker trips after two failures in a row, stays open 30 s (doubling on a re-trip,
// no jitter; a scout every 30 s while open) and closes after one good probe.
func fastBreaker(c *Config) {
	c.Breaker.ConsecutiveFailures = 2
	c.Breaker.OpenDuration = 30 * time.Second
	c.Breaker.OpenJitter = 0
	c.Breaker.HalfOpenProbes = 1
	c.Breaker.ScoutInterval = 0 // one scout per open period, so the tests' steps can count them
	c.Retry.MaxRetries = 0
	c.Routes[0].Candidates = []string{"a", "b"}
}

// TestBreakerLifecycle walks one key's breaker through every state the router can put it
// in, and checks at each step which model answered, whether the open model was called at
// all, what DescribeRoutes says, and the transition events on NATS's subject. With side
// scouts (the default) a scout goes beside the request, which b answers at once; without,
// the scout is the request itself.
func TestBreakerLifecycle(t *testing.T) {
	t.Parallel()
	for _, side := range []bool{true, false} {
		t.Run(fmt.Sprintf("side_scouts=%t", side), func(t *testing.T) {
			t.Parallel()
			breakerLifecycle(t, side)
		})
	}
}

func breakerLifecycle(t *testing.T, sideScouts bool) {
	cfg := testConfig()
	fastBreaker(&cfg)
	cfg.SideScouts = sideScouts
	h := newHarness(t, cfg, &harness{providers: map[string]*fakeProvider{
		"a": newFakeProvider(
			failure(classTransient, "502"), failure(classTransient, "502"), // trip
			failure(classTransient, "502"), // the first probe fails
			failure(classTransient, "502"), // so does the scout 30 s into the 60 s period
			failure(classTransient, "502"), // and the probe when the 60 s are over
			reply("a is back", 1, 1),       // the scout 30 s into the 120 s period succeeds
			reply("a is back", 1, 1),       // (side scouts) the probe that follows it
		),
	}})
	type step struct {
		name    string
		advance time.Duration // before the request
		model   string        // who answers
		callsA  int           // a's calls so far
		state   mantlev1.BreakerState
		reason  string // substring of a's breaker reason in DescribeRoutes
	}
	steps := []step{
		{"first failure: breaker still closed", 0, "b", 1, breakerClosed, "closed"},
		{"second failure in a row trips it", 0, "b", 2, breakerOpen, "2 consecutive failures (scenario support)"},
		{"open: a is skipped without a call", 0, "b", 2, breakerOpen, "2 consecutive failures"},
		{"still open before its period ends", 29 * time.Second, "b", 2, breakerOpen, "2 consecutive failures"},
		{"open period over: the probe fails and re-opens it for twice as long", time.Second, "b", 3, breakerOpen, "probe failed"},
		{"30 s into the 60 s period a scout is let through; it fails, the period stays", 30 * time.Second, "b", 4, breakerOpen, "probe failed"},
		{"no second scout before the interval", 29 * time.Second, "b", 4, breakerOpen, "probe failed"},
		{"after 60 s the probe fails and re-opens it for 120 s", time.Second, "b", 5, breakerOpen, "probe failed"},
	}
	if sideScouts {
		steps = append(steps,
			step{"30 s in, a scout beside the request (which b answers at once) finds a back: closed (the scout was the one probe)", 30 * time.Second, "b", 6, breakerClosed, "closed"},
			step{"the next request goes to a", 0, "a", 7, breakerClosed, "closed"})
	} else {
		steps = append(steps,
			step{"30 s in, a scout finds a back: closed without waiting out the 120 s", 30 * time.Second, "a", 6, breakerClosed, "closed"})
	}
	for _, st := range steps {
		h.clock.Advance(st.advance)
		resp, err := h.router.Complete(context.Background(), ask("chat"))
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		h.router.scouts.Wait() // a side scout's verdict is in before the checks
		if resp.Model != st.model || h.calls("a") != st.callsA {
			t.Errorf("%s: answered by %s with %d calls to a, want %s and %d", st.name, resp.Model, h.calls("a"), st.model, st.callsA)
		}
		k := describeKey(t, h, "chat", "a", "sim")
		if k.BreakerState != st.state || !strings.Contains(k.BreakerReason, st.reason) {
			t.Errorf("%s: DescribeRoutes says %v (%q), want %v (%q)", st.name, k.BreakerState, k.BreakerReason, st.state, st.reason)
		}
	}

	// Every transition is an event, with its reason, in order.
	type tr struct {
		From, To mantlev1.BreakerState
		Reason   string
	}
	var got []tr
	for _, m := range h.events.on(events.SubjectBreaker) {
		ev := m.(*eventsv1.BreakerTransitionEvent)
		if ev.Provider != "p" || ev.Model != "a" || ev.KeyId != "sim" || ev.Scenario != "support" {
			t.Errorf("event for %s/%s/%s/%s, want p/a/sim/support", ev.Provider, ev.Model, ev.KeyId, ev.Scenario)
		}
		got = append(got, tr{ev.From, ev.To, ev.Reason})
	}
	want := []tr{
		{breakerClosed, breakerOpen, "2 consecutive failures"},
		{breakerOpen, breakerHalfOpen, "open period elapsed"},
		{breakerHalfOpen, breakerOpen, "probe failed"},
		{breakerOpen, breakerHalfOpen, "open period elapsed"},
		{breakerHalfOpen, breakerOpen, "probe failed"},
		{breakerOpen, breakerHalfOpen, "scout succeeded"},
		{breakerHalfOpen, breakerClosed, "probes succeeded"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("breaker transition events (-want +got):\n%s", diff)
	}
}

// TestBreakerLateTimeouts: a timeout this process noticed over a tenth of the limit late
// (short of CPU: the answer may have been there, unread) gives the breaker no verdict, so
// a busy machine does not open a healthy model's breaker; nor does a timeout at the
// request's remaining budget, shorter than the provider's own. A timeout noticed on time,
// at the provider's timeout, counts.
func TestBreakerLateTimeouts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		budget  time.Duration // the route's; 0 keeps the default 30 s
		latency time.Duration // of each timed-out call, against a's 1 s timeout
		state   mantlev1.BreakerState
		late    float64 // mantle_router_late_timeouts_total{model="a"}
	}{
		{"noticed 100 ms late: counts", 0, 1100 * time.Millisecond, breakerOpen, 0},
		{"noticed 101 ms late: no verdict", 0, 1101 * time.Millisecond, breakerClosed, 2},
		{"cut short by the request's budget: no verdict", 500 * time.Millisecond, 0, breakerClosed, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig()
			fastBreaker(&cfg) // two failures in a row trip it
			cfg.Providers[0].Timeout = time.Second
			cfg.Routes[0].Budget = tc.budget
			h := newHarness(t, cfg, &harness{providers: map[string]*fakeProvider{
				"a": newFakeProvider(result{err: &provider.Error{Class: classTimeout, Message: "deadline exceeded"}, advance: tc.latency}),
			}})
			for i := range 2 {
				resp, err := h.router.Complete(context.Background(), ask("chat"))
				if err != nil || resp.Model != "b" {
					t.Fatalf("request %d: %v %v, want b's answer after a's timeout", i, resp.GetModel(), err)
				}
			}
			if k := describeKey(t, h, "chat", "a", "sim"); k.BreakerState != tc.state {
				t.Errorf("a's breaker is %v (%q) after two timeouts, want %v", k.BreakerState, k.BreakerReason, tc.state)
			}
			if got := counterValue(t, h.router.deps.Metrics.lateTimeouts.WithLabelValues("a")); got != tc.late {
				t.Errorf("late timeouts = %v, want %v", got, tc.late)
			}
		})
	}
}

// TestBreakerTimeoutsWhileStarved: a timeout noticed on time still gives the breaker no
// verdict while the process's goroutines wait for a CPU (the overload shedder's P90) over a
// tenth of the call's limit: the answer may have come in time and waited to be read.
func TestBreakerTimeoutsWhileStarved(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		wait  time.Duration // the P90 wait for a CPU of the shedder's last interval
		state mantlev1.BreakerState
		late  float64
	}{
		{"P90 wait 100 ms for a 1 s limit: counts", 100 * time.Millisecond, breakerOpen, 0},
		{"P90 wait 101 ms for a 1 s limit: no verdict", 101 * time.Millisecond, breakerClosed, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig()
			fastBreaker(&cfg)
			cfg.Providers[0].Timeout = time.Second
			cfg.Overload.MaxSchedulingDelay = time.Hour // measured, never shed
			d := newShedderDriver(t)
			h := newHarness(t, cfg, &harness{schedulingDelay: d.delay, providers: map[string]*fakeProvider{
				"a": newFakeProvider(result{err: &provider.Error{Class: classTimeout, Message: "deadline exceeded"}, advance: time.Second}),
			}})
			d.start(h)
			d.interval(tc.wait)
			for i := range 2 {
				resp, err := h.router.Complete(context.Background(), ask("chat"))
				if err != nil || resp.Model != "b" {
					t.Fatalf("request %d: %v %v, want b's answer after a's timeout", i, resp.GetModel(), err)
				}
			}
			if k := describeKey(t, h, "chat", "a", "sim"); k.BreakerState != tc.state {
				t.Errorf("a's breaker is %v (%q) after two timeouts, want %v", k.BreakerState, k.BreakerReason, tc.state)
			}
			if got := counterValue(t, h.router.deps.Metrics.lateTimeouts.WithLabelValues("a")); got != tc.late {
				t.Errorf("late timeouts = %v, want %v", got, tc.late)
			}
		})
	}
}

// TestBreakerPerScenario: the breaker belongs to (provider, model, key, scenario): a model
// that keeps failing for one scenario is still called for another.
func TestBreakerPerScenario(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	fastBreaker(&cfg)
	cfg.Routes = append(cfg.Routes, RouteConfig{Name: "other", Scenario: "billing", Candidates: []string{"a", "b"}})
	h := newHarness(t, cfg, &harness{providers: map[string]*fakeProvider{
		"a": newFakeProvider(failure(classTransient, "502"), failure(classTransient, "502"), reply("a", 1, 1)),
	}})
	for range 2 {
		if _, err := h.router.Complete(context.Background(), ask("chat")); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := h.router.Complete(context.Background(), ask("other"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Model != "a" || h.calls("a") != 3 {
		t.Errorf("scenario billing answered by %s after %d calls to a, want a (its breaker is closed)", resp.Model, h.calls("a"))
	}
}

// TestBulkheadFullFailsOver: a model at its concurrency limit is skipped at once, not
// queued behind the slow call holding its place.
func TestBulkheadFullFailsOver(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Models[0].MaxConcurrency = 1
	release := make(chan struct{})
	h := newHarness(t, cfg, &harness{providers: map[string]*fakeProvider{
		"a": newFakeProvider(result{release: release, res: reply("slow a", 1, 1).res}, reply("a", 1, 1)),
	}})
	first := h.start(context.Background(), ask("chat"))
	<-h.providers["a"].started // the slow call holds a's only place

	resp, err := h.router.Complete(context.Background(), ask("chat"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Model != "b" || h.calls("a") != 1 {
		t.Errorf("answered by %s with %d calls to a, want b without calling a", resp.Model, h.calls("a"))
	}
	if diff := cmp.Diff([]string{"b:none"}, attemptsOf(resp.Quality)); diff != "" {
		t.Errorf("attempts (-want +got):\n%s", diff)
	}
	if !hasAudit(resp.Quality, "skip", "a: bulkhead_full") {
		t.Errorf("audit %v, want a skip of a for its full bulkhead", resp.Quality.Audit)
	}

	close(release)
	if d := await(t, first); d.err != nil || d.resp.Model != "a" {
		t.Errorf("the slow request: %v %v, want a's answer", d.resp.GetModel(), d.err)
	}
	// The place is free again.
	if resp, err := h.router.Complete(context.Background(), ask("chat")); err != nil || resp.Model != "a" {
		t.Errorf("after the slow call: %v %v, want a", resp.GetModel(), err)
	}
}

// TestSlowKeySkippedWhenBudgetTooShort: an attempt is not started when the remaining budget
// is below the key's observed median latency; a faster candidate answers instead.
func TestSlowKeySkippedWhenBudgetTooShort(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Routes = append(cfg.Routes, RouteConfig{Name: "quick", Candidates: []string{"a", "b"}, Budget: 3 * time.Second})
	h := newHarness(t, cfg, &harness{providers: map[string]*fakeProvider{
		"a": newFakeProvider(result{res: reply("slow", 1, 1).res, advance: 5 * time.Second}),
	}})
	if _, err := h.router.Complete(context.Background(), ask("a")); err != nil { // a's median is now 5 s
		t.Fatal(err)
	}
	resp, err := h.router.Complete(context.Background(), ask("quick"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Model != "b" || h.calls("a") != 1 {
		t.Errorf("answered by %s with %d calls to a, want b: a's 5 s median does not fit in 3 s", resp.Model, h.calls("a"))
	}
	if !hasAudit(resp.Quality, "skip", "a: budget_exhausted") {
		t.Errorf("audit %v, want a skip of a for the budget", resp.Quality.Audit)
	}
}

// TestDescribeAfterTrip: DescribeRoutes reports the open breaker with its reason, and the
// route's ladder level moves to the backup while the primary is open.
func TestDescribeAfterTrip(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	fastBreaker(&cfg)
	h := newHarness(t, cfg, &harness{providers: map[string]*fakeProvider{
		"a": newFakeProvider(failure(classOverloaded, "busy")),
	}})
	for range 2 {
		if _, err := h.router.Complete(context.Background(), ask("chat")); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := h.router.Describe("chat")
	if err != nil {
		t.Fatal(err)
	}
	rt := resp.Routes[0]
	if rt.LadderLevel != levelBackup {
		t.Errorf("ladder level = %v, want backup while a is open", rt.LadderLevel)
	}
	if k := rt.Candidates[0].Keys[0]; k.BreakerState != breakerOpen || k.BreakerReason != "2 consecutive failures (scenario support)" || k.Failures != 2 {
		t.Errorf("a's key: %v %q failures %d, want open, the reason and 2 failures", k.BreakerState, k.BreakerReason, k.Failures)
	}
	if got := rt.Candidates[1].Keys[0].BreakerState; got != breakerClosed {
		t.Errorf("b's breaker = %v, want closed", got)
	}
}

func hasAudit(qc *mantlev1.QualityContext, step, detail string) bool {
	for _, a := range qc.GetAudit() {
		if a.Step == step && strings.Contains(a.Detail, detail) {
			return true
		}
	}
	return false
}

// TestSlowCallsTripTheBreaker: a provider that answers every call correctly but slowly
// (P99 40 s with 0% errors) trips the breaker on its slow-call rate. The calls
// take 5 s here, slower than slow_call but within the budget (a key whose median exceeds
// what is left of the budget is not called at all).
func TestSlowCallsTripTheBreaker(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Routes[0].Candidates = []string{"a", "b"}
	cfg.Breaker.MinCalls, cfg.Breaker.SlowCall, cfg.Breaker.SlowCallRate = 3, 2*time.Second, 0.5
	h := newHarness(t, cfg, &harness{providers: map[string]*fakeProvider{
		"a": newFakeProvider(result{res: reply("correct but slow", 1, 1).res, advance: 5 * time.Second}),
	}})
	var answeredBy []string
	for range 4 {
		resp, err := h.router.Complete(context.Background(), ask("chat"))
		if err != nil {
			t.Fatal(err)
		}
		answeredBy = append(answeredBy, resp.Model)
	}
	if diff := cmp.Diff([]string{"a", "a", "a", "b"}, answeredBy); diff != "" {
		t.Errorf("answered by (-want +got):\n%s", diff)
	}
	k := describeKey(t, h, "chat", "a", "sim")
	if k.BreakerState != breakerOpen || !strings.Contains(k.BreakerReason, "slow-call rate 100% (>2s) over 3 calls") || k.Failures != 0 {
		t.Errorf("a's key: %v %q failures %d, want open on the slow-call rate with no failures", k.BreakerState, k.BreakerReason, k.Failures)
	}
}

// TestDescribeRoutesNextProbe: an open key's next_probe_at is when its breaker next lets a
// call through: the next scout when one is due before the open period ends.
func TestDescribeRoutesNextProbe(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		scout time.Duration
		want  time.Duration // from the re-trip
	}{
		{"the scout, halfway through the 60 s period", 0, 30 * time.Second},
		{"the period's end with scouting off", -1, time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig()
			fastBreaker(&cfg)
			cfg.Breaker.ScoutInterval = tt.scout
			h := newHarness(t, cfg, &harness{providers: map[string]*fakeProvider{
				"a": newFakeProvider(failure(classTransient, "502")),
			}})
			for _, advance := range []time.Duration{0, 0, 30 * time.Second} { // trip, then a failed probe
				h.clock.Advance(advance)
				if _, err := h.router.Complete(context.Background(), ask("chat")); err != nil {
					t.Fatal(err)
				}
			}
			k := describeKey(t, h, "chat", "a", "sim")
			if k.BreakerState != breakerOpen || !k.NextProbeAt.AsTime().Equal(h.clock.Now().Add(tt.want)) {
				t.Errorf("%v, next probe at %s, want open and %s", k.BreakerState, k.NextProbeAt.AsTime(), h.clock.Now().Add(tt.want))
			}
		})
	}
}
