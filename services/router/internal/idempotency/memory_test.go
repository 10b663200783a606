package idempotency

import (
	"context"
	"errors"
	"fmt"
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

// TestMemoryBoundsEachTenant: a tenant that sends endless distinct keys fills only its own
// share; another tenant's keys are still protected, and the full tenant's keys are again
// once its entries expire.
func TestMemoryBoundsEachTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	m := NewMemory(time.Minute, 10*time.Second, clock).LimitPerTenant(3)
	for i := range 3 {
		key := fmt.Sprintf("hostile/k%d", i)
		if _, owner, err := m.Begin(ctx, key); err != nil || !owner {
			t.Fatalf("Begin(%s) = %t, %v; want the claim", key, owner, err)
		}
		if err := m.Complete(ctx, key, Record{Response: []byte("r")}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := m.Begin(ctx, "hostile/k3"); !errors.Is(err, ErrTenantFull) {
		t.Errorf("a fourth key of the full tenant: %v, want ErrTenantFull", err)
	}
	// Its recorded keys still replay.
	if rec, owner, err := m.Begin(ctx, "hostile/k0"); err != nil || owner || string(rec.Response) != "r" {
		t.Errorf("replay of a recorded key: %v %t %v", rec, owner, err)
	}
	if _, owner, err := m.Begin(ctx, "acme/k0"); err != nil || !owner {
		t.Errorf("another tenant's key: %t, %v; want the claim", owner, err)
	}
	clock.Advance(time.Minute + time.Second)
	if _, owner, err := m.Begin(ctx, "hostile/k3"); err != nil || !owner {
		t.Errorf("after its records expired: %t, %v; want the claim", owner, err)
	}
	// The sweep the full tenant caused dropped every expired entry (acme's claim too).
	if n := m.len(); n != 1 {
		t.Errorf("%d entries after the sweep, want 1 (hostile/k3's claim)", n)
	}
}
