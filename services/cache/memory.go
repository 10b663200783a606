package cache

import (
	"container/list"
	"context"
	"errors"
	"sync"
	"time"
)

// MemoryIndex is an Index in process memory, bounded by a number of entries: when a new
// entry would exceed the bound, the least recently used entry is evicted. Expired entries
// are removed when a Get finds them, or evicted as they age to the back of the list, so no
// background sweep is needed.
type MemoryIndex struct {
	maxEntries int

	mu    sync.Mutex
	byKey map[Key]*list.Element // values are *Entry
	// recency orders entries from most (front) to least (back) recently used.
	recency   *list.List
	evictions uint64
}

var _ Index = (*MemoryIndex)(nil)

// NewMemoryIndex returns an empty index that holds at most maxEntries entries.
func NewMemoryIndex(maxEntries int) *MemoryIndex {
	return &MemoryIndex{
		maxEntries: maxEntries,
		byKey:      make(map[Key]*list.Element),
		recency:    list.New(),
	}
}

// Get implements Index.
func (m *MemoryIndex) Get(_ context.Context, key Key, now time.Time) (Entry, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	el, ok := m.byKey[key]
	if !ok {
		return Entry{}, false, nil
	}
	e := el.Value.(*Entry)
	if !e.liveAt(now) {
		m.remove(el)
		return Entry{}, false, nil
	}
	m.recency.MoveToFront(el)
	return *e, true, nil
}

// Put implements Index.
func (m *MemoryIndex) Put(_ context.Context, e Entry) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if el, ok := m.byKey[e.Key]; ok {
		el.Value = &e
		m.recency.MoveToFront(el)
		return nil
	}
	m.byKey[e.Key] = m.recency.PushFront(&e)
	for m.recency.Len() > m.maxEntries {
		m.remove(m.recency.Back())
		m.evictions++
	}
	return nil
}

// Delete implements Index. It scans every entry: invalidation is an operator action,
// rare next to lookups, and a scan needs no secondary indexes to keep consistent.
func (m *MemoryIndex) Delete(_ context.Context, f Filter) (int, error) {
	if f.Tenant == "" {
		return 0, errors.New("memory index: delete without a tenant")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	removed := 0
	for el := m.recency.Front(); el != nil; {
		next := el.Next() // read before remove unlinks el
		if f.matches(*el.Value.(*Entry)) {
			m.remove(el)
			removed++
		}
		el = next
	}
	return removed, nil
}

// Len returns the number of entries held, expired ones included until they are removed.
func (m *MemoryIndex) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.recency.Len()
}

// Evictions returns how many entries were evicted to make room since the index was created.
func (m *MemoryIndex) Evictions() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.evictions
}

// remove unlinks el; m.mu must be held.
func (m *MemoryIndex) remove(el *list.Element) {
	delete(m.byKey, el.Value.(*Entry).Key)
	m.recency.Remove(el)
}
