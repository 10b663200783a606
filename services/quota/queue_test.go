package quota

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/services/quota/internal/ledger"
	"github.com/mantle-mesh/mantle/services/quota/internal/memstore"
)

// Most queue tests drive the dispatcher by hand (manualQueue): they advance the fake
// clock, call dispatch, and then look at who was admitted, with no goroutine racing
// them. TestQueueWaitsForRefill runs the real dispatcher end to end.

type reserveResult struct {
	r   reserveOutcome
	err error
}

// queueFixture is a Service whose queue waits are allowed and whose dispatcher the test
// calls itself.
type queueFixture struct {
	*fixture
	pushed chan struct{}
}

func manualQueue(t *testing.T, cfg Config) *queueFixture {
	t.Helper()
	f := newFixture(t, cfg)
	q := &queueFixture{fixture: f, pushed: make(chan struct{}, 1000)}
	f.svc.queue.onPush = func() { q.pushed <- struct{}{} }
	f.svc.queue.setRunning(true)
	return q
}

// longDeadline is a context whose deadline never limits a wait (MaxWait does).
func longDeadline(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	t.Cleanup(cancel)
	return ctx
}

// start calls Reserve in a goroutine and returns its result channel.
func (q *queueFixture) start(ctx context.Context, req reserveRequest) <-chan reserveResult {
	ch := make(chan reserveResult, 1)
	go func() {
		r, err := q.svc.Reserve(ctx, req)
		ch <- reserveResult{r, err}
	}()
	return ch
}

// enqueue starts req and waits until it waits in the queue.
func (q *queueFixture) enqueue(t *testing.T, ctx context.Context, req reserveRequest) <-chan reserveResult {
	t.Helper()
	ch := q.start(ctx, req)
	select {
	case <-q.pushed:
	case res := <-ch:
		t.Fatalf("%s was decided at once (%+v), want it queued", req.RequestID, res)
	case <-time.After(10 * time.Second): // a failure timeout, not a wait
		t.Fatalf("%s was not queued", req.RequestID)
	}
	return ch
}

// dispatchAfter advances the clock and runs one dispatch.
func (q *queueFixture) dispatchAfter(d time.Duration) {
	q.clock.Advance(d)
	q.svc.queue.dispatch()
}

// await returns the result of a request the test expects to be decided by now.
func await(t *testing.T, name string, ch <-chan reserveResult) reserveResult {
	t.Helper()
	select {
	case res := <-ch:
		return res
	case <-time.After(10 * time.Second): // a failure timeout, not a wait
		t.Fatalf("%s is still waiting", name)
		return reserveResult{}
	}
}

// waiting returns how many requests are in the queue. Outcomes are delivered inside
// dispatch, so after dispatch returns this is exact.
func (q *queueFixture) waiting() int { return int(q.svc.queue.waiting.Load()) }

func req(id, tenant string, p mantlev1.Priority, tokens int64) reserveRequest {
	return reserveRequest{Tenant: tenant, RequestID: id, Priority: p, Model: "m", InputTokens: tokens - 1, MaxOutputTokens: 1}
}

func TestQueueWaitsForRefill(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testConfig())
	pushed := make(chan struct{}, 1)
	f.svc.queue.onPush = func() { pushed <- struct{}{} }
	f.run(t)
	f.reserve(t, "acme", 5999, 1) // empty: 100 tokens a second come back

	q := &queueFixture{fixture: f, pushed: pushed}
	ch := q.enqueue(t, longDeadline(t), req("r1", "acme", mantlev1.Priority_PRIORITY_NORMAL, 250))
	f.clock.Advance(2500 * time.Millisecond)
	res := await(t, "r1", ch)
	if res.err != nil {
		t.Fatalf("after the refill: %v, want granted", res.err)
	}
	if res.r.Waited != 2500*time.Millisecond || res.r.Levels.Tokens.Remaining != 0 {
		t.Errorf("waited %v with %d tokens left, want 2.5s and 0", res.r.Waited, res.r.Levels.Tokens.Remaining)
	}
	if got := f.counter(t, "mantle_quota_decisions_total", "result", "granted", "priority", "normal"); got != 2 {
		t.Errorf("granted normal decisions = %v, want 2", got)
	}
}

