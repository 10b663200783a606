package vector

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sync"
)

// Set holds the vectors of one partition and finds those most similar to a query. Without
// Limits the search is exact: every stored vector at or above the minimum score is
// considered. With Limits it reads a bounded part of the index (see Limits). It is not safe for concurrent
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
// Under Limits, candidates are then scored in the order of their partial products, and
// scoring stops once the next one's bound (partial product plus the norm of the rest of
// the query) cannot beat the k-th hit held (the MaxScore rule of top-k retrieval).
type Set struct {
	sparse bool
	dim    int // dense only; fixed by the first vector

	live  []bool
	free  []uint32 // slots that Add may reuse
	count int

	// Sparse storage: each slot's coordinates (vecs, pointer-free chunks: arena.go), and
	// the inverted index. A removed slot's postings stay in their lists, skipped (the slot
	// is not live), until the list is compacted, which happens to a list once removed slots
	// hold more than half of it: a list at a time, so removal stays amortised
	// O(coordinates) and searches do not wait for a pass over every list
	// (docs/design/008-compact-a-list-at-a-time.md). A slot is reused only once every list
	// it was in has dropped it, so a posting's weight is always its slot's current one.
	vecs     arena
	postings *postingIndex
	// listsLeft holds, for each removed slot not yet free, the lists that still hold one
	// of its postings; taken counts those slots.
	listsLeft strided[int32]
	taken     int

	// Dense storage: slot i's vector is dense.of(i).
	dense strided[float32]

	limits Limits

	// graph, once the set has held graphCfg.MinLen vectors, is the approximate search
	// path (graph.go).
	graphCfg Graph
	graph    *graph

	// spare holds up to maxSpare scratches for searches. Not a sync.Pool: a pool is emptied
	// by garbage collections, and the search after one would allocate and zero two arrays
	// as long as the set (8 MB at a million vectors), which is what its P99 would measure.
	spareMu sync.Mutex
	spare   []*searchScratch
}

// maxSpare is how many searches' scratch a set keeps between searches: as many as run at
// once on a small machine; more concurrent searches allocate their own.
const maxSpare = 4

