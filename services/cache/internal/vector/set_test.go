package vector

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

func mustSparse(t testing.TB, pairs ...float32) Vector {
	t.Helper()
	var fs []Feature
	for i := 0; i+1 < len(pairs); i += 2 {
		fs = append(fs, Feature{Index: uint32(pairs[i]), Weight: pairs[i+1]})
	}
	v, err := NewSparse(fs)
	if err != nil {
		t.Fatalf("NewSparse: %v", err)
	}
	return v
}

func TestNewSparseMergesAndNormalises(t *testing.T) {
	t.Parallel()
	v := mustSparse(t, 7, 1, 3, 2, 7, 1)
	if !slices.Equal(v.Indices, []uint32{3, 7}) {
		t.Fatalf("indices = %v, want [3 7]", v.Indices)
	}
	want := float32(1 / math.Sqrt2)
	for i, got := range v.Values {
		if math.Abs(float64(got-want)) > 1e-6 {
			t.Errorf("values[%d] = %v, want %v", i, got, want)
		}
	}
	if d := Dot(v, v); math.Abs(float64(d-1)) > 1e-6 {
		t.Errorf("Dot(v, v) = %v, want 1", d)
	}
}

func TestZeroVectorsAreRefused(t *testing.T) {
	t.Parallel()
	if _, err := NewSparse(nil); !errors.Is(err, ErrZero) {
		t.Errorf("NewSparse(nil) error = %v, want ErrZero", err)
	}
	if _, err := NewSparse([]Feature{{1, 1}, {1, -1}}); !errors.Is(err, ErrZero) {
		t.Errorf("NewSparse(cancelling) error = %v, want ErrZero", err)
	}
	if _, err := NewDense([]float32{0, 0}); !errors.Is(err, ErrZero) {
		t.Errorf("NewDense(zeros) error = %v, want ErrZero", err)
	}
}

