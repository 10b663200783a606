package router

import (
	"fmt"
	"slices"
	"testing"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
)

func TestDegradationRing(t *testing.T) {
	t.Parallel()
	var ring degradationRing
	ids := func() []string {
		var out []string
		for _, ev := range ring.list() {
			out = append(out, ev.RequestId)
		}
		return out
	}
	steps := []struct {
		add      string
		capacity int
		want     []string // newest first
	}{
		{"r1", 3, []string{"r1"}},
		{"r2", 3, []string{"r2", "r1"}},
		{"r3", 3, []string{"r3", "r2", "r1"}},
		{"r4", 3, []string{"r4", "r3", "r2"}},
		// A reload that shrinks the ring applies at the next event.
		{"r5", 2, []string{"r5", "r4"}},
		// Capacity 0 records nothing and keeps what is there.
		{"r6", 0, []string{"r5", "r4"}},
	}
	for _, st := range steps {
		ev := &eventsv1.DegradationEvent{RequestId: st.add}
		ring.add(ev, st.capacity)
		if got := ids(); !slices.Equal(got, st.want) {
			t.Errorf("after %s (capacity %d): %v, want %v", st.add, st.capacity, got, st.want)
		}
	}
	if got := fmt.Sprint(len(ring.events)); got != "2" {
		t.Errorf("ring holds %s events, want 2", got)
	}
}
