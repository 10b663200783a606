package vector

import "unsafe"

// arena holds a sparse set's vectors, one per slot, in large pointer-free chunks: a slot's
// indices and then its values' bits in one block of 2n words. Scoring a stored vector then
// reads the slot's span (a small array indexed by slot) and one contiguous block, instead
// of two slice headers and two separate arrays, which on a set larger than the processor's
// caches is a cache miss fewer per vector; and the garbage collector has a few chunks to
// mark instead of two objects per vector.
//
// Free space is kept in size-class free lists: a released block is reused by the next
// vector of its class, and a block never moves, so a vector returned by Vector stays valid
// until its slot is released. The memory held is at most what the set held at its largest
// in each class, plus the rounding of blocks up to their class (7 words, or a quarter of a
// block past 64 words).
type arena struct {
	chunks [][]uint32
	// spans[slot] locates the slot's block; n == 0 for a slot without a vector.
	spans []span
	// free[c] holds the released blocks of class c, by position.
	free [][]uint32
	// freeChunks holds the indices of released oversized chunks, for reuse.
	freeChunks []uint32
	// cut is the chunk blocks are cut from (at chunk index cur), used its words in use;
	// nil before the first block.
	cut       []uint32
	cur, used int
	nextChunk int
}

// span locates a block: chunk at>>chunkBits, offset at&(chunkWords-1), n coordinates.
type span struct {
	at uint32
	n  uint32
}

const (
	// chunkWords is the largest chunk blocks are cut from (256 KB); a vector larger than
	// that gets a chunk of its own. A span's 16 bits of chunk index allow 2^16 chunks, 16 GB
	// of vectors per set.
	chunkBits  = 16
	chunkWords = 1 << chunkBits
	// firstChunk is the size of a set's first chunk; each next one doubles up to
	// chunkWords, so that a partition with a few vectors holds a few kilobytes.
	firstChunk = 256
)

// classWords returns the block size, in words, of class c: multiples of 8 words (32
// bytes) up to 64, then steps of an eighth rounded up to 8 words (at most a quarter).
func classWords(c int) int {
	if c < 8 {
		return 8 * (c + 1)
	}
	w := 64
	for range c - 7 {
		w += (w/8 + 7) &^ 7
	}
	return w
}

// classOf returns the smallest class whose blocks hold words, and -1 when none within a
// chunk does (the block gets a chunk of its own).
func classOf(words int) int {
	if words > chunkWords {
		return -1
	}
	if words <= 64 {
		return (words - 1) / 8
	}
	c, w := 7, 64
	for w < words {
		w += (w/8 + 7) &^ 7
		c++
	}
	if w > chunkWords {
		return -1
	}
	return c
}

// grow makes room for the slots below n.
func (a *arena) grow(n int) {
	for len(a.spans) < n {
		a.spans = append(a.spans, span{})
	}
}

// set stores v as slot's vector, releasing the one it held.
func (a *arena) set(slot uint32, v Vector) {
	a.release(slot)
	n := len(v.Indices)
	at := a.alloc(2 * n)
	b := a.chunks[at>>chunkBits][at&(chunkWords-1):]
	copy(b, v.Indices)
	copy(floats(b[n:2*n]), v.Values)
	a.spans[slot] = span{at, uint32(n)}
}

// alloc returns the position of a free block of at least words words.
func (a *arena) alloc(words int) uint32 {
	c := classOf(words)
	if c < 0 {
		chunk := make([]uint32, words)
		if k := len(a.freeChunks); k > 0 {
			i := a.freeChunks[k-1]
			a.freeChunks = a.freeChunks[:k-1]
			a.chunks[i] = chunk
			return i << chunkBits
		}
		a.chunks = append(a.chunks, chunk)
		return uint32(len(a.chunks)-1) << chunkBits
	}
	if c < len(a.free) {
		if k := len(a.free[c]); k > 0 {
			at := a.free[c][k-1]
			a.free[c] = a.free[c][:k-1]
			return at
		}
	}
	size := classWords(c)
	if a.used+size > len(a.cut) {
		// The rest of the current chunk, smaller than the block, stays unused.
		a.nextChunk = min(max(2*a.nextChunk, firstChunk, size), chunkWords)
		a.cut = make([]uint32, a.nextChunk)
		a.chunks = append(a.chunks, a.cut)
		a.cur, a.used = len(a.chunks)-1, 0
	}
	at := uint32(a.cur)<<chunkBits | uint32(a.used)
	a.used += size
	return at
}

// release frees slot's block, if it holds one.
func (a *arena) release(slot uint32) {
	sp := a.spans[slot]
	if sp.n == 0 {
		return
	}
	a.spans[slot] = span{}
	c := classOf(2 * int(sp.n))
	if c < 0 {
		a.chunks[sp.at>>chunkBits] = nil
		a.freeChunks = append(a.freeChunks, sp.at>>chunkBits)
		return
	}
	for len(a.free) <= c {
		a.free = append(a.free, nil)
	}
	a.free[c] = append(a.free[c], sp.at)
}

// get returns slot's indices and values, sharing the arena's storage; both are empty for a
// slot without a vector.
func (a *arena) get(slot uint32) ([]uint32, []float32) {
	sp := a.spans[slot]
	if sp.n == 0 {
		return nil, nil
	}
	off := int(sp.at & (chunkWords - 1))
	b := a.chunks[sp.at>>chunkBits][off : off+2*int(sp.n) : off+2*int(sp.n)]
	return b[:sp.n:sp.n], floats(b[sp.n:])
}

// touch reads a word of every cache line of the slots' blocks and returns a value made of
// them (kept by the caller, so that the reads are not dropped). The reads depend on nothing
// but the spans, so the processor has all of them in flight at once: a walk that touches a
// node's neighbours before scoring them waits for memory about once per node instead of
// once or twice per neighbour.
func (a *arena) touch(slots []uint32) uint32 {
	var x uint32
	for _, slot := range slots {
		x ^= a.touchSlot(slot)
	}
	return x
}

// touchSlot is touch of one slot.
func (a *arena) touchSlot(slot uint32) uint32 {
	sp := a.spans[slot]
	if sp.n == 0 {
		return 0
	}
	var x uint32
	c := a.chunks[sp.at>>chunkBits]
	off := int(sp.at & (chunkWords - 1))
	for i := off; i < off+2*int(sp.n); i += 16 {
		x ^= c[i]
	}
	return x
}

// floats views w's words as the float32s whose bits they hold: the two types have the
// same size and alignment, and the chunks stay free of pointers.
func floats(w []uint32) []float32 {
	if len(w) == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(w))), len(w))
}