func TestDot(t *testing.T) {
	t.Parallel()
	a, _ := NewDense([]float32{3, 4})
	b, _ := NewDense([]float32{4, 3})
	tests := []struct {
		name string
		x, y Vector
		want float32
	}{
		{"dense", a, b, 24.0 / 25},
		{"sparse disjoint", mustSparse(t, 1, 1), mustSparse(t, 2, 1), 0},
		{"sparse overlap", mustSparse(t, 1, 1, 2, 1), mustSparse(t, 2, 1, 3, 1), 0.5},
		{"mixed forms are unrelated", a, mustSparse(t, 0, 1), 0},
		{"other dimension is unrelated", a, Vector{Dense: []float32{1, 0, 0}}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := Dot(tt.x, tt.y); math.Abs(float64(got-tt.want)) > 1e-6 {
				t.Errorf("Dot = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestSetRejectsMismatchedVectors(t *testing.T) {
	t.Parallel()
	dense := NewSet(false, Limits{}, Graph{})
	v, _ := NewDense([]float32{1, 2, 3})
	if _, err := dense.Add(v); err != nil {
		t.Fatalf("Add: %v", err)
	}
	w, _ := NewDense([]float32{1, 2})
	if _, err := dense.Add(w); err == nil {
		t.Errorf("Add of another dimension succeeded")
	}
	if _, err := dense.Add(mustSparse(t, 1, 1)); err == nil {
		t.Errorf("Add of a sparse vector to a dense set succeeded")
	}
	if got := dense.Search(w, 3, 0, nil); got != nil {
		t.Errorf("Search with another dimension = %v, want nothing", got)
	}
}

// bruteForce is the reference Search: score everything, keep the best k at or above min.
func bruteForce(vs map[uint32]Vector, q Vector, k int, min float32, accept func(uint32) bool) []Hit {
	var all []Hit
	for slot, v := range vs {
		if s := Dot(q, v); s > 0 && s >= min && (accept == nil || accept(slot)) {
			all = append(all, Hit{slot, s})
		}
	}
	slices.SortFunc(all, func(a, b Hit) int {
		if better(a, b) {
			return -1
		}
		return 1
	})
	if len(all) > k {
		all = all[:k]
	}
	return all
}

// TestSetSearchMatchesBruteForce adds, removes and searches at random and checks every
// result against scoring all vectors: the pruning must never lose a qualifying vector, and
// limits that the set never reaches change nothing. Limits that bind may lose vectors but
// never report one with a wrong score, below the minimum, unaccepted or out of order.
func TestSetSearchMatchesBruteForce(t *testing.T) {
	t.Parallel()
	small := Graph{MinLen: 6, M: 2, EfConstruction: 4, EfSearch: 3, Seed: 1}
	for _, tt := range []struct {
		name   string
		limits Limits
		graph  Graph
		exact  bool
	}{
		{"unlimited", Limits{}, Graph{}, true},
		{"limits not reached", Limits{Postings: 1 << 20, Scored: 1 << 20}, Graph{}, true},
		{"tight limits", Limits{Postings: 6, Scored: 2}, Graph{}, false},
		{"postings only", Limits{Postings: 3}, Graph{}, false},
		{"graph", Limits{}, small, false},
		{"graph and limits", Limits{Postings: 6, Scored: 2}, small, false},
		{"graph never reached", Limits{}, Graph{MinLen: 1 << 20, M: 2, EfConstruction: 4}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			checkSearch(t, tt.limits, tt.graph, tt.exact)
		})
	}
}

// checkSearch runs random operations on a set. With a graph, linking is one more: some
// queued vectors linked at once, or a plan made, the set changed, and the plan applied
// (it must be refused when the change made it stale, and do no harm when it is not).
func checkSearch(t *testing.T, limits Limits, graph Graph, exact bool) {
	rapid.Check(t, func(t *rapid.T) {
		sparse := rapid.Bool().Draw(t, "sparse")
		genVec := func(label string) Vector {
			if sparse {
				// A small coordinate space makes overlaps, and so close vectors, common.
				n := rapid.IntRange(1, 8).Draw(t, label+"-n")
				var fs []Feature
				for range n {
					fs = append(fs, Feature{
						Index:  uint32(rapid.IntRange(0, 20).Draw(t, label+"-i")),
						Weight: float32(rapid.SampledFrom([]int{-2, -1, 1, 2, 3, 5}).Draw(t, label+"-w")),
					})
				}
				v, err := NewSparse(fs)
				if errors.Is(err, ErrZero) { // the weights cancelled out: any non-zero vector will do
					v, err = NewSparse([]Feature{{Index: 21, Weight: 1}})
				}
				if err != nil {
					t.Fatalf("NewSparse: %v", err)
				}
				return v
			}
			x := make([]float32, 4)
			for i := range x {
				x[i] = float32(rapid.IntRange(-3, 3).Draw(t, label+"-x"))
			}
			x[0] += 0.5 // never the zero vector
			v, err := NewDense(x)
			if err != nil {
				t.Fatalf("NewDense: %v", err)
			}
			return v
		}
		set := NewSet(sparse, limits, graph)
		held := map[uint32]Vector{}
		steps := rapid.IntRange(1, 120).Draw(t, "steps")
		var plan *LinkPlan
		// A lookup's vector and what its search recorded near it, waiting to be added (as
		// an answer is stored after its lookup, other operations in between).
		var looked *Vector
		var lookedNear *Near
		for range steps {
			switch op := rapid.IntRange(0, 12).Draw(t, "op"); {
			case op == 12:
				v := genVec("lookup")
				lookedNear = new(Near)
				got := set.SearchNear(v, 3, 0, nil, lookedNear)
				checkSound(t, held, v, 3, 0, nil, got)
				looked = &v
			case op == 10:
				set.LinkPending(rapid.IntRange(1, 8).Draw(t, "link"))
			case op == 11:
				if plan == nil {
					plan = set.PlanLink()
				} else {
					set.ApplyLink(plan)
					plan = nil
				}
			case op < 5 || len(held) == 0:
				v, near := genVec("add"), (*Near)(nil)
				if looked != nil && rapid.Bool().Draw(t, "add-looked-up") {
					v, near, looked = *looked, lookedNear, nil
				}
				slot, err := set.AddNear(v, near)
				if err != nil {
					t.Fatalf("Add: %v", err)
				}
				if _, taken := held[slot]; taken {
					t.Fatalf("Add returned slot %d, which is in use", slot)
				}
				held[slot] = v
			case op < 7:
				slots := make([]uint32, 0, len(held))
				for s := range held {
					slots = append(slots, s)
				}
				slices.Sort(slots)
				victim := rapid.SampledFrom(slots).Draw(t, "victim")
				set.Remove(victim)
				delete(held, victim)
			default:
				q := genVec("query")
				k := rapid.IntRange(1, 6).Draw(t, "k")
				min := float32(rapid.IntRange(0, 100).Draw(t, "min")) / 100
				odd := rapid.Bool().Draw(t, "only-even-slots")
				var accept func(uint32) bool
				if odd {
					accept = func(s uint32) bool { return s%2 == 0 }
				}
				got := set.Search(q, k, min, accept)
				if !exact && (sparse || graph.MinLen > 0) {
					checkSound(t, held, q, k, min, accept, got)
					break
				}
				want := bruteForce(held, q, k, min, accept)
				if len(got) != len(want) {
					t.Fatalf("Search(k=%d, min=%v) = %v, want %v", k, min, got, want)
				}
				for i := range got {
					if got[i] != want[i] {
						t.Fatalf("Search(k=%d, min=%v) = %v, want %v", k, min, got, want)
					}
				}
			}
			if set.Len() != len(held) {
				t.Fatalf("Len() = %d, want %d", set.Len(), len(held))
			}
		}
		// Linking ends: every queued vector can be linked, whatever happened since it was queued.
		if graph.MinLen > 0 {
			set.LinkPending(1 << 20)
			if set.Pending() != 0 {
				t.Fatalf("%d vectors still queued after linking all", set.Pending())
			}
		}
	})
}

// checkSound checks a search that may have missed vectors: what it returns must be true.
func checkSound(t *rapid.T, held map[uint32]Vector, q Vector, k int, min float32, accept func(uint32) bool, got []Hit) {
	if len(got) > k {
		t.Fatalf("Search(k=%d) returned %d hits", k, len(got))
	}
	for i, h := range got {
		v, ok := held[h.Slot]
		if !ok {
			t.Fatalf("hit %v is not a held slot", h)
		}
		if want := Dot(q, v); h.Score != want || h.Score <= 0 || h.Score < min {
			t.Fatalf("hit %v: similarity %v, minimum %v", h, want, min)
		}
		if accept != nil && !accept(h.Slot) {
			t.Fatalf("hit %v was not accepted", h)
		}
		if i > 0 && !better(got[i-1], h) {
			t.Fatalf("hits out of order: %v", got)
		}
	}
}

// TestLimitedSearchCountsUnreadLists: when a common list is too long to walk for pruning,
// a candidate's partial product misses that coordinate, and stopping the scoring must
// allow for it. The query itself is stored, behind a vector whose partial product is
// higher but whose similarity is lower.
func TestLimitedSearchCountsUnreadLists(t *testing.T) {
	t.Parallel()
	set := NewSet(true, Limits{Postings: 1 << 20, Scored: 1 << 20}, Graph{})
	for i := range 2000 { // the common coordinate 0, with coordinates nobody asks for
		if _, err := set.Add(mustSparse(t, 0, 1, float32(100+i), 1)); err != nil {
			t.Fatal(err)
		}
	}
	decoy, err := set.Add(mustSparse(t, 1, 1))
	if err != nil {
		t.Fatal(err)
	}
	q := mustSparse(t, 0, 0.4, 1, 0.9165)
	twin, err := set.Add(q)
	if err != nil {
		t.Fatal(err)
	}
	got := set.Search(q, 1, 0.5, nil)
	if len(got) != 1 || got[0].Slot != twin {
		t.Fatalf("Search = %v, want the stored query (slot %d) before the decoy (slot %d)", got, twin, decoy)
	}
}

func TestSelectTop(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		key := rapid.SliceOfN(rapid.SampledFrom([]float32{0, 0.1, 0.5, 0.5, 0.7, 1, 2}), 1, 60).Draw(t, "key")
		hits := make([]Hit, len(key))
		for i := range hits {
			hits[i] = Hit{uint32(i), key[i]}
		}
		rand.New(rand.NewPCG(uint64(len(key)), 1)).Shuffle(len(hits), func(i, j int) { hits[i], hits[j] = hits[j], hits[i] })
		n := rapid.IntRange(1, len(key)).Draw(t, "n")
		selectTop(hits, n)
		want := slices.Clone(key)
		slices.SortFunc(want, func(a, b float32) int { return cmp.Compare(b, a) })
		var got []float32
		for _, h := range hits[:n] {
			got = append(got, h.Score)
		}
		slices.SortFunc(got, func(a, b float32) int { return cmp.Compare(b, a) })
		if !slices.Equal(got, want[:n]) {
			t.Fatalf("top %d of %v = %v, want %v", n, key, got, want[:n])
		}
		seen := map[uint32]bool{}
		for _, h := range hits {
			if seen[h.Slot] || h.Score != key[h.Slot] {
				t.Fatalf("hit %v in %v: twice, or parted from its key %v", h, hits, key[h.Slot])
			}
			seen[h.Slot] = true
		}
	})
}

// TestSparseCompactionKeepsResults removes two vectors of every three, which compacts the
// postings lists as it goes, and checks that no list is more than half stale, that the
// freed slots are reused, and that the survivors and the newcomers are still found.
func TestSparseCompactionKeepsResults(t *testing.T) {
	t.Parallel()
	set := NewSet(true, Limits{}, Graph{})
	var keep []uint32
	for i := range 3000 {
		slot, err := set.Add(mustSparse(t, float32(i), 1, float32(i+1), 1))
		if err != nil {
			t.Fatalf("Add: %v", err)
		}
		if i%3 == 0 {
			keep = append(keep, slot)
		} else {
			set.Remove(slot)
		}
	}
	set.postings.eachStale(func(e *postingEntry) {
		if 2*int(e.stale) > e.len() {
			t.Errorf("list %d holds %d stale postings of %d: it was not compacted", e.coord, e.stale, e.len())
		}
	})
	if set.taken != 0 {
		t.Errorf("%d removed slots are still taken: their two-posting lists were not compacted", set.taken)
	}
	// New vectors reuse the freed slots; their postings must not mix with the old ones.
	for i := range 1500 {
		slot, err := set.Add(mustSparse(t, float32(10_000+i), 1, float32(10_001+i), 1))
		if err != nil {
			t.Fatalf("Add: %v", err)
		}
		keep = append(keep, slot)
	}
	if set.Len() != len(keep) {
		t.Fatalf("Len() = %d, want %d", set.Len(), len(keep))
	}
	if len(set.live) != set.Len() {
		t.Errorf("%d slots for %d vectors: the newcomers did not reuse the freed slots", len(set.live), set.Len())
	}
	for _, slot := range keep {
		v := set.Vector(slot)
		hits := set.Search(v, 1, 0.99, nil)
		if len(hits) != 1 || hits[0].Slot != slot {
			t.Fatalf("Search for slot %d = %v", slot, hits)
		}
	}
}

// BenchmarkSetSearchDense measures the scan that dense embedders' partitions get in the
// embedded index (768 dimensions, as bge-base or nomic-embed-text).
func BenchmarkSetSearchDense(b *testing.B) {
	const dim = 768
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("vectors=%d", n), func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 2))
			random := func() Vector {
				x := make([]float32, dim)
				for i := range x {
					x[i] = float32(r.NormFloat64())
				}
				v, _ := NewDense(x)
				return v
			}
			set := NewSet(false, Limits{}, Graph{})
			for range n {
				if _, err := set.Add(random()); err != nil {
					b.Fatal(err)
				}
			}
			q := random()
			b.ReportAllocs()
			for b.Loop() {
				set.Search(q, 5, 0.9, nil)
			}
		})
	}
}

