package vector

import "math/bits"

// A set's arrays grow while the index holds its write lock, and every search waits for
// it. Grown by append, an array as long as the set is allocated anew and copied at each
// step: megabytes at tens of thousands of vectors, over a hundred at a million; and an
// allocation that size first pays its share of a running garbage collection (the
// allocating goroutine helps mark, or waits for credit). Such steps held the lock, and
// every search behind it, for 15 to 80 ms at 20,000 to 30,000 vectors. The largest
// arrays (a graph's links, dense vectors, long posting lists) grow a chunk at a time
// instead: an allocation of tens or hundreds of kilobytes, and nothing copied
// (docs/design/015-grow-by-chunks.md).

// strided holds stride values per slot, in chunks of a power-of-two number of slots.
type strided[T any] struct {
	stride int
	shift  uint  // log2 of the slots per chunk
	chunks [][]T // each of (1<<shift)*stride values
}

// newStrided returns storage for stride values of size bytes each per slot, in chunks of
// about chunkBytes.
func newStrided[T any](stride, size, chunkBytes int) strided[T] {
	perChunk := max(chunkBytes/(stride*size), 1)
	return strided[T]{stride: stride, shift: uint(bits.Len(uint(perChunk)) - 1)}
}

// of returns slot's values, sharing the storage; slot must be below the length grown to.
func (t *strided[T]) of(slot uint32) []T {
	c := t.chunks[slot>>t.shift]
	i := int(slot&(1<<t.shift-1)) * t.stride
	return c[i : i+t.stride : i+t.stride]
}

// at returns the first of slot's values: with a stride of 1, the slot's value.
func (t *strided[T]) at(slot uint32) *T {
	return &t.chunks[slot>>t.shift][int(slot&(1<<t.shift-1))*t.stride]
}

// grow makes room for the slots below n, zeroed.
func (t *strided[T]) grow(n int) {
	for len(t.chunks)<<t.shift < n {
		t.chunks = append(t.chunks, make([]T, (1<<t.shift)*t.stride))
	}
}

// postingBlock is how many postings each block of a long list holds (8 KiB).
const postingBlock = 1024

// postingList is one coordinate's postings, oldest first: full blocks of postingBlock,
// then head, the newest, which grows by append up to postingBlock. A rare coordinate's
// list is its head alone; a common one's grows by a block, never by copying itself.
type postingList struct {
	full [][]posting
	head []posting
}

func (l postingList) len() int { return len(l.full)*postingBlock + len(l.head) }

func (l *postingList) add(p posting) {
	switch {
	case len(l.head) == postingBlock:
		l.full = append(l.full, l.head)
		l.head = make([]posting, 0, postingBlock)
	case len(l.head) == cap(l.head):
		// Doubling, as append would, but to postingBlock at most.
		l.head = resized(l.head, min(max(2*len(l.head), 2), postingBlock))
	}
	l.head = append(l.head, p)
}

// appendTail appends to segs the segments, oldest first, that hold l's newest n postings
// (all of them when n is at least l's length).
func (l *postingList) appendTail(segs [][]posting, n int) [][]posting {
	skip := max(l.len()-n, 0) // the oldest postings left out
	if b := skip / postingBlock; b < len(l.full) {
		segs = append(segs, l.full[b][skip%postingBlock:])
		segs = append(segs, l.full[b+1:]...)
		skip = 0
	} else {
		skip -= len(l.full) * postingBlock
	}
	if skip < len(l.head) {
		segs = append(segs, l.head[skip:])
	}
	return segs
}

// filter keeps the postings keep accepts, in order, in place: blocks left empty are let
// go, and a head left with under a quarter of its capacity is copied into one that fits.
func (l *postingList) filter(keep func(posting) bool) {
	w := 0 // postings kept so far; the next goes at w
	at := func(i int) *posting {
		if b := i / postingBlock; b < len(l.full) {
			return &l.full[b][i%postingBlock]
		}
		return &l.head[i-len(l.full)*postingBlock]
	}
	n := l.len()
	for i := range n {
		p := at(i)
		if keep(*p) {
			*at(w) = *p
			w++
		}
	}
	// The blocks that hold the first w postings stay: the last of them is the new head.
	blocks := (w + postingBlock - 1) / postingBlock
	switch {
	case blocks == 0:
		*l = postingList{}
		return
	case blocks <= len(l.full):
		l.head = l.full[blocks-1]
		clear(l.full[blocks-1:])
		l.full = l.full[:blocks-1]
	}
	l.head = l.head[:w-len(l.full)*postingBlock]
	if len(l.head) < cap(l.head)/4 {
		l.head = resized(l.head, len(l.head))
	}
}

// resized is a copy of p with capacity c (at least len(p)), exactly: a list's blocks are
// never over postingBlock.
func resized(p []posting, c int) []posting {
	grown := make([]posting, len(p), c)
	copy(grown, p)
	return grown
}

// Chunk sizes. A graph's links are read a node at a time, wherever the walk goes, so
// their chunks can be small, and so can those of the sparse set's posting entries and
// removal counts, read an entry at a time wherever the coordinates and slots fall; a scan
// of dense vectors reads them in order, and chunks of a few vectors each cost it a third
// of its speed (the processor's prefetching starts over at every chunk).
const (
	linkChunkBytes  = 32 << 10
	entryChunkBytes = 16 << 10
	denseChunkBytes = 256 << 10
)
