package vector

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// clustered draws n unit vectors of dim dimensions around a few hundred centres, the shape
// of sentence embeddings (topics), so that nearest neighbours mean something.
func clustered(r *rand.Rand, n, dim int) []Vector {
	centres := make([][]float32, 300)
	for i := range centres {
		centres[i] = make([]float32, dim)
		for j := range centres[i] {
			centres[i][j] = float32(r.NormFloat64())
		}
	}
	out := make([]Vector, 0, n)
	for range n {
		c := centres[r.IntN(len(centres))]
		x := make([]float32, dim)
		for j := range x {
			x[j] = c[j] + 0.6*float32(r.NormFloat64())
		}
		v, err := NewDense(x)
		if err != nil {
			continue
		}
		out = append(out, v)
	}
	return out
}

// near is v moved a little: a paraphrase of a stored question.
func near(r *rand.Rand, v Vector) Vector {
	x := make([]float32, len(v.Dense))
	for j := range x {
		x[j] = v.Dense[j] + 0.02*float32(r.NormFloat64())
	}
	w, _ := NewDense(x)
	return w
}

// TestGraphRecall measures the graph search against scoring every vector, on dense
// vectors (the embedded index's graph for embedding models), after the set has turned
// over: 60% of its slots removed and reused by new vectors, as an LRU cache at its bound
// does, so the links left pointing at replaced vectors are part of what is measured.
// recall@1 counts the searches whose best hit has the best score there is. (The lexical
// embedder's sparse vectors are measured in the cache package, TestIndexRecall.)
func TestGraphRecall(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a graph of 20k vectors")
	}
	t.Parallel()
	const n, dim = 20_000, 64
	r := rand.New(rand.NewPCG(11, 12))
	cfg := Graph{MinLen: 1024, M: 16, EfConstruction: 100, EfSearch: 64, Seed: 1}
	set := NewSet(false, Limits{}, cfg)
	held := map[uint32]Vector{}
	var lastSlot uint32
	// Half the vectors are stored as the cache stores an answer, after a search for them
	// whose walk the linking starts from (AddNear), half without one.
	add := func(v Vector) {
		var near *Near
		if r.IntN(2) == 0 {
			near = new(Near)
			set.SearchNear(v, 5, -1, nil, near)
		}
		slot, err := set.AddNear(v, near)
		if err != nil {
			t.Fatalf("Add: %v", err)
		}
		held[slot] = v
		lastSlot = slot
		set.LinkPending(1 << 30)
	}
	for _, v := range clustered(r, n, dim) {
		add(v)
	}
	// Turn over 60% of the set: remove a random slot, add a new vector (into that slot).
	// Slots are drawn from r and a slice, not from the map's order, so that every run
	// measures the same set: a recall that varies between runs cannot be held to a bound.
	slots := make([]uint32, 0, len(held))
	for slot := range held {
		slots = append(slots, slot)
	}
	slices.Sort(slots)
	for _, v := range clustered(r, n*6/10, dim) {
		i := r.IntN(len(slots))
		set.Remove(slots[i])
		delete(held, slots[i])
		slots[i] = slots[len(slots)-1]
		slots = slots[:len(slots)-1]
		add(v)
		slots = append(slots, lastSlot)
	}
	if !set.GraphReady() {
		t.Fatal("the set does not search through its graph")
	}
	// Near: a stored vector moved a little, as a paraphrase is (similarity about 0.99), the
	// search the cache lives on. New: a point of a cluster not stored, whose nearest
	// neighbour is one of many at similar distances, the hard case for any graph.
	const queries = 250
	for _, kind := range []struct {
		name string
		want float64
		draw func() Vector
	}{
		{"near", 0.99, func() Vector { return near(r, held[slots[r.IntN(len(slots))]]) }},
		{"new", 0.85, func() Vector { return clustered(r, 1, dim)[0] }},
	} {
		found := 0
		for range queries {
			q := kind.draw()
			want := bruteForce(held, q, 1, -1, nil)
			got := set.Search(q, 5, -1, nil)
			if len(got) > 0 && len(want) > 0 && got[0].Score == want[0].Score {
				found++
			}
			for _, h := range got {
				if v, ok := held[h.Slot]; !ok || h.Score != Dot(q, v) {
					t.Fatalf("hit %v is not a held vector with its exact score", h)
				}
			}
		}
		recall := float64(found) / queries
		t.Logf("%s questions: recall@1 %.3f (%d vectors after turnover, %d queries)", kind.name, recall, len(held), queries)
		if recall < kind.want {
			t.Errorf("%s questions: recall@1 %.3f, want at least %.2f", kind.name, recall, kind.want)
		}
	}
}

