package idempotency

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// TestStoresBoundEachTenant runs the per-tenant bound against both stores, the JetStream one
// on a real (embedded) JetStream bucket, alone and as two replicas sharing the bucket: a
// tenant that sends endless distinct keys fills only its own share; its recorded keys still
// replay, another tenant's keys are still protected, and the full tenant's keys are again
// once its entries expire.
func TestStoresBoundEachTenant(t *testing.T) {
	const limit = 3
	srv := startNATS(t)
	// stores returns the store that fills the tenant, the one that checks it (the same
	// store, or another replica on the same bucket) and their clock.
	type stores func(t *testing.T) (fill, check Store, clock *clockwork.FakeClock)
	newJS := func(t *testing.T, bucket string, clock clockwork.Clock) *JetStream {
		_, js := connect(t, srv)
		s, err := newJetStream(t.Context(), js, bucket, time.Minute, 10*time.Second, clock)
		if err != nil {
			t.Fatal(err)
		}
		return s.LimitPerTenant(limit)
	}
	kinds := []struct {
		name string
		new  stores
	}{
		{"memory", func(t *testing.T) (Store, Store, *clockwork.FakeClock) {
			clock := clockwork.NewFakeClockAt(epoch)
			m := NewMemory(time.Minute, 10*time.Second, clock).LimitPerTenant(limit)
			return m, m, clock
		}},
		{"jetstream", func(t *testing.T) (Store, Store, *clockwork.FakeClock) {
			clock := clockwork.NewFakeClockAt(epoch)
			s := newJS(t, newBucketName(), clock)
			return s, s, clock
		}},
		{"jetstream, two replicas", func(t *testing.T) (Store, Store, *clockwork.FakeClock) {
			clock := clockwork.NewFakeClockAt(epoch)
			bucket := newBucketName()
			return newJS(t, bucket, clock), newJS(t, bucket, clock), clock
		}},
	}
	for _, kind := range kinds {
		t.Run(kind.name, func(t *testing.T) {
			ctx := context.Background()
			fill, check, clock := kind.new(t)
			for i := range limit {
				key := fmt.Sprintf("hostile/k%d", i)
				if _, owner, err := fill.Begin(ctx, key); err != nil || !owner {
					t.Fatalf("Begin(%s) = %t, %v; want the claim", key, owner, err)
				}
				if err := fill.Complete(ctx, key, Record{Response: []byte("r")}); err != nil {
					t.Fatal(err)
				}
			}
			steps := []struct {
				name      string
				store     Store
				key       string
				advance   time.Duration
				wantFull  bool
				wantOwner bool
				wantRec   string
			}{
				{name: "a new key of the full tenant", store: check, key: "hostile/k3", wantFull: true},
				{name: "its recorded keys still replay", store: check, key: "hostile/k0", wantRec: "r"},
				{name: "another tenant's key", store: check, key: "acme/k0", wantOwner: true},
				{name: "a tenant whose id extends the full one's", store: check, key: "hostile-2/k0", wantOwner: true},
				{name: "still full a moment later", store: check, key: "hostile/k4", advance: 2 * time.Second, wantFull: true},
				{name: "after its records expired", store: check, key: "hostile/k3", advance: time.Minute, wantOwner: true},
			}
			for _, st := range steps {
				clock.Advance(st.advance)
				rec, owner, err := st.store.Begin(ctx, st.key)
				switch {
				case st.wantFull:
					if !errors.Is(err, ErrTenantFull) {
						t.Errorf("%s: Begin(%s) = %v %t %v, want ErrTenantFull", st.name, st.key, rec, owner, err)
					}
				case err != nil || owner != st.wantOwner || (st.wantRec != "") != (rec != nil) || (rec != nil && string(rec.Response) != st.wantRec):
					t.Errorf("%s: Begin(%s) = %v %t %v; want owner %t, record %q", st.name, st.key, rec, owner, err, st.wantOwner, st.wantRec)
				}
			}
		})
	}
}
