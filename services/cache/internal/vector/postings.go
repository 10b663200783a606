package vector

import "unsafe"

// postingIndex is a sparse set's inverted index: each coordinate's posting list, found
// through a map from the coordinate to a small id, the list kept in chunks at that id.
//
// A search looks up every coordinate of its query (dozens), and storing a vector or
// removing one touches every list of its coordinates; with a list per distinct word and
// number, the map holds about as many coordinates as the set holds vectors. A map whose
// entries were the lists themselves (48 bytes each) spread its control words and keys
// over six times the memory, and nearly every lookup missed the processor's caches more
// than once; with 4-byte ids a group of eight entries shares a cache line or two. The
// lists grow a chunk at a time (strided), as the set's other large arrays do, so that
// no step copies them all.
type postingIndex struct {
	ids   map[uint32]uint32 // coordinate → id
	lists strided[postingEntry]
	next  uint32   // ids below next have been handed out
	free  []uint32 // ids of dropped lists, handed out again first
}

// postingEntry is one coordinate's list and what removal needs to know of it.
type postingEntry struct {
	postingList
	coord uint32
	stale int32 // postings of removed slots still in the list
}

func newPostingIndex() *postingIndex {
	return &postingIndex{
		ids:   make(map[uint32]uint32),
		lists: newStrided[postingEntry](1, int(unsafe.Sizeof(postingEntry{})), entryChunkBytes),
	}
}

// find returns coord's list, or nil when no vector has it. The entry stays where it is
// until the list is dropped; a new list may be added meanwhile.
func (x *postingIndex) find(coord uint32) *postingEntry {
	id, ok := x.ids[coord]
	if !ok {
		return nil
	}
	return x.lists.at(id)
}

// ensure returns coord's list, empty if new.
func (x *postingIndex) ensure(coord uint32) *postingEntry {
	if id, ok := x.ids[coord]; ok {
		return x.lists.at(id)
	}
	var id uint32
	if n := len(x.free); n > 0 {
		id, x.free = x.free[n-1], x.free[:n-1]
	} else {
		id = x.next
		x.next++
		x.lists.grow(int(x.next))
	}
	x.ids[coord] = id
	e := x.lists.at(id)
	e.coord = coord
	return e
}

// drop forgets coord's list; its id goes to the next new coordinate.
func (x *postingIndex) drop(coord uint32) {
	id, ok := x.ids[coord]
	if !ok {
		return
	}
	delete(x.ids, coord)
	*x.lists.at(id) = postingEntry{}
	x.free = append(x.free, id)
}

// eachStale calls f with every list that holds stale postings; f may drop the list it is
// given. It reads every list's entry: the set calls it only once removals have pinned
// more slots than twice its live ones, and then compacts most of the lists it finds.
func (x *postingIndex) eachStale(f func(*postingEntry)) {
	for id := range x.next {
		if e := x.lists.at(id); e.stale > 0 {
			f(e)
		}
	}
}
