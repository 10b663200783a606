package vector

import (
	"math/rand/v2"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// TestPostingListMatchesASlice: a list that grows, is read from its tail and is filtered
// holds what a plain slice given the same operations holds, across block boundaries, and
// keeps its shape: full blocks of postingBlock, then a head of at most postingBlock.
func TestPostingListMatchesASlice(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		r := rand.New(rand.NewPCG(rapid.Uint64().Draw(rt, "seed"), 1))
		var l postingList
		var want []posting
		next := uint32(0)
		for range rapid.IntRange(1, 30).Draw(rt, "ops") {
			switch r.IntN(4) {
			case 0, 1: // a run of adds, up to a few blocks
				for range r.IntN(3 * postingBlock) {
					p := posting{next, float32(next)}
					next++
					l.add(p)
					want = append(want, p)
				}
			case 2: // a filter that keeps about 1 in k
				k := uint32(1 + r.IntN(8))
				keep := func(p posting) bool { return p.slot%k == 0 }
				l.filter(keep)
				want = slices.DeleteFunc(want, func(p posting) bool { return !keep(p) })
			case 3: // a filter that drops nothing
				l.filter(func(posting) bool { return true })
			}
			checkPostingList(rt, &l, want)
			n := r.IntN(len(want) + 2)
			var got []posting
			for _, seg := range l.appendTail(nil, n) {
				got = append(got, seg...)
			}
			if tail := want[max(len(want)-n, 0):]; !slices.Equal(got, tail) {
				rt.Fatalf("tail of %d of %d: %d postings, want %d (%v... against %v...)", n, len(want), len(got), len(tail), prefix(got), prefix(tail))
			}
		}
	})
}

// TestPostingListTailEdges: the tail of a list is read right at the edges the property
// test reaches only by chance: none of it, all of it, more than all, and a block's
// boundary, with a head that is empty, holds one posting or is a whole block.
func TestPostingListTailEdges(t *testing.T) {
	t.Parallel()
	for _, size := range []int{0, 1, postingBlock, postingBlock + 1, 2 * postingBlock, 3*postingBlock - 1} {
		var l postingList
		var want []posting
		for i := range size {
			p := posting{uint32(i), 1}
			l.add(p)
			want = append(want, p)
		}
		for _, n := range []int{0, 1, postingBlock - 1, postingBlock, postingBlock + 1, size - 1, size, size + 1} {
			if n < 0 {
				continue
			}
			var got []posting
			for _, seg := range l.appendTail(nil, n) {
				got = append(got, seg...)
			}
			if tail := want[max(len(want)-n, 0):]; !slices.Equal(got, tail) {
				t.Errorf("list of %d, tail of %d: %d postings, want %d", size, n, len(got), len(tail))
			}
		}
	}
}

func checkPostingList(t *rapid.T, l *postingList, want []posting) {
	if l.len() != len(want) {
		t.Fatalf("len %d, want %d", l.len(), len(want))
	}
	for i, b := range l.full {
		if len(b) != postingBlock {
			t.Fatalf("full block %d of %d holds %d postings, want %d", i, len(l.full), len(b), postingBlock)
		}
	}
	if cap(l.head) > postingBlock {
		t.Fatalf("head of %d postings, capacity %d: over a block", len(l.head), cap(l.head))
	}
	got := slices.Concat(slices.Concat(l.full...), l.head)
	if !slices.Equal(got, want) {
		t.Fatalf("holds %v..., want %v...", prefix(got), prefix(want))
	}
}

// prefix is the start of p, for failure messages.
func prefix(p []posting) []posting { return p[:min(len(p), 4)] }

// TestStridedKeepsEachSlot: slots written before the storage grows keep their values, each
// slot's values are its own (writing one never shows in another), and a chunk is about
// chunkBytes.
func TestStridedKeepsEachSlot(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		stride, size int
		wantPerChunk int
	}{
		{"links of M=16", 33, 4, 128},
		{"a 1536-dimension embedding", 1536, 4, 4},
		{"one slice header", 1, 24, 1024},
		{"wider than a chunk", 10000, 4, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newStrided[uint32](tt.stride, tt.size, 32<<10)
			if got := 1 << s.shift; got != tt.wantPerChunk {
				t.Errorf("%d slots per chunk, want %d", got, tt.wantPerChunk)
			}
			const n = 700
			for slot := range uint32(n) {
				s.grow(int(slot) + 1)
				v := s.of(slot)
				if len(v) != tt.stride || cap(v) != tt.stride {
					t.Fatalf("slot %d: %d values (capacity %d), want %d", slot, len(v), cap(v), tt.stride)
				}
				for i := range v {
					if v[i] != 0 {
						t.Fatalf("slot %d: value %d is %d before any write, want 0", slot, i, v[i])
					}
					v[i] = slot*7 + uint32(i)
				}
			}
			for slot := range uint32(n) {
				v := s.of(slot)
				if v[0] != slot*7 || v[len(v)-1] != slot*7+uint32(tt.stride-1) || *s.at(slot) != slot*7 {
					t.Fatalf("slot %d holds %d..%d, want %d..%d", slot, v[0], v[len(v)-1], slot*7, slot*7+uint32(tt.stride-1))
				}
			}
		})
	}
}
