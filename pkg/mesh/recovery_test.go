package mesh_test

import (
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/pkg/sim"
	"github.com/mantle-mesh/mantle/services/quota"
	"github.com/mantle-mesh/mantle/services/router"
)

// These tests replay low-rate traffic (a request every 4 s) through the HTTP front door on a
// fake clock shared by the router and the sim, with the retry budget and the breaker at
// their defaults: the shape in which an outside fault rig found a healthy fallback refused
// and a recovered primary left unused.

// lowRateConfig is resilienceConfig with the default retry budgets and breaker, and a route
// "chat" over a primary with the given profile and the healthy backup.
func lowRateConfig(primary sim.Profile) mesh.Config {
	cfg := resilienceConfig()
	r := &cfg.Router
	defaults := router.DefaultConfig()
	r.RetryBudget, r.Breaker = defaults.RetryBudget, defaults.Breaker
	cfg.Quota.RetryBudget = quota.DefaultConfig().RetryBudget
	r.SimProfiles["primary"] = primary
	r.Models = append(r.Models, router.ModelConfig{Name: "primary", Provider: "sim", SimProfile: "primary", ContextWindow: 4000})
	r.Routes = append(r.Routes, router.RouteConfig{Name: "chat", Scenario: "chat", Candidates: []string{"primary", "backup"}})
	return cfg
}

// TestLowRateFailoversAreNeverRefused: two minutes of requests every 4 s, each failing on
// its first choice and failing over to a healthy model. A retry budget of a share of the
// requests would refuse them past its floor (every request fails over, so failovers are
// all of the traffic); a failover to a model whose breaker is closed needs no budget.
func TestLowRateFailoversAreNeverRefused(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClockAt(time.Now())
	m := meshtest.StartWith(t, lowRateConfig(sim.Profile{Errors: sim.ErrorMix{Overloaded: 1}}), meshtest.All, mesh.Options{Clock: clock})
	tests := []struct {
		route, model, first string
	}{
		// A context overflow is the caller's request, not the provider's health: the
		// breaker stays closed and every request fails over to the larger window.
		{"r-context-length", "large", "context-length:context_length_exceeded"},
		// A 503 trips the primary's breaker after five; scouts keep failing over after that.
		{"chat", "backup", ""},
	}
	for i := range 30 {
		tt := tests[i%len(tests)]
		res := chat(t, m.HTTPAddr, tt.route, fmt.Sprintf("question %d at %s", i, tt.route), false, false)
		if res.status != http.StatusOK || res.model != tt.model {
			t.Fatalf("request %d on %s: status %d from %q after %v (%s %s), want 200 from %s",
				i, tt.route, res.status, res.model, res.attempts(), res.errCode, res.errMsg, tt.model)
		}
		if tt.first != "" && res.attempts()[0] != tt.first {
			t.Errorf("request %d on %s: attempts %v, want %s first", i, tt.route, res.attempts(), tt.first)
		}
		for _, step := range res.quality.GetAudit() {
			if strings.Contains(step.Detail, "retry budget exhausted") {
				t.Errorf("request %d on %s: %s", i, tt.route, step.Detail)
			}
		}
		clock.Advance(4 * time.Second)
	}
}

// TestRecoveredPrimaryAnswersWithinTenSeconds: a primary answers 503 for its first minute
// and is healthy after. With a request every 4 s, every request is answered (by the
// backup while the primary is down), the primary is tried at most once per scout interval
// while its breaker is open, and it answers again within 10 s of its recovery.
func TestRecoveredPrimaryAnswersWithinTenSeconds(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClockAt(time.Now())
	start := clock.Now()
	outage := sim.Profile{Phases: []sim.Phase{
		{Name: "down", Start: 0, Duration: time.Minute, Errors: &sim.ErrorMix{Overloaded: 1}},
		{Name: "up", Start: time.Minute},
	}}
	cfg := lowRateConfig(outage)
	scout := cfg.Router.Breaker.ScoutInterval
	if scout <= 0 || scout > 6*time.Second {
		t.Fatalf("default scout_interval %s: want a few seconds", scout)
	}
	m := meshtest.StartWith(t, cfg, meshtest.All, mesh.Options{Clock: clock})

	var primaryTries []time.Duration // when, after the start, a request or its side scout tried the primary
	scouts := 0.0                    // side scouts to the primary so far
	answered := 0                    // calls to the primary among the answers' attempts
	recoveredAt := time.Duration(-1)
	for i := 0; clock.Since(start) <= 2*time.Minute; i++ {
		at := clock.Since(start)
		res := chat(t, m.HTTPAddr, "chat", fmt.Sprintf("question %d", i), false, false)
		if res.status != http.StatusOK {
			t.Fatalf("request at %s: status %d (%s %s) after %v, want an answer", at, res.status, res.errCode, res.errMsg, res.attempts())
		}
		for _, a := range res.attempts() {
			if strings.HasPrefix(a, "primary:") {
				primaryTries = append(primaryTries, at)
				answered++
			}
		}
		// A scout sent beside the request is not among its attempts; it is counted, and
		// its verdict awaited, before the clock moves on: 4 s is ample time for a call to
		// an instant sim, which the fake clock does not give it.
		if n := scoutsSettled(t, m, answered); n > scouts {
			for ; scouts < n; scouts++ {
				primaryTries = append(primaryTries, at)
			}
		}
		if res.model == "primary" && recoveredAt < 0 {
			recoveredAt = at
		}
		clock.Advance(4 * time.Second)
	}
	if recoveredAt < time.Minute || recoveredAt > time.Minute+10*time.Second {
		t.Errorf("the primary answered again %s after the start, want within 10s of its recovery at 1m0s (tries at %v)", recoveredAt, primaryTries)
	}
	// While the breaker is open (from the fifth failure until the recovery), at most one
	// request per scout interval (with its jitter) reaches the primary.
	var open []time.Duration
	for _, at := range primaryTries {
		if at > 16*time.Second && at < time.Minute {
			open = append(open, at)
		}
	}
	minGap := time.Duration(float64(scout) * (1 - cfg.Router.Breaker.OpenJitter))
	for i := 1; i < len(open); i++ {
		if gap := open[i] - open[i-1]; gap < minGap {
			t.Errorf("the open primary was tried at %s and %s, %s apart, under the scout interval %s (-jitter)", open[i-1], open[i], gap, scout)
		}
	}
	if len(open) == 0 {
		t.Errorf("the open primary was never scouted before its recovery (tries at %v)", primaryTries)
	}
}

