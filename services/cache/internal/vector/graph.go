package vector

import (
	"math"
	"math/rand/v2"
	"slices"
)

// Graph configures the approximate search of large sets: a hierarchical navigable small
// world graph (Malkov and Yashunin, 2018) over the set's slots. A search walks the graph
// from a fixed entry point towards the query, comparing the query with a few hundred
// vectors whatever the size of the set, instead of reading posting lists or scanning
// vectors whose length grows with it. Every score it returns is the exact similarity,
// computed from the stored vector; what the graph trades is recall: a vector the walk does
// not reach is not returned, which for the cache costs a model call, never a wrong answer.
//
// The zero Graph never builds one.
type Graph struct {
	// MinLen is the number of vectors at which a set builds its graph; once every vector
	// present then is linked, searches go through the graph. A set that shrinks below a
	// quarter of MinLen drops its graph and searches as before.
	MinLen int
	// M is how many links a node keeps on each upper layer; layer 0 keeps 2M.
	M int
	// EfConstruction is how many candidates the search that links a new vector keeps.
	EfConstruction int
	// EfSearch is how many candidates a search keeps (at least the k asked for).
	EfSearch int
	// Seed seeds the draw of each node's layer.
	Seed uint64
	// SeedsPer grows the seeds' postings budget with the set: at least one posting per
	// SeedsPer vectors held (and a scored candidate per 64 of them), because a rare
	// coordinate's list grows with the set and the seeds find close vectors only when
	// such lists are read whole. 0: Seeds as they are.
	SeedsPer int
	// Seeds bound the postings search that a sparse set runs beside the walk: the vectors
	// it finds through the query's rarest coordinates are candidates, and the walk starts
	// from them too. A close vector that shares a rare word with the query is found this
	// way even where the graph's neighbourhoods are flat (prompts from one template that
	// differ in a number), and one that shares only common words through the graph.
	Seeds Limits
}

// maxLevel caps a node's layer: with M of 8 or more, layer 16 is reached once in 8^16
// nodes, so the cap only guards the uint8 that stores it.
const maxLevel = 16

// graph is the state of a set's graph. Only the linking (PlanLink, then ApplyLink) changes
// the links; Add and Remove change vectors and the queue of slots to link, never a link,
// so that a plan made under a read lock stays consistent until it is applied.
type graph struct {
	cfg Graph
	ml  float64 // 1/ln(M): layer l is reached with probability M^-l
	rng *rand.Rand

	// Per slot: the node's layer, and its links: layer 0 as a count and 2M slots in
	// links0.of(slot), upper layers as a count and M slots per layer in *upper.at(slot).
	// The links grow a chunk at a time (chunks.go).
	level  []uint8
	links0 strided[uint32]
	upper  strided[[]uint32]

	entry    uint32
	top      int
	hasEntry bool

	// pending holds the slots to link, oldest first; queued marks them. A removed slot's
	// vector stays in place, unreachable by Search's results but still a step for walks,
	// until Add reuses the slot: the new vector is then linked, and the links that led to
	// the old one lead to the new one until pruning drops them (a far neighbour goes
	// first). gen counts the vectors each slot has held, so that a plan for a vector that
	// was replaced in the meantime is not applied.
	pending []uint32
	queued  []bool
	gen     []uint32
	// near holds, for queued slots whose vector a search walked the graph for, what it found
	// near the vector (see Near).
	near map[uint32]*Near
	// version counts applied plans: a plan made before another was applied is stale.
	version uint64
	// unbuilt counts the vectors present when the graph was built that are still queued
	// (the first of pending, which is first in, first out). The graph serves once it is 0;
	// until then searches use the set's other path. Vectors stored meanwhile need not be
	// linked too: under a steady stream of stores the queue may never empty, and the graph
	// would never serve.
	unbuilt int
}

func newGraph(cfg Graph) *graph {
	return &graph{
		cfg: cfg, ml: 1 / math.Log(float64(cfg.M)), rng: rand.New(rand.NewPCG(cfg.Seed, 0x9e3779b97f4a7c15)),
		links0: newStrided[uint32](2*cfg.M+1, 4, linkChunkBytes),
		upper:  newStrided[[]uint32](1, 24, linkChunkBytes),
	}
}

