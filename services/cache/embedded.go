package cache

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/mantle-mesh/mantle/services/cache/internal/vector"
)

// EmbeddedIndex is an Index in process memory, for mantle dev and single nodes. Entries
// are grouped by partition (the scope every lookup filters on), and each partition keeps
// its vectors in a vector.Set. A partition of sparseGraph.MinLen vectors or more (the
// lexical embedder's; denseGraph's for an embedding model's) is searched through a graph
// of its vectors (package vector, graph.go), so that a lookup costs about the same in a
// partition of a million entries as in one of ten thousand; smaller ones through their
// postings, within searchLimits, or a scan. The index holds at most maxEntries entries of
// at most about maxBytes in all: when a new one would exceed either, the least recently
// used are evicted. Entries past their
// StaleUntil are removed when a read finds them or evicted as they age to the back of the
// list, so no background sweep is needed. Save and Load write it to and read it from a
// snapshot.
//
// Linking a vector into its partition's graph costs a search of the graph (unless the
// lookup that missed it recorded its own, Query.Near), so Put leaves it to RunLinker when
// that runs: the entry is found by its key at once, and by
// similarity through the postings (sparse) or a scan of the vectors not yet linked
// (dense, at most maxUnlinked of them: past that a Put links one itself).
type EmbeddedIndex struct {
	maxEntries  int
	maxBytes    int64
	limits      vector.Limits
	sparseGraph vector.Graph
	denseGraph  vector.Graph

	// mu guards the nodes (but their recency links), the maps and the partitions' sets:
	// searches share it, writes hold it alone. Stores and links take it through
	// lockToWrite, which lets the searches in progress finish first.
	mu sync.RWMutex
	// writersWaiting counts the writers waiting in lockToWrite for mu to be free, and
	// unlocked carries word to one of them that whoever held mu has let it go. held counts
	// those holding mu (lockRead, lockWrite, lockToWrite), each of which leaves word when
	// it lets go; tryLock is mu.TryLock (a test makes it fail as another writer's try can).
	writersWaiting atomic.Int32
	unlocked       chan struct{}
	held           atomic.Int32
	tryLock        func() bool
	// keyMu guards byKey and the node table's places too, for Get and Touch, which read
	// them under it alone: a write changes them holding mu and keyMu, and holds keyMu for
	// the map and table change only, not for the vector work around it. An exact lookup
	// that waited for mu waited behind every store and link (tens of microseconds each,
	// one after every answer), and then for a CPU to wake it on: on two busy CPUs, a
	// millisecond or more for one lookup in seventy. Lock order: mu, keyMu, lruMu.
	keyMu sync.RWMutex
	nodes nodeTable
	byKey map[Key]nodeRef
	parts map[Key]*partition
	// bytes is the sum of the entries' sizes (entrySize).
	bytes int64

	// lruMu guards recency and the nodes' links in it, so that a read under mu's read lock
	// can still record a use. Lock order: mu, then lruMu.
	lruMu   sync.Mutex
	recency recencyList

	evictions atomic.Uint64

	// linkMu keeps one link plan in flight: it is made under mu's read lock and applied
	// under its write lock. Lock order: linkMu, then mu.
	linkMu sync.Mutex
	// toLink holds the partitions with vectors waiting to be linked, oldest first; mu
	// guards it.
	toLink []*partition
	// wake tells RunLinker that a Put queued work; linker is set while RunLinker runs.
	wake   chan struct{}
	linker atomic.Bool
	// searches counts Search calls, for RunLinker to tell a busy index from an idle one.
	searches atomic.Uint64
}

type partition struct {
	key Key
	set *vector.Set // nil until the first vector arrives; its form follows that vector
	// bySlot[slot] is the node whose vector is in the set's slot, or 0.
	bySlot []nodeRef
	nodes  int
	// linkQueued: the partition is in the index's toLink.
	linkQueued bool
}

var _ Index = (*EmbeddedIndex)(nil)

// searchLimits bound a sparse search below sparseGraph.MinLen to 1024 postings read and 32
// candidates scored in full (about 20 µs in a partition just below MinLen of prompts from
// one template, where every entry shares every common word; 16k postings and 64 scored
// cost three to four times as much and found nothing more). Lists are read rarest first,
// and a true paraphrase shares a question's rarest words, so its partial product puts it
// among the first candidates scored; what the bound gives up is older entries that share
// only common words with the question. The recall this costs is measured against the exact
// search in TestIndexRecall ("bounded"): 1.000 on both corpora.
var searchLimits = vector.Limits{Postings: 1 << 10, Scored: 32}

