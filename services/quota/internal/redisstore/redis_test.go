package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/mantle-mesh/mantle/services/quota/internal/ledger"
)

func TestRedisDecidesAtServerTime(t *testing.T) {
	t.Parallel()
	store := newTestRedisStore(t, clockwork.NewRealClock(), Options{ServerTime: true})
	spec := ledger.BucketSpec{Group: "tenant:acme", Field: ledger.FieldTPM, Kind: ledger.KindTokens, Cost: 60, Limit: 60}
	before := time.Now()
	g, err := store.Reserve(context.Background(), ledger.Charge{ID: "r1", Tenant: "acme", TTL: time.Minute, Tokens: 60, Buckets: []ledger.BucketSpec{spec}})
	if err != nil {
		t.Fatal(err)
	}
	// Redis's clock is this machine's: the decision happened while we waited for it.
	if after := time.Now(); g.At.Before(before.Add(-time.Second)) || g.At.After(after.Add(time.Second)) {
		t.Errorf("decided at %v, want between %v and %v", g.At, before, after)
	}
	spec.Cost = 1
	_, err = store.Reserve(context.Background(), ledger.Charge{ID: "r2", Tenant: "acme", TTL: time.Minute, Tokens: 1, Buckets: []ledger.BucketSpec{spec}})
	e, ok := errors.AsType[*ledger.ExhaustedError](err)
	if !ok || e.RetryAfter <= 0 || e.RetryAfter > time.Second {
		t.Fatalf("err = %v, want exhausted for at most the second one token takes", err)
	}
}

// The Lua refill arithmetic (prelude.lua: dur) gives Go's durationOf to the nanosecond,
// on both sides of 2^53 ns of n × window, where it switches from dividing directly to
// long division.
// Reservation records are fields of the tenant's hash, which Redis does not expire one
// by one: the hash outlives each record by a minute, settle refuses and deletes an
// expired one, and reserves sweep the ones nobody settled out of the hash.
func TestRedisRecordsInTheTenantsHash(t *testing.T) {
	t.Parallel()
	c := newTestRedisClient(t)
	clock := clockwork.NewFakeClockAt(t0)
	store := New(c, Options{Prefix: testPrefix(t, c), Clock: clock})
	t.Cleanup(func() { _ = store.Close() })
	ctx := context.Background()
	hash := store.groupKey(ledger.TenantGroup("acme"))
	spec := ledger.BucketSpec{Group: "tenant:acme", Field: ledger.FieldTPM, Kind: ledger.KindTokens, Cost: 1, Limit: 6000}
	reserve := func(id string) {
		t.Helper()
		if _, err := store.Reserve(ctx, ledger.Charge{ID: id, Tenant: "acme", TTL: 2 * time.Minute, Tokens: 1, Buckets: []ledger.BucketSpec{spec}}); err != nil {
			t.Fatal(err)
		}
	}
	records := func() []string {
		t.Helper()
		fields, err := c.HKeys(ctx, hash).Result()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, f := range fields {
			if strings.HasPrefix(f, "r|") {
				out = append(out, strings.TrimPrefix(f, "r|"))
			}
		}
		slices.Sort(out)
		return out
	}

	for i := range 5 {
		reserve(fmt.Sprint("old-", i))
	}
	// The hash lives at least as long as the records in it, and a minute more.
	if ttl, err := c.PTTL(ctx, hash).Result(); err != nil || ttl < 2*time.Minute+59*time.Second {
		t.Fatalf("hash TTL %v (%v), want at least the reservations' 2m and a minute", ttl, err)
	}
	if _, err := store.Settle(ctx, "acme", "old-0", ledger.Actual{Tokens: 1}, false); err != nil {
		t.Fatal(err)
	}
	if got, want := records(), []string{"old-1", "old-2", "old-3", "old-4"}; !slices.Equal(got, want) {
		t.Fatalf("records after one settle: %v, want %v", got, want)
	}

	// Expired: refused, and deleted by the refusal.
	clock.Advance(2 * time.Minute)
	if _, err := store.Settle(ctx, "acme", "old-1", ledger.Actual{Tokens: 1}, false); !errors.Is(err, ledger.ErrReservationNotFound) {
		t.Fatalf("settling an expired reservation: %v, want ErrReservationNotFound", err)
	}
	if got, want := records(), []string{"old-2", "old-3", "old-4"}; !slices.Equal(got, want) {
		t.Fatalf("records after settling an expired one: %v, want %v", got, want)
	}

	// The next reserve after the sweep interval deletes the rest, and keeps its own.
	clock.Advance(time.Minute)
	reserve("new")
	if got, want := records(), []string{"new"}; !slices.Equal(got, want) {
		t.Fatalf("records after the sweep: %v, want %v", got, want)
	}
	if _, err := store.Settle(ctx, "acme", "new", ledger.Actual{Tokens: 1}, false); err != nil {
		t.Fatal(err)
	}
}

