package router

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
)

// hedging turns hedging on for route chat with a 100-500 ms delay.
func hedging(c *Config) {
	c.Routes[0].Hedge = HedgeConfig{Enabled: true, MinDelay: 100 * time.Millisecond, MaxDelay: 500 * time.Millisecond}
}

func TestHedging(t *testing.T) {
	t.Parallel()

	t.Run("slow primary: the hedge after the delay wins and the primary is cancelled", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig()
		hedging(&cfg)
		h := newHarness(t, cfg, &harness{providers: map[string]*fakeProvider{
			"a": newFakeProvider(hang()),
			"b": newFakeProvider(reply("from the hedge", 2, 3)),
		}})
		ch := h.start(context.Background(), ask("chat"))
		h.blockUntil(t, 1) // the hedge timer: a has no latency history, so the delay is max_delay
		h.clock.Advance(499 * time.Millisecond)
		if n := h.calls("b"); n != 0 {
			t.Fatalf("hedged after 499ms, before the 500ms delay (b called %d times)", n)
		}
		h.clock.Advance(time.Millisecond)
		d := await(t, ch)
		if d.err != nil {
			t.Fatal(d.err)
		}
		if d.resp.Model != "b" || d.resp.Message.Content != "from the hedge" {
			t.Errorf("answered by %s: %q, want the hedge's answer", d.resp.Model, d.resp.Message.Content)
		}
		// Both attempts are recorded: the cancelled primary, then the hedge that answered.
		if diff := cmp.Diff([]string{"a:canceled", "b:none:hedged"}, attemptsOf(d.resp.Quality)); diff != "" {
			t.Errorf("attempts (-want +got):\n%s", diff)
		}
		if got := counterValue(t, h.router.deps.Metrics.hedges); got != 1 {
			t.Errorf("hedges = %v, want 1", got)
		}
		if diff := cmp.Diff(usage(2, 3), d.resp.Usage, protocmp.Transform()); diff != "" {
			t.Errorf("response usage is the hedge's (-want +got):\n%s", diff)
		}
	})

	// A call that failed at once leaves its request as far from an answer as a new one: the
	// attempt that follows (a failover here, a retry elsewhere) is raced like a first one.
	t.Run("the attempt after a call that failed at once is hedged", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig()
		hedging(&cfg)
		cfg.Retry.MaxRetries = 0 // a fails over to b at once
		h := newHarness(t, cfg, &harness{providers: map[string]*fakeProvider{
			"a": newFakeProvider(failure(classTransient, "503 at once")),
			"b": newFakeProvider(hang()),
			"c": newFakeProvider(reply("from the hedge", 1, 1)),
		}})
		ch := h.start(context.Background(), ask("chat"))
		<-h.providers["b"].started // a has failed: the first attempt's hedge timer is gone
		h.blockUntil(t, 1)         // b's hedge timer (b has no history: max_delay)
		h.clock.Advance(499 * time.Millisecond)
		if n := h.calls("c"); n != 0 {
			t.Fatalf("hedged the failover before the 500ms delay (c called %d times)", n)
		}
		h.clock.Advance(time.Millisecond)
		d := await(t, ch)
		if d.err != nil {
			t.Fatal(d.err)
		}
		if diff := cmp.Diff([]string{"a:transient", "b:canceled", "c:none:hedged"}, attemptsOf(d.resp.Quality)); diff != "" {
			t.Errorf("attempts (-want +got):\n%s", diff)
		}
		if got := counterValue(t, h.router.deps.Metrics.hedges); got != 1 {
			t.Errorf("hedges = %v, want 1", got)
		}
	})

	t.Run("the hedge delay is the key's live p95, within the bounds", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig()
		hedging(&cfg)
		h := newHarness(t, cfg, &harness{providers: map[string]*fakeProvider{
			"a": newFakeProvider(result{res: reply("a", 1, 1).res, advance: 300 * time.Millisecond}, hang()),
			"b": newFakeProvider(reply("from the hedge", 1, 1)),
		}})
		if _, err := h.router.Complete(context.Background(), ask("a")); err != nil { // a's p95: 300ms
			t.Fatal(err)
		}
		ch := h.start(context.Background(), ask("chat"))
		h.blockUntil(t, 1)
		h.clock.Advance(299 * time.Millisecond)
		if n := h.calls("b"); n != 0 {
			t.Fatalf("hedged before a's p95 of 300ms (b called %d times)", n)
		}
		h.clock.Advance(time.Millisecond)
		if d := await(t, ch); d.err != nil || d.resp.Model != "b" {
			t.Errorf("got %v %v, want the hedge's answer", d.resp.GetModel(), d.err)
		}
	})

	// A call that timed out never answered: once one in twenty of a key's recent calls did,
	// the request's own call may well be one of them, and waiting for the p95 of the calls
	// that answered only delays the hedge that will answer it.
	t.Run("a key whose recent calls time out is hedged at min_delay, not at its p95", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name     string
			timedOut bool // a's second call timed out (else it failed at once)
			delay    time.Duration
		}{
			{"one call in two timed out: min_delay", true, 100 * time.Millisecond},
			{"one call in two failed at once: the p95 of the answered", false, 300 * time.Millisecond},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				cfg := testConfig()
				hedging(&cfg)
				cfg.Retry.MaxRetries = 0
				second := result{err: &provider.Error{Class: classTimeout, Message: "deadline exceeded"}, advance: 5 * time.Second} // the provider's 5 s timeout, on time
				if !tc.timedOut {
					second = failure(classTransient, "502")
				}
				h := newHarness(t, cfg, &harness{providers: map[string]*fakeProvider{
					"a": newFakeProvider(result{res: reply("a", 1, 1).res, advance: 300 * time.Millisecond}, second, hang()),
					"b": newFakeProvider(reply("from the hedge", 1, 1)),
				}})
				if _, err := h.router.Complete(context.Background(), ask("a")); err != nil { // a's p95: 300ms
					t.Fatal(err)
				}
				if _, err := h.router.Complete(context.Background(), ask("a")); err == nil {
					t.Fatal("a's second call answered; the script makes it fail")
				}
				ch := h.start(context.Background(), ask("chat"))
				h.blockUntil(t, 1)
				h.clock.Advance(tc.delay - time.Millisecond)
				if n := h.calls("b"); n != 0 {
					t.Fatalf("hedged before %s (b called %d times)", tc.delay, n)
				}
				h.clock.Advance(time.Millisecond)
				if d := await(t, ch); d.err != nil || d.resp.Model != "b" {
					t.Errorf("got %v %v, want the hedge's answer after %s", d.resp.GetModel(), d.err, tc.delay)
				}
			})
		}
	})

	t.Run("no hedge when the hedge budget is spent", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig()
		hedging(&cfg)
		cfg.HedgeBudget = HedgeBudgetConfig{} // ratio 0, floor 0: no hedges (and the window's default)
		noRetryBudget(&cfg)
		cfg.Providers[0].Timeout = 50 * time.Millisecond // real time: a hangs until its per-try timeout
		h := newHarness(t, cfg, &harness{providers: map[string]*fakeProvider{"a": newFakeProvider(hang())}})
		ch := h.start(context.Background(), ask("chat"))
		h.blockUntil(t, 1)
		h.clock.Advance(500 * time.Millisecond)
		d := await(t, ch)
		// Had the hedge gone, b would have answered while a hung, in an attempt marked hedged.
		// Without it a is waited for until its per-try timeout, and then the request fails
		// over to the healthy b, which needs no retry budget.
		if d.err != nil || d.resp.GetModel() != "b" {
			t.Fatalf("got %v %v, want b's answer after a's timeout", d.resp.GetModel(), d.err)
		}
		if diff := cmp.Diff([]string{"a:timeout", "b:none"}, attemptsOf(d.resp.GetQuality())); diff != "" {
			t.Errorf("attempts (-want +got):\n%s", diff)
		}
		for _, a := range d.resp.GetQuality().GetAttempts() {
			if a.Hedged {
				t.Errorf("attempt %d on %s is a hedge; the hedge budget was spent", a.Number, a.Model)
			}
		}
		if got := counterValue(t, h.router.deps.Metrics.hedges); got != 0 {
			t.Errorf("hedges = %v, want 0", got)
		}
		if got := counterValue(t, h.router.deps.Metrics.hedgeBudgetDenied); got != 1 {
			t.Errorf("hedge budget rejections = %v, want 1", got)
		}
	})

	// Hedges and failovers have separate budgets: a retry budget spent by failovers does
	// not stop a hedge (nor, TestAttemptLoopProperties checks, the other way round).
	t.Run("a spent retry budget does not stop a hedge", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig()
		hedging(&cfg)
		noRetryBudget(&cfg)
		h := newHarness(t, cfg, &harness{providers: map[string]*fakeProvider{
			"a": newFakeProvider(hang()),
			"b": newFakeProvider(reply("from the hedge", 1, 1)),
		}})
		ch := h.start(context.Background(), ask("chat"))
		h.blockUntil(t, 1)
		h.clock.Advance(500 * time.Millisecond)
		if d := await(t, ch); d.err != nil || d.resp.Model != "b" {
			t.Fatalf("got %v %v, want the hedge's answer", d.resp.GetModel(), d.err)
		}
		if asked := h.quota.retryRequests(); len(asked) != 0 {
			t.Errorf("the hedge asked quota's shared retry budget %d times, want never", len(asked))
		}
		if _, retries, _ := h.router.budget.Snapshot(); retries != 0 {
			t.Errorf("the retry budget counted %d retries, want 0: the hedge is the hedge budget's", retries)
		}
		if _, hedges, _ := h.router.hedgeBudget.Snapshot(); hedges != 1 {
			t.Errorf("the hedge budget counted %d hedges, want 1", hedges)
		}
	})

	t.Run("the hedge fails, the primary still answers", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig()
		hedging(&cfg)
		release := make(chan struct{})
		h := newHarness(t, cfg, &harness{providers: map[string]*fakeProvider{
			"a": newFakeProvider(result{release: release, res: reply("slow but fine", 1, 1).res}),
			"b": newFakeProvider(failure(classTransient, "502")),
		}})
		ch := h.start(context.Background(), ask("chat"))
		h.blockUntil(t, 1)
		h.clock.Advance(500 * time.Millisecond)
		<-h.providers["b"].returned // the hedge has failed; only then may a answer
		close(release)
		d := await(t, ch)
		if d.err != nil || d.resp.Model != "a" {
			t.Fatalf("got %v %v, want a's answer", d.resp.GetModel(), d.err)
		}
		if diff := cmp.Diff([]string{"b:transient:hedged", "a:none"}, attemptsOf(d.resp.Quality)); diff != "" {
			t.Errorf("attempts (-want +got):\n%s", diff)
		}
	})

	t.Run("both fail: the plan learns from the primary's failure too", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig()
		hedging(&cfg)
		releaseA, releaseB := make(chan struct{}), make(chan struct{})
		h := newHarness(t, cfg, &harness{providers: map[string]*fakeProvider{
			// a's key timed out: it must not be asked again in this request.
			"a": newFakeProvider(result{release: releaseA, err: failure(classTimeout, "deadline").err}),
			"b": newFakeProvider(result{release: releaseB, err: failure(classTransient, "502").err}, failure(classTransient, "502")),
			"c": newFakeProvider(reply("from c", 1, 1)),
		}})
		ch := h.start(context.Background(), ask("chat"))
		h.blockUntil(t, 1)
		h.clock.Advance(500 * time.Millisecond)
		<-h.providers["b"].started
		close(releaseA)
		close(releaseB)
		d := await(t, ch)
		if d.err != nil || d.resp.Model != "c" {
			t.Fatalf("got %v %v, want c's answer", d.resp.GetModel(), d.err)
		}
		if n := h.calls("a"); n != 1 {
			t.Errorf("a called %d times, want 1: its key timed out", n)
		}
		if n := h.calls("b"); n != 3 {
			t.Errorf("b called %d times, want 3: the hedge and max_retries (2)", n)
		}
	})
}