// grow makes room for the slots below n, drawing the layer of each new one.
func (g *graph) grow(n int) {
	g.links0.grow(n)
	g.upper.grow(n)
	for len(g.level) < n {
		l := int(-math.Log(1-g.rng.Float64()) * g.ml)
		l = min(l, maxLevel)
		if l > 0 {
			*g.upper.at(uint32(len(g.level))) = make([]uint32, l*(g.cfg.M+1))
		}
		g.level = append(g.level, uint8(l))
		g.queued = append(g.queued, false)
		g.gen = append(g.gen, 0)
	}
}

// enqueue asks for slot's (new) vector to be linked, with what a search for it found near it
// (nil when nothing was recorded, or near was recorded on another graph).
func (g *graph) enqueue(slot uint32, near *Near) {
	g.gen[slot]++
	if near != nil && near.g == g && len(near.hits) > 0 {
		if g.near == nil {
			g.near = make(map[uint32]*Near)
		}
		g.near[slot] = near
	} else {
		delete(g.near, slot)
	}
	if !g.queued[slot] {
		g.queued[slot] = true
		g.pending = append(g.pending, slot)
	}
}

// links returns slot's links on level, sharing the graph's storage.
func (g *graph) links(slot uint32, level int) []uint32 {
	if level == 0 {
		l := g.links0.of(slot)
		return l[1 : 1+l[0]]
	}
	m := g.cfg.M
	up := *g.upper.at(slot)
	base := (level - 1) * (m + 1)
	return up[base+1 : base+1+int(up[base])]
}

func (g *graph) setLinks(slot uint32, level int, links []uint32) {
	if level == 0 {
		l := g.links0.of(slot)
		l[0] = uint32(len(links))
		copy(l[1:], links)
		return
	}
	up := *g.upper.at(slot)
	base := (level - 1) * (g.cfg.M + 1)
	up[base] = uint32(len(links))
	copy(up[base+1:], links)
}

// maxLinks is how many links a node keeps on level.
func (g *graph) maxLinks(level int) int {
	if level == 0 {
		return 2 * g.cfg.M
	}
	return g.cfg.M
}

// Pending returns the number of vectors waiting to be linked into the graph (0 without one).
func (s *Set) Pending() int {
	if s.graph == nil {
		return 0
	}
	return len(s.graph.pending)
}

// GraphReady reports whether searches go through the graph.
func (s *Set) GraphReady() bool { return s.graph != nil && s.graph.unbuilt == 0 }

// score is the similarity of q to the vector in slot, live or not: exactly what Dot
// returns for them.
func (s *Set) score(q Vector, slot uint32) float32 {
	if s.sparse {
		indices, values := s.vecs.get(slot)
		return sparseDot(q.Indices, q.Values, indices, values)
	}
	return denseDot(q.Dense, s.dense.of(slot))
}

// vec is the vector in slot, live or not.
func (s *Set) vec(slot uint32) Vector {
	if s.sparse {
		indices, values := s.vecs.get(slot)
		return Vector{Indices: indices, Values: values}
	}
	return Vector{Dense: s.dense.of(slot)}
}

// buildGraph starts a graph over the set: every live vector is queued for linking.
func (s *Set) buildGraph() {
	g := newGraph(s.graphCfg)
	g.grow(len(s.live))
	for slot, live := range s.live {
		if live {
			g.enqueue(uint32(slot), nil)
		}
	}
	g.unbuilt = len(g.pending)
	s.graph = g
}

// dropGraph returns a set that has shrunk to searching without the graph. A sparse set's
// removed slots, whose vectors the graph kept, let their vectors go.
func (s *Set) dropGraph() {
	s.graph = nil
	if !s.sparse {
		return
	}
	for slot, live := range s.live {
		if !live {
			s.vecs.release(uint32(slot))
		}
	}
}

// LinkPlan is the linking of one queued vector, computed by PlanLink without changing the
// set and applied by ApplyLink.
type LinkPlan struct {
	slot    uint32
	gen     uint32
	version uint64
	level   int
	lists   []planList
	// buf holds the lists' links: a plan's lists share its arrays instead of one each.
	buf []uint32
}

// take returns room for n links in p's own array.
func (p *LinkPlan) take(n int) []uint32 {
	if cap(p.buf)-len(p.buf) < n {
		p.buf = make([]uint32, 0, max(n, 2*cap(p.buf), 160))
	}
	start := len(p.buf)
	p.buf = p.buf[:start+n]
	return p.buf[start : start+n : start+n]
}

type planList struct {
	slot  uint32
	level int
	links []uint32
}

