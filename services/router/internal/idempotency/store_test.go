package idempotency

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Durations every fixture uses. They are on a fake clock, so their size costs nothing.
const (
	testTTL         = time.Hour
	testInflightTTL = time.Minute
	// waitBound bounds every wait on another goroutine: generous, because it only matters
	// when the code under test is broken.
	waitBound = 10 * time.Second
)

// fixture is a fresh, empty store on a fake clock with the test durations.
type fixture struct {
	store Store
	now   func() time.Time
	// advance moves the store's clock forward.
	advance func(time.Duration)
	// awaitWaiters returns once n Begin calls are blocked on a live claim (each such call
	// holds one timer on the clock until the claim's deadline).
	awaitWaiters func(t *testing.T, n int)
}

type beginResult struct {
	rec   *Record
	owner bool
	err   error
}

func beginAsync(ctx context.Context, s Store, key string) <-chan beginResult {
	ch := make(chan beginResult, 1)
	go func() {
		rec, owner, err := s.Begin(ctx, key)
		ch <- beginResult{rec, owner, err}
	}()
	return ch
}

func receive(t *testing.T, ch <-chan beginResult) beginResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(waitBound):
		t.Fatalf("Begin did not return within %s", waitBound)
		return beginResult{}
	}
}

func mustOwn(t *testing.T, s Store, key string) {
	t.Helper()
	rec, owner, err := s.Begin(t.Context(), key)
	if err != nil || !owner || rec != nil {
		t.Fatalf("Begin(%q) = (%v, %v, %v), want to own the key", key, rec, owner, err)
	}
}

func mustReplay(t *testing.T, s Store, key string, want Record) {
	t.Helper()
	rec, owner, err := s.Begin(t.Context(), key)
	if err != nil || owner || rec == nil {
		t.Fatalf("Begin(%q) = (%v, %v, %v), want a record", key, rec, owner, err)
	}
	if diff := cmp.Diff(want, *rec); diff != "" {
		t.Fatalf("Begin(%q) record (-want +got):\n%s", key, diff)
	}
}

func mustComplete(t *testing.T, s Store, key string, rec Record) {
	t.Helper()
	if err := s.Complete(t.Context(), key, rec); err != nil {
		t.Fatalf("Complete(%q): %v", key, err)
	}
}

func mustAbandon(t *testing.T, s Store, key string) {
	t.Helper()
	if err := s.Abandon(t.Context(), key); err != nil {
		t.Fatalf("Abandon(%q): %v", key, err)
	}
}

// mustTimeOut checks that Begin is still waiting on a live claim: with a short real
// deadline it returns the context's error.
func mustTimeOut(t *testing.T, s Store, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	rec, owner, err := s.Begin(ctx, key)
	if !errors.Is(err, context.DeadlineExceeded) || owner || rec != nil {
		t.Fatalf("Begin(%q) = (%v, %v, %v), want to wait until %v", key, rec, owner, err, context.DeadlineExceeded)
	}
}

