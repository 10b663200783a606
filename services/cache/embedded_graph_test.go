package cache

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

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
		x.RunLinker(ctx, clockwork.NewRealClock())
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

// linkClock is a fake clock on which every link takes linkTook: each reading of the time
// advances it after reading, so that the linker's clock.Since(start) sees that much.
type linkClock struct{ *clockwork.FakeClock }

const linkTook = 500 * time.Microsecond

func (c linkClock) Now() time.Time {
	now := c.FakeClock.Now()
	c.Advance(linkTook)
	return now
}

// linkerFixture is an index of smallGraph partitions whose linker runs, until the test
// ends, on a linkClock, and whose entries are tenant acme's in one partition, asking one
// question template numbered by the entry.
type linkerFixture struct {
	t        *testing.T
	x        *EmbeddedIndex
	clock    linkClock
	ctx      context.Context
	question string // a format of one %d, the entry's number
}

func newLinkerFixture(t *testing.T, question string) *linkerFixture {
	t.Helper()
	f := &linkerFixture{t: t, x: newEmbeddedIndex(100_000, searchLimits, smallGraph, smallGraph),
		clock: linkClock{clockwork.NewFakeClock()}, question: question}
	ctx, stop := context.WithCancel(context.Background())
	f.ctx = ctx
	linked := make(chan struct{})
	go func() {
		defer close(linked)
		f.x.RunLinker(ctx, f.clock)
	}()
	t.Cleanup(func() {
		stop()
		<-linked
	})
	// Put links at once while no linker runs: wait for it before any store.
	for !f.x.linker.Load() {
		runtime.Gosched()
	}
	return f
}

func (f *linkerFixture) entry(i int) Entry {
	return testEntry(fmt.Sprint(i), "acme", "s", "p", fmt.Sprintf(f.question, i))
}

func (f *linkerFixture) put(i int) Entry {
	f.t.Helper()
	e := f.entry(i)
	if err := f.x.Put(context.Background(), e, vec(f.t, e.Question), nil); err != nil {
		f.t.Fatal(err)
	}
	return e
}

// search looks entry 0's question up, as the requests of a busy index do.
func (f *linkerFixture) search() {
	f.t.Helper()
	e := f.entry(0)
	if _, err := f.x.Search(context.Background(), Query{Tenant: "acme", Partition: e.Partition, Vector: vec(f.t, e.Question), Limit: 1, MinScore: 0.9, Now: epoch}); err != nil {
		f.t.Fatal(err)
	}
}

// ready reports whether the partition's graph serves.
func (f *linkerFixture) ready() bool {
	f.x.lockRead()
	defer f.x.unlockRead()
	p := f.x.parts[f.entry(0).Partition]
	return p != nil && p.set.GraphReady()
}

// waitPause returns once the linker waits on its pause, and fails the test when the
// backlog empties without one.
func (f *linkerFixture) waitPause(what string) {
	f.t.Helper()
	waitCtx, stopWaiting := context.WithCancel(f.ctx)
	defer stopWaiting()
	blocked := make(chan error, 1)
	go func() { blocked <- f.clock.BlockUntilContext(waitCtx, 1) }()
	for {
		select {
		case err := <-blocked:
			if err != nil {
				f.t.Fatal(err)
			}
			return
		default:
		}
		if f.x.LinkBacklog() == 0 {
			f.t.Fatalf("the backlog emptied without %s", what)
		}
		runtime.Gosched()
	}
}

// drain returns once nothing waits to be linked, and fails the test when the linker
// pauses (it stays paused: the clock does not move) with vectors queued.
func (f *linkerFixture) drain(what string) {
	f.t.Helper()
	waitCtx, stopWaiting := context.WithCancel(f.ctx)
	defer stopWaiting()
	paused := make(chan struct{})
	go func() {
		if f.clock.BlockUntilContext(waitCtx, 1) == nil {
			close(paused)
		}
	}()
	for f.x.LinkBacklog() > 0 {
		select {
		case <-paused:
			f.t.Fatalf("the linker paused with %d vectors of %s queued, the graph serving %v", f.x.LinkBacklog(), what, f.ready())
		default:
			runtime.Gosched()
		}
	}
}

// The linker's pace while a graph is built: buildSlice of links, then a pause three times
// as long (buildDuty).
var (
	perSlice = int(buildSlice / linkTook)
	pause    = time.Duration(float64(buildSlice) * (1 - buildDuty) / buildDuty)
)