// A record kept as a key of its own (as versions before records in the hash wrote every
// record, and as key-only reservations still do) is settled once, like any other.
func TestRedisSettlesRecordsOfTheirOwnKey(t *testing.T) {
	t.Parallel()
	c := newTestRedisClient(t)
	clock := clockwork.NewFakeClockAt(t0)
	store := New(c, Options{Prefix: testPrefix(t, c), Clock: clock})
	t.Cleanup(func() { _ = store.Close() })
	ctx := context.Background()
	spec := ledger.BucketSpec{Group: "tenant:acme", Field: ledger.FieldTPM, Kind: ledger.KindTokens, Cost: 600, Limit: 6000}
	if _, err := store.Reserve(ctx, ledger.Charge{ID: "r1", Tenant: "acme", TTL: time.Minute, Tokens: 600, Buckets: []ledger.BucketSpec{spec}}); err != nil {
		t.Fatal(err)
	}
	// Move the record where an earlier version kept it.
	hash, key := store.groupKey(ledger.TenantGroup("acme")), store.reservationKey("acme", "r1")
	rec, err := c.HGet(ctx, hash, recordField("r1")).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.HDel(ctx, hash, recordField("r1")).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, key, rec, 2*time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	st, err := store.Settle(ctx, "acme", "r1", ledger.Actual{Tokens: 100}, false)
	if err != nil {
		t.Fatal(err)
	}
	if st.Refunded != 500 || len(st.Levels) != 1 || st.Levels[0].Remaining != 5900 {
		t.Fatalf("settlement %+v, want 500 refunded and 5900 left", st)
	}
	if _, err := store.Settle(ctx, "acme", "r1", ledger.Actual{Tokens: 100}, false); !errors.Is(err, ledger.ErrReservationNotFound) {
		t.Fatalf("second settle: %v, want ErrReservationNotFound", err)
	}
}

func TestRedisRefillTimeMatchesGo(t *testing.T) {
	t.Parallel()
	store := newTestRedisStore(t, clockwork.NewFakeClockAt(t0), Options{})
	ctx := context.Background()
	limits := []int64{1, 7, 60, 6000, 999_983, 1_000_000_007, 1 << 40, 1 << 50}
	// 150,119 tokens is the last n with n × 60e9 below 2^53.
	tokens := []int64{1, 59, 61, 12_345, 150_119, 150_120, 150_121, 9_999_991, 1 << 30, 1 << 45}
	i := 0
	for _, limit := range limits {
		for _, n := range tokens {
			i++
			group := fmt.Sprint("refill-", i) // a fresh, full bucket each time
			debts, err := store.adjustGroup(ctx, group, []adjustOp{{field: "b", take: n, limit: limit}})
			if err != nil {
				t.Fatal(err)
			}
			if want := ledger.DurationOf(n, limit); debts[0] != want {
				t.Errorf("taking %d of limit %d: Lua %d ns, Go %d ns", n, limit, debts[0], want)
			}
		}
	}
}
