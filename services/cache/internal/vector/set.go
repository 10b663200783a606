package vector

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
)

// Set holds the vectors of one partition and finds those most similar to a query. The
// search is exact: every stored vector at or above the minimum score is considered, so a
// result is never missed because of an approximation. It is not safe for concurrent
// writes; concurrent Searches are safe when no write runs at the same time (the caller
// holds a read lock).
//
// Dense vectors are compared one by one. Sparse vectors (the lexical embedder's) are
// found through an inverted index from each coordinate to the slots that use it, with the
// candidate pruning of all-pairs similarity search: a stored vector that shares no
// coordinate with a chosen part P of the query has a similarity of at most the norm of the
// rest of the query, so when that norm is below the minimum score only the slots listed
// under P's coordinates can qualify. P is filled with the query's coordinates with the
// shortest lists first, so the fewest candidates are scored.
type Set struct {
	sparse bool
	dim    int // dense only; fixed by the first vector

	live  []bool
	free  []uint32 // removed slots, reused by Add
	count int

	// Sparse storage: each slot's coordinates, and the inverted index. A removed slot's
	// postings stay in the lists until a rebuild; they are skipped (dead slot) or merely
	// scored once more (the slot was reused), never trusted.
	indices  [][]uint32
	values   [][]float32
	postings map[uint32][]uint32
	total    int // postings held, stale ones included
	stale    int // postings left behind by removed slots

	// Dense storage: slot i is dense[i*dim : (i+1)*dim].
	dense []float32

	scratch sync.Pool // *searchScratch
}

// Hit is a stored vector and its similarity to the query.
type Hit struct {
	Slot  uint32
	Score float32
}

// NewSet returns an empty set for sparse or dense vectors.
func NewSet(sparse bool) *Set {
	s := &Set{sparse: sparse}
	if sparse {
		s.postings = make(map[uint32][]uint32)
	}
	return s
}

// Len returns the number of vectors held.
func (s *Set) Len() int { return s.count }

// Add stores v and returns its slot. The set keeps v's slices; the caller must not change
// them afterwards.
func (s *Set) Add(v Vector) (uint32, error) {
	if v.Sparse() != s.sparse {
		return 0, fmt.Errorf("vector: sparse %v vector in a sparse %v set", v.Sparse(), s.sparse)
	}
	if v.Len() == 0 {
		return 0, ErrZero
	}
	if !s.sparse {
		if s.dim == 0 {
			s.dim = len(v.Dense)
		}
		if len(v.Dense) != s.dim {
			return 0, fmt.Errorf("vector: dimension %d in a set of dimension %d", len(v.Dense), s.dim)
		}
	}
	var slot uint32
	if n := len(s.free); n > 0 {
		slot, s.free = s.free[n-1], s.free[:n-1]
		s.live[slot] = true
	} else {
		slot = uint32(len(s.live))
		s.live = append(s.live, true)
		if s.sparse {
			s.indices = append(s.indices, nil)
			s.values = append(s.values, nil)
		} else {
			s.dense = append(s.dense, make([]float32, s.dim)...)
		}
	}
	s.count++
	if s.sparse {
		s.indices[slot], s.values[slot] = v.Indices, v.Values
		for _, f := range v.Indices {
			s.postings[f] = append(s.postings[f], slot)
		}
		s.total += len(v.Indices)
	} else {
		copy(s.dense[int(slot)*s.dim:], v.Dense)
	}
	return slot, nil
}

// Remove deletes the vector in slot; removing an empty slot does nothing.
func (s *Set) Remove(slot uint32) {
	if int(slot) >= len(s.live) || !s.live[slot] {
		return
	}
	s.live[slot] = false
	s.free = append(s.free, slot)
	s.count--
	if !s.sparse {
		return
	}
	s.stale += len(s.indices[slot])
	s.indices[slot], s.values[slot] = nil, nil
	// Rebuilding costs one pass over the live postings, so doing it once stale postings
	// outnumber live ones keeps removal amortised O(coordinates).
	if s.stale > 1024 && 2*s.stale > s.total {
		s.rebuild()
	}
}