func BenchmarkGraphSearchDense(b *testing.B) {
	const dim = 768
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("vectors=%d", n), func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 2))
			set := NewSet(false, Limits{}, Graph{MinLen: 1024, M: 16, EfConstruction: 100, EfSearch: 64, Seed: 1})
			vs := clustered(r, n, dim)
			for _, v := range vs {
				if _, err := set.Add(v); err != nil {
					b.Fatal(err)
				}
				set.LinkPending(1 << 30)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				set.Search(near(r, vs[i%len(vs)]), 5, 0.9, nil)
				i++
			}
		})
	}
}

// Linking a sparse vector compares vectors through tables (the vectors picked as
// neighbours, the node pruned) rather than by merging index lists; the links chosen must
// be those the merge's scores choose, for lists of every length the heuristic sees.
func TestSparseLinkingMatchesMerge(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(21, 22))
	set := NewSet(true, Limits{}, Graph{})
	base := randomSparse(t, r, 40, 1<<20)
	for range 300 {
		// Most coordinates shared, as prompts of one template do, so that candidates are
		// close to each other and the heuristic leaves some out.
		fs := make([]Feature, 0, 48)
		for j, k := range base.Indices {
			if r.IntN(5) != 0 {
				fs = append(fs, Feature{Index: k, Weight: base.Values[j] * (0.5 + r.Float32())})
			}
		}
		for range 8 {
			fs = append(fs, Feature{Index: r.Uint32N(1 << 20), Weight: r.Float32() + 0.01})
		}
		v, err := NewSparse(fs)
		if err != nil {
			t.Fatalf("NewSparse: %v", err)
		}
		if _, err := set.Add(v); err != nil {
			t.Fatalf("Add: %v", err)
		}
	}
	sc := &searchScratch{}
	for _, tt := range []struct {
		name  string
		cands int
		m     int
	}{
		{"one candidate", 1, 4},
		{"fewer candidates than links", 3, 8},
		{"the linker's sizes", 24, 8},
		{"many candidates, few links", 100, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for trial := range 20 {
				q := set.vec(uint32(r.IntN(300)))
				var cands []Hit
				for _, slot := range r.Perm(300)[:tt.cands] {
					cands = append(cands, Hit{uint32(slot), set.score(q, uint32(slot))})
				}
				slices.SortFunc(cands, func(a, b Hit) int {
					if better(a, b) {
						return -1
					}
					return 1
				})
				// The heuristic with merged scores.
				var want []uint32
				for _, c := range cands {
					if len(want) >= tt.m {
						break
					}
					good := true
					for _, p := range want {
						if set.score(set.vec(c.Slot), p) > c.Score {
							good = false
							break
						}
					}
					if good {
						want = append(want, c.Slot)
					}
				}
				if got := set.selectNeighbours(nil, cands, tt.m, sc); !slices.Equal(got, want) {
					t.Fatalf("trial %d: selectNeighbours = %v, want %v", trial, got, want)
				}
				// prune: the m closest to the node by merged scores, closest first.
				node := cands[0].Slot
				list := make([]uint32, 0, len(cands))
				byMerge := make([]Hit, 0, len(cands))
				for _, c := range cands {
					list = append(list, c.Slot)
					byMerge = append(byMerge, Hit{c.Slot, set.score(set.vec(node), c.Slot)})
				}
				slices.SortFunc(byMerge, func(a, b Hit) int {
					if better(a, b) {
						return -1
					}
					return 1
				})
				m := min(tt.m, len(list))
				wantPrune := make([]uint32, 0, m)
				for _, h := range byMerge[:m] {
					wantPrune = append(wantPrune, h.Slot)
				}
				if got := set.prune(node, list, m, sc); !slices.Equal(got, wantPrune) {
					t.Fatalf("trial %d: prune = %v, want %v", trial, got, wantPrune)
				}
			}
		})
	}
}

