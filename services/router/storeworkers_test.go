package router

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	cachev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/cache/v1"
)

// gatedStores is a store function that records each store's lease and, for the leases
// with a gate, waits for the gate.
type gatedStores struct {
	mu    sync.Mutex
	done  []string
	gates map[string]chan struct{}
}

func (g *gatedStores) send(_ context.Context, req *cachev1.StoreRequest) {
	g.mu.Lock()
	gate := g.gates[req.GetLeaseId()]
	g.mu.Unlock()
	if gate != nil {
		<-gate
	}
	g.mu.Lock()
	g.done = append(g.done, req.GetLeaseId())
	g.mu.Unlock()
}

// open lets lease's store (waiting or still to come) go on; opening it again does nothing.
func (g *gatedStores) open(lease string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if gate := g.gates[lease]; gate != nil {
		close(gate)
		delete(g.gates, lease)
	}
}

// openAll opens every gate: registered after the workers' stop, so that it runs first, it
// keeps a test that fails before its gates open from leaving stop waiting on them.
func (g *gatedStores) openAll() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for lease, gate := range g.gates {
		close(gate)
		delete(g.gates, lease)
	}
}

func (g *gatedStores) stored() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.done...)
}

// waitWorkers waits until the workers are n alive of which idle wait for a store. The
// workers change state on their own goroutines, so this polls; the deadline only turns
// a hang into a failure.
func waitWorkers(t *testing.T, w *storeWorkers, n, idle int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		w.mu.Lock()
		gotN, gotIdle := w.n, len(w.idle)
		w.mu.Unlock()
		if gotN == n && gotIdle == idle {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("workers: %d alive, %d idle; want %d, %d", gotN, gotIdle, n, idle)
		}
		runtime.Gosched()
	}
}

func storeOf(lease string) *cachev1.StoreRequest { return &cachev1.StoreRequest{LeaseId: lease} }

// TestStoreWorkersReuseTheLastToFinish: a store goes to the worker that finished last
// (its stack is grown, and the others can end), a new worker starts only while every
// other is busy, and no more than max run.
func TestStoreWorkersReuseTheLastToFinish(t *testing.T) {
	t.Parallel()
	g := &gatedStores{gates: map[string]chan struct{}{"a": make(chan struct{}), "b": make(chan struct{}), "c": make(chan struct{})}}
	w := newStoreWorkers(2, g.send)
	t.Cleanup(w.stop)
	t.Cleanup(g.openAll)
	ctx := context.Background()

	if w.offer(ctx, storeOf("a")) != nil || w.offer(ctx, storeOf("b")) != nil {
		t.Fatal("offers refused with workers to spare")
	}
	waitWorkers(t, w, 2, 0)
	if err := w.offer(ctx, storeOf("c")); !errors.Is(err, errStoresFull) {
		t.Fatalf("a third store with both workers busy and max 2: %v, want errStoresFull", err)
	}

	g.open("a") // a's worker waits first
	waitWorkers(t, w, 2, 1)
	w.mu.Lock()
	first := w.idle[0]
	w.mu.Unlock()
	g.open("b") // then b's
	waitWorkers(t, w, 2, 2)
	if err := w.offer(ctx, storeOf("c")); err != nil {
		t.Fatalf("store refused with two workers waiting: %v", err)
	}
	w.mu.Lock()
	left := w.idle
	w.mu.Unlock()
	if len(left) != 1 || left[0] != first {
		t.Error("the store went to the worker that had waited longest, want the one that finished last")
	}
	g.open("c")
	waitWorkers(t, w, 2, 2)
	if got := g.stored(); len(got) != 3 || got[2] != "c" {
		t.Errorf("stores made %q, want a and b then c", got)
	}
}

// TestStoreWorkersStop: stop ends the waiting workers at once, waits for a busy one's
// store, and the stores offered after it are refused with errStoresStopped (the router
// then makes them before the answer).
func TestStoreWorkersStop(t *testing.T) {
	t.Parallel()
	g := &gatedStores{gates: map[string]chan struct{}{"busy": make(chan struct{})}}
	w := newStoreWorkers(4, g.send)
	ctx := context.Background()
	w.offer(ctx, storeOf("quick"))
	waitWorkers(t, w, 1, 1)
	w.offer(ctx, storeOf("busy")) // the waiting worker takes it
	w.offer(ctx, storeOf("quick"))
	waitWorkers(t, w, 2, 1)

	// The busy store is let go once stop has begun; stop returning before it is made
	// would leave it out of the stores below.
	go func() {
		for {
			w.mu.Lock()
			stopping := w.stopped
			w.mu.Unlock()
			if stopping {
				g.open("busy")
				return
			}
			runtime.Gosched()
		}
	}()
	w.stop()
	if got := g.stored(); len(got) != 3 {
		t.Errorf("stores made by the time stop returned %q, want all three", got)
	}
	if err := w.offer(ctx, storeOf("late")); !errors.Is(err, errStoresStopped) {
		t.Errorf("a store offered after stop: %v, want errStoresStopped", err)
	}
}

// TestStoreWorkersEndWhenIdle: a worker that gets no store within idleFor ends, also
// when offers race with its end; every store offered is made once.
func TestStoreWorkersEndWhenIdle(t *testing.T) {
	t.Parallel()
	g := &gatedStores{}
	w := newStoreWorkers(8, g.send)
	w.idleFor = time.Microsecond // the wait ends about when the next offer comes
	ctx := context.Background()
	const stores = 2000
	taken := 0
	for range stores {
		if w.offer(ctx, storeOf("x")) == nil {
			taken++
		} else {
			g.send(ctx, storeOf("x")) // as the router does with a refused store
		}
	}
	waitWorkers(t, w, 0, 0)
	if got := len(g.stored()); got != stores {
		t.Errorf("%d stores made, want %d (%d taken by workers)", got, stores, taken)
	}
	w.stop()
}

// TestStoreWorkersSetMax: the bound counts stores in flight, not workers alive, so that a
// reload that lowers it sheds the next stores even while idle workers remain from before,
// and one that raises it lets more in at once.
func TestStoreWorkersSetMax(t *testing.T) {
	t.Parallel()
	g := &gatedStores{gates: map[string]chan struct{}{"a": make(chan struct{}), "b": make(chan struct{})}}
	w := newStoreWorkers(3, g.send)
	t.Cleanup(w.stop)
	t.Cleanup(g.openAll)
	ctx := context.Background()
	for _, lease := range []string{"a", "b", "x"} { // x lands at once: its worker waits
		if err := w.offer(ctx, storeOf(lease)); err != nil {
			t.Fatalf("offer %s: %v", lease, err)
		}
	}
	waitWorkers(t, w, 3, 1)

	w.setMax(2)
	if err := w.offer(ctx, storeOf("c")); !errors.Is(err, errStoresFull) {
		t.Fatalf("offer with 2 in flight, max lowered to 2 and a worker idle: %v, want errStoresFull", err)
	}
	w.setMax(4)
	if err := w.offer(ctx, storeOf("d")); err != nil {
		t.Fatalf("offer with 2 in flight, max raised to 4: %v", err)
	}
	g.open("a")
	g.open("b")
	waitWorkers(t, w, 3, 3)
	if got := g.stored(); len(got) != 4 || slices.Contains(got, "c") {
		t.Errorf("stores made %q, want x, d, a and b (c was shed)", got)
	}
}
