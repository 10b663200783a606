package vector

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

func TestClassesHoldTheirWordsWithLittleRounding(t *testing.T) {
	t.Parallel()
	for words := 2; words <= chunkWords+1; words++ {
		c := classOf(words)
		if c < 0 {
			if words <= chunkWords*7/8 {
				t.Fatalf("classOf(%d) = -1: a block well within a chunk gets a chunk of its own", words)
			}
			continue
		}
		size := classWords(c)
		if size < words || size%8 != 0 || size > chunkWords {
			t.Fatalf("classOf(%d) = %d of %d words", words, c, size)
		}
		if c > 0 && classWords(c-1) >= words {
			t.Fatalf("classOf(%d) = %d, but class %d of %d words holds it", words, c, c-1, classWords(c-1))
		}
		if words > 64 && 4*size > 5*words+32 {
			t.Fatalf("%d words rounded up to %d", words, size)
		}
	}
}

// TestArenaKeepsEachVector stores, replaces and releases vectors of random sizes (some
// larger than a chunk) and checks that every slot's vector reads back as stored, that a
// vector read earlier is unchanged while its slot holds it, and that released blocks are
// reused: the arena never holds more than its largest contents would take.
func TestArenaKeepsEachVector(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		r := rand.New(rand.NewPCG(rapid.Uint64().Draw(rt, "seed"), 1))
		var a arena
		const slots = 40
		a.grow(slots)
		held := map[uint32]Vector{}
		views := map[uint32]Vector{}
		for range rapid.IntRange(1, 400).Draw(rt, "ops") {
			slot := uint32(r.IntN(slots))
			switch r.IntN(3) {
			case 0:
				a.release(slot)
				delete(held, slot)
				delete(views, slot)
			default:
				n := 1 + r.IntN(40)
				if r.IntN(50) == 0 {
					n = chunkWords/2 + r.IntN(100) // a block of a chunk of its own
				}
				v := randomSparse(t, r, n, uint32(4*n))
				a.set(slot, v)
				held[slot] = v
				indices, values := a.get(slot)
				views[slot] = Vector{Indices: indices, Values: values}
			}
			for s, v := range held {
				indices, values := a.get(s)
				if !slices.Equal(indices, v.Indices) || !slices.Equal(values, v.Values) {
					rt.Fatalf("slot %d reads %v %v, stored %v %v", s, indices, values, v.Indices, v.Values)
				}
				if w := views[s]; !slices.Equal(w.Indices, v.Indices) || !slices.Equal(w.Values, v.Values) {
					rt.Fatalf("slot %d: a view taken when it was stored changed", s)
				}
			}
		}
		for s := range uint32(slots) {
			if _, ok := held[s]; !ok {
				if indices, values := a.get(s); indices != nil || values != nil {
					rt.Fatalf("released slot %d reads %v %v", s, indices, values)
				}
			}
		}
	})
}

func TestArenaReusesReleasedBlocks(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	var a arena
	const slots = 1000
	a.grow(slots)
	words := func() int {
		n := 0
		for _, c := range a.chunks {
			n += len(c)
		}
		return n
	}
	for s := range uint32(slots) {
		a.set(s, randomSparse(t, r, 1+r.IntN(30), 1000))
	}
	before := words()
	// An LRU's churn: the vectors replaced have the same sizes as those that replace them.
	for range 20 {
		for s := range uint32(slots) {
			a.release(s)
			a.set(s, randomSparse(t, r, 1+r.IntN(30), 1000))
		}
	}
	if after := words(); after > 2*before {
		t.Errorf("arena grew from %d to %d words under churn of same-sized vectors", before, after)
	}
}

// A chunk of its own, released, goes; the blocks cut after it must not have been in it.
func TestArenaOversizedChunkHoldsOnlyItsVector(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(3, 4))
	var a arena
	a.grow(2)
	big, small := randomSparse(t, r, chunkWords, 8*chunkWords), randomSparse(t, r, 5, 100)
	a.set(0, big)
	if indices, _ := a.get(0); len(indices) != len(big.Indices) {
		t.Fatalf("oversized vector reads %d coordinates, stored %d", len(indices), len(big.Indices))
	}
	a.set(1, small)
	a.release(0)
	if indices, values := a.get(1); !slices.Equal(indices, small.Indices) || !slices.Equal(values, small.Values) {
		t.Fatalf("after the oversized vector's release, slot 1 reads %v %v, stored %v", indices, values, small)
	}
}

// BenchmarkScoreScattered scores stored vectors in random order, 16 at a time as a graph
// walk scores a node's unseen neighbours: what a walk pays per vector when the set is far
// larger than the processor's caches (400k vectors, about 100 MB with their postings) and
// when it is not (10k).
func BenchmarkScoreScattered(b *testing.B) {
	for _, n := range []int{10_000, 400_000} {
		b.Run(fmt.Sprintf("vectors=%d", n), func(b *testing.B) {
			r := rand.New(rand.NewPCG(5, 6))
			set := NewSet(true, Limits{}, Graph{})
			for range n {
				if _, err := set.Add(randomSparse(b, r, 30, 50_000)); err != nil {
					b.Fatal(err)
				}
			}
			q := randomSparse(b, r, 30, 50_000)
			sc := set.takeScratch()
			sc.qt.reset(q)
			slots := make([]uint32, 1<<20)
			for i := range slots {
				slots[i] = uint32(r.IntN(n))
			}
			var sum float32
			i := 0
			for b.Loop() {
				for _, x := range set.scoreSlots(sc, q, slots[i:i+16]) {
					sum += x
				}
				i = (i + 16) & (len(slots) - 1)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(16*b.N), "ns/vector")
			if sum < 0 {
				b.Fatal("negative similarities")
			}
		})
	}
}