// sparseGraph is the graph a partition of the lexical embedder's vectors builds once it
// holds MinLen of them. Below that size its postings answer in tens of microseconds. The
// walk starts from what a small postings search finds (Seeds: the rarest lists, where a
// reworded question shares its rare words with the stored one; reading long lists of
// common words found nothing more in TestIndexRecall and cost most of a lookup of prompts
// from one template) and is skipped when that search was exact, which it is for most
// questions that carry a rare word. The budget grows past 128k entries (SeedsPer), where a
// rare word's list outgrows it: 512 postings lost 3% of reworded questions at 1M. Scoring
// 16 seeds rather than 32 kept recall@1 at 1.000 in TestIndexRecall and in
// BenchmarkIndexLookup at 100k entries, and cut a lookup of a new numbered prompt at 100k
// from 60 to 46 µs (CPU, P50); past 128k entries SeedsPer sets the seeds scored. The walk
// keeps EfSearch candidates: 8 kept recall@1 at 1.000 in TestIndexRecall and in
// BenchmarkIndexLookup at 100k entries, as 16 did, and cut a miss of a new numbered prompt
// at 100k from 40 to 28 µs (CPU, P50) and BenchmarkMissStore's CPU by a quarter. Every
// stored answer is linked: on the bottom layer from what its lookup found (Query.Near:
// where its walk ended, or its seeds), otherwise from the seeds of its own postings search;
// a node drawn to an upper layer is linked there by a walk with EfConstruction candidates,
// kept as low as the recall allows: twice as many found nothing more in TestIndexRecall
// nor in BenchmarkIndexLookup's recall at 1M entries. The figures and the recall behind
// these values are in docs/performance.md, "Cache lookup".
var sparseGraph = vector.Graph{MinLen: 8192, M: 8, EfConstruction: 24, EfSearch: 8, Seed: 1,
	Seeds: vector.Limits{Postings: 512, Scored: 16}, SeedsPer: 256}

// denseGraph is the graph of an embedding model's vectors: a scan costs a dot product of
// hundreds of dimensions per entry (about 4 ms at 10k entries of 768), so the graph starts
// early, and its links and candidate lists are those usual for such embeddings.
var denseGraph = vector.Graph{MinLen: 2048, M: 16, EfConstruction: 100, EfSearch: 64, Seed: 1}

// maxUnlinked is how many vectors of a dense partition's graph may wait for RunLinker
// before Put links one itself: each search scans them.
const maxUnlinked = 256

// NewEmbeddedIndex returns an empty index that holds at most maxEntries entries and, when
// maxBytes is positive, entries of at most about maxBytes in all (entrySize).
func NewEmbeddedIndex(maxEntries int, maxBytes int64) *EmbeddedIndex {
	x := newEmbeddedIndex(maxEntries, searchLimits, sparseGraph, denseGraph)
	x.maxBytes = maxBytes
	return x
}

// entryOverhead is what an entry costs the index beyond its strings and vector: its node
// (with its recency links), its places in the key and slot maps, and its links in a
// partition's graph. With it, entrySize comes within a tenth of the heap an entry of
// support questions takes (BenchmarkEmbeddedIndexMemory: counted-bytes/entry beside
// heap-bytes/entry: 1816 beside 1801 at 10k entries, 1624 at 100k).
const entryOverhead = 800

// entrySize is about how much of the heap e with vector v holds in the index: its text,
// its vector (a sparse coordinate's index and weight, and its posting; a dense one's
// weight) and entryOverhead. It leaves out the Go allocator's rounding and the collector's
// headroom, so a process holds more than the sum, about twice it at the default GOGC.
func entrySize(e Entry, v vector.Vector) int64 {
	n := entryOverhead + len(e.ID) + len(e.Tenant) + len(e.Scenario) + len(e.Namespace) +
		len(e.Question) + len(e.Content) + len(e.SourceModel) + len(e.FinishReason)
	for _, tc := range e.ToolCalls {
		n += 64 + len(tc.ID) + len(tc.Type) + len(tc.Name) + len(tc.Arguments)
	}
	if v.Sparse() {
		n += 16 * v.Len()
	} else {
		n += 4 * v.Len()
	}
	return int64(n)
}

