package agent

import (
	"container/list"
	"sync"
	"time"
)

// staleStore keeps the last good result of each query call (tool and canonical
// arguments, per tenant), for the cache's fresh hits and the stale gear. It is per
// replica and bounded: at most maxEntries per tool and maxBytes in total, least recently
// stored out first. A tenant never reads another tenant's results: the tenant is part of
// the key.
type staleStore struct {
	maxEntries int
	maxBytes   int

	mu      sync.Mutex
	bytes   int
	order   *list.List // of *staleEntry, most recently stored first
	entries map[staleKey]*list.Element
	perTool map[string]int
}

type staleKey struct {
	tenant, tool, args string // args: the arguments' canonical digest
}

type staleEntry struct {
	key    staleKey
	result string
	stored time.Time
}

func newStaleStore(maxEntries, maxBytes int) *staleStore {
	return &staleStore{maxEntries: maxEntries, maxBytes: maxBytes, order: list.New(),
		entries: map[staleKey]*list.Element{}, perTool: map[string]int{}}
}

// size is what an entry counts against maxBytes: its result and key, and a fixed
// overhead for the bookkeeping.
func (e *staleEntry) size() int {
	return len(e.result) + len(e.key.tenant) + len(e.key.tool) + len(e.key.args) + 128
}

// put stores the result of a call at now, replacing an older one of the same call. A
// result larger than the whole store is not kept.
func (s *staleStore) put(k staleKey, result string, now time.Time) {
	e := &staleEntry{key: k, result: result, stored: now}
	if e.size() > s.maxBytes {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if el, ok := s.entries[k]; ok {
		s.removeLocked(el)
	}
	s.entries[k] = s.order.PushFront(e)
	s.bytes += e.size()
	s.perTool[k.tool]++
	// Over the tool's count: its oldest entry goes; over the bytes: the oldest of any.
	for el := s.order.Back(); el != nil && s.perTool[k.tool] > s.maxEntries; {
		prev := el.Prev()
		if el.Value.(*staleEntry).key.tool == k.tool {
			s.removeLocked(el)
		}
		el = prev
	}
	for s.bytes > s.maxBytes {
		s.removeLocked(s.order.Back())
	}
}

// get returns the last good result of a call and when it was stored.
func (s *staleStore) get(k staleKey) (result string, stored time.Time, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	el, ok := s.entries[k]
	if !ok {
		return "", time.Time{}, false
	}
	e := el.Value.(*staleEntry)
	return e.result, e.stored, true
}

// dropTool forgets every result of a tool (removed from the registry, or its backend
// changed so that its old results answer for another backend).
func (s *staleStore) dropTool(tool string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for el := s.order.Back(); el != nil; {
		prev := el.Prev()
		if el.Value.(*staleEntry).key.tool == tool {
			s.removeLocked(el)
		}
		el = prev
	}
}

// count returns how many results of a tool are kept.
func (s *staleStore) count(tool string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.perTool[tool]
}

func (s *staleStore) removeLocked(el *list.Element) {
	e := el.Value.(*staleEntry)
	s.order.Remove(el)
	delete(s.entries, e.key)
	s.bytes -= e.size()
	if s.perTool[e.key.tool]--; s.perTool[e.key.tool] <= 0 {
		delete(s.perTool, e.key.tool)
	}
}
