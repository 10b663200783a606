package cache

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

var epoch = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func testEntry(id, tenant, scenario string) Entry {
	return Entry{
		ID: id, Key: sha256.Sum256([]byte(tenant + "/" + scenario + "/" + id)),
		Tenant: tenant, Scenario: scenario, Content: "answer " + id,
		CreatedAt: epoch, ExpiresAt: epoch.Add(time.Hour),
	}
}

func mustPut(t *testing.T, idx Index, entries ...Entry) {
	t.Helper()
	for _, e := range entries {
		if err := idx.Put(context.Background(), e); err != nil {
			t.Fatalf("Put(%s): %v", e.ID, err)
		}
	}
}

func present(t *testing.T, idx Index, now time.Time, entries ...Entry) []string {
	t.Helper()
	var ids []string
	for _, e := range entries {
		got, ok, err := idx.Get(context.Background(), e.Key, now)
		if err != nil {
			t.Fatalf("Get(%s): %v", e.ID, err)
		}
		if ok {
			ids = append(ids, got.ID)
		}
	}
	return ids
}

func TestMemoryIndexEvictsLeastRecentlyUsed(t *testing.T) {
	t.Parallel()
	idx := NewMemoryIndex(2)
	a, b, c := testEntry("a", "t", "s"), testEntry("b", "t", "s"), testEntry("c", "t", "s")
	mustPut(t, idx, a, b)
	// Reading a makes b the least recently used.
	if got := present(t, idx, epoch, a); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("before eviction got %v, want [a]", got)
	}
	mustPut(t, idx, c)

	if got := present(t, idx, epoch, a, b, c); !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("after eviction got %v, want [a c]", got)
	}
	if got := idx.Len(); got != 2 {
		t.Errorf("Len() = %d, want 2", got)
	}
	if got := idx.Evictions(); got != 1 {
		t.Errorf("Evictions() = %d, want 1", got)
	}
}

func TestMemoryIndexPutReplacesSameKey(t *testing.T) {
	t.Parallel()
	idx := NewMemoryIndex(10)
	old := testEntry("a", "t", "s")
	replacement := old
	replacement.ID, replacement.Content = "a2", "newer answer"
	mustPut(t, idx, old, replacement)

	got, ok, _ := idx.Get(context.Background(), old.Key, epoch)
	if !ok || got.ID != "a2" || got.Content != "newer answer" {
		t.Errorf("Get = (%+v, %v), want the replacement", got, ok)
	}
	if idx.Len() != 1 {
		t.Errorf("Len() = %d, want 1", idx.Len())
	}
}

func TestMemoryIndexRemovesExpiredOnGet(t *testing.T) {
	t.Parallel()
	idx := NewMemoryIndex(10)
	e := testEntry("a", "t", "s")
	mustPut(t, idx, e)

	if got := present(t, idx, e.ExpiresAt.Add(-time.Nanosecond), e); len(got) != 1 {
		t.Fatalf("just before expiry: got %v, want a hit", got)
	}
	if got := present(t, idx, e.ExpiresAt, e); len(got) != 0 {
		t.Errorf("at expiry: got %v, want a miss", got)
	}
	if idx.Len() != 0 {
		t.Errorf("Len() after expired Get = %d, want 0 (removed)", idx.Len())
	}
}

func TestMemoryIndexDelete(t *testing.T) {
	t.Parallel()
	all := []Entry{
		testEntry("a1", "acme", "support"),
		testEntry("a2", "acme", "support"),
		testEntry("a3", "acme", "sales"),
		testEntry("g1", "globex", "support"),
	}
	tests := []struct {
		name        string
		filter      Filter
		wantRemoved int
		wantLeft    []string
	}{
		{"whole tenant", Filter{Tenant: "acme"}, 3, []string{"g1"}},
		{"scenario within tenant", Filter{Tenant: "acme", Scenario: "support"}, 2, []string{"a3", "g1"}},
		{"entry id", Filter{Tenant: "acme", ID: "a2"}, 1, []string{"a1", "a3", "g1"}},
		{"other tenant's entry id", Filter{Tenant: "acme", ID: "g1"}, 0, []string{"a1", "a2", "a3", "g1"}},
		{"id outside the scenario", Filter{Tenant: "acme", Scenario: "sales", ID: "a1"}, 0, []string{"a1", "a2", "a3", "g1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			idx := NewMemoryIndex(10)
			mustPut(t, idx, all...)
			removed, err := idx.Delete(context.Background(), tt.filter)
			if err != nil {
				t.Fatalf("Delete: %v", err)
			}
			if removed != tt.wantRemoved {
				t.Errorf("removed %d, want %d", removed, tt.wantRemoved)
			}
			if got := present(t, idx, epoch, all...); !slices.Equal(got, tt.wantLeft) {
				t.Errorf("left %v, want %v", got, tt.wantLeft)
			}
		})
	}
}

func TestMemoryIndexDeleteRequiresTenant(t *testing.T) {
	t.Parallel()
	idx := NewMemoryIndex(10)
	mustPut(t, idx, testEntry("a", "acme", "s"))
	if _, err := idx.Delete(context.Background(), Filter{}); err == nil {
		t.Errorf("Delete without a tenant succeeded; want an error")
	}
	if idx.Len() != 1 {
		t.Errorf("Len() = %d, want 1", idx.Len())
	}
}

// TestMemoryIndexConcurrentUse gives the race detector concurrent readers, writers and
// deleters; the bound must hold throughout.
func TestMemoryIndexConcurrentUse(t *testing.T) {
	t.Parallel()
	const workers, rounds, maxEntries = 8, 200, 50
	idx := NewMemoryIndex(maxEntries)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			ctx := context.Background()
			for i := range rounds {
				e := testEntry(fmt.Sprintf("%d-%d", w, i), "acme", "support")
				if err := idx.Put(ctx, e); err != nil {
					t.Errorf("Put: %v", err)
					return
				}
				if _, _, err := idx.Get(ctx, e.Key, epoch); err != nil {
					t.Errorf("Get: %v", err)
					return
				}
				if i%50 == 0 {
					if _, err := idx.Delete(ctx, Filter{Tenant: "acme", ID: e.ID}); err != nil {
						t.Errorf("Delete: %v", err)
						return
					}
				}
				if n := idx.Len(); n > maxEntries {
					t.Errorf("Len() = %d, above the bound %d", n, maxEntries)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := idx.Len(); n != maxEntries {
		t.Errorf("Len() after %d puts = %d, want %d", workers*rounds, n, maxEntries)
	}
}
