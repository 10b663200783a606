package cache

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mantle-mesh/mantle/services/cache/internal/vector"
)

// EmbeddedIndex is an Index in process memory, for mantle dev and single nodes. Entries
// are grouped by partition (the scope every lookup filters on), and each partition keeps
// its vectors in a vector.Set. Sparse searches run within searchLimits, so that a lookup
// costs about the same in a partition of a million entries as in one of ten thousand. The index holds at most maxEntries
// entries: when a new one would exceed that, the least recently used is evicted. Entries
// past their StaleUntil are removed when a read finds them or evicted as they age to the
// back of the list, so no background sweep is needed. Save and Load write it to and read
// it from a snapshot.
type EmbeddedIndex struct {
	maxEntries int
	limits     vector.Limits

	// mu guards the maps and the partitions' sets: searches share it, writes hold it alone.
	mu    sync.RWMutex
	byKey map[Key]*node
	parts map[Key]*partition

	// lruMu guards recency, so that a read under mu's read lock can still record a use.
	// Lock order: mu, then lruMu.
	lruMu sync.Mutex
	// recency orders entries from most (front) to least (back) recently used.
	recency *list.List // values are *node

	evictions atomic.Uint64
}

type node struct {
	entry Entry
	vec   vector.Vector // the zero Vector for entries only exact lookups find
	part  *partition
	slot  uint32
	inSet bool
	elem  *list.Element
}

type partition struct {
	set    *vector.Set // nil until the first vector arrives; its form follows that vector
	bySlot map[uint32]*node
	nodes  int
}

var _ Index = (*EmbeddedIndex)(nil)

// searchLimits bound a sparse search to the lexical vectors of about 16k postings read and
// 256 candidates scored in full (a few hundred microseconds at most). Lists are read
// rarest first, and a true paraphrase shares a question's rarest words, so it is found
// among the first candidates; what the bound gives up is older entries that share only
// common words with the question. The recall this costs is measured against the exact
// search in TestBoundedSearchRecall.
var searchLimits = vector.Limits{Postings: 1 << 14, Scored: 256}

// NewEmbeddedIndex returns an empty index that holds at most maxEntries entries.
func NewEmbeddedIndex(maxEntries int) *EmbeddedIndex {
	return newEmbeddedIndex(maxEntries, searchLimits)
}

// newEmbeddedIndex is NewEmbeddedIndex with other search limits (the zero Limits: exact).
func newEmbeddedIndex(maxEntries int, limits vector.Limits) *EmbeddedIndex {
	return &EmbeddedIndex{
		maxEntries: maxEntries,
		limits:     limits,
		byKey:      make(map[Key]*node),
		parts:      make(map[Key]*partition),
		recency:    list.New(),
	}
}

// Get implements Index. A read counts as a use for eviction but does not extend the
// entry's life.
// The namespace is part of every key's partition, so the key alone finds the entry.
func (x *EmbeddedIndex) Get(_ context.Context, _ string, key Key, now time.Time) (Entry, bool, error) {
	x.mu.RLock()
	n, ok := x.byKey[key]
	if ok && n.entry.heldAt(now) {
		x.touch(n)
		e := n.entry
		x.mu.RUnlock()
		return e, true, nil
	}
	x.mu.RUnlock()
	if ok {
		x.mu.Lock()
		// Another writer may have replaced the entry in between; remove only what expired.
		if n, ok := x.byKey[key]; ok && !n.entry.heldAt(now) {
			x.remove(n)
		}
		x.mu.Unlock()
	}
	return Entry{}, false, nil
}

// Touch records a use of the entry under key, as Get does; the service calls it after a
// similarity hit.
func (x *EmbeddedIndex) Touch(key Key) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if n, ok := x.byKey[key]; ok {
		x.touch(n)
	}
}

// touch moves n to the front of the recency list; x.mu must be held (read or write).
func (x *EmbeddedIndex) touch(n *node) {
	x.lruMu.Lock()
	x.recency.MoveToFront(n.elem)
	x.lruMu.Unlock()
}

