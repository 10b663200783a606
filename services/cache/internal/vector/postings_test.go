package vector

import (
	"slices"
	"testing"
)

func TestPostingIndex(t *testing.T) {
	t.Parallel()
	x := newPostingIndex()
	if e := x.find(7); e != nil {
		t.Fatalf("find(7) in an empty index = %+v, want nil", e)
	}
	// More lists than a chunk holds, so that ids span chunks.
	const lists = 600
	for c := range uint32(lists) {
		x.ensure(c).add(posting{slot: c, weight: float32(c)})
	}
	for c := range uint32(lists) {
		e := x.find(c)
		if e == nil || e.coord != c || e.len() != 1 || e.head[0].slot != c {
			t.Fatalf("find(%d) = %+v, want the list holding slot %d", c, e, c)
		}
	}
	if e := x.ensure(5); e.len() != 1 {
		t.Fatalf("ensure(5) of a list held = %d postings, want its 1", e.len())
	}

	// A dropped list is gone, and its id goes to the next new coordinate, empty.
	x.drop(5)
	x.drop(5) // dropping a coordinate without a list does nothing
	if e := x.find(5); e != nil {
		t.Fatalf("find(5) after drop = %+v, want nil", e)
	}
	next := x.next
	e := x.ensure(1000)
	if x.next != next || e.len() != 0 || e.coord != 1000 || e.stale != 0 {
		t.Fatalf("ensure(1000) after a drop = %+v (ids handed out %d, before %d), want the dropped id, empty", e, x.next, next)
	}
	if e := x.find(6); e == nil || e.head[0].slot != 6 {
		t.Fatalf("find(6) after reusing 5's id = %+v, want its own list", e)
	}

	// eachStale visits the lists with stale postings, and only those, even as it drops them.
	for _, c := range []uint32{3, 300, 599} {
		x.find(c).stale = 1
	}
	var visited []uint32
	x.eachStale(func(e *postingEntry) {
		visited = append(visited, e.coord)
		x.drop(e.coord)
	})
	slices.Sort(visited)
	if !slices.Equal(visited, []uint32{3, 300, 599}) {
		t.Fatalf("eachStale visited %v, want [3 300 599]", visited)
	}
	for _, c := range []uint32{3, 300, 599} {
		if x.find(c) != nil {
			t.Errorf("list %d still found after eachStale dropped it", c)
		}
	}
}