// Limits bound the work of one sparse search, so that its cost stops growing with the
// number of vectors held. The zero Limits search exactly.
type Limits struct {
	// Postings is the most posting-list entries one search reads. Lists are read rarest
	// first, and a list longer than what is left of the budget is read from its newest end,
	// so what goes unread is older vectors that share only the query's commonest
	// coordinates.
	Postings int
	// Scored is the most candidates scored in full: those with the highest partial dot
	// products, which are read first.
	Scored int
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

// NewSet returns an empty set for sparse or dense vectors. Limits apply to sparse searches
// without a graph; dense sets without one are scanned in full. With a graph configured,
// a set that grows to its MinLen builds one (graph.go).
func NewSet(sparse bool, limits Limits, g Graph) *Set {
	if g.M < 2 || g.EfConstruction < 1 {
		g.MinLen = 0
	}
	s := &Set{sparse: sparse, limits: limits, graphCfg: g}
	if sparse {
		s.postings = newPostingIndex()
		s.listsLeft = newStrided[int32](1, 4, entryChunkBytes)
	}
	return s
}

// Len returns the number of vectors held.
func (s *Set) Len() int { return s.count }

// Add stores a copy of v and returns its slot.
func (s *Set) Add(v Vector) (uint32, error) {
	return s.AddNear(v, nil)
}

// AddNear is Add of a vector that SearchNear searched for (the same vector), with what that
// search recorded in near: when v is linked into the graph, near stands in for the search
// linking would run. The set takes near over; the caller must not use it afterwards.
func (s *Set) AddNear(v Vector, near *Near) (uint32, error) {
	if v.Sparse() != s.sparse {
		return 0, fmt.Errorf("vector: sparse %v vector in a sparse %v set", v.Sparse(), s.sparse)
	}
	if v.Len() == 0 {
		return 0, ErrZero
	}
	if !s.sparse {
		if s.dim == 0 {
			s.dim = len(v.Dense)
			s.dense = newStrided[float32](s.dim, 4, denseChunkBytes)
		}
		if len(v.Dense) != s.dim {
			return 0, fmt.Errorf("vector: dimension %d in a set of dimension %d", len(v.Dense), s.dim)
		}
	}
	var slot uint32
	if len(s.free) == 0 && s.taken > 2*s.count+64 {
		// A removed slot stays taken while a list that is mostly live holds it. Before the
		// set grows with more such slots than twice its live ones (removals that spare the
		// lists they share, unlike an LRU's), every list with a stale posting is compacted,
		// which frees them all.
		s.postings.eachStale(s.compact)
	}
	if n := len(s.free); n > 0 {
		slot, s.free = s.free[n-1], s.free[:n-1]
		s.live[slot] = true
	} else {
		slot = uint32(len(s.live))
		s.live = append(s.live, true)
		if s.sparse {
			s.vecs.grow(len(s.live))
			s.listsLeft.grow(len(s.live))
		} else {
			s.dense.grow(len(s.live))
		}
	}
	s.count++
	if s.sparse {
		s.vecs.set(slot, v)
		for i, f := range v.Indices {
			s.postings.ensure(f).add(posting{slot, v.Values[i]})
		}
	} else {
		copy(s.dense.of(slot), v.Dense)
	}
	switch {
	case s.graph != nil:
		s.graph.grow(len(s.live))
		s.graph.enqueue(slot, near)
	case s.graphCfg.MinLen > 0 && s.count >= s.graphCfg.MinLen:
		s.buildGraph()
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
	defer func() {
		if s.graph != nil && s.count < s.graphCfg.MinLen/4 {
			s.dropGraph()
		}
	}()
	if !s.sparse {
		// Without postings to keep consistent the slot is free at once. In a graph its
		// vector stays, a step for walks, until Add replaces it.
		s.free = append(s.free, slot)
		return
	}
	coords, _ := s.vecs.get(slot)
	*s.listsLeft.at(slot) = int32(len(coords))
	s.taken++
	for _, f := range coords {
		e := s.postings.find(f)
		e.stale++
		if n := e.len(); 2*int(e.stale) > n || n <= smallList {
			s.compact(e)
		}
	}
	if s.graph == nil {
		s.vecs.release(slot)
	}
}

// smallList is the length up to which a list is compacted at every removal from it: it
// costs little, and frees the slots of rare coordinates' lists at once.
const smallList = 16

// compact drops the postings of removed slots from e's list, and frees each slot that no
// list holds a posting of any more.
func (s *Set) compact(e *postingEntry) {
	e.filter(func(p posting) bool {
		if s.live[p.slot] {
			return true
		}
		left := s.listsLeft.at(p.slot)
		if *left--; *left == 0 {
			s.taken--
			s.free = append(s.free, p.slot)
		}
		return false
	})
	e.stale = 0
	if e.len() == 0 {
		s.postings.drop(e.coord)
	}
}

// Vector returns the vector in slot, sharing the set's storage: it stays valid until the slot
// is removed.
func (s *Set) Vector(slot uint32) Vector {
	if int(slot) >= len(s.live) || !s.live[slot] {
		return Vector{}
	}
	return s.vec(slot)
}

// Search returns up to k slots whose similarity to q is positive and at least minScore, best
// first; equal scores are ordered by slot. (A vector that shares nothing with q is never a
// result, even for a minScore of 0.) accept, when not nil, is asked about each qualifying
// slot before it takes a place in the result (the index uses it to skip expired entries).
//
// Every hit's score is its exact similarity. Within the set's Limits (all of them with the
// zero Limits) the result is the exact one; past them, a vector may be missed, never
// reported with a wrong score.
func (s *Set) Search(q Vector, k int, minScore float32, accept func(slot uint32) bool) []Hit {
	return s.SearchNear(q, k, minScore, accept, nil)
}

// SearchNear is Search that also records in near, when it is not nil, what a walk of the
// graph found near q (see Near); near is emptied when the search did not walk the graph.
func (s *Set) SearchNear(q Vector, k int, minScore float32, accept func(slot uint32) bool, near *Near) []Hit {
	if near != nil {
		near.reset()
	}
	if k <= 0 || s.count == 0 || q.Sparse() != s.sparse || q.Len() == 0 {
		return nil
	}
	t := &topK{hits: make([]Hit, 0, k), k: k, min: minScore, accept: accept}
	if !s.sparse && len(q.Dense) != s.dim {
		return nil
	}
	if s.GraphReady() {
		sc := s.takeScratch()
		defer s.returnScratch(sc)
		sc.seeds = sc.seeds[:0]
		if s.sparse && s.searchSparse(sc, q, minScore, t, s.seedLimits()) {
			// The rarest lists sufficed: the walk could add nothing.
			if near != nil && len(sc.seeds) > 0 {
				near.record(s.graph, sc.seeds)
			}
			return t.hits
		}
		walked := s.searchGraph(sc, q, k, t)
		if near != nil && len(walked) > 0 {
			near.record(s.graph, walked)
		}
		return t.hits
	}
	if s.sparse {
		sc := s.takeScratch()
		defer s.returnScratch(sc)
		s.searchSparse(sc, q, minScore, t, s.limits)
	} else {
		for slot, live := range s.live {
			if live {
				t.consider(uint32(slot), denseDot(q.Dense, s.dense.of(uint32(slot))))
			}
		}
	}
	return t.hits
}

// topK keeps the best k accepted hits seen so far, best first.
type topK struct {
	hits   []Hit
	k      int
	min    float32
	accept func(uint32) bool
}

func (t *topK) consider(slot uint32, score float32) {
	if score <= 0 || score < t.min || (len(t.hits) == t.k && !better(Hit{slot, score}, t.hits[t.k-1])) {
		return
	}
	for _, h := range t.hits {
		if h.Slot == slot { // found twice (by the postings and the graph)
			return
		}
	}
	if t.accept != nil && !t.accept(slot) {
		return
	}
	i, _ := slices.BinarySearchFunc(t.hits, Hit{slot, score}, func(a, b Hit) int {
		if better(a, b) {
			return -1
		}
		return 1
	})
	if len(t.hits) < t.k {
		t.hits = append(t.hits, Hit{})
	}
	copy(t.hits[i+1:], t.hits[i:len(t.hits)-1])
	t.hits[i] = Hit{slot, score}
}

// full reports whether k hits are held, and the worst of them.
func (t *topK) full() (Hit, bool) {
	if len(t.hits) < t.k {
		return Hit{}, false
	}
	return t.hits[t.k-1], true
}

func better(a, b Hit) bool {
	return a.Score > b.Score || (a.Score == b.Score && a.Slot < b.Slot)
}

// bestFirst orders hits for slices.SortFunc, best first.
func bestFirst(a, b Hit) int {
	switch {
	case better(a, b):
		return -1
	case better(b, a):
		return 1
	}
	return 0
}

// pruneMargin keeps float rounding from pruning a vector that is exactly at the minimum
// score: the bound is applied to a slightly lower score than asked for.
const pruneMargin = 1e-4

type searchScratch struct {
	// order is the query's coordinates shortest list first: each a list's length in the
	// high half and the coordinate's position in the low one, so that a plain sort of
	// integers orders them.
	order []uint64
	lists []postingList // lists[i] is the postings of the query's coordinate i
	segs  [][]posting   // the segments of the list being read
	// marks[slot].epoch == epoch marks a candidate of this search (or a node a walk has
	// reached); marks[slot].acc is a candidate's partial dot product so far. Side by side,
	// as a posting reads both: one cache miss for the pair.
	marks []slotMark
	cands []uint32
	// ranked holds the candidates that may reach the minimum score, with their partial
	// products (Score), in the order they are scored.
	ranked []Hit
	epoch  uint32
	// cand and res are a graph walk's heaps; seeds are where it starts.
	cand, res, seeds []Hit
	// qt is the sparse query's table, built by each search before it scores candidates.
	qt queryTable
	// picked and base are the tables of the vectors that linking compares others with:
	// the neighbours selectNeighbours has picked, and the node prune trims.
	picked []queryTable
	base   queryTable
	// pruned holds prune's candidates.
	pruned []Hit
	// next holds the neighbours a walk scores next, scores their scores; sink keeps what
	// arena.touch read.
	next   []uint32
	scores []float32
	sink   uint32
}

// slotMark is what a search keeps of one slot.
type slotMark struct {
	epoch uint32
	acc   float32
}

// mark starts a search over n slots: a slot is marked seen by setting its mark's epoch to
// the new epoch.
func (sc *searchScratch) mark(n int) {
	if len(sc.marks) < n {
		n += n / 4
		sc.marks = make([]slotMark, n)
		sc.epoch = 0
	}
	sc.epoch++
	if sc.epoch == 0 { // wrapped: old marks could collide with the new epoch
		clear(sc.marks)
		sc.epoch = 1
	}
}

// walkFactor bounds the pruning walk: a list is walked only while it is at most this many
// times longer than the number of candidates, since adding a posting costs a few
// nanoseconds and scoring a candidate in full a few hundred.
const walkFactor = 16

// searchSparse offers t the candidates the postings give within limits and reports
// whether the result is the exact one all the same: the lists it read cover enough of the
// query that no vector outside them reaches minScore, and it scored every candidate that
// could still beat the k-th hit. With a graph it also keeps every vector it scored in
// sc.seeds, where the graph's walk starts.
func (s *Set) searchSparse(sc *searchScratch, q Vector, minScore float32, t *topK, limits Limits) (exact bool) {
	sc.mark(len(s.live))
	sc.cands = sc.cands[:0]

	// The query's lists, shortest first; each is looked up once.
	sc.order = sc.order[:0]
	sc.lists = sc.lists[:0]
	for i, f := range q.Indices {
		var list postingList
		if e := s.postings.find(f); e != nil {
			list = e.postingList
		}
		sc.lists = append(sc.lists, list)
		sc.order = append(sc.order, uint64(list.len())<<32|uint64(i))
	}
	slices.Sort(sc.order)
	// rest is the squared norm of the query's coordinates that not every candidate's
	// partial product has taken into account yet.
	var rest float32
	for _, w := range q.Values {
		rest += w * w
	}
	bound := minScore - pruneMargin
	limited := limits.Postings > 0
	budget := limits.Postings

	// Candidates: the lists of P. Past the budget, a list is read from its newest end only,
	// and its weight stays in rest: the slots it added have that coordinate counted twice
	// in their upper bound, which is loose but still an upper bound.
	next := 0
	for ; next < len(sc.order); next++ {
		if (bound > 0 && rest < bound*bound) || (limited && budget == 0) {
			break
		}
		i := uint32(sc.order[next])
		qw := q.Values[i]
		list := &sc.lists[i]
		n := list.len()
		if limited && n > budget {
			n = budget
		} else {
			rest -= qw * qw
		}
		budget -= n
		sc.segs = list.appendTail(sc.segs[:0], n)
		for _, seg := range sc.segs {
			for _, p := range seg {
				if !s.live[p.slot] {
					continue
				}
				m := &sc.marks[p.slot]
				if m.epoch != sc.epoch {
					*m = slotMark{epoch: sc.epoch}
					sc.cands = append(sc.cands, p.slot)
				}
				m.acc += qw * p.weight
			}
		}
	}
	complete := bound > 0 && rest < bound*bound
	// Pruning: more of the query's lists, for the candidates only.
	for ; bound > 0 && next < len(sc.order); next++ {
		i := uint32(sc.order[next])
		list := &sc.lists[i]
		n := list.len()
		if n > walkFactor*len(sc.cands)+64 || (limited && n > budget) {
			break
		}
		budget -= n
		qw := q.Values[i]
		rest -= qw * qw
		sc.segs = list.appendTail(sc.segs[:0], n)
		for _, seg := range sc.segs {
			for _, p := range seg {
				if m := &sc.marks[p.slot]; m.epoch == sc.epoch && s.live[p.slot] {
					m.acc += qw * p.weight
				}
			}
		}
	}
	restNorm := float32(math.Sqrt(float64(max(rest, 0))))
	sc.qt.reset(q)
	if !limited {
		for _, slot := range sc.cands {
			if bound > 0 && sc.marks[slot].acc+restNorm < bound {
				continue // cannot reach minScore
			}
			t.consider(slot, sc.qt.dot(s.vecs.get(slot)))
		}
		return true
	}
	// Limited: the candidates with the highest partial products first (acc+restNorm is
	// each one's upper bound), at most Scored of them, stopping as soon as the next cannot
	// beat the k-th hit held.
	ranked := sc.ranked[:0]
	for _, slot := range sc.cands {
		if acc := sc.marks[slot].acc; bound <= 0 || acc+restNorm >= bound {
			ranked = append(ranked, Hit{slot, acc})
		}
	}
	sc.ranked = ranked
	cut := false
	if n := limits.Scored; n > 0 && len(ranked) > n {
		selectTop(ranked, n)
		ranked = ranked[:n]
		cut = true
	}
	slices.SortFunc(ranked, func(a, b Hit) int {
		if c := cmp.Compare(b.Score, a.Score); c != 0 {
			return c
		}
		return cmp.Compare(a.Slot, b.Slot)
	})
	// The best candidates are all or most scored: their blocks are read at once first, so
	// that their cache misses overlap (arena.touch).
	for _, h := range ranked[:min(len(ranked), maxTouched)] {
		sc.sink ^= s.vecs.touchSlot(h.Slot)
	}
	for _, h := range ranked {
		slot := h.Slot
		if worst, full := t.full(); full && h.Score+restNorm < worst.Score-pruneMargin {
			// The candidates left out by Scored have lower partial products still.
			return complete
		}
		score := sc.qt.dot(s.vecs.get(slot))
		t.consider(slot, score)
		if s.graph != nil {
			sc.seeds = append(sc.seeds, Hit{slot, score})
		}
	}
	return complete && !cut
}

// maxTouched is how many of a bounded search's candidates are read ahead of scoring: the
// seeds of a graph's search (16) and more, without filling the first-level cache.
const maxTouched = 32

func (s *Set) takeScratch() *searchScratch {
	s.spareMu.Lock()
	if n := len(s.spare); n > 0 {
		sc := s.spare[n-1]
		s.spare = s.spare[:n-1]
		s.spareMu.Unlock()
		return sc
	}
	s.spareMu.Unlock()
	// Allocated outside the lock: an allocation may wait on the garbage collector, and
	// every search that starts meanwhile would wait behind it.
	return &searchScratch{}
}

func (s *Set) returnScratch(sc *searchScratch) {
	clear(sc.lists) // a rebuild replaces the set's lists; a spare scratch must not keep old ones
	clear(sc.segs)
	s.spareMu.Lock()
	defer s.spareMu.Unlock()
	if len(s.spare) < maxSpare {
		s.spare = append(s.spare, sc)
	}
}

// selectTop reorders hits so that its first n hold n of the hits with the highest Score
// (quickselect; the order within either part is unspecified).
func selectTop(hits []Hit, n int) {
	lo, hi := 0, len(hits)-1
	for lo < hi {
		// Median of three as the pivot, so that sorted input stays linear.
		mid := lo + (hi-lo)/2
		a, b, c := hits[lo].Score, hits[mid].Score, hits[hi].Score
		pivot := max(min(a, b), min(max(a, b), c))
		i, j := lo, hi
		for i <= j {
			for hits[i].Score > pivot {
				i++
			}
			for hits[j].Score < pivot {
				j--
			}
			if i <= j {
				hits[i], hits[j] = hits[j], hits[i]
				i++
				j--
			}
		}
		switch {
		case n-1 <= j:
			hi = j
		case n-1 >= i:
			lo = i
		default:
			return
		}
	}
}