// PlanLink computes the links of the oldest queued vector: the search for its neighbours
// and the pruned lists of those neighbours. It only reads the set, so it may run
// concurrently with Searches (under the same read lock); nil when nothing is queued.
// Only one plan may be in flight at a time: ApplyLink refuses a plan made before another
// was applied.
func (s *Set) PlanLink() *LinkPlan {
	g := s.graph
	if g == nil || len(g.pending) == 0 {
		return nil
	}
	slot := g.pending[0]
	p := &LinkPlan{slot: slot, gen: g.gen[slot], version: g.version, level: int(g.level[slot])}
	if !s.live[slot] || !g.hasEntry || (g.entry == slot && g.top >= p.level) {
		// Removed before it was linked, the first node, or the entry point itself
		// replaced (its links are rebuilt as neighbours link to it).
		return p
	}
	sc := s.takeScratch()
	defer s.returnScratch(sc)
	// The bottom layer's links are chosen from a lookup's record of this vector (where its
	// walk ended, or the seeds its postings search scored), else from the seeds of this
	// vector's own postings search: the vectors that share its rarest coordinates, scored
	// exactly (docs/design/013-link-from-the-postings.md). That holds for a node of the
	// upper layers too: only those layers' links come from a walk.
	var seeds []Hit
	if near := g.near[slot]; near != nil {
		seeds = near.candidates(slot)
	}
	q := s.vec(slot)
	if len(seeds) == 0 && s.sparse {
		sc.seeds = sc.seeds[:0]
		limits := s.seedLimits()
		n := max(limits.Scored, 1)
		s.searchSparse(sc, q, 0, &topK{hits: make([]Hit, 0, n+1), k: n + 1}, limits)
		seeds = slices.DeleteFunc(slices.Clone(sc.seeds), func(h Hit) bool { return h.Slot == slot })
	}
	lowest := 0 // the lowest layer whose links come from a walk
	if len(seeds) > 0 {
		slices.SortFunc(seeds, bestFirst)
		lowest = 1
	}
	if p.level >= lowest {
		// A walk (the upper layers of a node drawn to them, or every layer where there are
		// no seeds: a dense set without a record, a vector sharing no coordinate): the
		// upper layers lead to the vector from the entry point, and each layer's walk
		// starts from where the one above ended.
		if s.sparse {
			sc.qt.reset(q) // the walk scores through the query's table
		}
		ep := Hit{g.entry, s.scoreQuery(sc, q, g.entry)}
		for l := g.top; l > p.level; l-- {
			ep = s.greedy(sc, q, ep, l)
		}
		eps := []Hit{ep}
		for l := min(g.top, p.level); l >= lowest; l-- {
			// A copy: the next layer starts from it, and the scratch serves that search too.
			w := slices.Clone(s.searchLayer(q, eps, g.cfg.EfConstruction, l, sc))
			w = slices.DeleteFunc(w, func(h Hit) bool { return h.Slot == slot })
			s.planLevel(p, l, w, sc)
			eps = w
		}
	}
	if lowest == 1 {
		s.planLevel(p, 0, seeds, sc)
	}
	return p
}

// planLevel adds to p the links of its vector on level, chosen from w (the nodes of level
// nearest to it, best first, itself not among them), and the lists of the neighbours that
// link back to it.
func (s *Set) planLevel(p *LinkPlan, l int, w []Hit, sc *searchScratch) {
	g := s.graph
	neighbours := s.selectNeighbours(p.take(g.cfg.M)[:0], w, g.cfg.M, sc)
	p.lists = append(p.lists, planList{p.slot, l, neighbours})
	for _, n := range neighbours {
		cur := g.links(n, l)
		if slices.Contains(cur, p.slot) {
			continue
		}
		next := p.take(len(cur) + 1)
		copy(next, cur)
		next[len(cur)] = p.slot
		if len(next) > g.maxLinks(l) {
			next = s.prune(n, next, g.maxLinks(l), sc)
			if !slices.Contains(next, p.slot) {
				continue // the new vector is the farthest: the list stays as it is
			}
		}
		p.lists = append(p.lists, planList{n, l, next})
	}
}

