package router

import (
	"context"
	"slices"
	"testing"
)

// TestAsyncCacheStore: with router.async_cache_store, a request that holds the cache's
// lease is answered before its store is made (the store waits here on storeGate), the
// store carries the lease (so identical lookups wait for it), and WaitStores waits for
// it. Without a lease, or with the option off, the answer waits for the store.
func TestAsyncCacheStore(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name       string
		async      bool
		lease      string
		afterStore bool // the answer comes only once the store is made
	}{
		{"async with a lease", true, "lease-1", false},
		{"async without a lease", true, "", true},
		{"off", false, "lease-1", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig()
			cfg.AsyncCacheStore = tt.async
			gate := make(chan struct{})
			h := newHarness(t, cfg, &harness{cache: &fakeCache{lease: tt.lease, storeGate: gate}})
			answered := make(chan error, 1)
			go func() {
				_, err := h.router.Complete(context.Background(), ask("chat"))
				answered <- err
			}()
			if !tt.afterStore {
				if err := <-answered; err != nil {
					t.Fatalf("Complete: %v", err)
				}
				if n := h.cache.stored(); n != 0 {
					t.Fatalf("%d stores made before the answer, want 0", n)
				}
			}
			close(gate)
			if tt.afterStore {
				if err := <-answered; err != nil {
					t.Fatalf("Complete: %v", err)
				}
				if n := h.cache.stored(); n != 1 {
					t.Fatalf("%d stores made when the answer came, want 1", n)
				}
			}
			h.router.WaitStores()
			if n := h.cache.stored(); n != 1 {
				t.Fatalf("%d stores after WaitStores, want 1", n)
			}
			if got := h.cache.stores[0].GetLeaseId(); got != tt.lease {
				t.Errorf("store's lease %q, want %q", got, tt.lease)
			}
		})
	}
}

// TestAsyncCacheStoreShedWhenBackedUp: with max_async_cache_stores stores in flight, a
// request that holds a lease is answered without waiting for any store, its store is shed
// (counted, not made) and its lease released so that identical requests waiting on it go
// on; the store already in flight still lands.
func TestAsyncCacheStoreShedWhenBackedUp(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	cfg := testConfig()
	cfg.MaxAsyncCacheStores = 1
	h := newHarness(t, cfg, &harness{cache: &fakeCache{lease: "lease-1", storeGate: gate}})
	ctx := context.Background()
	if _, err := h.router.Complete(ctx, ask("chat")); err != nil {
		t.Fatalf("first Complete: %v", err)
	}
	waitWorkers(t, h.router.stores, 1, 0) // its store holds the one worker at the gate

	if _, err := h.router.Complete(ctx, ask("chat")); err != nil { // would hang at the gate if it stored before answering
		t.Fatalf("second Complete: %v", err)
	}
	if got := counterValue(t, h.router.deps.Metrics.storesShed); got != 1 {
		t.Errorf("stores shed %v, want 1", got)
	}
	if got := h.cache.releasedLeases(); !slices.Equal(got, []string{"lease-1"}) {
		t.Errorf("leases released %q, want the shed store's", got)
	}

	// A reload that raises the bound lets the next store in beside the held one.
	cfg.MaxAsyncCacheStores = 2
	if err := h.router.Reload(cfg); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if _, err := h.router.Complete(ctx, ask("chat")); err != nil {
		t.Fatalf("third Complete: %v", err)
	}
	if got := counterValue(t, h.router.deps.Metrics.storesShed); got != 1 {
		t.Errorf("stores shed %v after max_async_cache_stores was raised to 2, want still 1", got)
	}
	close(gate)
	h.router.WaitStores()
	if n := h.cache.stored(); n != 2 {
		t.Errorf("%d stores made, want 2 (the first and third requests'; the second's was shed)", n)
	}
}