// full reports whether the index holds more than its bounds allow.
func (x *EmbeddedIndex) full() bool {
	return len(x.byKey) > x.maxEntries || (x.maxBytes > 0 && x.bytes > x.maxBytes)
}

// newEmbeddedIndex is NewEmbeddedIndex with other search limits and graphs (the zero
// Limits and Graphs: exact).
func newEmbeddedIndex(maxEntries int, limits vector.Limits, sparse, dense vector.Graph) *EmbeddedIndex {
	x := &EmbeddedIndex{
		maxEntries:  maxEntries,
		limits:      limits,
		sparseGraph: sparse,
		denseGraph:  dense,
		wake:        make(chan struct{}, 1),
		unlocked:    make(chan struct{}, 1),
		byKey:       make(map[Key]nodeRef),
		parts:       make(map[Key]*partition),
	}
	x.tryLock = x.mu.TryLock
	return x
}

// Get implements Index. A read counts as a use for eviction but does not extend the
// entry's life.
// The namespace is part of every key's partition, so the key alone finds the entry.
func (x *EmbeddedIndex) Get(_ context.Context, _ string, key Key, now time.Time) (Entry, bool, error) {
	x.keyMu.RLock()
	r, ok := x.byKey[key]
	if ok && x.nodes.at(r).entry.heldAt(now) {
		x.touch(r)
		e := x.nodes.at(r).entry.entry()
		x.keyMu.RUnlock()
		return e, true, nil
	}
	x.keyMu.RUnlock()
	if ok {
		x.lockWrite()
		// Another writer may have replaced the entry in between; remove only what expired.
		if r, ok := x.byKey[key]; ok && !x.nodes.at(r).entry.heldAt(now) {
			x.remove(r)
		}
		x.unlockWrite()
	}
	return Entry{}, false, nil
}

// Touch records a use of the entry under key, as Get does; the service calls it after a
// similarity hit.
func (x *EmbeddedIndex) Touch(key Key) {
	x.keyMu.RLock()
	defer x.keyMu.RUnlock()
	if r, ok := x.byKey[key]; ok {
		x.touch(r)
	}
}

// touch moves r to the front of the recency list; x.mu or x.keyMu must be held (read or
// write), so that r is not released meanwhile.
func (x *EmbeddedIndex) touch(r nodeRef) {
	x.lruMu.Lock()
	x.recency.moveToFront(&x.nodes, r)
	x.lruMu.Unlock()
}

// Search implements Index. It never touches an entry: candidates are not yet answers.
func (x *EmbeddedIndex) Search(_ context.Context, q Query) ([]Candidate, error) {
	if q.Vector.Len() == 0 || q.Limit <= 0 {
		return nil, nil
	}
	x.searches.Add(1)
	x.lockRead()
	defer x.unlockRead()
	p := x.parts[q.Partition]
	if p == nil || p.set == nil || p.set.Len() == 0 {
		return nil, nil
	}
	accept := func(slot uint32) bool {
		if int(slot) >= len(p.bySlot) || p.bySlot[slot] == 0 {
			return false
		}
		n := x.nodes.at(p.bySlot[slot])
		// The partition is a hash that includes the tenant, so the tenant check can only
		// fail on a hash collision; it is here because an answer crossing tenants is the
		// one failure the cache must not have.
		if n.entry.field(textTenant) != q.Tenant {
			return false
		}
		if q.FreshOnly {
			return n.entry.freshAt(q.Now)
		}
		return n.entry.heldAt(q.Now)
	}
	hits := p.set.SearchNear(q.Vector, q.Limit, q.MinScore, accept, q.Near)
	out := make([]Candidate, 0, len(hits))
	for _, h := range hits {
		out = append(out, Candidate{Entry: x.nodes.at(p.bySlot[h.Slot]).entry.entry(), Score: h.Score})
	}
	return out, nil
}

