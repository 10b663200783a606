package router

import (
	"context"
	"net/http"

	cachev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/cache/v1"
)

// afterAnswer holds the cache stores a request's front door makes in the request's own
// goroutine once the answer has gone out (withAfterAnswer, run), instead of handing them
// to the store workers. Handing a store over wakes a worker; on a replica with few
// requests in flight that wake-up, and the store's data gone cold by the time the worker
// runs, cost more than the store: in three alternating runs of `mantle bench-load --modes
// direct,proxy,all --temperature 0`, the mesh's CPU per request fell from 1.46 to 1.59 ms
// to 1.22 to 1.53 at 200/s and from 1.15 to 1.20 to 1.08 to 1.14 at 500/s (design record
// 009). Only while the replica is nearly idle (inlineStoreMaxInFlight): the connection
// the answer went out on serves its next request after the store, and under load, when
// stores wait for the index's lock, the workers make them.
type afterAnswer struct {
	jobs []storeJob
}

// inlineStoreMaxInFlight is the most requests in flight on the replica, the storing one
// included, for a front door to store after its answer itself.
const inlineStoreMaxInFlight = 2

type afterAnswerKey struct{}

// withAfterAnswer returns ctx carrying a for the router to leave the request's stores
// in; the caller must call a.run once it has written the answer, whatever the outcome.
func withAfterAnswer(ctx context.Context) (context.Context, *afterAnswer) {
	a := new(afterAnswer)
	return context.WithValue(ctx, afterAnswerKey{}, a), a
}

// leaveAfterAnswer leaves sreq to ctx's front door, reporting false when there is none,
// the replica is busy, or the router's stores have stopped: the caller then stores some
// other way.
func (r *Router) leaveAfterAnswer(ctx context.Context, sreq *cachev1.StoreRequest) bool {
	a, ok := ctx.Value(afterAnswerKey{}).(*afterAnswer)
	if !ok || r.shedder.InFlight() > inlineStoreMaxInFlight || !r.stores.hold() {
		return false
	}
	a.jobs = append(a.jobs, storeJob{ctx: context.WithoutCancel(ctx), req: sreq})
	return true
}

// run makes the stores left, after flushing w so that the caller has the whole answer
// first.
func (a *afterAnswer) run(r *Router, w http.ResponseWriter) {
	if len(a.jobs) == 0 {
		return
	}
	_ = http.NewResponseController(w).Flush() // an error is the caller's gone: store all the same
	jobs := a.jobs
	a.jobs = nil
	defer func() { // released even if a store panics, or WaitStores would wait forever
		for range jobs {
			r.stores.release()
		}
	}()
	for _, job := range jobs {
		job.make(r.sendStore)
	}
}