func TestQueueServesHigherClassesFirst(t *testing.T) {
	t.Parallel()
	q := manualQueue(t, testConfig())
	q.reserve(t, "acme", 5999, 1)
	ctx := longDeadline(t)
	// Arrivals in reverse priority order, each needing 10s of refill.
	batch := q.enqueue(t, ctx, req("batch", "acme", mantlev1.Priority_PRIORITY_BATCH, 1000))
	normal := q.enqueue(t, ctx, req("normal", "acme", mantlev1.Priority_PRIORITY_UNSPECIFIED, 1000))
	critical := q.enqueue(t, ctx, req("critical", "acme", mantlev1.Priority_PRIORITY_CRITICAL, 1000))

	for i, want := range []struct {
		name string
		ch   <-chan reserveResult
	}{{"critical", critical}, {"normal", normal}, {"batch", batch}} {
		q.dispatchAfter(10 * time.Second)
		res := await(t, want.name, want.ch)
		if res.err != nil || res.r.Waited != time.Duration(i+1)*10*time.Second {
			t.Fatalf("%s: waited %v, err %v; want granted after %ds", want.name, res.r.Waited, res.err, (i+1)*10)
		}
		if got, wantWaiting := q.waiting(), 2-i; got != wantWaiting {
			t.Fatalf("after %s: %d waiting, want %d", want.name, got, wantWaiting)
		}
	}
}

func TestQueueLowerClassCannotTakeWhatAHigherWaitsFor(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Queue.MaxWait = 2 * time.Minute
	q := manualQueue(t, cfg)
	q.reserve(t, "acme", 5999, 1)
	ctx := longDeadline(t)
	// A large critical request waits 50s for 5000 tokens.
	critical := q.enqueue(t, ctx, req("critical", "acme", mantlev1.Priority_PRIORITY_CRITICAL, 5000))

	q.clock.Advance(10 * time.Second) // 1000 tokens are back: plenty for a small request
	// Without a deadline a small batch request is refused at once, told to come back
	// when the critical one is due...
	_, err := q.svc.Reserve(context.Background(), req("batch-now", "acme", mantlev1.Priority_PRIORITY_BATCH, 100))
	if e, ok := errors.AsType[*ledger.ExhaustedError](err); !ok || e.Bucket != "tenant:acme:tpm" || e.RetryAfter != 40*time.Second {
		t.Fatalf("batch without deadline: err = %v, want held back on tenant:acme:tpm for 40s", err)
	}
	// ... and with one it waits behind it.
	batch := q.enqueue(t, ctx, req("batch", "acme", mantlev1.Priority_PRIORITY_BATCH, 100))
	// So does a request of the same class.
	second := q.enqueue(t, ctx, req("critical-2", "acme", mantlev1.Priority_PRIORITY_CRITICAL, 100))
	q.svc.queue.dispatch()
	if got := q.waiting(); got != 3 {
		t.Fatalf("%d waiting, want all 3: nobody may take the critical request's tokens", got)
	}
	q.dispatchAfter(40 * time.Second)
	if res := await(t, "critical", critical); res.err != nil || res.r.Waited != 50*time.Second {
		t.Fatalf("critical: %+v, want granted after 50s", res)
	}
	q.dispatchAfter(time.Second)
	if res := await(t, "critical-2", second); res.err != nil {
		t.Fatalf("critical-2: %v", res.err)
	}
	q.dispatchAfter(time.Second)
	if res := await(t, "batch", batch); res.err != nil {
		t.Fatalf("batch: %v", res.err)
	}
	// A request on another tenant's buckets was never held up.
	if _, err := q.svc.Reserve(context.Background(), req("other", "beta", mantlev1.Priority_PRIORITY_BATCH, 100)); err != nil {
		t.Errorf("another tenant: %v, want granted", err)
	}
}

func TestQueueSharesAContendedKeyByWeight(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.DefaultLimits = RateLimits{RPM: 10_000, TPM: 10_000_000}
	cfg.UpstreamKeys = map[string]RateLimits{"shared": {TPM: 6000}} // 100 tokens a second
	cfg.Queue.Weights = map[string]float64{"heavy": 3}
	cfg.Queue.MaxWait = 10 * time.Minute
	q := manualQueue(t, cfg)
	ctx := longDeadline(t)
	if _, err := q.svc.Reserve(ctx, reserveRequest{Tenant: "drain", Model: "m", InputTokens: 5999, MaxOutputTokens: 1, UpstreamKey: "shared"}); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		for _, tenant := range []string{"light", "heavy"} {
			r := req(fmt.Sprintf("%s-%d", tenant, i), tenant, mantlev1.Priority_PRIORITY_NORMAL, 100)
			r.UpstreamKey = "shared"
			q.enqueue(t, ctx, r)
		}
	}
	// One request fits per second; after 20 of them, weights 3:1 give 15 and 5.
	for range 20 {
		q.dispatchAfter(time.Second)
	}
	granted := map[string]int{"light": 20, "heavy": 20}
	q.svc.queue.mu.Lock()
	for tenant, tq := range q.svc.queue.classes[classNormal].tenants {
		granted[tenant] -= len(tq.waiters)
	}
	q.svc.queue.mu.Unlock()
	if granted["heavy"]+granted["light"] != 20 || granted["heavy"] < 14 || granted["heavy"] > 16 {
		t.Errorf("granted %v in 20 seconds, want 20 split about 15:5", granted)
	}
}