// TestNearStandsInForTheLinkingSearch: a vector added with what a search for it recorded
// is linked from that record (to the nodes the walk found, which the search then reaches
// it through), and a record that no longer describes the graph is not used: one from a
// graph since dropped, and nodes whose slots took other vectors.
func TestNearStandsInForTheLinkingSearch(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(5, 6))
	cfg := Graph{MinLen: 64, M: 4, EfConstruction: 16, EfSearch: 8, Seed: 1}
	vs := clustered(r, 400, 16)
	set := NewSet(false, Limits{}, cfg)
	for _, v := range vs[:300] {
		if _, err := set.Add(v); err != nil {
			t.Fatalf("Add: %v", err)
		}
	}
	set.LinkPending(1 << 20)
	if !set.GraphReady() {
		t.Fatal("no graph")
	}

	t.Run("linked from the record", func(t *testing.T) {
		// Every vector's bottom-layer links come from the record, whatever its layer (the
		// upper layers of one drawn to them are walked): vectors are added until both kinds
		// were checked.
		bottom, upper := 0, 0
		for i := 350; bottom == 0 || upper == 0; i++ {
			if i == len(vs) {
				t.Fatalf("%d vectors drawn to the bottom layer alone and %d to upper ones, want both", bottom, upper)
			}
			q, near := vs[i], new(Near)
			set.SearchNear(q, 3, -1, nil, near)
			if len(near.hits) == 0 {
				t.Fatal("a search through the graph recorded nothing")
			}
			slot, err := set.AddNear(q, near)
			if err != nil {
				t.Fatalf("AddNear: %v", err)
			}
			if set.graph.near[slot] != near {
				t.Fatal("the record was not kept for the linking")
			}
			set.LinkPending(1 << 20)
			if _, kept := set.graph.near[slot]; kept {
				t.Error("the record outlived the linking")
			}
			recorded := map[uint32]bool{}
			for _, h := range near.hits {
				recorded[h.Slot] = true
			}
			checkLinkedFrom(t, set, slot, q, recorded)
			if set.graph.level[slot] == 0 {
				bottom++
			} else {
				upper++
			}
		}
	})

	t.Run("replaced nodes are left out", func(t *testing.T) {
		q := vs[301]
		near := new(Near)
		set.SearchNear(q, 3, -1, nil, near)
		replaced := near.hits[0].Slot
		set.Remove(replaced)
		if slot, err := set.Add(vs[302]); err != nil || slot != replaced {
			t.Fatalf("Add = %d, %v; want the freed slot %d", slot, err, replaced)
		}
		for _, h := range near.candidates(1 << 30) {
			if h.Slot == replaced {
				t.Fatalf("candidates keep slot %d, which holds another vector now", replaced)
			}
		}
	})

	t.Run("a record of a dropped graph is ignored", func(t *testing.T) {
		near := new(Near)
		set.SearchNear(vs[303], 3, -1, nil, near)
		old := set.graph
		set.dropGraph()
		set.buildGraph()
		if set.graph == old {
			t.Fatal("the graph was not rebuilt")
		}
		slot, err := set.AddNear(vs[303], near)
		if err != nil {
			t.Fatalf("AddNear: %v", err)
		}
		if _, kept := set.graph.near[slot]; kept {
			t.Error("a record of the dropped graph was kept")
		}
		set.LinkPending(1 << 20)
		if set.Pending() != 0 {
			t.Errorf("%d vectors left unlinked", set.Pending())
		}
	})
}

