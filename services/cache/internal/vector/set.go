package vector

import (
	"cmp"
	"fmt"
	"math"
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
// found through an inverted index from each coordinate to the slots that use it (with the
// slot's weight), with the bounds of all-pairs similarity search (Bayardo et al., 2007):
//
//   - Candidates: a stored vector that shares no coordinate with a part P of the query has
//     a similarity of at most the norm of the rest of the query (Cauchy-Schwarz), so once
//     that norm is below the minimum score only slots listed under P can qualify. P takes
//     the query's coordinates with the shortest lists first, so the fewest slots qualify.
//   - Pruning: walking further (short enough) lists only adds to the partial dot products
//     of those candidates; a candidate whose partial product plus the norm of the rest of
//     the query is below the minimum score cannot reach it and is never scored in full.
//
// Both bounds are exact: only vectors that provably cannot reach the minimum are skipped.
type Set struct {
	sparse bool
	dim    int // dense only; fixed by the first vector

	live  []bool
	free  []uint32 // slots that Add may reuse
	count int

	// Sparse storage: each slot's coordinates, and the inverted index. A removed slot's
	// postings stay in the lists until a rebuild and are skipped (the slot is not live);
	// the slot is reused only after the rebuild dropped them, so a posting's weight is
	// always its slot's current one.
	indices  [][]uint32
	values   [][]float32
	postings map[uint32][]posting
	total    int      // postings held, stale ones included
	stale    int      // postings left behind by removed slots
	dead     []uint32 // removed slots whose postings are still in the lists

	// Dense storage: slot i is dense[i*dim : (i+1)*dim].
	dense []float32

	scratch sync.Pool // *searchScratch
}

// posting is one slot listed under a coordinate, with the slot's weight there.
type posting struct {
	slot   uint32
	weight float32
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
		s.postings = make(map[uint32][]posting)
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
		for i, f := range v.Indices {
			s.postings[f] = append(s.postings[f], posting{slot, v.Values[i]})
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
	s.count--
	if !s.sparse {
		s.free = append(s.free, slot)
		return
	}
	s.dead = append(s.dead, slot)
	s.stale += len(s.indices[slot])
	s.indices[slot], s.values[slot] = nil, nil
	// Rebuilding costs one pass over the live postings, so doing it once stale postings
	// outnumber live ones keeps removal amortised O(coordinates).
	if s.stale > 1024 && 2*s.stale > s.total {
		s.rebuild()
	}
}

func (s *Set) rebuild() {
	postings := make(map[uint32][]posting, len(s.postings))
	total := 0
	for slot, live := range s.live {
		if !live {
			continue
		}
		for i, f := range s.indices[slot] {
			postings[f] = append(postings[f], posting{uint32(slot), s.values[slot][i]})
		}
		total += len(s.indices[slot])
	}
	s.postings, s.total, s.stale = postings, total, 0
	s.free, s.dead = append(s.free, s.dead...), s.dead[:0]
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
	// seen[slot] == epoch marks a candidate of this search; acc[slot] is its partial dot
	// product so far.
	seen  []uint32
	acc   []float32
	cands []uint32
	epoch uint32
}

// walkFactor bounds the pruning walk: a list is walked only while it is at most this many
// times longer than the number of candidates, since adding a posting costs a few
// nanoseconds and scoring a candidate in full a few hundred.
const walkFactor = 16

func (s *Set) searchSparse(q Vector, minScore float32, consider func(uint32, float32)) {
	sc, _ := s.scratch.Get().(*searchScratch)
	if sc == nil {
		sc = &searchScratch{}
	}
	defer s.scratch.Put(sc)
	if len(sc.seen) < len(s.live) {
		n := len(s.live) + len(s.live)/4
		sc.seen, sc.acc = make([]uint32, n), make([]float32, n)
		sc.epoch = 0
	}
	sc.epoch++
	if sc.epoch == 0 { // wrapped: old marks could collide with the new epoch
		clear(sc.seen)
		sc.epoch = 1
	}
	sc.cands = sc.cands[:0]

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

	// Candidates: the lists of P.
	next := 0
	for ; next < len(sc.order); next++ {
		if bound > 0 && rest < bound*bound {
			break
		}
		i := sc.order[next]
		qw := q.Values[i]
		rest -= qw * qw
		for _, p := range s.postings[q.Indices[i]] {
			if !s.live[p.slot] {
				continue
			}
			if sc.seen[p.slot] != sc.epoch {
				sc.seen[p.slot], sc.acc[p.slot] = sc.epoch, 0
				sc.cands = append(sc.cands, p.slot)
			}
			sc.acc[p.slot] += qw * p.weight
		}
	}
	// Pruning: more of the query's lists, for the candidates only.
	for ; bound > 0 && next < len(sc.order); next++ {
		i := sc.order[next]
		list := s.postings[q.Indices[i]]
		if len(list) > walkFactor*len(sc.cands)+64 {
			break
		}
		qw := q.Values[i]
		rest -= qw * qw
		for _, p := range list {
			if sc.seen[p.slot] == sc.epoch && s.live[p.slot] {
				sc.acc[p.slot] += qw * p.weight
			}
		}
	}
	restNorm := float32(math.Sqrt(float64(max(rest, 0))))
	for _, slot := range sc.cands {
		if bound > 0 && sc.acc[slot]+restNorm < bound {
			continue // cannot reach minScore
		}
		consider(slot, sparseDot(q.Indices, q.Values, s.indices[slot], s.values[slot]))
	}
}
