package cache

import (
	"context"
	"crypto/sha256"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/mantle-mesh/mantle/services/cache/internal/embed"
	"github.com/mantle-mesh/mantle/services/cache/internal/vector"
)

// vec is the lexical embedding of text.
func vec(t testing.TB, text string) vector.Vector {
	t.Helper()
	v, err := embed.NewLexical().Embed(context.Background(), text)
	if err != nil {
		t.Fatalf("Embed(%q): %v", text, err)
	}
	return v
}

// testEntry is an entry of tenant in scenario, in a partition named by tenant, scenario
// and part, asking question.
func testEntry(id, tenant, scenario, part, question string) Entry {
	partition := sha256.Sum256([]byte(tenant + "/" + scenario + "/" + part))
	return Entry{
		ID: id, Key: sha256.Sum256([]byte(tenant + "/" + scenario + "/" + part + "/" + question)), Partition: partition,
		Tenant: tenant, Scenario: scenario, Namespace: "lexical-v1", Question: question,
		Content: "answer " + id, SourceModel: "m", FinishReason: "stop",
		CreatedAt: epoch, ExpiresAt: epoch.Add(time.Hour), StaleUntil: epoch.Add(2 * time.Hour),
	}
}

func put(t testing.TB, idx Index, entries ...Entry) {
	t.Helper()
	for _, e := range entries {
		if err := idx.Put(context.Background(), e, vec(t, e.Question), nil); err != nil {
			t.Fatalf("Put(%s): %v", e.ID, err)
		}
	}
}

// present returns the ids of entries that Get finds at now.
func present(t testing.TB, idx Index, now time.Time, entries ...Entry) []string {
	t.Helper()
	var ids []string
	for _, e := range entries {
		got, ok, err := idx.Get(context.Background(), e.Namespace, e.Key, now)
		if err != nil {
			t.Fatalf("Get(%s): %v", e.ID, err)
		}
		if ok {
			ids = append(ids, got.ID)
		}
	}
	return ids
}

func TestIndexGetAndReplace(t *testing.T) {
	t.Parallel()
	for _, b := range testBackends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			idx := b.open(t)
			old := testEntry("a", "acme", "s", "p", "how do i reset my password")
			put(t, idx, old)
			got, ok, err := idx.Get(context.Background(), old.Namespace, old.Key, epoch)
			if err != nil || !ok {
				t.Fatalf("Get = (%v, %v), want the entry", ok, err)
			}
			if !entriesEqual(got, old) {
				t.Errorf("Get\n got %+v\nwant %+v", got, old)
			}
			replacement := old
			replacement.ID, replacement.Content = "a2", "newer answer"
			put(t, idx, replacement)
			if got := present(t, idx, epoch, old); !slices.Equal(got, []string{"a2"}) {
				t.Errorf("after a second Put with the same key, Get finds %v, want [a2]", got)
			}
		})
	}
}

// entriesEqual compares entries with the timestamps at millisecond precision, which is
// what the Qdrant payload keeps.
func entriesEqual(a, b Entry) bool {
	for _, e := range []*Entry{&a, &b} {
		e.CreatedAt, e.ExpiresAt, e.StaleUntil = e.CreatedAt.Truncate(time.Millisecond).UTC(), e.ExpiresAt.Truncate(time.Millisecond).UTC(), e.StaleUntil.Truncate(time.Millisecond).UTC()
	}
	return reflect.DeepEqual(a, b)
}

func TestIndexHoldsEntriesUntilStaleUntil(t *testing.T) {
	t.Parallel()
	for _, b := range testBackends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			idx := b.open(t)
			e := testEntry("a", "acme", "s", "p", "how do i reset my password")
			put(t, idx, e)
			q := Query{Tenant: "acme", Partition: e.Partition, Namespace: e.Namespace, Vector: vec(t, e.Question), Limit: 3, MinScore: 0.5}
			for _, step := range []struct {
				at                  time.Time
				wantGet             bool
				wantFresh, wantHeld bool
			}{
				{e.ExpiresAt.Add(-time.Millisecond), true, true, true},
				{e.ExpiresAt, true, false, true}, // stale: kept for cache-only lookups
				{e.StaleUntil.Add(-time.Millisecond), true, false, true},
				{e.StaleUntil, false, false, false},
			} {
				if got := len(present(t, idx, step.at, e)) == 1; got != step.wantGet {
					t.Errorf("Get at %s: found %v, want %v", step.at.Sub(epoch), got, step.wantGet)
				}
				q.Now = step.at
				for _, fresh := range []bool{true, false} {
					q.FreshOnly = fresh
					c, err := idx.Search(context.Background(), q)
					if err != nil {
						t.Fatalf("Search: %v", err)
					}
					want := step.wantHeld
					if fresh {
						want = step.wantFresh
					}
					if got := len(c) == 1; got != want {
						t.Errorf("Search(fresh only %v) at %s: found %v, want %v", fresh, step.at.Sub(epoch), got, want)
					}
				}
			}
		})
	}
}

