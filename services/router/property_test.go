package router

import (
	"context"
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/resilience"
)

// outcomes a scripted provider can give in the property test.
var propertyOutcomes = []struct {
	name string
	r    func() result
}{
	{"ok", func() result { return reply("fine", 2, 3) }},
	{"slow_ok", func() result { return result{res: reply("slow", 2, 3).res, advance: time.Second} }},
	{"transient", func() result { return failure(classTransient, "502") }},
	{"overloaded", func() result { return failure(classOverloaded, "503") }},
	{"hidden", func() result { return failure(classHidden, "error in a 200") }},
	{"rate_limited", func() result { return rateLimited(0) }},
	{"rate_limited_1s", func() result { return rateLimited(time.Second) }},
	{"rate_limited_10s", func() result { return rateLimited(10 * time.Second) }},
	{"timeout", func() result { return failure(classTimeout, "deadline") }},
	{"auth", func() result { return failure(classAuth, "bad key") }},
	{"malformed", func() result { return failure(classMalformed, "not JSON") }},
	{"refusal", func() result { return failure(classRefusal, "no") }},
	{"context_length", func() result { return failure(classContext, "too long") }},
	{"bad_request", func() result { return failure(classBadRequest, "bad") }},
	{"content_filter", func() result { return failure(classFiltered, "flagged") }},
}

