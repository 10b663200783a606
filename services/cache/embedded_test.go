package cache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mantle-mesh/mantle/services/cache/internal/embed"
	"github.com/mantle-mesh/mantle/services/cache/internal/vector"
)

func TestEmbeddedIndexEvictsLeastRecentlyUsed(t *testing.T) {
	t.Parallel()
	idx := NewEmbeddedIndex(2, 0)
	a, b, c := testEntry("a", "t", "s", "p", "alpha question"), testEntry("b", "t", "s", "p", "beta question"), testEntry("c", "t", "s", "p", "gamma question")
	put(t, idx, a, b)
	// Reading a makes b the least recently used.
	if got := present(t, idx, epoch, a); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("before eviction got %v, want [a]", got)
	}
	put(t, idx, c)

	if got := present(t, idx, epoch, a, b, c); !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("after eviction got %v, want [a c]", got)
	}
	if got := idx.Len(); got != 2 {
		t.Errorf("Len() = %d, want 2", got)
	}
	if got := idx.Evictions(); got != 1 {
		t.Errorf("Evictions() = %d, want 1", got)
	}
	// The evicted entry left the partition's vectors too.
	hits, _ := idx.Search(context.Background(), Query{Tenant: "t", Partition: b.Partition, Vector: vec(t, "beta question"), Limit: 3, MinScore: 0.9, Now: epoch})
	if len(hits) != 0 {
		t.Errorf("search finds the evicted entry: %v", hits)
	}
}

// max_bytes bounds the entries by their size as entrySize counts it: the least recently
// used go first, as many as the new entry needs, and Bytes follows every store and removal;
// an entry over the bound on its own is kept (the store said it was stored) and goes first
// when the next one comes.
func TestEmbeddedIndexEvictsByBytes(t *testing.T) {
	t.Parallel()
	long := func(id string, n int) Entry {
		e := testEntry(id, "t", "s", "p", id+" question")
		e.Content = strings.Repeat("x", n)
		return e
	}
	a, b, c := long("a", 1000), long("b", 1000), long("c", 1000)
	sizeOf := func(e Entry) int64 { return entrySize(e, vec(t, e.Question)) }
	tests := []struct {
		name     string
		maxBytes int64
		stored   []Entry
		want     []string
	}{
		{"all fit", sizeOf(a) + sizeOf(b) + sizeOf(c), []Entry{a, b, c}, []string{"a", "b", "c"}},
		{"the oldest goes", sizeOf(a) + sizeOf(b) + sizeOf(c) - 1, []Entry{a, b, c}, []string{"b", "c"}},
		{"as many as it takes", sizeOf(a) + sizeOf(b), []Entry{a, b, long("big", 2500)}, []string{"big"}},
		{"one over the bound stays", 100, []Entry{a}, []string{"a"}},
		{"and goes first next", 100, []Entry{a, b}, []string{"b"}},
		{"no byte bound", 0, []Entry{a, b, c}, []string{"a", "b", "c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			idx := NewEmbeddedIndex(100, tt.maxBytes)
			put(t, idx, tt.stored...)
			if got := present(t, idx, epoch, tt.stored...); !slices.Equal(got, tt.want) {
				t.Errorf("left %v, want %v", got, tt.want)
			}
			var want int64
			for _, e := range tt.stored {
				if slices.Contains(tt.want, e.ID) {
					want += sizeOf(e)
				}
			}
			if b := idx.Bytes(); b != want {
				t.Errorf("Bytes() = %d, want %d (the entries left)", b, want)
			}
		})
	}
}

func TestEmbeddedIndexTouchCountsAsUse(t *testing.T) {
	t.Parallel()
	idx := NewEmbeddedIndex(2, 0)
	a, b, c := testEntry("a", "t", "s", "p", "alpha question"), testEntry("b", "t", "s", "p", "beta question"), testEntry("c", "t", "s", "p", "gamma question")
	put(t, idx, a, b)
	idx.Touch(a.Key) // what the service does after a similarity hit
	put(t, idx, c)
	if got := present(t, idx, epoch, a, b, c); !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("left %v, want [a c]", got)
	}
}

