package router

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// probeCapBreaker trips a after two failures in a row and opens it for 30 s (no jitter);
// half-open then admits three probes.
func probeCapBreaker(c *Config) {
	fastBreaker(c)
	c.Breaker.HalfOpenProbes = 3
}

// TestHalfOpenProbeCapWithHedging: a hedged probe that loses to its hedge was sent to the
// recovering provider, so it stays spent: however many requests arrive while a is
// half-open, at most half_open_probes calls reach it in the period (mantle drill found 4 to
// 9 when the loser's place was given back). A trial whose probes were all abandoned gave no
// verdict and re-opens without calling a again.
func TestHalfOpenProbeCapWithHedging(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	probeCapBreaker(&cfg)
	hedging(&cfg) // hedge after 100-500 ms
	h := newHarness(t, cfg, &harness{providers: map[string]*fakeProvider{
		// Two failures trip a; from then on it is slow: every probe hangs until the
		// hedge to b has answered and the probe is cancelled.
		"a": newFakeProvider(failure(classTransient, "502"), failure(classTransient, "502"), hang()),
		"b": newFakeProvider(reply("from b", 1, 1)),
	}})
	for range 2 {
		if _, err := h.router.Complete(context.Background(), ask("chat")); err != nil {
			t.Fatal(err)
		}
	}
	if k := describeKey(t, h, "chat", "a", "sim"); k.BreakerState != breakerOpen {
		t.Fatalf("a's breaker %v after two failures, want open", k.BreakerState)
	}
	drain(h.providers["a"].started)
	h.clock.Advance(30 * time.Second) // half-open from the next request on

	const requests = 6
	for i := range requests {
		probe := i < cfg.Breaker.HalfOpenProbes
		ch := h.start(context.Background(), ask("chat"))
		if probe {
			<-h.providers["a"].started
			h.blockUntil(t, 1) // the hedge timer
			h.clock.Advance(500 * time.Millisecond)
		}
		d := await(t, ch)
		if d.err != nil {
			t.Fatalf("request %d: %v", i, d.err)
		}
		want := []string{"b:none"}
		if probe {
			want = []string{"a:canceled", "b:none:hedged"}
		}
		if diff := cmp.Diff(want, attemptsOf(d.resp.Quality)); diff != "" {
			t.Errorf("request %d: attempts (-want +got):\n%s", i, diff)
		}
	}
	if n := h.calls("a") - 2; n != cfg.Breaker.HalfOpenProbes {
		t.Errorf("%d calls reached a in its half-open period over %d requests, want half_open_probes = %d", n, requests, cfg.Breaker.HalfOpenProbes)
	}
	k := describeKey(t, h, "chat", "a", "sim")
	if k.BreakerState != breakerOpen || !strings.Contains(k.BreakerReason, "no probe verdict") {
		t.Errorf("a's breaker %v (%q), want open again: no probe gave a verdict", k.BreakerState, k.BreakerReason)
	}
}

// TestProbeOfCallerWhoLeftStaysSpent: a caller that goes away while its request probes a
// half-open provider leaves no verdict, but the call was sent: the next request must not
// probe again in the same period.
func TestProbeOfCallerWhoLeftStaysSpent(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	probeCapBreaker(&cfg)
	cfg.Breaker.HalfOpenProbes = 1
	h := newHarness(t, cfg, &harness{providers: map[string]*fakeProvider{
		"a": newFakeProvider(failure(classTransient, "502"), failure(classTransient, "502"), hang()),
	}})
	for range 2 {
		if _, err := h.router.Complete(context.Background(), ask("chat")); err != nil {
			t.Fatal(err)
		}
	}
	drain(h.providers["a"].started)
	h.clock.Advance(30 * time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	ch := h.start(ctx, ask("chat"))
	<-h.providers["a"].started
	cancel() // the caller leaves mid-call
	if d := await(t, ch); d.err == nil {
		t.Fatalf("got %v, want an error: the caller left", d.resp.GetModel())
	}
	resp, err := h.router.Complete(context.Background(), ask("chat"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Model != "b" || h.calls("a") != 3 {
		t.Errorf("answered by %s after %d calls to a, want b without calling a: the probe was spent", resp.Model, h.calls("a"))
	}
}

// drain empties the announcements of calls already made, so that the next receive waits for
// a new call.
func drain[T any](ch <-chan T) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}