func (s *Set) rebuild() {
	postings := make(map[uint32][]uint32, len(s.postings))
	total := 0
	for slot, live := range s.live {
		if !live {
			continue
		}
		for _, f := range s.indices[slot] {
			postings[f] = append(postings[f], uint32(slot))
		}
		total += len(s.indices[slot])
	}
	s.postings, s.total, s.stale = postings, total, 0
}

// Vector returns the vector in slot, sharing the set's storage.
func (s *Set) Vector(slot uint32) Vector {
	if int(slot) >= len(s.live) || !s.live[slot] {
		return Vector{}
	}
	if s.sparse {
		return Vector{Indices: s.indices[slot], Values: s.values[slot]}
	}
	return Vector{Dense: s.dense[int(slot)*s.dim : (int(slot)+1)*s.dim]}
}

// Search returns up to k slots whose similarity to q is positive and at least minScore, best
// first; equal scores are ordered by slot. (A vector that shares nothing with q is never a
// result, even for a minScore of 0.) accept, when not nil, is asked about each qualifying
// slot before it takes a place in the result (the index uses it to skip expired entries).
func (s *Set) Search(q Vector, k int, minScore float32, accept func(slot uint32) bool) []Hit {
	if k <= 0 || s.count == 0 || q.Sparse() != s.sparse || q.Len() == 0 {
		return nil
	}
	top := make([]Hit, 0, k)
	consider := func(slot uint32, score float32) {
		if score <= 0 || score < minScore || (len(top) == k && !better(Hit{slot, score}, top[k-1])) {
			return
		}
		if accept != nil && !accept(slot) {
			return
		}
		i, _ := slices.BinarySearchFunc(top, Hit{slot, score}, func(a, b Hit) int {
			if better(a, b) {
				return -1
			}
			return 1
		})
		if len(top) < k {
			top = append(top, Hit{})
		}
		copy(top[i+1:], top[i:len(top)-1])
		top[i] = Hit{slot, score}
	}
	if s.sparse {
		s.searchSparse(q, minScore, consider)
	} else {
		if len(q.Dense) != s.dim {
			return nil
		}
		for slot, live := range s.live {
			if live {
				consider(uint32(slot), denseDot(q.Dense, s.dense[slot*s.dim:(slot+1)*s.dim]))
			}
		}
	}
	return top
}

func better(a, b Hit) bool {
	return a.Score > b.Score || (a.Score == b.Score && a.Slot < b.Slot)
}

// pruneMargin keeps float rounding from pruning a vector that is exactly at the minimum
// score: the bound is applied to a slightly lower score than asked for.
const pruneMargin = 1e-4

type searchScratch struct {
	order []int
	seen  []uint32 // seen[slot] == epoch: the slot was scored in this search
	epoch uint32
}

func (s *Set) searchSparse(q Vector, minScore float32, consider func(uint32, float32)) {
	sc, _ := s.scratch.Get().(*searchScratch)
	if sc == nil {
		sc = &searchScratch{}
	}
	defer s.scratch.Put(sc)
	if len(sc.seen) < len(s.live) {
		sc.seen = make([]uint32, len(s.live)+len(s.live)/4)
		sc.epoch = 0
	}
	sc.epoch++
	if sc.epoch == 0 { // wrapped: old marks could collide with the new epoch
		clear(sc.seen)
		sc.epoch = 1
	}

	// Choose P: coordinates with the shortest lists first, until the rest of the query is
	// too short to reach minScore on its own.
	sc.order = sc.order[:0]
	for i := range q.Indices {
		sc.order = append(sc.order, i)
	}
	slices.SortFunc(sc.order, func(a, b int) int {
		return cmp.Compare(len(s.postings[q.Indices[a]]), len(s.postings[q.Indices[b]]))
	})
	var rest float32
	for _, w := range q.Values {
		rest += w * w
	}
	bound := minScore - pruneMargin
	for _, i := range sc.order {
		if bound > 0 && rest < bound*bound {
			break
		}
		rest -= q.Values[i] * q.Values[i]
		for _, slot := range s.postings[q.Indices[i]] {
			if sc.seen[slot] == sc.epoch || !s.live[slot] {
				continue
			}
			sc.seen[slot] = sc.epoch
			consider(slot, sparseDot(q.Indices, q.Values, s.indices[slot], s.values[slot]))
		}
	}
}