func TestEmbeddedIndexRemovesExpiredOnGet(t *testing.T) {
	t.Parallel()
	idx := NewEmbeddedIndex(10, 0)
	e := testEntry("a", "t", "s", "p", "alpha question")
	put(t, idx, e)
	if got := present(t, idx, e.StaleUntil, e); len(got) != 0 {
		t.Errorf("at StaleUntil: got %v, want a miss", got)
	}
	if idx.Len() != 0 {
		t.Errorf("Len() after the expired Get = %d, want 0 (removed)", idx.Len())
	}
}

func TestEmbeddedIndexEntriesWithoutVector(t *testing.T) {
	t.Parallel()
	idx := NewEmbeddedIndex(10, 0)
	e := testEntry("a", "t", "s", "p", "？？？")
	if err := idx.Put(context.Background(), e, vector.Vector{}, nil); err != nil {
		t.Fatalf("Put without a vector: %v", err)
	}
	if got := present(t, idx, epoch, e); len(got) != 1 {
		t.Errorf("exact Get of an entry without a vector = %v, want it found", got)
	}
	removed, err := idx.Delete(context.Background(), Filter{Tenant: "t"})
	if err != nil || removed != 1 || idx.Len() != 0 {
		t.Errorf("Delete = (%d, %v), Len %d; want 1 removed and none left", removed, err, idx.Len())
	}
}

func TestEmbeddedIndexRefusesMixedVectorsInAPartition(t *testing.T) {
	t.Parallel()
	idx := NewEmbeddedIndex(10, 0)
	put(t, idx, testEntry("a", "t", "s", "p", "alpha question"))
	dense, _ := vector.NewDense([]float32{1, 2})
	if err := idx.Put(context.Background(), testEntry("b", "t", "s", "p", "beta question"), dense, nil); err == nil {
		t.Errorf("Put of a dense vector into a sparse partition succeeded")
	}
	if idx.Len() != 1 {
		t.Errorf("Len() = %d, want 1: the refused entry must not be half stored", idx.Len())
	}
}

