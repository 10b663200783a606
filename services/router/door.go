package router

import (
	"context"
	"net/http"
	"time"

	cachev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/cache/v1"
)

// doorRequest is what an HTTP door tells the router's work about its request, in one
// context value (withDoor): when the request arrived, so that the overhead includes
// reading and decoding it, and, for a door that writes its whole answer at once, the
// cache stores it makes itself once that answer is out (storesAfter, makeStores).
//
// Handing a store to the store workers wakes one; on a replica with few requests in
// flight that wake-up, and the store's data gone cold by the time the worker runs, cost
// more than the store: in three alternating runs of `mantle bench-load --modes
// direct,proxy,all --temperature 0`, the mesh's CPU per request fell from 1.46 to 1.59 ms
// to 1.22 to 1.53 at 200/s and from 1.15 to 1.20 to 1.08 to 1.14 at 500/s (design record
// 009). Only while the replica is nearly idle (inlineStoreMaxInFlight): the connection
// the answer went out on serves its next request after the store, and under load, when
// stores wait for the index's lock, the workers make them.
//
// One request's goroutine reads and writes it; nothing else does.
type doorRequest struct {
	arrived time.Time
	// storesAfter says the door makes the stores left in stores (makeStores) once it has
	// written its answer; a door that streams, or answers other than with Complete, leaves
	// it false and the stores go to the workers.
	storesAfter bool
	stores      []storeJob
}

// inlineStoreMaxInFlight is the most requests in flight on the replica, the storing one
// included, for a door to store after its answer itself.
const inlineStoreMaxInFlight = 2

type doorKey struct{}

// withDoor marks ctx as an HTTP door's request that arrived at arrived.
func withDoor(ctx context.Context, arrived time.Time) (context.Context, *doorRequest) {
	d := &doorRequest{arrived: arrived}
	return context.WithValue(ctx, doorKey{}, d), d
}

func doorOf(ctx context.Context) *doorRequest {
	d, _ := ctx.Value(doorKey{}).(*doorRequest)
	return d
}

// arrivalOf is the request's arrival (withDoor), or now when no HTTP door marked one (gRPC
// callers: the method starts when the request has been decoded).
func arrivalOf(ctx context.Context, now time.Time) time.Time {
	if d := doorOf(ctx); d != nil {
		return d.arrived
	}
	return now
}

// leaveToDoor leaves sreq to ctx's door to make after its answer, reporting false when
// the door does not make stores, the replica is busy, or the router's stores have stopped:
// the caller then stores some other way.
func (r *Router) leaveToDoor(ctx context.Context, sreq *cachev1.StoreRequest) bool {
	d := doorOf(ctx)
	if d == nil || !d.storesAfter || r.shedder.InFlight() > inlineStoreMaxInFlight || !r.stores.hold() {
		return false
	}
	d.stores = append(d.stores, storeJob{ctx: context.WithoutCancel(ctx), req: sreq})
	return true
}

// makeStores makes the stores left to the door, after flushing w so that the caller has
// the whole answer first. The door defers it once it sets storesAfter.
func (d *doorRequest) makeStores(r *Router, w http.ResponseWriter) {
	if len(d.stores) == 0 {
		return
	}
	_ = http.NewResponseController(w).Flush() // an error is the caller's gone: store all the same
	jobs := d.stores
	d.stores = nil
	defer func() { // released even if a store panics, or WaitStores would wait forever
		for range jobs {
			r.stores.release()
		}
	}()
	for _, job := range jobs {
		job.make(r.sendStore)
	}
}