func TestQueueFullShedsTheLowestClass(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Queue.Size = 2
	q := manualQueue(t, cfg)
	q.reserve(t, "acme", 5999, 1)
	ctx := longDeadline(t)
	batch := q.enqueue(t, ctx, req("batch", "acme", mantlev1.Priority_PRIORITY_BATCH, 100))
	normal := q.enqueue(t, ctx, req("normal", "acme", mantlev1.Priority_PRIORITY_NORMAL, 100))
	critical := q.enqueue(t, ctx, req("critical", "acme", mantlev1.Priority_PRIORITY_CRITICAL, 100))

	res := await(t, "batch", batch)
	if e, ok := errors.AsType[*ledger.ExhaustedError](res.err); !ok || e.Cause != ledger.CauseShed || e.Bucket != "queue" {
		t.Fatalf("batch: err = %v, want shed from the queue", res.err)
	}
	// Nothing lower than a newcomer batch request is left to displace.
	_, err := q.svc.Reserve(ctx, req("batch-2", "acme", mantlev1.Priority_PRIORITY_BATCH, 100))
	if e, ok := errors.AsType[*ledger.ExhaustedError](err); !ok || e.Cause != ledger.CauseQueueFull {
		t.Fatalf("batch-2: err = %v, want queue full", err)
	}
	reasons := map[string]int{}
	for _, ev := range q.events.rejections(t) {
		reasons[ev.GetReason()+"/"+ev.GetRequestId()]++
	}
	if reasons["SHED/batch"] != 1 || reasons["QUEUE_FULL/batch-2"] != 1 {
		t.Errorf("rejection events = %v, want SHED for batch and QUEUE_FULL for batch-2", reasons)
	}
	if got := q.counter(t, "mantle_quota_queue_shed_total", "priority", "batch"); got != 1 {
		t.Errorf("shed counter = %v, want 1", got)
	}
	q.dispatchAfter(2 * time.Second)
	for name, ch := range map[string]<-chan reserveResult{"critical": critical, "normal": normal} {
		if res := await(t, name, ch); res.err != nil {
			t.Errorf("%s: %v", name, res.err)
		}
	}
}

func TestQueueWaitsNeverOutlastTheDeadline(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Queue.MaxWait = 5 * time.Second
	q := manualQueue(t, cfg)
	q.reserve(t, "acme", 5999, 1)
	ctx := longDeadline(t)

	t.Run("a wait longer than the budget is refused at once", func(t *testing.T) {
		_, err := q.svc.Reserve(ctx, req("long", "acme", mantlev1.Priority_PRIORITY_CRITICAL, 600)) // 6s
		if e, ok := errors.AsType[*ledger.ExhaustedError](err); !ok || e.RetryAfter != 6*time.Second || e.EffectiveCause() != ledger.CauseBucket {
			t.Fatalf("err = %v, want exhausted with retry after 6s", err)
		}
	})
	t.Run("the caller's deadline bounds the wait too", func(t *testing.T) {
		short, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := q.svc.Reserve(short, req("short", "acme", mantlev1.Priority_PRIORITY_CRITICAL, 300)) // 3s
		if !errors.Is(err, ledger.ErrExhausted) {
			t.Fatalf("err = %v, want exhausted at once", err)
		}
	})
	t.Run("a waiter gives up when its budget runs out", func(t *testing.T) {
		// critical is due at 4s; high waits behind it, and once critical has taken the
		// refill, high would be due at 6s: past its 5s budget. The dispatcher says so
		// at once instead of letting it wait out its budget.
		critical := q.enqueue(t, ctx, req("critical", "acme", mantlev1.Priority_PRIORITY_CRITICAL, 400))
		high := q.enqueue(t, ctx, req("high", "acme", mantlev1.Priority_PRIORITY_HIGH, 200))
		q.dispatchAfter(4 * time.Second)
		if res := await(t, "critical", critical); res.err != nil {
			t.Fatal(res.err)
		}
		// The critical grant emptied the bucket again: high needs 2s more, at 6s > 5s.
		res := await(t, "high", high)
		e, ok := errors.AsType[*ledger.ExhaustedError](res.err)
		if !ok || e.Cause != ledger.CauseDeadline || e.Bucket != "tenant:acme:tpm" || e.RetryAfter != 2*time.Second {
			t.Fatalf("high: err = %v, want refused for its deadline, retry after 2s", res.err)
		}
	})
	t.Run("a waiter's own timer ends its wait", func(t *testing.T) {
		q.dispatchAfter(time.Minute) // refill completely
		q.reserve(t, "acme", 5999, 1)
		w := q.enqueue(t, ctx, req("timer", "acme", mantlev1.Priority_PRIORITY_NORMAL, 300)) // due at 3s
		q.clock.Advance(5 * time.Second)                                                     // no dispatch: the budget ends first
		res := await(t, "timer", w)
		if e, ok := errors.AsType[*ledger.ExhaustedError](res.err); !ok || e.Cause != ledger.CauseDeadline || e.Waited != 5*time.Second {
			t.Fatalf("timer: err = %v, want refused at its 5s budget, having waited 5s", res.err)
		}
		if q.waiting() != 0 {
			t.Errorf("%d still waiting, want 0", q.waiting())
		}
	})
	if got := q.counter(t, "mantle_quota_decisions_total", "result", "deadline"); got != 2 {
		t.Errorf("deadline decisions = %v, want 2", got)
	}
}