// TestEmbeddedIndexPacesAGraphBuild: when a partition reaches its graph's MinLen while the
// index is searched, its vectors are linked buildSlice of linking at a time, each slice
// followed by a pause of three times as long (buildDuty); a slice during which nobody
// searched is not followed by one; once the graph is ready, the vectors stored later are
// linked without pauses.
func TestEmbeddedIndexPacesAGraphBuild(t *testing.T) {
	t.Parallel()
	f := newLinkerFixture(t, "question %d: how long does a parcel to Lisbon take?")
	// Below MinLen nothing waits; the Put that reaches it queues the whole partition.
	for i := range smallGraph.MinLen - 1 {
		f.put(i)
	}
	if n := f.x.LinkBacklog(); n != 0 {
		t.Fatalf("backlog below MinLen = %d, want 0", n)
	}
	f.search()
	f.put(smallGraph.MinLen - 1)
	const busySlices = 3
	want := smallGraph.MinLen
	for i := range busySlices {
		want -= perSlice
		f.waitPause(fmt.Sprintf("pause %d", i))
		// The linker waits on its pause: exactly one slice more is linked.
		if n := f.x.LinkBacklog(); n != want {
			t.Fatalf("backlog at pause %d = %d, want %d (%d links a slice)", i, n, want, perSlice)
		}
		f.clock.Advance(pause - time.Nanosecond)
		if n := f.x.LinkBacklog(); n != want {
			t.Fatalf("backlog before pause %d ended = %d, want %d", i, n, want)
		}
		if i < busySlices-1 {
			f.search()
		}
		f.clock.Advance(time.Nanosecond)
	}
	// Nobody searches any more: the rest of the build, and the stores into the ready graph
	// after it, are linked without a pause, which would leave the linker waiting on the
	// clock with vectors still queued.
	f.drain("an idle index's build")
	f.put(smallGraph.MinLen)
	if !f.ready() {
		t.Fatal("the graph is not ready after its build")
	}
	// A ready graph's links are never paced, searched or not.
	for i := range 3 * perSlice {
		f.put(smallGraph.MinLen + 1 + i)
		f.search()
	}
	f.drain("a ready graph")
}

// TestEmbeddedIndexWakesTheLinkerOnlyForLinks: a Put into a partition below its graph's
// MinLen leaves nothing to link and does not wake RunLinker (a goroutine switch per store
// for nothing); the Put that queues the partition's vectors does.
func TestEmbeddedIndexWakesTheLinkerOnlyForLinks(t *testing.T) {
	t.Parallel()
	x := newEmbeddedIndex(100_000, searchLimits, smallGraph, smallGraph)
	x.linker.Store(true) // as while RunLinker runs; it does not, so its wake stays to be read
	put := func(i int) {
		t.Helper()
		e := testEntry(fmt.Sprint(i), "acme", "s", "p", fmt.Sprintf("question %d: how long does a parcel to Lisbon take?", i))
		if err := x.Put(context.Background(), e, vec(t, e.Question), nil); err != nil {
			t.Fatal(err)
		}
	}
	for i := range smallGraph.MinLen - 1 {
		put(i)
	}
	if n := len(x.wake); n != 0 || x.LinkBacklog() != 0 {
		t.Fatalf("below MinLen: %d wakes, backlog %d; want none", n, x.LinkBacklog())
	}
	put(smallGraph.MinLen - 1)
	if n := len(x.wake); n != 1 || x.LinkBacklog() == 0 {
		t.Fatalf("at MinLen: %d wakes, backlog %d; want the linker woken for the backlog", n, x.LinkBacklog())
	}
}

// TestEmbeddedIndexGraphServesWhileStoresArrive: a graph built while the index is searched,
// with stores arriving faster than its paced build links them, serves as soon as the
// vectors it was built with are linked; then the vectors stored meanwhile are linked
// without pauses. (A graph that waited for an empty queue never served under such load.)
func TestEmbeddedIndexGraphServesWhileStoresArrive(t *testing.T) {
	t.Parallel()
	f := newLinkerFixture(t, "question %d: can a parcel to Porto be insured?")
	next := 0
	for ; next < smallGraph.MinLen; next++ {
		if next == smallGraph.MinLen-1 {
			f.search() // the index is searched: the build is paced
		}
		f.put(next)
	}
	slices := (smallGraph.MinLen + perSlice - 1) / perSlice
	for i := range slices - 1 {
		f.waitPause(fmt.Sprintf("pause %d", i))
		if f.ready() {
			t.Fatalf("serving at pause %d, after %d of the %d vectors it was built with", i, (i+1)*perSlice, smallGraph.MinLen)
		}
		for range perSlice + 1 { // stores arrive faster than the build links them
			f.put(next)
			next++
		}
		f.search()
		f.clock.Advance(pause)
	}
	// The last slice links the last of the vectors the graph was built with: it serves,
	// and the linker goes on without pausing until the stores made meanwhile are linked.
	f.drain("the stores made during the build")
	if !f.ready() {
		t.Fatal("the graph does not serve after its build")
	}
}
