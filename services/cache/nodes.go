package cache

// The embedded index keeps its entries in a nodeTable and finds them through maps and
// slices of nodeRefs, which hold no pointers. Why: the index is most of a busy process's
// live heap, and at every collection the collector follows each pointer in it while
// requests share the CPUs with it; what it costs is the pointers it follows more than the
// bytes or the objects. Held as pointers (a *node in the key map, in the slot map and in a
// container/list element, each node pointing to its partition and element, each entry to
// a dozen strings and three time zones), an entry cost the collector about twenty of
// them; with its strings packed (packedEntry) and its node in a table, it costs one, its
// text, and the maps and slices of nodeRefs are not scanned at all. With 100,000 entries
// of one partition, a full collection took 2.5 to 2.6 ms per 10,000 entries on two CPUs,
// 2.0 to 2.2 with the strings packed, and 0.9 to 1.0 in the table, of which the vector
// sets are about half (BenchmarkEmbeddedIndexMemory, gc-ms/10k-entries, alternating runs;
// docs/performance.md).

// nodeRef names a node of a nodeTable: its index plus one, so that the zero nodeRef names
// none.
type nodeRef uint32

// node is one entry of the embedded index. Its only pointers are its entry's text and
// tool calls (nil for most answers).
type node struct {
	entry packedEntry
	size  int64  // entrySize, counted in the index's bytes
	slot  uint32 // its vector's slot in its partition's set, when inSet
	inSet bool
	// prev and next are its neighbours in the recency list, toward the front and the back.
	prev, next nodeRef
}

// nodeChunk is how many nodes a chunk of a nodeTable holds: about 120 KB of them, so that
// a table of a million entries is two thousand allocations and growing it copies no node.
const nodeChunk = 512

// nodeTable holds nodes in chunks that are never moved nor freed, and reuses the places of
// released nodes. Its memory is that of the most nodes it held at once, which for a cache
// bounded by entries and bytes is about its size when full.
type nodeTable struct {
	chunks []*[nodeChunk]node
	free   []nodeRef
	used   int // places handed out, released ones included
}

// at returns the node r names; r must be one that add returned and release did not take
// back.
func (t *nodeTable) at(r nodeRef) *node {
	i := uint32(r) - 1
	return &t.chunks[i/nodeChunk][i%nodeChunk]
}

// add stores n and returns its place.
func (t *nodeTable) add(n node) nodeRef {
	var r nodeRef
	if k := len(t.free); k > 0 {
		r, t.free = t.free[k-1], t.free[:k-1]
	} else {
		if t.used == len(t.chunks)*nodeChunk {
			t.chunks = append(t.chunks, new([nodeChunk]node))
		}
		t.used++
		r = nodeRef(t.used)
	}
	*t.at(r) = n
	return r
}

// release clears the node r names, so that its text can be collected, and takes its
// place back.
func (t *nodeTable) release(r nodeRef) {
	*t.at(r) = node{}
	t.free = append(t.free, r)
}

// recencyList orders a nodeTable's nodes from most (front) to least (back) recently used,
// linked through their prev and next.
type recencyList struct{ front, back nodeRef }

func (l *recencyList) pushFront(t *nodeTable, r nodeRef) { l.link(t, r, 0, l.front) }

func (l *recencyList) pushBack(t *nodeTable, r nodeRef) { l.link(t, r, l.back, 0) }

// link puts r, which must not be in the list, between prev and next, neighbours in it; 0
// stands for the list's end on that side.
func (l *recencyList) link(t *nodeTable, r, prev, next nodeRef) {
	n := t.at(r)
	n.prev, n.next = prev, next
	if prev != 0 {
		t.at(prev).next = r
	} else {
		l.front = r
	}
	if next != 0 {
		t.at(next).prev = r
	} else {
		l.back = r
	}
}

// remove unlinks r, which must be in the list.
func (l *recencyList) remove(t *nodeTable, r nodeRef) {
	n := t.at(r)
	if n.prev != 0 {
		t.at(n.prev).next = n.next
	} else {
		l.front = n.next
	}
	if n.next != 0 {
		t.at(n.next).prev = n.prev
	} else {
		l.back = n.prev
	}
	n.prev, n.next = 0, 0
}

func (l *recencyList) moveToFront(t *nodeTable, r nodeRef) {
	if l.front == r {
		return
	}
	l.remove(t, r)
	l.pushFront(t, r)
}