// TestAttemptLoopProperties drives the router with random routes, retry policies, budgets,
// keys and per-provider sequences of outcomes, and checks after every request that
//
//   - the loop ended with either an answer or an error (never both, never neither);
//   - attempts never exceed candidates x (1 + max_retries), plus hedges;
//   - every attempt after a request's first drew on the retry budget, or for a hedge on the
//     hedge budget, and neither budget admitted more than max(floor, ratio x requests).
//
// Waits (Retry-After hints, hedge delays) run on the fake clock, advanced by a helper that
// moves time on whenever the router waits.
func TestAttemptLoopProperties(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		models := []string{"a", "b", "c"}
		nCands := rapid.IntRange(1, 3).Draw(rt, "candidates")
		maxRetries := rapid.IntRange(0, 3).Draw(rt, "max_retries")
		floor := rapid.IntRange(0, 4).Draw(rt, "budget_floor")
		ratio := rapid.SampledFrom([]float64{0, 0.1, 0.5, 1}).Draw(rt, "budget_ratio")
		keys := rapid.IntRange(1, 2).Draw(rt, "keys")
		hedge := rapid.Bool().Draw(rt, "hedge")
		hedgeFloor := rapid.IntRange(0, 2).Draw(rt, "hedge_budget_floor")
		hedgeRatio := rapid.SampledFrom([]float64{0, 0.5, 1}).Draw(rt, "hedge_budget_ratio")

		cfg := testConfig()
		cfg.Retry.MaxRetries = maxRetries
		// A window longer than any run, so the budget's counts are exact.
		cfg.RetryBudget = BudgetConfig{Ratio: ratio, Floor: floor, Window: 24 * time.Hour, FormatOnlyAbove: 0.15}
		cfg.HedgeBudget = HedgeBudgetConfig{Ratio: hedgeRatio, Floor: hedgeFloor, Window: 24 * time.Hour}
		cfg.Routes[0].Candidates = models[:nCands]
		cfg.Routes[0].Hedge = HedgeConfig{Enabled: hedge, MinDelay: 100 * time.Millisecond, MaxDelay: 500 * time.Millisecond}
		for i := range cfg.Models {
			cfg.Models[i].ContextWindow = rapid.IntRange(0, 3).Draw(rt, fmt.Sprintf("context_window_%d", i)) * 4000
			cfg.Models[i].FormatStability = rapid.Float64Range(0, 1).Draw(rt, fmt.Sprintf("format_stability_%d", i))
		}
		var keyIDs []string
		if keys == 2 {
			twoKeys(&cfg)
			keyIDs = []string{"k1", "k2"}
		} else {
			keyIDs = []string{"sim"}
		}
		h := &harness{providers: map[string]*fakeProvider{}}
		for _, m := range models {
			for _, k := range keyIDs {
				n := rapid.IntRange(1, 6).Draw(rt, fmt.Sprintf("script_len_%s_%s", m, k))
				var script []result
				for i := range n {
					o := rapid.IntRange(0, len(propertyOutcomes)-1).Draw(rt, fmt.Sprintf("outcome_%s_%s_%d", m, k, i))
					rt.Logf("%s/%s call %d: %s", m, k, i+1, propertyOutcomes[o].name)
					script = append(script, propertyOutcomes[o].r())
				}
				h.providers[m+"/"+k] = newFakeProvider(script...)
			}
		}
		h = newHarness(t, cfg, h)

		ctx, stop := context.WithCancel(context.Background())
		defer stop()
		go func() { // move time on whenever the router (or a slow provider) waits
			for {
				if h.clock.BlockUntilContext(ctx, 1) != nil {
					return
				}
				h.clock.Advance(100 * time.Millisecond)
			}
		}()

		// sameModel counts the extra attempts the retry budget must have paid for (a retry on
		// the model just tried); failovers those it pays for only when they probe or scout a
		// breaker that is not closed (plan.isFailover), which the attempts do not show.
		requests, sameModel, failovers, hedged, hedgeable := 0, 0, 0, 0, 0
		for i := range rapid.IntRange(1, 5).Draw(rt, "requests") {
			ch := h.start(context.Background(), ask("chat"))
			var d done
			select {
			case d = <-ch:
			case <-time.After(10 * time.Second):
				rt.Fatalf("request %d did not terminate", i)
			}
			if (d.err == nil) == (d.resp == nil) {
				rt.Fatalf("request %d: answer %v and error %v; want exactly one", i, d.resp, d.err)
			}
			var qc *mantlev1.QualityContext
			if d.err == nil {
				qc = d.resp.Quality
			} else {
				qc = FailedQuality(d.err)
			}
			attempts, hedges := len(qc.Attempts), 0
			for _, a := range qc.Attempts {
				if a.Hedged {
					hedges++
				}
			}
			if limit := nCands*(1+maxRetries) + hedges; attempts > limit {
				rt.Fatalf("request %d: %d attempts %v, over candidates x (1 + max_retries) + hedges = %d", i, attempts, attemptsOf(qc), limit)
			}
			requests++
			if hedge {
				hedgeable++ // unary requests on a route that hedges
			}
			prev := ""
			for _, a := range qc.Attempts {
				switch {
				case a.Hedged:
				case prev == "":
				case a.Model == prev:
					sameModel++
				default:
					failovers++
				}
				if !a.Hedged {
					prev = a.Model
				}
			}
			hedged += hedges
			checkBudget(rt, i, "retry", h.router.budget, requests, sameModel, sameModel+failovers, floor, ratio)
			checkBudget(rt, i, "hedge", h.router.hedgeBudget, hedgeable, hedged, hedged, hedgeFloor, hedgeRatio)
			if d.err == nil && qc.Attempts[len(qc.Attempts)-1].ErrorClass != mantlev1.ErrorClass_ERROR_CLASS_NONE {
				rt.Fatalf("request %d answered, but its last attempt failed: %v", i, attemptsOf(qc))
			}
		}
	})
}

// checkBudget fails rt unless budget counted the requests, and between minSpent and
// maxSpent extra attempts (what the attempts show it must and may have paid for), and what
// it spent stays within max(floor, ratio x requests).
func checkBudget(rt *rapid.T, request int, name string, budget *resilience.Budget, requests, minSpent, maxSpent, floor int, ratio float64) {
	gotRequests, gotSpent, _ := budget.Snapshot()
	if gotRequests != requests || gotSpent < minSpent || gotSpent > maxSpent {
		rt.Fatalf("after request %d the %s budget counted %d requests and %d extra attempts; the attempts say %d and %d to %d",
			request, name, gotRequests, gotSpent, requests, minSpent, maxSpent)
	}
	if allowed := max(floor, int(ratio*float64(requests))); gotSpent > allowed {
		rt.Fatalf("after request %d: %d extra attempts admitted, over the %s budget's %d", request, gotSpent, name, allowed)
	}
}
