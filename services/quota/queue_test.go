package quota

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/services/quota/internal/ledger"
	"github.com/mantle-mesh/mantle/services/quota/internal/memstore"
)

// The queue's order, fairness, bounds and shedding are tested in internal/admission.
// These tests check what the service adds around it: Run owns the dispatcher, a
// refusal after a wait says how long, decisions are counted, rejections published and
// an unused grant released. Most run the real dispatcher.

type reserveResult struct {
	r   reserveOutcome
	err error
}

// queueFixture is a fixture whose background work runs.
type queueFixture struct {
	*fixture
}

func runningQueue(t *testing.T, cfg Config) *queueFixture {
	t.Helper()
	f := newFixture(t, cfg)
	f.run(t)
	return &queueFixture{fixture: f}
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

// enqueue starts req and returns once it waits in the queue, which then holds waiting
// calls, req included. The fake clock tells: it holds the sweeper's ticker, the
// dispatcher's timer while a waiter is due later (every waiter here is), and one timer
// per waiting call for the end of its wait, so it holds waiting+2 timers only once req
// waits.
func (q *queueFixture) enqueue(t *testing.T, ctx context.Context, req reserveRequest, waiting int) <-chan reserveResult {
	t.Helper()
	ch := q.start(ctx, req)
	failAfter, cancel := context.WithTimeout(ctx, 10*time.Second) // a failure timeout, not a wait
	defer cancel()
	if err := q.clock.BlockUntilContext(failAfter, waiting+2); err != nil {
		select {
		case res := <-ch:
			t.Fatalf("%s was decided at once (%+v), want it queued", req.RequestID, res)
		default:
			t.Fatalf("%s was not queued: %v", req.RequestID, err)
		}
	}
	return ch
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

func req(id, tenant string, p mantlev1.Priority, tokens int64) reserveRequest {
	return reserveRequest{Tenant: tenant, RequestID: id, Priority: p, Model: "m", InputTokens: tokens - 1, MaxOutputTokens: 1}
}

func TestQueueWaitsForRefill(t *testing.T) {
	t.Parallel()
	q := runningQueue(t, testConfig())
	q.reserve(t, "acme", 5999, 1) // empty: 100 tokens a second come back

	ch := q.enqueue(t, longDeadline(t), req("r1", "acme", mantlev1.Priority_PRIORITY_NORMAL, 250), 1)
	q.clock.Advance(2500 * time.Millisecond)
	res := await(t, "r1", ch)
	if res.err != nil {
		t.Fatalf("after the refill: %v, want granted", res.err)
	}
	if res.r.Waited != 2500*time.Millisecond || res.r.Levels.Tokens.Remaining != 0 {
		t.Errorf("waited %v with %d tokens left, want 2.5s and 0", res.r.Waited, res.r.Levels.Tokens.Remaining)
	}
	if got := q.counter(t, "mantle_quota_decisions_total", "result", "granted", "priority", "normal"); got != 2 {
		t.Errorf("granted normal decisions = %v, want 2", got)
	}
	if got := q.counter(t, "mantle_quota_queue_length"); got != 0 {
		t.Errorf("queue length = %v, want 0", got)
	}
}

// A shed waiter and a newcomer to a full queue are published and counted as such.
func TestQueueFullRefusalsArePublished(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Queue.Size = 2
	q := runningQueue(t, cfg)
	q.reserve(t, "acme", 5999, 1)
	ctx := longDeadline(t)
	batch := q.enqueue(t, ctx, req("batch", "acme", mantlev1.Priority_PRIORITY_BATCH, 100), 1)
	q.enqueue(t, ctx, req("normal", "acme", mantlev1.Priority_PRIORITY_NORMAL, 100), 2)
	q.start(ctx, req("critical", "acme", mantlev1.Priority_PRIORITY_CRITICAL, 100))

	res := await(t, "batch", batch)
	if e, ok := errors.AsType[*ledger.ExhaustedError](res.err); !ok || e.Cause != ledger.CauseShed || e.Bucket != "queue" {
		t.Fatalf("batch: err = %v, want shed from the queue", res.err)
	}
	// batch's wait is over (its timer stopped): the clock now counts critical's.
	failAfter, cancel := context.WithTimeout(ctx, 10*time.Second) // a failure timeout, not a wait
	defer cancel()
	if err := q.clock.BlockUntilContext(failAfter, 2+2); err != nil {
		t.Fatalf("critical was not queued: %v", err)
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
}

func TestQueueRefusalAfterAWaitSaysHowLong(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Queue.MaxWait = 5 * time.Second
	q := runningQueue(t, cfg)
	q.reserve(t, "acme", 5999, 1)
	ctx := longDeadline(t)
	// critical is due at 4s; high waits behind it, and once critical has taken the
	// refill, high would be due at 6s: past its 5s budget, so it is refused at 4s.
	critical := q.enqueue(t, ctx, req("critical", "acme", mantlev1.Priority_PRIORITY_CRITICAL, 400), 1)
	high := q.enqueue(t, ctx, req("high", "acme", mantlev1.Priority_PRIORITY_HIGH, 200), 2)
	q.clock.Advance(4 * time.Second)
	if res := await(t, "critical", critical); res.err != nil {
		t.Fatal(res.err)
	}
	res := await(t, "high", high)
	e, ok := errors.AsType[*ledger.ExhaustedError](res.err)
	if !ok || e.Cause != ledger.CauseDeadline || e.Bucket != "tenant:acme:tpm" || e.RetryAfter != 2*time.Second || e.Waited != 4*time.Second {
		t.Fatalf("high: err = %v, want refused for its deadline after waiting 4s, retry after 2s", res.err)
	}
	if got := q.counter(t, "mantle_quota_decisions_total", "result", "deadline"); got != 1 {
		t.Errorf("deadline decisions = %v, want 1", got)
	}
}

func TestQueueCallerCancels(t *testing.T) {
	t.Parallel()
	q := runningQueue(t, testConfig())
	q.reserve(t, "acme", 5999, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	ch := q.enqueue(t, ctx, req("gone", "acme", mantlev1.Priority_PRIORITY_NORMAL, 100), 1)
	cancel()
	if res := await(t, "gone", ch); !errors.Is(res.err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", res.err)
	}
	if got := q.counter(t, "mantle_quota_queue_length"); got != 0 {
		t.Errorf("queue length = %v after the cancel, want 0", got)
	}
	// Canceling is not a quota refusal.
	if n := len(q.events.rejections(t)); n != 0 {
		t.Errorf("published %d rejection events, want none", n)
	}
}

func TestQueueShutdownRefusesWaiters(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testConfig())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.svc.Run(ctx) }()
	<-f.svc.queue.Started()
	f.reserve(t, "acme", 5999, 1)
	q := &queueFixture{fixture: f}
	ch := q.enqueue(t, longDeadline(t), req("r", "acme", mantlev1.Priority_PRIORITY_NORMAL, 100), 1)
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

// release, which the queue calls for a grant whose caller left, gives back everything
// the grant took, its request included (internal/admission tests when it is called).
func TestReleaseReturnsEverythingAGrantTook(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClockAt(t0)
	memory := memstore.New(clock)
	f := newFixtureWith(t, memory, clock, testConfig())
	f.reserve(t, "acme", 5899, 1)
	left := f.reserve(t, "acme", 99, 1)
	f.svc.release(ledger.Charge{ID: left.ReservationID, Tenant: "acme"})
	if n := memory.OpenReservations(); n != 1 {
		t.Errorf("%d reservations open, want only the first: the unused grant released", n)
	}
	// The 100 tokens and the request came back: they are there to take again.
	if got := f.reserve(t, "acme", 99, 1); got.Levels.Tokens.Remaining != 0 || got.Levels.Requests.Remaining != 58 {
		t.Errorf("levels = %+v, want the released 100 tokens taken again and 58 requests left", got.Levels)
	}
}
