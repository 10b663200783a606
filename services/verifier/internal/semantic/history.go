package semantic

import (
	"container/list"
	"slices"
	"sync"
)

// History remembers the embeddings of recent answers per question key, to measure how far a
// new answer strays from what was said before (divergence from earlier
// answers to the same query > 0.8 is an output risk). It keeps at most maxKeys questions
// (least recently seen evicted) and perKey answers each. Safe for concurrent use.
type History struct {
	maxKeys, perKey int

	mu      sync.Mutex
	order   *list.List // of *historyEntry, most recent first
	entries map[string]*list.Element
}

type historyEntry struct {
	key  string
	vecs [][]float32
	next int // ring position of the next write once full
}

// NewHistory returns an empty History.
func NewHistory(maxKeys, perKey int) *History {
	return &History{maxKeys: max(1, maxKeys), perKey: max(1, perKey), order: list.New(), entries: map[string]*list.Element{}}
}

// Observe returns the divergence of vec from the answers stored under key, 1 minus their
// mean cosine similarity, and whether there were any; then it stores a copy of vec, so
// the caller may reuse vec. Once a key's ring is full the copy overwrites the oldest
// answer's vector in place.
func (h *History) Observe(key string, vec []float32) (float64, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	el, ok := h.entries[key]
	switch {
	case ok:
		h.order.MoveToFront(el)
	case h.order.Len() >= h.maxKeys:
		// The least recently seen question makes room, and its storage serves the new one:
		// with every question new (most are), nothing is allocated here.
		el = h.order.Back()
		old := el.Value.(*historyEntry)
		delete(h.entries, old.key)
		*old = historyEntry{key: key, vecs: old.vecs[:0]}
		h.entries[key] = el
		h.order.MoveToFront(el)
	default:
		el = h.order.PushFront(&historyEntry{key: key})
		h.entries[key] = el
	}
	e := el.Value.(*historyEntry)
	divergence, seen := 0.0, len(e.vecs) > 0
	if seen {
		var sum float64
		for _, prev := range e.vecs {
			sum += Cosine(prev, vec)
		}
		divergence = 1 - sum/float64(len(e.vecs))
	}
	if n := len(e.vecs); n < h.perKey {
		if n < cap(e.vecs) && len(e.vecs[:n+1][n]) == len(vec) {
			// A vector a recycled entry held.
			e.vecs = e.vecs[:n+1]
			copy(e.vecs[n], vec)
		} else {
			e.vecs = append(e.vecs, slices.Clone(vec))
		}
	} else {
		old := e.vecs[e.next]
		if len(old) == len(vec) {
			copy(old, vec)
		} else {
			e.vecs[e.next] = slices.Clone(vec)
		}
		e.next = (e.next + 1) % h.perKey
	}
	return divergence, seen
}

// Len is the number of questions remembered.
func (h *History) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.order.Len()
}