// ApplyLink installs p's links and reports whether it did; a plan for a vector replaced or
// already linked since, or made before another plan was applied, is refused (plan again).
// The caller holds the set exclusively.
func (s *Set) ApplyLink(p *LinkPlan) bool {
	g := s.graph
	if g == nil || p == nil || p.version != g.version || len(g.pending) == 0 || g.pending[0] != p.slot || g.gen[p.slot] != p.gen {
		return false
	}
	for _, pl := range p.lists {
		g.setLinks(pl.slot, pl.level, pl.links)
	}
	if s.live[p.slot] && (!g.hasEntry || p.level > g.top) {
		g.entry, g.top, g.hasEntry = p.slot, p.level, true
	}
	g.pending = g.pending[1:]
	g.queued[p.slot] = false
	delete(g.near, p.slot)
	g.version++
	if g.unbuilt > 0 {
		g.unbuilt--
	}
	return true
}

// LinkPending links up to n queued vectors at once (the caller holds the set exclusively)
// and returns how many it linked.
func (s *Set) LinkPending(n int) int {
	done := 0
	for done < n {
		p := s.PlanLink()
		if p == nil || !s.ApplyLink(p) {
			break
		}
		done++
	}
	return done
}

// scoreQuery is score(q, slot) through sc.qt, which holds q in a sparse set: the same
// value, for about half the work of merging the two index lists.
func (s *Set) scoreQuery(sc *searchScratch, q Vector, slot uint32) float32 {
	if s.sparse {
		return sc.qt.dot(s.vecs.get(slot))
	}
	return s.score(q, slot)
}

// scoreSlots returns q's similarity to each of slots (sc.qt holds a sparse q), in sc's
// storage. A sparse set reads every slot's block before scoring any (arena.touch), so that
// their cache misses overlap.
func (s *Set) scoreSlots(sc *searchScratch, q Vector, slots []uint32) []float32 {
	scores := sc.scores[:0]
	if s.sparse {
		sc.sink ^= s.vecs.touch(slots)
	}
	for _, n := range slots {
		scores = append(scores, s.scoreQuery(sc, q, n))
	}
	sc.scores = scores
	return scores
}

// greedy walks level from ep to the node closest to q (sc.qt holds a sparse q).
func (s *Set) greedy(sc *searchScratch, q Vector, ep Hit, level int) Hit {
	for changed := true; changed; {
		changed = false
		for _, n := range s.graph.links(ep.Slot, level) {
			if score := s.scoreQuery(sc, q, n); score > ep.Score {
				ep, changed = Hit{n, score}, true
			}
		}
	}
	return ep
}

// searchLayer returns the ef nodes of level closest to q that a best-first walk from eps
// finds, best first (Algorithm 2 of the paper); sc.qt holds a sparse q. The result is sc's
// storage, valid until the next searchLayer with sc.
func (s *Set) searchLayer(q Vector, eps []Hit, ef, level int, sc *searchScratch) []Hit {
	g := s.graph
	sc.mark(len(s.live))
	cand, res := sc.cand[:0], sc.res[:0]
	for _, ep := range eps {
		if sc.marks[ep.Slot].epoch == sc.epoch {
			continue
		}
		sc.marks[ep.Slot].epoch = sc.epoch
		cand = pushHit(cand, ep, better)
		res = pushHit(res, ep, worse)
		if len(res) > ef {
			_, res = popHit(res, worse)
		}
	}
	for len(cand) > 0 {
		var c Hit
		c, cand = popHit(cand, better)
		if len(res) >= ef && c.Score < res[0].Score {
			break
		}
		next := sc.next[:0]
		for _, n := range g.links(c.Slot, level) {
			if m := &sc.marks[n]; m.epoch != sc.epoch {
				m.epoch = sc.epoch
				next = append(next, n)
			}
		}
		sc.next = next
		for i, score := range s.scoreSlots(sc, q, next) {
			n := next[i]
			if len(res) < ef || score > res[0].Score {
				h := Hit{n, score}
				cand = pushHit(cand, h, better)
				res = pushHit(res, h, worse)
				if len(res) > ef {
					_, res = popHit(res, worse)
				}
			}
		}
	}
	sc.cand = cand
	slices.SortFunc(res, bestFirst)
	sc.res = res
	return res
}