func TestIndexSearchStaysInItsScope(t *testing.T) {
	t.Parallel()
	question := "how do i reset my password"
	home := testEntry("home", "acme", "support", "p", question)
	others := []Entry{
		testEntry("other-tenant", "globex", "support", "p", question),
		testEntry("other-partition", "acme", "support", "q", question),
		testEntry("other-scenario", "acme", "sales", "p", question),
	}
	for _, b := range testBackends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			idx := b.open(t)
			put(t, idx, append([]Entry{home}, others...)...)
			similar := testEntry("similar", "acme", "support", "p", "how can i reset my password")
			unrelated := testEntry("unrelated", "acme", "support", "p", "what is the refund policy")
			put(t, idx, similar, unrelated)

			c, err := idx.Search(context.Background(), Query{
				Tenant: "acme", Partition: home.Partition, Namespace: home.Namespace,
				Vector: vec(t, question), Limit: 5, MinScore: 0.5, Now: epoch, FreshOnly: true,
			})
			if err != nil {
				t.Fatalf("Search: %v", err)
			}
			var ids []string
			for _, cand := range c {
				ids = append(ids, cand.Entry.ID)
			}
			if !slices.Equal(ids, []string{"home", "similar"}) {
				t.Fatalf("Search found %v, want [home similar] (best first, nothing outside the partition, nothing below 0.5)", ids)
			}
			if c[0].Score < 0.999 || c[1].Score >= c[0].Score {
				t.Errorf("scores %v, %v: want about 1 for the same question, then lower", c[0].Score, c[1].Score)
			}
			// A tenant that is not the partition's finds nothing, even with its hash.
			c, err = idx.Search(context.Background(), Query{
				Tenant: "globex", Partition: home.Partition, Namespace: home.Namespace,
				Vector: vec(t, question), Limit: 5, MinScore: 0, Now: epoch,
			})
			if err != nil {
				t.Fatalf("Search: %v", err)
			}
			for _, cand := range c {
				if cand.Entry.Tenant != "globex" {
					t.Errorf("globex's search returned %s of %s", cand.Entry.ID, cand.Entry.Tenant)
				}
			}
		})
	}
}

func TestIndexDelete(t *testing.T) {
	t.Parallel()
	all := []Entry{
		testEntry("a1", "acme", "support", "p", "one"),
		testEntry("a2", "acme", "support", "p", "two"),
		testEntry("a3", "acme", "sales", "p", "three"),
		testEntry("g1", "globex", "support", "p", "one"),
	}
	old := testEntry("a4", "acme", "support", "other-embedder", "four")
	old.Namespace = "openai-m-8"
	tests := []struct {
		name        string
		filter      Filter
		wantRemoved int
		wantLeft    []string
	}{
		{"whole tenant", Filter{Tenant: "acme"}, 4, []string{"g1"}},
		{"scenario within tenant", Filter{Tenant: "acme", Scenario: "support"}, 3, []string{"a3", "g1"}},
		{"entry id", Filter{Tenant: "acme", ID: "a2"}, 1, []string{"a1", "a3", "g1", "a4"}},
		{"other tenant's entry id", Filter{Tenant: "acme", ID: "g1"}, 0, []string{"a1", "a2", "a3", "g1", "a4"}},
		{"id outside the scenario", Filter{Tenant: "acme", Scenario: "sales", ID: "a1"}, 0, []string{"a1", "a2", "a3", "g1", "a4"}},
		{"namespace", Filter{Tenant: "acme", Namespace: "openai-m-8"}, 1, []string{"a1", "a2", "a3", "g1"}},
	}
	for _, b := range testBackends() {
		for _, tt := range tests {
			t.Run(b.name+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				idx := b.open(t)
				put(t, idx, all...)
				// An entry of another embedder: a dense vector, as an OpenAI-compatible
				// embedder would give, in its own namespace (its own Qdrant collection).
				dense, _ := vector.NewDense([]float32{1, 2, 3, 4, 5, 6, 7, 8})
				if err := idx.Put(context.Background(), old, dense, nil); err != nil {
					t.Fatalf("Put(dense): %v", err)
				}
				removed, err := idx.Delete(context.Background(), tt.filter)
				if err != nil {
					t.Fatalf("Delete: %v", err)
				}
				if removed != tt.wantRemoved {
					t.Errorf("removed %d, want %d", removed, tt.wantRemoved)
				}
				if got := present(t, idx, epoch, append(slices.Clone(all), old)...); !slices.Equal(got, tt.wantLeft) {
					t.Errorf("left %v, want %v", got, tt.wantLeft)
				}
			})
		}
	}
}

func TestIndexDeleteRequiresTenant(t *testing.T) {
	t.Parallel()
	for _, b := range testBackends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			idx := b.open(t)
			e := testEntry("a", "acme", "s", "p", "hello there")
			put(t, idx, e)
			if _, err := idx.Delete(context.Background(), Filter{}); err == nil {
				t.Errorf("Delete without a tenant succeeded; want an error")
			}
			if got := present(t, idx, epoch, e); len(got) != 1 {
				t.Errorf("entry gone after a refused delete")
			}
		})
	}
}