// TestHedgeNotice: the route's degraded-answer notice (and a degradation reason) go with a
// hedge's answer only when the first choice failed; a hedge that merely answered first,
// while the first choice was still working, is not degraded.
func TestHedgeNotice(t *testing.T) {
	t.Parallel()
	const notice = "Answered by a backup model."
	for _, tt := range []struct {
		name         string
		primaryFails bool
		notice       string
	}{
		{"the primary is only slow", false, ""},
		{"the primary failed while the hedge ran", true, notice},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig()
			hedging(&cfg)
			cfg.Routes[0].Ladder.Notice = notice
			releaseA, releaseB := make(chan struct{}), make(chan struct{})
			a := hang()
			if tt.primaryFails {
				a = result{err: &provider.Error{Class: mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, StatusCode: 503, Message: "busy"}, release: releaseA}
			}
			b := reply("from the hedge", 1, 1)
			b.release = releaseB
			h := newHarness(t, cfg, &harness{providers: map[string]*fakeProvider{"a": newFakeProvider(a), "b": newFakeProvider(b)}})
			ch := h.start(context.Background(), ask("chat"))
			h.blockUntil(t, 1) // the hedge timer
			h.clock.Advance(500 * time.Millisecond)
			<-h.providers["b"].started
			if tt.primaryFails {
				close(releaseA)
				<-h.providers["a"].returned
			}
			close(releaseB)
			d := await(t, ch)
			if d.err != nil || d.resp.Model != "b" {
				t.Fatalf("got %v %v, want the hedge's answer", d.resp.GetModel(), d.err)
			}
			q := d.resp.Quality
			if q.UserNotice != tt.notice || (q.DegradationReason != "") != tt.primaryFails {
				t.Errorf("notice %q, degradation reason %q; want notice %q and a reason only when the primary failed (%t)", q.UserNotice, q.DegradationReason, tt.notice, tt.primaryFails)
			}
			if q.FallbackLevel != mantlev1.FallbackLevel_FALLBACK_LEVEL_BACKUP_MODEL {
				t.Errorf("level %v, want BACKUP_MODEL: the backup answered either way", q.FallbackLevel)
			}
		})
	}
}
