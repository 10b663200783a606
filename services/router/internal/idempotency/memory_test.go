package idempotency

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

var epoch = time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)

func newMemoryFixture(t *testing.T) fixture {
	clock := clockwork.NewFakeClockAt(epoch)
	return fixture{
		store:        NewMemory(testTTL, testInflightTTL, clock),
		now:          clock.Now,
		advance:      clock.Advance,
		awaitWaiters: awaitTimers(clock),
	}
}

// awaitTimers returns a fixture.awaitWaiters for stores whose waiters hold one timer each
// on clock.
func awaitTimers(clock *clockwork.FakeClock) func(t *testing.T, n int) {
	return func(t *testing.T, n int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), waitBound)
		defer cancel()
		if err := clock.BlockUntilContext(ctx, n); err != nil {
			t.Fatalf("%d Begin calls did not start waiting within %s", n, waitBound)
		}
	}
}

func TestMemory(t *testing.T) {
	testStore(t, newMemoryFixture)
}

func TestMemorySweep(t *testing.T) {
	clock := clockwork.NewFakeClockAt(epoch)
	m := NewMemory(testTTL, testInflightTTL, clock)
	mustOwn(t, m, "old-claim")
	mustComplete(t, m, "old-record", Record{Response: []byte("r")})
	clock.Advance(testInflightTTL)
	mustOwn(t, m, "new-claim")
	clock.Advance(testTTL - testInflightTTL)
	mustComplete(t, m, "new-record", Record{Response: []byte("r")})

	tests := []struct {
		name      string
		advance   time.Duration
		wantSwept int
		wantLeft  int
	}{
		// old-record reached its ttl and old-claim its deadline long ago; new-claim was
		// claimed testTTL-testInflightTTL ago, which is past its deadline too.
		{name: "expired entries go", advance: 0, wantSwept: 3, wantLeft: 1},
		{name: "live record stays", advance: testTTL - time.Nanosecond, wantSwept: 0, wantLeft: 1},
		{name: "record goes at its ttl", advance: time.Nanosecond, wantSwept: 1, wantLeft: 0},
	}
	for _, tt := range tests {
		clock.Advance(tt.advance)
		if got := m.Sweep(); got != tt.wantSwept {
			t.Errorf("%s: Sweep() = %d, want %d", tt.name, got, tt.wantSwept)
		}
		if got := m.len(); got != tt.wantLeft {
			t.Errorf("%s: %d entries left, want %d", tt.name, got, tt.wantLeft)
		}
	}
}

func TestMemorySweepWakesWaiters(t *testing.T) {
	// A waiter on a claim that Sweep removes must not wait for its timer: the key is free.
	clock := clockwork.NewFakeClockAt(epoch)
	m := NewMemory(testTTL, testInflightTTL, clock)
	mustOwn(t, m, "k")
	ctx, cancel := context.WithTimeout(t.Context(), waitBound)
	defer cancel()
	waiter := beginAsync(ctx, m, "k")
	awaitTimers(clock)(t, 1)
	// Move time without firing the waiter's timer (Advance would): expire the claim by
	// rewriting its deadline, as if the clock had jumped.
	m.mu.Lock()
	m.entries["k"].expires = clock.Now()
	m.mu.Unlock()
	if got := m.Sweep(); got != 1 {
		t.Fatalf("Sweep() = %d, want 1", got)
	}
	if r := receive(t, waiter); r.err != nil || !r.owner {
		t.Fatalf("waiter after Sweep = %+v, want to own the key", r)
	}
}

func TestNewMemoryRejectsNonPositiveDurations(t *testing.T) {
	tests := []struct {
		name             string
		ttl, inflightTTL time.Duration
	}{
		{"zero ttl", 0, time.Second},
		{"negative inflight", time.Hour, -time.Second},
		{"zero inflight", time.Hour, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Errorf("NewMemory(%s, %s) did not panic", tt.ttl, tt.inflightTTL)
				}
			}()
			NewMemory(tt.ttl, tt.inflightTTL, nil)
		})
	}
}