// Put implements Index. The vector is linked into its partition's graph by RunLinker when
// it runs, here otherwise; with near, its links are chosen from it.
func (x *EmbeddedIndex) Put(_ context.Context, e Entry, v vector.Vector, near *vector.Near) error {
	help, queued, err := x.put(e, v, near)
	if err != nil {
		return err
	}
	if !queued {
		// Nothing to link (a partition below its graph's MinLen has no graph): waking
		// RunLinker for nothing would cost a goroutine switch per store, a large part of
		// a store's CPU when requests come one at a time.
		return nil
	}
	if !x.linker.Load() {
		x.linkAll()
		return nil
	}
	if help {
		x.linkOne()
	}
	select {
	case x.wake <- struct{}{}:
	default: // RunLinker has been told already
	}
	return nil
}

// put stores e and reports whether its partition has more vectors waiting to be linked
// than searches should scan, and whether any partition has vectors waiting.
func (x *EmbeddedIndex) put(e Entry, v vector.Vector, near *vector.Near) (help, queued bool, err error) {
	x.lockToWrite()
	defer x.unlockWrite()
	if old, ok := x.byKey[e.Key]; ok {
		x.remove(old)
	}
	if err := x.insert(e, v, near, true); err != nil {
		return false, false, err
	}
	// The entry just stored stays even when it alone is over maxBytes: an answer is bounded
	// by the request's and the provider's limits, and dropping it here would say it was
	// stored when it was not.
	for x.full() && len(x.byKey) > 1 {
		x.lruMu.Lock()
		back := x.recency.back
		x.lruMu.Unlock()
		x.remove(back)
		x.evictions.Add(1)
	}
	if p := x.parts[e.Partition]; p != nil && p.set != nil && !v.Sparse() && p.set.GraphReady() {
		help = p.set.Pending() > maxUnlinked
	}
	return help, len(x.toLink) > 0, nil
}