// TestSparseSearchKnowsWhenItIsExact: a bounded postings search that reports its result
// exact (the graph is then not walked) must return what scoring every vector returns.
func TestSparseSearchKnowsWhenItIsExact(t *testing.T) {
	t.Parallel()
	exactSeen := 0
	rapid.Check(t, func(t *rapid.T) {
		set := NewSet(true, Limits{}, Graph{})
		held := map[uint32]Vector{}
		gen := func(label string) Vector {
			var fs []Feature
			for range rapid.IntRange(1, 8).Draw(t, label+"-n") {
				fs = append(fs, Feature{
					Index:  uint32(rapid.IntRange(0, 30).Draw(t, label+"-i")),
					Weight: float32(rapid.IntRange(1, 5).Draw(t, label+"-w")),
				})
			}
			v, err := NewSparse(fs)
			if err != nil {
				t.Fatalf("NewSparse: %v", err)
			}
			return v
		}
		for range rapid.IntRange(1, 80).Draw(t, "vectors") {
			v := gen("v")
			slot, err := set.Add(v)
			if err != nil {
				t.Fatalf("Add: %v", err)
			}
			held[slot] = v
		}
		limits := Limits{Postings: rapid.IntRange(1, 40).Draw(t, "postings"), Scored: rapid.IntRange(1, 10).Draw(t, "scored")}
		q := gen("q")
		k := rapid.IntRange(1, 4).Draw(t, "k")
		min := float32(rapid.IntRange(1, 100).Draw(t, "min")) / 100
		tk := &topK{hits: make([]Hit, 0, k), k: k, min: min}
		sc := set.takeScratch()
		exact := set.searchSparse(sc, q, min, tk, limits)
		set.returnScratch(sc)
		if !exact {
			return
		}
		exactSeen++
		if want := bruteForce(held, q, k, min, nil); !slices.Equal(tk.hits, want) {
			t.Fatalf("search with %+v reported exact: got %v, want %v", limits, tk.hits, want)
		}
	})
	if exactSeen == 0 {
		t.Fatal("no search reported an exact result: the test checks nothing")
	}
}