// The seeds' budget grows with the set once a rare coordinate's list can outgrow it.
func TestSeedLimitsGrowWithTheSet(t *testing.T) {
	t.Parallel()
	base := Limits{Postings: 512, Scored: 32}
	for _, tt := range []struct {
		name  string
		per   int
		count int
		want  Limits
	}{
		{"small set", 256, 30_000, base},
		{"at the turn", 256, 512 * 256, base},
		{"a million", 256, 1_000_000, Limits{Postings: 3906, Scored: 61}},
		{"no growth", 0, 1_000_000, base},
	} {
		s := &Set{graphCfg: Graph{Seeds: base, SeedsPer: tt.per}, count: tt.count}
		if got := s.seedLimits(); got != tt.want {
			t.Errorf("%s: seedLimits() = %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

// TestLinksChosenFromTheSeeds: a search whose postings sufficed records the seeds it
// scored (each with its exact score, the new vector not among them), and a vector added
// with that record is linked from them without a walk: it has links, on the bottom layer
// every one to a recorded seed, each live, and a search for it finds it first.
func TestLinksChosenFromTheSeeds(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(31, 32))
	// Short posting lists (30 coordinates each out of 2000) that the seeds' budget reads
	// whole, so that the postings answer exactly and no search walks.
	set := linkedSparseSet(t, r, Limits{Postings: 4096, Scored: 256})
	for trial := range 20 {
		q := randomSparse(t, r, 30, 2000)
		near := new(Near)
		set.SearchNear(q, 3, 0.05, nil, near)
		if len(near.hits) == 0 {
			t.Fatalf("trial %d: nothing recorded, want the seeds of an exact postings search", trial)
		}
		seeds := map[uint32]bool{}
		for _, h := range near.hits {
			if want := set.score(q, h.Slot); h.Score != want {
				t.Fatalf("trial %d: seed %d scored %v, exact %v", trial, h.Slot, h.Score, want)
			}
			seeds[h.Slot] = true
		}
		slot, err := set.AddNear(q, near)
		if err != nil {
			t.Fatalf("AddNear: %v", err)
		}
		set.LinkPending(1 << 20)
		checkLinkedFrom(t, set, slot, q, seeds)
	}
}

// TestLinksFromThePostingsWithoutARecord: a vector stored without a lookup's record (a
// store without a lease, a graph's first build) is linked on the bottom layer from the
// seeds its own postings search scores, without a walk there, whatever its layer: every
// bottom-layer link is one of them, one drawn to an upper layer has links there too (a
// walk), and a search for it finds it first.
func TestLinksFromThePostingsWithoutARecord(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(33, 34))
	// Few seeds: a walk from them would reach nodes beyond them.
	set := linkedSparseSet(t, r, Limits{Postings: 64, Scored: 4})
	upper := 0
	for range 40 {
		q := randomSparse(t, r, 30, 2000)
		slot, err := set.Add(q)
		if err != nil {
			t.Fatalf("Add: %v", err)
		}
		// The seeds the linking's postings search scores, asked the same way.
		sc := set.takeScratch()
		sc.seeds = sc.seeds[:0]
		limits := set.seedLimits()
		set.searchSparse(sc, q, 0, &topK{hits: make([]Hit, 0, limits.Scored+1), k: limits.Scored + 1}, limits)
		seeds := map[uint32]bool{}
		for _, h := range sc.seeds {
			seeds[h.Slot] = true
		}
		set.returnScratch(sc)
		set.LinkPending(1 << 20)
		if set.graph.level[slot] > 0 {
			upper++
		}
		checkLinkedFrom(t, set, slot, q, seeds)
	}
	if upper == 0 {
		t.Fatal("no vector of 40 drawn to an upper layer: the test checks only the bottom one")
	}
}

// linkedSparseSet is a sparse set of 300 random vectors (30 coordinates of 2000 each)
// whose graph is built, with seeds as the postings search's limits for its walks.
func linkedSparseSet(t *testing.T, r *rand.Rand, seeds Limits) *Set {
	t.Helper()
	set := NewSet(true, Limits{}, Graph{MinLen: 64, M: 4, EfConstruction: 16, EfSearch: 8, Seed: 1, Seeds: seeds})
	for range 300 {
		if _, err := set.Add(randomSparse(t, r, 30, 2000)); err != nil {
			t.Fatalf("Add: %v", err)
		}
	}
	set.LinkPending(1 << 20)
	if !set.GraphReady() {
		t.Fatal("no graph")
	}
	return set
}

// checkLinkedFrom fails unless the vector q stored in slot has links, each to another
// live node, on the bottom layer each to one of from (linked there without a walk), on
// each upper layer it was drawn to below the graph's top some (a walk), and a search for q
// finds it first.
func checkLinkedFrom(t *testing.T, set *Set, slot uint32, q Vector, from map[uint32]bool) {
	t.Helper()
	g := set.graph
	for l := 0; l <= int(g.level[slot]); l++ {
		links := g.links(slot, l)
		if len(links) == 0 && (l == 0 || l < g.top || g.entry != slot) {
			t.Fatalf("the vector has no links on layer %d", l)
		}
		for _, n := range links {
			if n == slot || !set.live[n] {
				t.Fatalf("layer %d: link to %d (itself, or not live)", l, n)
			}
			if l == 0 && !from[n] {
				t.Fatalf("link to %d, not a seed: the linking walked the bottom layer", n)
			}
		}
	}
	if got := set.Search(q, 1, -1, nil); len(got) == 0 || got[0].Slot != slot {
		t.Fatalf("Search for the vector = %v, want slot %d first", got, slot)
	}
}

// TestGraphReadyUnderSteadyStores: a graph serves once the vectors present when it was
// built are linked, even when stores keep the queue from ever emptying (a linker that
// links one vector per vector stored), and not before.
func TestGraphReadyUnderSteadyStores(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(41, 42))
	for _, sparse := range []bool{true, false} {
		cfg := Graph{MinLen: 64, M: 4, EfConstruction: 16, EfSearch: 8, Seed: 1, Seeds: Limits{Postings: 512, Scored: 16}}
		set := NewSet(sparse, Limits{}, cfg)
		add := func() {
			var v Vector
			if sparse {
				v = randomSparse(t, r, 20, 5000)
			} else {
				v = clustered(r, 1, 16)[0]
			}
			if _, err := set.Add(v); err != nil {
				t.Fatalf("Add: %v", err)
			}
		}
		for range cfg.MinLen {
			add()
		}
		for i := range cfg.MinLen {
			if set.GraphReady() {
				t.Fatalf("sparse %v: ready after %d of the %d vectors it was built with", sparse, i, cfg.MinLen)
			}
			add()
			if n := set.LinkPending(1); n != 1 {
				t.Fatalf("sparse %v: LinkPending(1) = %d", sparse, n)
			}
		}
		if !set.GraphReady() || set.Pending() != cfg.MinLen {
			t.Errorf("sparse %v: ready %v with %d pending, want ready with the %d stored since still queued", sparse, set.GraphReady(), set.Pending(), cfg.MinLen)
		}
	}
}