func statusBytes(t *testing.T, code codes.Code, msg string) []byte {
	t.Helper()
	b, err := proto.Marshal(status.New(code, msg).Proto())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// testStore is the behaviour every Store must have. newStore returns an empty store for
// each subtest.
func testStore(t *testing.T, newStore func(t *testing.T) fixture) {
	t.Run("first call owns", func(t *testing.T) {
		fx := newStore(t)
		for _, key := range []string{
			"req-1",
			"req-2",
			"tenant-a/Idempotency-Key: 订单 42 .*> with spaces",
			strings.Repeat("k", 2000),
		} {
			mustOwn(t, fx.store, key)
		}
	})

	t.Run("replay returns the record", func(t *testing.T) {
		fx := newStore(t)
		explicit := fx.now().Add(-time.Minute)
		tests := []struct {
			name string
			rec  Record
			want Record // At zero: the store's clock at Complete
		}{
			{name: "answer", rec: Record{Response: []byte("\x0a\x03abc")}, want: Record{Response: []byte("\x0a\x03abc")}},
			{
				name: "recorded error",
				rec:  Record{Status: statusBytes(t, codes.InvalidArgument, "context length exceeded")},
				want: Record{Status: statusBytes(t, codes.InvalidArgument, "context length exceeded")},
			},
			{name: "caller's time", rec: Record{Response: []byte("r"), At: explicit}, want: Record{Response: []byte("r"), At: explicit}},
			{name: "fingerprint", rec: Record{Response: []byte("r"), Fingerprint: []byte{1, 2, 3}, At: explicit}, want: Record{Response: []byte("r"), Fingerprint: []byte{1, 2, 3}, At: explicit}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				key := "replay-" + tt.name
				mustOwn(t, fx.store, key)
				if tt.want.At.IsZero() {
					tt.want.At = fx.now()
				}
				mustComplete(t, fx.store, key, tt.rec)
				// The store keeps its own copy: changing the caller's bytes changes nothing.
				if len(tt.rec.Response) > 0 {
					tt.rec.Response[0] ^= 0xff
				}
				mustReplay(t, fx.store, key, tt.want)
				mustReplay(t, fx.store, key, tt.want)
			})
		}
		rec, _, err := fx.store.Begin(t.Context(), "replay-recorded error")
		if err != nil {
			t.Fatal(err)
		}
		var st spb.Status
		if err := proto.Unmarshal(rec.Status, &st); err != nil {
			t.Fatalf("recorded status does not unmarshal: %v", err)
		}
		if got := status.FromProto(&st); got.Code() != codes.InvalidArgument || got.Message() != "context length exceeded" {
			t.Errorf("recorded status = %v, want InvalidArgument: context length exceeded", got)
		}
	})

	t.Run("concurrent duplicates join the owner", func(t *testing.T) {
		fx := newStore(t)
		const n = 8
		ctx, cancel := context.WithTimeout(t.Context(), waitBound)
		defer cancel()
		results := make(chan beginResult, n)
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				rec, owner, err := fx.store.Begin(ctx, "dup")
				results <- beginResult{rec, owner, err}
			})
		}
		// The owner returns at once; wait until the other n-1 are blocked on its claim so
		// that they really join an in-flight request rather than replay a finished one.
		first := receive(t, results)
		if first.err != nil || !first.owner {
			t.Fatalf("first Begin to return = %+v, want the owner", first)
		}
		fx.awaitWaiters(t, n-1)
		want := Record{Response: []byte("answer"), At: fx.now()}
		mustComplete(t, fx.store, "dup", want)
		wg.Wait()
		close(results)
		got := 0
		for r := range results {
			if r.err != nil || r.owner {
				t.Errorf("duplicate Begin = (%v, %v), want the owner's record", r.owner, r.err)
				continue
			}
			if diff := cmp.Diff(want, *r.rec); diff != "" {
				t.Errorf("duplicate record (-want +got):\n%s", diff)
			}
			got++
		}
		if got != n-1 {
			t.Errorf("%d duplicates got the record, want %d", got, n-1)
		}
	})

	t.Run("abandon hands the key to exactly one waiter", func(t *testing.T) {
		fx := newStore(t)
		const waiters = 4
		mustOwn(t, fx.store, "ab")
		ctx, cancel := context.WithTimeout(t.Context(), waitBound)
		defer cancel()
		results := make(chan beginResult, waiters)
		for range waiters {
			go func() {
				rec, owner, err := fx.store.Begin(ctx, "ab")
				results <- beginResult{rec, owner, err}
			}()
		}
		fx.awaitWaiters(t, waiters)
		mustAbandon(t, fx.store, "ab")

		next := receive(t, results)
		if next.err != nil || !next.owner {
			t.Fatalf("first waiter to return after Abandon = %+v, want the new owner", next)
		}
		// The others keep waiting on the new owner and get its record.
		want := Record{Response: []byte("second try"), At: fx.now()}
		mustComplete(t, fx.store, "ab", want)
		for range waiters - 1 {
			r := receive(t, results)
			if r.err != nil || r.owner {
				t.Fatalf("other waiter = (%v, %v), want the new owner's record", r.owner, r.err)
			}
			if diff := cmp.Diff(want, *r.rec); diff != "" {
				t.Errorf("other waiter's record (-want +got):\n%s", diff)
			}
		}
	})

	t.Run("abandon without waiters frees the key", func(t *testing.T) {
		fx := newStore(t)
		mustOwn(t, fx.store, "free")
		mustAbandon(t, fx.store, "free")
		mustOwn(t, fx.store, "free")
		// Abandoning a key twice, or one never claimed, is harmless.
		mustAbandon(t, fx.store, "free")
		mustAbandon(t, fx.store, "free")
		mustAbandon(t, fx.store, "never-claimed")
		mustOwn(t, fx.store, "free")
	})

	t.Run("waiter gives up at its deadline and leaks no claim", func(t *testing.T) {
		tests := []struct {
			name  string
			end   func(t *testing.T, fx fixture, key string) // what the owner does after the waiter left
			owner bool                                       // whether the next caller owns the key
		}{
			{name: "owner completes", end: func(t *testing.T, fx fixture, key string) {
				mustComplete(t, fx.store, key, Record{Response: []byte("late")})
			}},
			{name: "owner abandons", end: func(t *testing.T, fx fixture, key string) { mustAbandon(t, fx.store, key) }, owner: true},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				fx := newStore(t)
				mustOwn(t, fx.store, "slow")
				mustTimeOut(t, fx.store, "slow")
				tt.end(t, fx, "slow")
				rec, owner, err := fx.store.Begin(t.Context(), "slow")
				if err != nil || owner != tt.owner || (rec == nil) != tt.owner {
					t.Fatalf("Begin after the waiter left = (%v, %v, %v), want owner=%v", rec, owner, err, tt.owner)
				}
			})
		}
	})

	t.Run("cancelled context claims nothing", func(t *testing.T) {
		fx := newStore(t)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if _, owner, err := fx.store.Begin(ctx, "cancelled"); !errors.Is(err, context.Canceled) || owner {
			t.Fatalf("Begin with a cancelled context = (%v, %v), want %v", owner, err, context.Canceled)
		}
		mustOwn(t, fx.store, "cancelled")
	})

	t.Run("dead owner is taken over after inflightTTL", func(t *testing.T) {
		t.Run("by a waiter", func(t *testing.T) {
			fx := newStore(t)
			mustOwn(t, fx.store, "dead")
			ctx, cancel := context.WithTimeout(t.Context(), waitBound)
			defer cancel()
			waiter := beginAsync(ctx, fx.store, "dead")
			fx.awaitWaiters(t, 1)
			fx.advance(testInflightTTL)
			if r := receive(t, waiter); r.err != nil || !r.owner {
				t.Fatalf("waiter after inflightTTL = %+v, want to take the key over", r)
			}
			// The new claim is live: the next caller waits again.
			mustTimeOut(t, fx.store, "dead")
		})
		t.Run("by the next caller", func(t *testing.T) {
			fx := newStore(t)
			mustOwn(t, fx.store, "dead")
			fx.advance(testInflightTTL - time.Second)
			mustTimeOut(t, fx.store, "dead") // not before the deadline
			fx.advance(time.Second)
			mustOwn(t, fx.store, "dead")
		})
	})

	t.Run("late owner's result is kept", func(t *testing.T) {
		fx := newStore(t)
		mustOwn(t, fx.store, "late")
		fx.advance(testInflightTTL)
		mustOwn(t, fx.store, "late") // a second caller takes the stale claim over
		first := Record{Response: []byte("from the slow owner"), At: fx.now()}
		mustComplete(t, fx.store, "late", first)
		mustReplay(t, fx.store, "late", first)
		// The second owner finishes too: the first record stays.
		mustComplete(t, fx.store, "late", Record{Response: []byte("from the second owner")})
		mustReplay(t, fx.store, "late", first)
	})

	t.Run("abandon keeps a record", func(t *testing.T) {
		fx := newStore(t)
		mustOwn(t, fx.store, "kept")
		want := Record{Response: []byte("done"), At: fx.now()}
		mustComplete(t, fx.store, "kept", want)
		mustAbandon(t, fx.store, "kept")
		mustReplay(t, fx.store, "kept", want)
	})

	t.Run("complete without a claim records", func(t *testing.T) {
		fx := newStore(t)
		want := Record{Response: []byte("unclaimed"), At: fx.now()}
		mustComplete(t, fx.store, "unclaimed", want)
		mustReplay(t, fx.store, "unclaimed", want)
	})

	t.Run("records expire after ttl", func(t *testing.T) {
		fx := newStore(t)
		mustOwn(t, fx.store, "exp")
		want := Record{Response: []byte("old"), At: fx.now()}
		mustComplete(t, fx.store, "exp", want)
		fx.advance(testTTL - time.Nanosecond)
		mustReplay(t, fx.store, "exp", want)
		fx.advance(time.Nanosecond)
		mustOwn(t, fx.store, "exp")
		// A new record replaces the expired one and starts its own ttl.
		fresh := Record{Response: []byte("new"), At: fx.now()}
		mustComplete(t, fx.store, "exp", fresh)
		mustReplay(t, fx.store, "exp", fresh)
	})

	t.Run("keys are independent", func(t *testing.T) {
		fx := newStore(t)
		for i := range 5 {
			mustOwn(t, fx.store, fmt.Sprintf("tenant-%d/same-id", i))
		}
		want := Record{Response: []byte("t0"), At: fx.now()}
		mustComplete(t, fx.store, "tenant-0/same-id", want)
		mustReplay(t, fx.store, "tenant-0/same-id", want)
		mustTimeOut(t, fx.store, "tenant-1/same-id")
	})
}