// RunLinker links the vectors Put stores into their partitions' graphs until ctx is done,
// so that Put returns without doing it. clock times the links and the pauses between them.
//
// Linking is background work, and it comes in bursts: a partition that reaches its
// graph's MinLen queues every vector it holds (8192 for the lexical embedder, about a
// second of CPU). While the index is searched, such a build is paced to buildDuty of one
// CPU, so that a process busy with requests does not lose a second of CPU to it at once
// (until the graph is ready, the partition is searched through its postings, as before it
// had a graph); an index that nobody searches, such as one loaded from a snapshot before
// traffic arrives, is built at full speed. The
// links of vectors stored later are not paced: there are as many as stores, each a
// fraction of a store's cost, and a backlog of them would only grow. Between two links the
// linker yields its CPU, so that requests waiting for one run first, instead of waiting
// for the scheduler's time slice (10 ms) to end; a link holds the index's locks for at
// most one plan and one apply either way.
func (x *EmbeddedIndex) RunLinker(ctx context.Context, clock clockwork.Clock) {
	x.linker.Store(true)
	defer x.linker.Store(false)
	var busy time.Duration // building links since the last slice ended
	var searched uint64    // x.searches when the last slice ended
	for {
		for {
			start := clock.Now()
			more, building := x.linkOne()
			if !more {
				break
			}
			if ctx.Err() != nil {
				return
			}
			if !building {
				busy = 0
				runtime.Gosched()
				continue
			}
			if busy += clock.Since(start); busy < buildSlice {
				runtime.Gosched()
				continue
			}
			slice := busy
			busy = 0
			n := x.searches.Load()
			idle := n == searched
			searched = n
			if idle {
				runtime.Gosched() // nobody searched during the slice: nobody to make room for
				continue
			}
			pause := clock.NewTimer(time.Duration(float64(slice) * (1 - buildDuty) / buildDuty))
			select {
			case <-ctx.Done():
				pause.Stop()
				return
			case <-pause.Chan():
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-x.wake:
		}
	}
}

// buildDuty is the share of one CPU that building a partition's graph takes, in slices
// of about buildSlice followed by a pause: a quarter spreads the lexical embedder's
// 8192-vector build over about four seconds.
const (
	buildDuty  = 0.25
	buildSlice = 2 * time.Millisecond
)

// linkOne links one waiting vector: the plan (a search of the graph) under the read lock,
// so that lookups go on meanwhile, and its links under the write lock. It reports whether
// vectors are still waiting, and whether the one it linked belongs to a graph being built
// (one whose partition has just reached the graph's MinLen and is not searched through it
// yet).
func (x *EmbeddedIndex) linkOne() (more, building bool) {
	x.linkMu.Lock()
	defer x.linkMu.Unlock()
	x.lockRead()
	var p *partition
	var plan *vector.LinkPlan
	for _, q := range x.toLink {
		if x.parts[q.key] == q && q.set.Pending() > 0 {
			p, plan = q, q.set.PlanLink()
			break
		}
	}
	x.unlockRead()
	x.lockToWrite()
	defer x.unlockWrite()
	if p != nil && x.parts[p.key] == p {
		// Refused only when the set changed under the plan; the next call plans again.
		p.set.ApplyLink(plan)
		building = !p.set.GraphReady()
	}
	x.toLink = slices.DeleteFunc(x.toLink, func(q *partition) bool {
		done := x.parts[q.key] != q || q.set.Pending() == 0
		if done {
			q.linkQueued = false
		}
		return done
	})
	return len(x.toLink) > 0, building
}

// lockToWrite takes mu for writing, for a store or a link: work that by default comes
// after the answer it serves (router.async_cache_store). A writer waiting in mu.Lock makes
// every search that arrives meanwhile wait behind it (an RWMutex queues new readers behind
// a waiting writer), and on busy CPUs each of those waits lasts until the searches already
// in, the writer and then the queued searches have each been given a CPU. So a write
// takes mu only when it is free: while searches (or another write) hold it, the writer
// waits for word that one has let it go (unlockRead, unlockWrite), and tries again; only
// after writeTries tries does it queue for the lock, so that searches that keep
// overlapping cannot hold a write off for ever (docs/design/014-writers-wait-for-word.md).
//
// A try can also fail while nobody holds mu: another writer's try that is failing holds
// mu's writer lock for an instant, and lets it go without word. A writer that then waited
// could wait for ever beside the other, with mu free; so it waits only while someone
// holds mu, who will leave word, and otherwise tries again at once
// (docs/design/018-wait-only-for-a-holder.md).
func (x *EmbeddedIndex) lockToWrite() {
	x.writersWaiting.Add(1)
	defer x.writersWaiting.Add(-1)
	// Counted before trying: a holder that lets mu go after this try sees the count and
	// leaves word, so the wait below cannot miss it.
	for range writeTries {
		if x.tryLock() {
			x.held.Add(1)
			return
		}
		// Counted after taking mu and until after letting it go, a holder that made this
		// try fail is still counted here, or has let mu go (try again).
		if x.held.Load() > 0 {
			<-x.unlocked
		}
	}
	x.lockWrite()
}

// writeTries is how many times lockToWrite tries mu before it queues.
const writeTries = 8

// lockRead takes mu for a search.
func (x *EmbeddedIndex) lockRead() {
	x.mu.RLock()
	x.held.Add(1)
}

// lockWrite takes mu for writing, queueing behind the searches in progress: for what is
// rare next to searches (removing an expired entry, invalidation, loading a snapshot).
func (x *EmbeddedIndex) lockWrite() {
	x.mu.Lock()
	x.held.Add(1)
}

// unlockRead lets mu go after a search, with word for a writer that waits.
func (x *EmbeddedIndex) unlockRead() {
	x.mu.RUnlock()
	x.held.Add(-1)
	x.tellWriters()
}

// unlockWrite lets mu go after lockToWrite or lockWrite, with word for the next writer
// that waits.
func (x *EmbeddedIndex) unlockWrite() {
	x.mu.Unlock()
	x.held.Add(-1)
	x.tellWriters()
}

func (x *EmbeddedIndex) tellWriters() {
	if x.writersWaiting.Load() > 0 {
		select {
		case x.unlocked <- struct{}{}:
		default: // word is waiting already
		}
	}
}

// linkAll links every waiting vector.
func (x *EmbeddedIndex) linkAll() {
	for {
		if more, _ := x.linkOne(); !more {
			return
		}
	}
}

// LinkBacklog returns the number of vectors waiting to be linked into their partitions'
// graphs.
func (x *EmbeddedIndex) LinkBacklog() int {
	x.lockRead()
	defer x.unlockRead()
	n := 0
	for _, p := range x.toLink {
		if x.parts[p.key] == p {
			n += p.set.Pending()
		}
	}
	return n
}

// insert adds e at the front (or the back, when loading a snapshot in recency order) of the
// recency list; x.mu must be held for writing.
func (x *EmbeddedIndex) insert(e Entry, v vector.Vector, near *vector.Near, front bool) error {
	p := x.parts[e.Partition]
	if p == nil {
		p = &partition{key: e.Partition}
		x.parts[e.Partition] = p
	}
	n := node{entry: pack(e), size: entrySize(e, v)}
	if v.Len() > 0 {
		if p.set == nil {
			g := x.denseGraph
			if v.Sparse() {
				g = x.sparseGraph
			}
			p.set = vector.NewSet(v.Sparse(), x.limits, g)
		}
		slot, err := p.set.AddNear(v, near)
		if err != nil {
			if p.nodes == 0 && p.set.Len() == 0 {
				delete(x.parts, e.Partition)
			}
			return fmt.Errorf("embedded index: %w", err)
		}
		n.slot, n.inSet = slot, true
		if p.set.Pending() > 0 && !p.linkQueued {
			p.linkQueued = true
			x.toLink = append(x.toLink, p)
		}
	}
	// The node is in the recency list before Get can find it, and may touch it.
	x.keyMu.Lock()
	r := x.nodes.add(n)
	x.lruMu.Lock()
	if front {
		x.recency.pushFront(&x.nodes, r)
	} else {
		x.recency.pushBack(&x.nodes, r)
	}
	x.lruMu.Unlock()
	x.byKey[e.Key] = r
	x.keyMu.Unlock()
	if n.inSet {
		if int(n.slot) >= len(p.bySlot) {
			p.bySlot = append(p.bySlot, make([]nodeRef, int(n.slot)+1-len(p.bySlot))...)
		}
		p.bySlot[n.slot] = r
	}
	p.nodes++
	x.bytes += n.size
	return nil
}

// Delete implements Index. It scans every entry: invalidation is an operator action,
// rare next to lookups, and a scan needs no secondary indexes to keep consistent.
func (x *EmbeddedIndex) Delete(_ context.Context, f Filter) (int, error) {
	if f.Tenant == "" {
		return 0, errors.New("embedded index: delete without a tenant")
	}
	x.lockWrite()
	defer x.unlockWrite()
	removed := 0
	for _, r := range x.byKey {
		if f.matches(x.nodes.at(r).entry.entry()) {
			x.remove(r) // deleting the current key while ranging over a map is allowed
			removed++
		}
	}
	return removed, nil
}

// Len returns the number of entries held, expired ones included until they are removed.
func (x *EmbeddedIndex) Len() int {
	x.lockRead()
	defer x.unlockRead()
	return len(x.byKey)
}

// Bytes returns about how much of the heap the entries held take (entrySize).
func (x *EmbeddedIndex) Bytes() int64 {
	x.lockRead()
	defer x.unlockRead()
	return x.bytes
}

// Evictions returns how many entries were evicted to make room since the index was created.
func (x *EmbeddedIndex) Evictions() uint64 { return x.evictions.Load() }

// vectorOf returns n's vector as its partition's set holds it (a copy, valid while n is
// held under x.mu), or the zero Vector for an entry only exact lookups find.
func (x *EmbeddedIndex) vectorOf(n *node) vector.Vector {
	if !n.inSet {
		return vector.Vector{}
	}
	return x.parts[n.entry.partition].set.Vector(n.slot)
}

// remove unlinks r and releases its node; x.mu must be held for writing.
func (x *EmbeddedIndex) remove(r nodeRef) {
	n := x.nodes.at(r)
	x.bytes -= n.size
	p := x.parts[n.entry.partition]
	if n.inSet {
		p.set.Remove(n.slot)
		p.bySlot[n.slot] = 0
	}
	p.nodes--
	if p.nodes == 0 {
		delete(x.parts, n.entry.partition)
	}
	// What Get reads under keyMu alone goes in one hold, as insert adds it: the key, the
	// node's place in the recency list (Get may touch it) and the node itself.
	x.keyMu.Lock()
	delete(x.byKey, n.entry.key)
	x.lruMu.Lock()
	x.recency.remove(&x.nodes, r)
	x.lruMu.Unlock()
	x.nodes.release(r)
	x.keyMu.Unlock()
}