// TestEmbeddedIndexConcurrentUse gives the race detector concurrent readers, searchers,
// writers and deleters; the bound must hold throughout.
func TestEmbeddedIndexConcurrentUse(t *testing.T) {
	t.Parallel()
	const workers, rounds, maxEntries = 8, 150, 50
	idx := NewEmbeddedIndex(maxEntries, 0)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			ctx := context.Background()
			for i := range rounds {
				e := testEntry(fmt.Sprintf("%d-%d", w, i), "acme", "support", "p", fmt.Sprintf("question number %d from worker %d", i, w))
				v := vec(t, e.Question)
				if err := idx.Put(ctx, e, v, nil); err != nil {
					t.Errorf("Put: %v", err)
					return
				}
				if _, _, err := idx.Get(ctx, "", e.Key, epoch); err != nil {
					t.Errorf("Get: %v", err)
					return
				}
				if _, err := idx.Search(ctx, Query{Tenant: "acme", Partition: e.Partition, Vector: v, Limit: 3, MinScore: 0.5, Now: epoch}); err != nil {
					t.Errorf("Search: %v", err)
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

// TestEmbeddedIndexGetDoesNotWaitForWrites: an exact lookup (Get) and a recorded use
// (Touch) read the key map under its own lock, so a store or a link holding the index's
// lock for its vector work does not hold them up.
func TestEmbeddedIndexGetDoesNotWaitForWrites(t *testing.T) {
	t.Parallel()
	idx := NewEmbeddedIndex(10, 0)
	e, absent := testEntry("a", "t", "s", "p", "alpha question"), testEntry("b", "t", "s", "p", "beta question")
	put(t, idx, e)

	idx.lockWrite() // a store or link in the middle of its vector work
	type result struct {
		hit, miss bool
		err       error
	}
	done := make(chan result, 1)
	go func() {
		got, ok, err := idx.Get(context.Background(), e.Namespace, e.Key, epoch)
		_, found, err2 := idx.Get(context.Background(), absent.Namespace, absent.Key, epoch)
		idx.Touch(e.Key)
		done <- result{hit: ok && got.ID == "a", miss: !found, err: errors.Join(err, err2)}
	}()
	select {
	case r := <-done:
		idx.unlockWrite()
		if r.err != nil || !r.hit || !r.miss {
			t.Errorf("Get under a write: hit %v, miss of the absent key %v, err %v", r.hit, r.miss, r.err)
		}
	case <-time.After(10 * time.Second): // turns a wait for the lock into a failure
		idx.unlockWrite()
		t.Fatal("Get waited for the index's write lock")
	}
}

// TestEmbeddedIndexWriteQueuesAfterWaiting: a store lets the searches holding the index's
// lock finish, but not for ever: with a search holding it throughout while others come and
// go, the store queues for the lock (which then turns new searches away, as TryRLock shows)
// and lands once the search ends.
func TestEmbeddedIndexWriteQueuesAfterWaiting(t *testing.T) {
	t.Parallel()
	idx := NewEmbeddedIndex(10, 0)
	e := testEntry("a", "t", "s", "p", "alpha question")
	v := vec(t, e.Question)
	idx.lockRead() // a search in progress, held throughout
	done := make(chan error, 1)
	go func() { done <- idx.Put(context.Background(), e, v, nil) }()
	// Other searches come and go while the first holds the lock: each that ends tells the
	// store, which tries again, and past writeTries queues, which keeps new searches out.
	deadline := time.Now().Add(10 * time.Second)
	queued := false
	for !queued && time.Now().Before(deadline) {
		if queued = !tryLockRead(idx); !queued {
			idx.unlockRead()
			runtime.Gosched()
		}
	}
	idx.unlockRead() // the first search ends
	if !queued {
		t.Fatal("the store never queued for the lock while searches held it")
	}
	storeLands(t, done, "the search ended")
	if got := present(t, idx, epoch, e); len(got) != 1 {
		t.Fatalf("after the store: %v, want [a]", got)
	}
}

// TestEmbeddedIndexWriterWaitsForWord: a store that finds the index's lock held waits
// without queueing for it (a search still gets in while it waits), and lands once the
// holder lets the lock go, whether a search or another write held it.
func TestEmbeddedIndexWriterWaitsForWord(t *testing.T) {
	t.Parallel()
	for _, holder := range []struct {
		name         string
		lock, unlock func(*EmbeddedIndex)
		searchGetsIn bool // while the store waits
	}{
		{"search", (*EmbeddedIndex).lockRead, (*EmbeddedIndex).unlockRead, true},
		{"write", (*EmbeddedIndex).lockWrite, (*EmbeddedIndex).unlockWrite, false},
	} {
		t.Run(holder.name, func(t *testing.T) {
			t.Parallel()
			idx := NewEmbeddedIndex(10, 0)
			e := testEntry("a", "t", "s", "p", "alpha question")
			v := vec(t, e.Question)
			holder.lock(idx)
			done := make(chan error, 1)
			go func() { done <- idx.Put(context.Background(), e, v, nil) }()
			// The store waits for word (it has not queued: a search still gets in) ...
			deadline := time.Now().Add(10 * time.Second)
			for idx.writersWaiting.Load() == 0 && time.Now().Before(deadline) {
				runtime.Gosched()
			}
			if idx.writersWaiting.Load() == 0 {
				t.Fatal("the store did not wait for the lock")
			}
			select {
			case err := <-done:
				t.Fatalf("Put returned while the lock was held: %v", err)
			default:
			}
			// A store queued in mu.Lock would turn a new search away.
			if holder.searchGetsIn {
				if !tryLockRead(idx) {
					t.Fatal("a search was turned away while the store waited: it queued instead of waiting for word")
				}
				idx.unlockRead() // word for the store, which tries, finds the holder, and waits again
			}
			// ... and letting the lock go is word enough, whoever held it.
			holder.unlock(idx)
			storeLands(t, done, "the lock was let go")
		})
	}
}

// TestEmbeddedIndexWriterTriesAgainWithNobodyHolding: a store whose try fails while
// nobody holds the lock (another writer's failing try holds its writer lock for an
// instant, and lets it go without word) tries again rather than wait for word nobody
// will leave. Two writers that waited so, a store and the linker, each failing on the
// other's try, stalled with the lock free until a search happened to end.
func TestEmbeddedIndexWriterTriesAgainWithNobodyHolding(t *testing.T) {
	t.Parallel()
	idx := NewEmbeddedIndex(10, 0)
	e := testEntry("a", "t", "s", "p", "alpha question")
	v := vec(t, e.Question)
	var failed atomic.Bool
	try := idx.tryLock
	idx.tryLock = func() bool { // the first try fails, as one racing another writer's can
		if failed.CompareAndSwap(false, true) {
			return false
		}
		return try()
	}
	done := make(chan error, 1)
	go func() { done <- idx.Put(context.Background(), e, v, nil) }()
	storeLands(t, done, "its first try failed with the lock free")
	if !failed.Load() {
		t.Fatal("the store never tried the lock")
	}
	if n := idx.held.Load(); n != 0 {
		t.Errorf("%d holders counted after the store, want 0", n)
	}
}

// tryLockRead takes the index's lock for a search if it is free of writers, as lockRead
// does otherwise.
func tryLockRead(x *EmbeddedIndex) bool {
	if !x.mu.TryRLock() {
		return false
	}
	x.held.Add(1)
	return true
}

// storeLands waits for a Put started in a goroutine, which must land once what held it
// back (when) is gone.
func storeLands(t *testing.T, done <-chan error, when string) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Put: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the store did not land once %s", when)
	}
}

func TestSnapshotRoundTrip(t *testing.T) {
	t.Parallel()
	idx := NewEmbeddedIndex(10, 0)
	a, b := testEntry("a", "t", "s", "p", "alpha question"), testEntry("b", "t", "s", "p", "beta question")
	expired := testEntry("x", "t", "s", "p", "expired question")
	expired.StaleUntil = epoch.Add(time.Minute)
	other := testEntry("o", "t", "s", "q", "other embedder question")
	other.Namespace = "openai-m-3"
	put(t, idx, a, expired, other, b)
	present(t, idx, epoch, a) // a is now the most recently used

	var buf bytes.Buffer
	if _, err := idx.Save(&buf, DefaultSnapshotMaxBytes); err != nil {
		t.Fatalf("Save: %v", err)
	}
	restored := NewEmbeddedIndex(10, 0)
	stats, err := restored.Load(&buf, DefaultSnapshotMaxBytes, epoch.Add(2*time.Minute), "lexical-v1")
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if stats != (LoadStats{Loaded: 2, Expired: 1, OtherNamespace: 1}) {
		t.Errorf("Load stats = %+v, want 2 loaded, 1 expired, 1 of another namespace", stats)
	}
	// Saved before any read below changes the recency.
	var again bytes.Buffer
	if _, err := restored.Save(&again, DefaultSnapshotMaxBytes); err != nil {
		t.Fatalf("Save: %v", err)
	}
	if got := present(t, restored, epoch, a, b, expired, other); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("restored %v, want [a b]", got)
	}
	hits, err := restored.Search(context.Background(), Query{Tenant: "t", Partition: a.Partition, Vector: vec(t, "beta question"), Limit: 1, MinScore: 0.9, Now: epoch})
	if err != nil || len(hits) != 1 || hits[0].Entry.ID != "b" {
		t.Errorf("Search after restore = (%v, %v), want b: vectors must survive", hits, err)
	}
	// Recency survives too: with room for one more, the least recently used (b) goes.
	small := NewEmbeddedIndex(2, 0)
	if _, err := small.Load(&again, DefaultSnapshotMaxBytes, epoch, "lexical-v1"); err != nil {
		t.Fatalf("Load: %v", err)
	}
	put(t, small, testEntry("c", "t", "s", "p", "gamma question"))
	if got := present(t, small, epoch, a, b); !slices.Equal(got, []string{"a"}) {
		t.Errorf("after one more entry, left %v, want [a]: recency order lost", got)
	}
}

func TestSnapshotFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "state", "cache.snap")
	idx := NewEmbeddedIndex(10, 0)
	e := testEntry("a", "t", "s", "p", "alpha question")
	put(t, idx, e)
	if _, err := idx.SaveFile(path, DefaultSnapshotMaxBytes); err != nil {
		t.Fatalf("SaveFile: %v", err)
	}
	info, err := os.Stat(path)
	if err != nil {
		t.Fatalf("stat: %v", err)
	}
	if mode := info.Mode().Perm(); mode != 0o600 {
		t.Errorf("snapshot mode %o, want 600: it holds tenants' answers", mode)
	}
	if matches, _ := filepath.Glob(path + ".tmp-*"); len(matches) != 0 {
		t.Errorf("temporary files left behind: %v", matches)
	}
	restored := NewEmbeddedIndex(10, 0)
	if stats, err := restored.LoadFile(path, DefaultSnapshotMaxBytes, epoch, "lexical-v1"); err != nil || stats.Loaded != 1 {
		t.Fatalf("LoadFile = (%+v, %v), want 1 loaded", stats, err)
	}
	missing := NewEmbeddedIndex(10, 0)
	if stats, err := missing.LoadFile(filepath.Join(t.TempDir(), "none"), DefaultSnapshotMaxBytes, epoch, "lexical-v1"); err != nil || stats.Loaded != 0 {
		t.Errorf("LoadFile of a missing file = (%+v, %v), want an empty cache and no error", stats, err)
	}
	if err := os.WriteFile(path, []byte("not a snapshot"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := NewEmbeddedIndex(10, 0).LoadFile(path, DefaultSnapshotMaxBytes, epoch, "lexical-v1"); err == nil {
		t.Errorf("LoadFile of garbage succeeded; want an error")
	}
}

// TestEmbeddedIndexFindsThroughEvictions stores prompts from one template through an index
// as the module builds it (a graph past 8192 entries) until more than half of what was
// stored is evicted, as a full cache does: the postings lists compact and removed slots
// are reused by new vectors. Every entry held is still its own vector's best hit, and no
// evicted one is found.
func TestEmbeddedIndexFindsThroughEvictions(t *testing.T) {
	t.Parallel()
	const held, stored = 8300, 17_000
	x := NewEmbeddedIndex(held, 0)
	e := embed.NewLexical()
	for i := range stored {
		v, err := e.Embed(context.Background(), numberedQuestion(i))
		if err != nil {
			t.Fatalf("Embed: %v", err)
		}
		lookupAndPut(t, x, benchEntry(i), v)
	}
	if x.Len() != held {
		t.Fatalf("Len() = %d, want %d", x.Len(), held)
	}
	search := func(i int) []Candidate {
		q := lexicalQuery(t, numberedQuestion(i))
		got, err := x.Search(context.Background(), q)
		if err != nil {
			t.Fatalf("Search: %v", err)
		}
		return got
	}
	for i := stored - held; i < stored; i += 17 {
		if got := search(i); len(got) == 0 || got[0].Entry.ID != benchEntry(i).ID {
			t.Fatalf("held entry %d: best hit %v", i, got)
		}
	}
	for i := 0; i < stored-held; i += 17 {
		for _, c := range search(i) {
			if id, _ := strconv.Atoi(c.Entry.ID); id < stored-held {
				t.Fatalf("search for evicted entry %d found evicted entry %s", i, c.Entry.ID)
			}
		}
	}
}
