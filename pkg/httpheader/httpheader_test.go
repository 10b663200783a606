package httpheader

import (
	"net/http"
	"reflect"
	"testing"
)

// TestSetter: headers set by a Setter are what http.Header.Set makes of the same calls,
// within the room it was made with and beyond it, and adding to any one of them leaves
// the others as they were.
func TestSetter(t *testing.T) {
	sets := [][2]string{{"Content-Type", "application/json"}, {"Accept", "a"}, {"X-One", "1"}, {"Accept", "b"}, {"X-Two", "2"}}
	want := http.Header{}
	for _, kv := range sets {
		want.Set(kv[0], kv[1])
	}
	build := func(room int) http.Header {
		h := http.Header{}
		s := NewSetter(h, room)
		for _, kv := range sets {
			s.Set(kv[0], kv[1])
		}
		return h
	}
	for _, room := range []int{0, 2, len(sets)} {
		if h := build(room); !reflect.DeepEqual(h, want) {
			t.Fatalf("room %d: headers = %v, want %v", room, h, want)
		}
		for name := range want {
			h := build(room)
			h.Add(name, "added")
			for other, v := range want {
				if other != name && !reflect.DeepEqual(h[other], v) {
					t.Errorf("room %d: adding to %s changed %s to %v, want %v", room, name, other, h[other], v)
				}
			}
		}
	}
}