// selectNeighbours picks up to m of cands (best first, scored against the vector being
// linked) by the paper's heuristic (Algorithm 4): a candidate closer to a node already
// picked than to the new vector is reached through that node and is left out, so links go
// in diverse directions and a walk can leave a dense cluster. A sparse set scores the
// candidates through a table of each node picked (sc.picked), built once per pick.
func (s *Set) selectNeighbours(out []uint32, cands []Hit, m int, sc *searchScratch) []uint32 {
	out = out[:0]
	if s.sparse && len(sc.picked) < m {
		sc.picked = append(sc.picked, make([]queryTable, m-len(sc.picked))...)
	}
	for _, c := range cands {
		if len(out) >= m {
			break
		}
		good := true
		for i, r := range out {
			var score float32
			if s.sparse {
				score = sc.picked[i].dot(s.vecs.get(c.Slot))
			} else {
				score = s.score(s.vec(c.Slot), r)
			}
			if score > c.Score {
				good = false
				break
			}
		}
		if good {
			if s.sparse {
				sc.picked[len(out)].reset(s.vec(c.Slot))
			}
			out = append(out, c.Slot)
		}
	}
	return out
}

// prune reduces node's list to its m closest links. Not the heuristic: it would compare
// every pair of the list, and a list overflows on most links made, so the heuristic here
// would be most of what linking costs; the node's own links, chosen when it was linked
// (or relinked), keep their diversity. It writes the result over list, which must be the
// caller's own.
func (s *Set) prune(node uint32, list []uint32, m int, sc *searchScratch) []uint32 {
	base := s.vec(node)
	if s.sparse {
		sc.base.reset(base)
	}
	cands := sc.pruned[:0]
	if s.sparse {
		sc.sink ^= s.vecs.touch(list)
	}
	for _, n := range list {
		var score float32
		if s.sparse {
			score = sc.base.dot(s.vecs.get(n))
		} else {
			score = s.score(base, n)
		}
		cands = append(cands, Hit{n, score})
	}
	slices.SortFunc(cands, bestFirst)
	sc.pruned = cands
	out := list[:m]
	for i, c := range cands[:m] {
		out[i] = c.Slot
	}
	return out
}

// searchGraph is Search through the graph: the walk's best ef are offered to t. It starts
// from sc.seeds, the best vectors the postings gave, or without them from the entry point
// down the upper layers. A dense set's queued vectors are scored one by
// one, as the walk cannot reach them yet; a sparse set's are in its postings, whose
// search (the seeds) reads the newest end of long lists, where they are, and leaves q's
// table in sc.qt for the walk. It returns the walk's result on the bottom layer, best first
// (sc's storage), nil when there was no walk.
func (s *Set) searchGraph(sc *searchScratch, q Vector, k int, t *topK) (walked []Hit) {
	g := s.graph
	if !s.sparse {
		for _, slot := range g.pending {
			if s.live[slot] {
				t.consider(slot, s.score(q, slot))
			}
		}
	}
	if !g.hasEntry {
		return nil
	}
	eps := sc.seeds
	if len(eps) == 0 {
		// Without seeds, the upper layers lead from the entry point towards q.
		ep := Hit{g.entry, s.scoreQuery(sc, q, g.entry)}
		for l := g.top; l > 0; l-- {
			ep = s.greedy(sc, q, ep, l)
		}
		eps = append(eps, ep)
	}
	walked = s.searchLayer(q, eps, max(g.cfg.EfSearch, k), 0, sc)
	for _, h := range walked {
		if s.live[h.Slot] {
			t.consider(h.Slot, h.Score)
		}
	}
	return walked
}

func worse(a, b Hit) bool { return better(b, a) }

// pushHit and popHit keep h as a binary heap whose top is the first by first.
func pushHit(h []Hit, x Hit, first func(a, b Hit) bool) []Hit {
	h = append(h, x)
	i := len(h) - 1
	for i > 0 {
		parent := (i - 1) / 2
		if !first(h[i], h[parent]) {
			break
		}
		h[i], h[parent] = h[parent], h[i]
		i = parent
	}
	return h
}

func popHit(h []Hit, first func(a, b Hit) bool) (Hit, []Hit) {
	top := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	i := 0
	for {
		l, r, best := 2*i+1, 2*i+2, i
		if l < n && first(h[l], h[best]) {
			best = l
		}
		if r < n && first(h[r], h[best]) {
			best = r
		}
		if best == i {
			break
		}
		h[i], h[best] = h[best], h[i]
		i = best
	}
	return top, h
}

// seedLimits is the graph's Seeds, grown with the set (Graph.SeedsPer).
func (s *Set) seedLimits() Limits {
	l := s.graphCfg.Seeds
	if per := s.graphCfg.SeedsPer; per > 0 && l.Postings > 0 {
		l.Postings = max(l.Postings, s.count/per)
		if l.Scored > 0 {
			l.Scored = max(l.Scored, l.Postings/64)
		}
	}
	return l
}
