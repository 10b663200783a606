package router

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	cachev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/cache/v1"
)

// storeWorkers make the cache stores that come after their answers
// (router.async_cache_store). A worker waits a while after its store for the next one,
// and the worker that finished last is the one given the next store: a goroutine per
// store started on a small stack and grew it through the cache's deep frames every time
// (copying it was about 40% of a store's CPU at 200 requests/s), while a worker that has
// just stored has its stack grown already. Workers beyond what the traffic keeps busy
// find no store within storeWorkerIdle and end.
type storeWorkers struct {
	send    func(context.Context, *cachev1.StoreRequest)
	idleFor time.Duration // storeWorkerIdle; tests shorten it

	mu      sync.Mutex
	max     int             // stores in flight at most (router.max_async_cache_stores)
	idle    []chan storeJob // the waiting workers, the last to finish at the end
	n       int             // workers alive, busy or waiting
	stopped bool
	wg      sync.WaitGroup
}

// storeJob is one store: ctx is the request's, without its cancellation (the request is
// answered and its context ends with it; the store gets asyncStoreTimeout of its own).
type storeJob struct {
	ctx context.Context
	req *cachev1.StoreRequest
}

// make sends the store with asyncStoreTimeout of its own.
func (j storeJob) make(send func(context.Context, *cachev1.StoreRequest)) {
	ctx, cancel := withLazyDeadline(j.ctx, time.Now().Add(asyncStoreTimeout))
	defer cancel()
	send(ctx, j.req)
}

// storeWorkerIdle is how long a worker waits for another store before it ends. The wait
// is on the real clock, not the router's: it only lets an idle goroutine go, and the
// router's tests count their fake clock's sleepers to know where requests are.
const storeWorkerIdle = 10 * time.Second

func newStoreWorkers(max int, send func(context.Context, *cachev1.StoreRequest)) *storeWorkers {
	return &storeWorkers{send: send, max: max, idleFor: storeWorkerIdle}
}

// setMax changes how many stores may be in flight (a reload). Lowered below the stores in
// flight, it sheds the next offers until enough of those have landed; workers beyond it
// end once idle.
func (w *storeWorkers) setMax(max int) {
	w.mu.Lock()
	w.max = max
	w.mu.Unlock()
}

// offer gives the store to a waiting worker, or to a new one, while fewer than max stores
// are in flight. Otherwise it returns errStoresFull (the router sheds the store) or
// errStoresStopped (after stop: the caller makes the store itself).
func (w *storeWorkers) offer(ctx context.Context, req *cachev1.StoreRequest) error {
	job := storeJob{ctx: context.WithoutCancel(ctx), req: req}
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return errStoresStopped
	}
	if busy := w.n - len(w.idle); busy >= w.max {
		w.mu.Unlock()
		return errStoresFull
	}
	if last := len(w.idle) - 1; last >= 0 {
		ch := w.idle[last]
		w.idle = w.idle[:last]
		w.mu.Unlock()
		ch <- job // buffered, and only this offer took it from idle: never blocks
		return nil
	}
	w.n++
	w.wg.Add(1)
	w.mu.Unlock()
	go w.run(job)
	return nil
}

// Why offer refused a store.
var (
	errStoresFull    = errors.New("cache stores: max_async_cache_stores in flight")
	errStoresStopped = errors.New("cache stores: stopped")
)

// run makes job's store, then the stores offered to it, until none comes within idleFor
// or the workers stop.
func (w *storeWorkers) run(job storeJob) {
	defer w.wg.Done()
	ch := make(chan storeJob, 1)
	idle := time.NewTimer(w.idleFor)
	defer idle.Stop()
	for {
		job.make(w.send)

		w.mu.Lock()
		if w.stopped {
			w.n--
			w.mu.Unlock()
			return
		}
		w.idle = append(w.idle, ch)
		w.mu.Unlock()
		idle.Reset(w.idleFor)
		var ok bool
		select {
		case job, ok = <-ch:
		case <-idle.C:
			if w.leave(ch) {
				return
			}
			// An offer took this worker from idle just as the wait ended: its job is
			// on the way.
			job, ok = <-ch
		}
		if !ok { // stop closed ch
			return
		}
	}
}

// leave takes a worker whose wait ended out of idle, reporting false when an offer or
// stop has taken it out already.
func (w *storeWorkers) leave(ch chan storeJob) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	i := slices.Index(w.idle, ch)
	if i < 0 {
		return false
	}
	w.idle = slices.Delete(w.idle, i, i+1)
	w.n--
	return true
}

// hold counts a store that a front door makes itself after its answer (doorRequest), so
// that stop waits for it as for the workers' own; false after stop, when the caller makes
// the store before its answer. A true hold is ended by release once the store is made.
func (w *storeWorkers) hold() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return false
	}
	w.wg.Add(1)
	return true
}

func (w *storeWorkers) release() { w.wg.Done() }

// stop ends the waiting workers and waits for the busy ones' stores and the held ones;
// offers and holds made after it are refused. The router's run loop calls it at shutdown.
func (w *storeWorkers) stop() {
	w.mu.Lock()
	w.stopped = true
	idle := w.idle
	w.idle = nil
	w.mu.Unlock()
	for _, ch := range idle {
		close(ch)
	}
	w.wg.Wait()
}