// scoutsSettled waits until the router's provider calls to the primary have all ended
// (its breaker has every verdict) and returns how many side scouts it has sent there.
// answered is how many calls to the primary the answers so far list among their attempts:
// those ended before their answers; a side scout is the one call that outlives its
// request. Waiting yields instead of sleeping, within a deadline.
func scoutsSettled(t *testing.T, m *meshtest.Mesh, answered int) float64 {
	t.Helper()
	model := map[string]string{"model": "primary"}
	deadline := time.Now().Add(30 * time.Second)
	for {
		scouts, _ := sample(t, m.Router.Metrics, "mantle_router_side_scouts_total", model)
		ended, _ := sample(t, m.Router.Metrics, "mantle_router_provider_attempt_duration_seconds", model)
		if ended >= float64(answered)+scouts {
			return scouts
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v side scouts and %d answered calls to the primary, but only %v calls ended after 30s", scouts, answered, ended)
		}
		runtime.Gosched()
	}
}

// TestEveryKeyThrottledIsA429: when every candidate's keys answer 429 with hints too long to
// wait for, the caller is told to come back (429 with the soonest truthful Retry-After), not
// that the providers failed (503). A route with one candidate that fails otherwise is an
// ordinary failure.
func TestEveryKeyThrottledIsA429(t *testing.T) {
	t.Parallel()
	cfg := resilienceConfig()
	r := &cfg.Router
	r.SimProfiles["429-3s"] = sim.Profile{Errors: sim.ErrorMix{RateLimited: 1}, RetryAfter: 3 * time.Second}
	r.Models = append(r.Models, router.ModelConfig{Name: "throttled-3s", Provider: "sim", SimProfile: "429-3s"})
	r.Routes = append(r.Routes,
		router.RouteConfig{Name: "all-throttled", Scenario: "throttled", Candidates: []string{"429-long-hint", "throttled-3s"}},
		router.RouteConfig{Name: "throttled-and-down", Scenario: "throttled-down", Candidates: []string{"429-long-hint", "503"}})
	m := meshtest.Start(t, cfg, meshtest.All)

	res, header := chatHeader(t, m.HTTPAddr, "all-throttled", "question while everyone is throttled")
	if res.status != http.StatusTooManyRequests || res.errCode != "upstream_rate_limited" {
		t.Fatalf("status %d code %q (%s) after %v, want 429 upstream_rate_limited", res.status, res.errCode, res.errMsg, res.attempts())
	}
	// The 3 s hint is the soonest; a second or so may pass before the answer, never more.
	if ra := header.Get("Retry-After"); ra != "3" && ra != "2" {
		t.Errorf("Retry-After %q, want 3 (the soonest provider hint, in whole seconds)", ra)
	}
	// The throttled keys are now cooling down; a request that meets them skips them and is
	// still a 429.
	res, _ = chatHeader(t, m.HTTPAddr, "all-throttled", "another question")
	if res.status != http.StatusTooManyRequests {
		t.Errorf("second request: status %d (%s), want 429 while the keys cool down", res.status, res.errMsg)
	}
	res, _ = chatHeader(t, m.HTTPAddr, "throttled-and-down", "question with one provider down")
	if res.status != http.StatusServiceUnavailable || res.errCode != "all_candidates_failed" {
		t.Errorf("one throttled, one down: status %d code %q, want 503 all_candidates_failed", res.status, res.errCode)
	}
}

// chatHeader is chat for a unary request, with the answer's headers.
func chatHeader(t *testing.T, addr, route, question string) (chatResult, http.Header) {
	t.Helper()
	var header http.Header
	res := chatWith(t, addr, route, question, func(h http.Header) { header = h })
	return res, header
}
