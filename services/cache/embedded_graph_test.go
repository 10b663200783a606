package cache

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/mantle-mesh/mantle/services/cache/internal/vector"
)

// smallGraph makes a partition build its graph after a few dozen vectors, so that tests
// reach it quickly.
var smallGraph = vector.Graph{MinLen: 48, M: 4, EfConstruction: 16, EfSearch: 8, Seed: 1, Seeds: vector.Limits{Postings: 64, Scored: 8}}

// TestEmbeddedIndexLinksInTheBackground stores, searches and deletes from several
// goroutines while RunLinker links the vectors into the partitions' graphs (go test -race
// checks the locking). Every entry is found by similarity as soon as Put returns, linked
// or not; a search returns only its own tenant's entries, with exact scores, even when
// another tenant's entries sit in the same partition; and once the linker has caught up,
// every partition searches through its graph and still finds every entry.
func TestEmbeddedIndexLinksInTheBackground(t *testing.T) {
	t.Parallel()
	x := newEmbeddedIndex(100_000, searchLimits, smallGraph, smallGraph)
	ctx, stop := context.WithCancel(context.Background())
	linked := make(chan struct{})
	go func() {
		defer close(linked)
		x.RunLinker(ctx)
	}()
	defer func() {
		stop()
		<-linked
	}()
	for !x.linker.Load() {
		runtime.Gosched() // Put links inline until the linker runs: wait for it to
	}

	ask := func(tenant string, i int) string {
		return fmt.Sprintf("%s question %d: how long does a parcel to Lisbon take?", tenant, i)
	}
	const writers, each = 3, 200
	var wg sync.WaitGroup
	errs := make(chan error, writers+1)
	for w := range writers {
		wg.Go(func() {
			for i := w * each; i < (w+1)*each; i++ {
				e := testEntry(fmt.Sprint(i), "acme", "s", "p", ask("acme", i))
				// A rival entry in acme's very partition: what a hash collision would do.
				rival := testEntry(fmt.Sprint("r", i), "rival", "s", "p", ask("acme", i))
				rival.Partition, rival.Key[0] = e.Partition, rival.Key[0]^1
				for _, stored := range []Entry{e, rival} {
					if err := x.Put(context.Background(), stored, vec(t, stored.Question), nil); err != nil {
						errs <- err
						return
					}
				}
				q := vec(t, e.Question)
				hits, err := x.Search(context.Background(), Query{Tenant: "acme", Partition: e.Partition, Vector: q, Limit: 5, MinScore: 0.9, Now: epoch})
				if err != nil {
					errs <- err
					return
				}
				if len(hits) == 0 || hits[0].Entry.ID != e.ID {
					errs <- fmt.Errorf("entry %s not found right after Put: %v", e.ID, hits)
					return
				}
				for _, h := range hits {
					if h.Entry.Tenant != "acme" || h.Score != vector.Dot(q, vec(t, h.Entry.Question)) {
						errs <- fmt.Errorf("search as acme returned %s of %s with score %v", h.Entry.ID, h.Entry.Tenant, h.Score)
						return
					}
				}
			}
		})
	}
	wg.Go(func() {
		for range 20 {
			if _, err := x.Delete(context.Background(), Filter{Tenant: "rival"}); err != nil {
				errs <- err
				return
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for x.LinkBacklog() > 0 {
		runtime.Gosched() // the linker is running: wait for it to catch up
	}
	p := x.parts[testEntry("0", "acme", "s", "p", "").Partition]
	if p == nil || !p.set.GraphReady() {
		t.Fatal("acme's partition does not search through a graph")
	}
	for i := range writers * each {
		e := testEntry(fmt.Sprint(i), "acme", "s", "p", ask("acme", i))
		hits, err := x.Search(context.Background(), Query{Tenant: "acme", Partition: e.Partition, Vector: vec(t, e.Question), Limit: 1, MinScore: 0.9, Now: epoch})
		if err != nil || len(hits) != 1 || hits[0].Entry.ID != e.ID {
			t.Fatalf("Search for entry %s = %v, %v", e.ID, hits, err)
		}
	}
}
