package router

import (
	"slices"
	"sync"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
)

// degradationRing keeps the last degradation events of this replica for the status page,
// so an operator sees what degraded and why without a NATS subscription. It is bounded: at
// most capacity events, the oldest dropped first. The zero value is ready to use.
type degradationRing struct {
	mu     sync.Mutex
	events []*eventsv1.DegradationEvent // oldest first
}

// add records ev, keeping at most capacity events (capacity comes from the live config,
// so a reload that shrinks it applies at the next event). The ring keeps ev itself, not a
// copy (a copy per degraded request added up during incidents): nobody may modify ev after
// add; the publisher and the status page only read it, which is safe concurrently.
func (d *degradationRing) add(ev *eventsv1.DegradationEvent, capacity int) {
	if capacity <= 0 {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if over := len(d.events) + 1 - capacity; over > 0 {
		// Shift rather than reslice from the front, so the backing array does not creep.
		d.events = slices.Delete(d.events, 0, min(over, len(d.events)))
	}
	d.events = append(d.events, ev)
}

// list returns the events newest first. They are shared: callers must not modify them.
func (d *degradationRing) list() []*eventsv1.DegradationEvent {
	d.mu.Lock()
	out := slices.Clone(d.events)
	d.mu.Unlock()
	slices.Reverse(out)
	return out
}

// RecentDegradations returns this replica's last degradation events (router.status.
// recent_degradations of them), newest first, for the status page. Callers must not modify
// them.
func (r *Router) RecentDegradations() []*eventsv1.DegradationEvent {
	return r.degradations.list()
}