// Search implements Index. It never touches an entry: candidates are not yet answers.
func (x *EmbeddedIndex) Search(_ context.Context, q Query) ([]Candidate, error) {
	if q.Vector.Len() == 0 || q.Limit <= 0 {
		return nil, nil
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	p := x.parts[q.Partition]
	if p == nil || p.set == nil || p.set.Len() == 0 {
		return nil, nil
	}
	accept := func(slot uint32) bool {
		n := p.bySlot[slot]
		// The partition is a hash that includes the tenant, so the tenant check can only
		// fail on a hash collision; it is here because an answer crossing tenants is the
		// one failure the cache must not have.
		if n == nil || n.entry.Tenant != q.Tenant {
			return false
		}
		if q.FreshOnly {
			return n.entry.freshAt(q.Now)
		}
		return n.entry.heldAt(q.Now)
	}
	hits := p.set.Search(q.Vector, q.Limit, q.MinScore, accept)
	out := make([]Candidate, 0, len(hits))
	for _, h := range hits {
		out = append(out, Candidate{Entry: p.bySlot[h.Slot].entry, Score: h.Score})
	}
	return out, nil
}

// Put implements Index.
func (x *EmbeddedIndex) Put(_ context.Context, e Entry, v vector.Vector) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if old, ok := x.byKey[e.Key]; ok {
		x.remove(old)
	}
	if err := x.insert(e, v, true); err != nil {
		return err
	}
	for len(x.byKey) > x.maxEntries {
		x.lruMu.Lock()
		back := x.recency.Back()
		x.lruMu.Unlock()
		x.remove(back.Value.(*node))
		x.evictions.Add(1)
	}
	return nil
}

// insert adds e at the front (or the back, when loading a snapshot in recency order) of the
// recency list; x.mu must be held for writing.
func (x *EmbeddedIndex) insert(e Entry, v vector.Vector, front bool) error {
	p := x.parts[e.Partition]
	if p == nil {
		p = &partition{bySlot: make(map[uint32]*node)}
		x.parts[e.Partition] = p
	}
	n := &node{entry: e, vec: v, part: p}
	if v.Len() > 0 {
		if p.set == nil {
			p.set = vector.NewSet(v.Sparse(), x.limits)
		}
		slot, err := p.set.Add(v)
		if err != nil {
			if p.nodes == 0 && p.set.Len() == 0 {
				delete(x.parts, e.Partition)
			}
			return fmt.Errorf("embedded index: %w", err)
		}
		n.slot, n.inSet = slot, true
		p.bySlot[slot] = n
	}
	p.nodes++
	x.byKey[e.Key] = n
	x.lruMu.Lock()
	if front {
		n.elem = x.recency.PushFront(n)
	} else {
		n.elem = x.recency.PushBack(n)
	}
	x.lruMu.Unlock()
	return nil
}

// Delete implements Index. It scans every entry: invalidation is an operator action,
// rare next to lookups, and a scan needs no secondary indexes to keep consistent.
func (x *EmbeddedIndex) Delete(_ context.Context, f Filter) (int, error) {
	if f.Tenant == "" {
		return 0, errors.New("embedded index: delete without a tenant")
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	removed := 0
	for _, n := range x.byKey {
		if f.matches(n.entry) {
			x.remove(n) // deleting the current key while ranging over a map is allowed
			removed++
		}
	}
	return removed, nil
}

// Len returns the number of entries held, expired ones included until they are removed.
func (x *EmbeddedIndex) Len() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.byKey)
}

// Evictions returns how many entries were evicted to make room since the index was created.
func (x *EmbeddedIndex) Evictions() uint64 { return x.evictions.Load() }

// remove unlinks n; x.mu must be held for writing.
func (x *EmbeddedIndex) remove(n *node) {
	delete(x.byKey, n.entry.Key)
	x.lruMu.Lock()
	x.recency.Remove(n.elem)
	x.lruMu.Unlock()
	p := n.part
	if n.inSet {
		p.set.Remove(n.slot)
		delete(p.bySlot, n.slot)
	}
	p.nodes--
	if p.nodes == 0 {
		delete(x.parts, n.entry.Partition)
	}
}