func TestQueueCallerCancels(t *testing.T) {
	t.Parallel()
	q := manualQueue(t, testConfig())
	q.reserve(t, "acme", 5999, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	ch := q.enqueue(t, ctx, req("gone", "acme", mantlev1.Priority_PRIORITY_NORMAL, 100))
	cancel()
	if res := await(t, "gone", ch); !errors.Is(res.err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", res.err)
	}
	if q.waiting() != 0 {
		t.Errorf("%d waiting after the cancel, want 0", q.waiting())
	}
	// Canceling is not a quota refusal.
	if n := len(q.events.rejections(t)); n != 0 {
		t.Errorf("published %d rejection events, want none", n)
	}
}

func TestQueueShutdownRefusesWaiters(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testConfig())
	pushed := make(chan struct{}, 1)
	f.svc.queue.onPush = func() { pushed <- struct{}{} }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.svc.Run(ctx) }()
	<-f.svc.queue.started
	f.reserve(t, "acme", 5999, 1)
	q := &queueFixture{fixture: f, pushed: pushed}
	ch := q.enqueue(t, longDeadline(t), req("r", "acme", mantlev1.Priority_PRIORITY_NORMAL, 100))
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if res := await(t, "r", ch); !errors.Is(res.err, errShuttingDown) {
		t.Fatalf("err = %v, want ErrShuttingDown", res.err)
	}
	// With no dispatcher nobody may wait.
	_, err := f.svc.Reserve(longDeadline(t), req("after", "acme", mantlev1.Priority_PRIORITY_CRITICAL, 100))
	if !errors.Is(err, ledger.ErrExhausted) {
		t.Errorf("after shutdown: err = %v, want refused at once", err)
	}
}

// gateStore holds the dispatcher inside Reserve, after the grant, until the test lets
// it go: the moment a caller may leave while its request is being granted.
type gateStore struct {
	stateStore
	armed   chan struct{} // one value arms the gate for one Reserve
	entered chan struct{}
	proceed chan struct{}
}

func (g *gateStore) Reserve(ctx context.Context, c ledger.Charge) (ledger.Grant, error) {
	gr, err := g.stateStore.Reserve(ctx, c)
	select {
	case <-g.armed:
		g.entered <- struct{}{}
		<-g.proceed
	default:
	}
	return gr, err
}

func TestQueueReleasesAGrantItsCallerLeft(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClockAt(t0)
	memory := memstore.New(clock)
	gate := &gateStore{stateStore: memory, armed: make(chan struct{}, 1), entered: make(chan struct{}), proceed: make(chan struct{})}
	q := &queueFixture{fixture: newFixtureWith(t, gate, clock, testConfig()), pushed: make(chan struct{}, 10)}
	q.svc.queue.onPush = func() { q.pushed <- struct{}{} }
	q.svc.queue.setRunning(true)
	q.reserve(t, "acme", 5999, 1)

	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	ch := q.enqueue(t, ctx, req("leaver", "acme", mantlev1.Priority_PRIORITY_NORMAL, 100))
	gate.armed <- struct{}{}
	clock.Advance(time.Second)
	dispatched := make(chan struct{})
	go func() {
		q.svc.queue.dispatch()
		close(dispatched)
	}()
	<-gate.entered // granted in the store, not yet delivered
	cancel()
	if res := await(t, "leaver", ch); !errors.Is(res.err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", res.err)
	}
	close(gate.proceed)
	<-dispatched
	if n := memory.OpenReservations(); n != 1 {
		t.Errorf("%d reservations open, want only the first: the unused grant released", n)
	}
	// The 100 tokens came back: they are there to take again. (The request bucket
	// refilled its one request in the second that passed.)
	if got := q.reserve(t, "acme", 99, 1); got.Levels.Tokens.Remaining != 0 || got.Levels.Requests.Remaining != 59 {
		t.Errorf("levels = %+v, want the released 100 tokens taken again and 59 requests left", got.Levels)
	}
}