// BenchmarkSparseRemove fills a set as a partition of prompts from one template fills
// (every vector 45 of 200 common coordinates and 15 rare ones), then removes every vector
// in the order it came, as an LRU evicts, and reports the removals' P99 and longest time:
// compacting a list at a time, no removal stops searches for a pass over every list.
func BenchmarkSparseRemove(b *testing.B) {
	const n, common, rare = 45_000, 45, 15
	r := rand.New(rand.NewPCG(1, 2))
	vecs := make([]Vector, n)
	for i := range vecs {
		seen := map[uint32]bool{}
		var fs []Feature
		for len(fs) < common+rare {
			f := uint32(r.IntN(200))
			if len(fs) >= common {
				f = 1000 + uint32(r.IntN(100_000))
			}
			if !seen[f] {
				seen[f] = true
				fs = append(fs, Feature{Index: f, Weight: 0.1})
			}
		}
		v, err := NewSparse(fs)
		if err != nil {
			b.Fatal(err)
		}
		vecs[i] = v
	}
	var took []time.Duration
	for b.Loop() {
		b.StopTimer()
		s := NewSet(true, Limits{}, Graph{})
		slots := make([]uint32, n)
		for i, v := range vecs {
			slot, err := s.Add(v)
			if err != nil {
				b.Fatal(err)
			}
			slots[i] = slot
		}
		b.StartTimer()
		for _, slot := range slots {
			start := time.Now()
			s.Remove(slot)
			took = append(took, time.Since(start))
		}
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)*99/100].Nanoseconds()), "p99-ns/remove")
	b.ReportMetric(float64(took[len(took)-1].Nanoseconds()), "max-ns/remove")
}
