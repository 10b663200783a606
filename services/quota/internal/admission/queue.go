// Package admission is quota's per-replica priority queue: it admits requests to the
// Store at once when it can, and otherwise lets them wait, in priority order and fairly
// between tenants, for as long as their deadline allows.
package admission

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/services/quota/internal/ledger"
)

// Priority classes, highest first. Unspecified counts as normal.
const (
	classCritical = iota
	classHigh
	classNormal
	classBatch
	// NumClasses is how many priority classes there are; classes are 0 (critical) to
	// NumClasses-1 (batch).
	NumClasses = iota
)

var classNames = [NumClasses]string{"critical", "high", "normal", "batch"}

// ClassOf is the class of a request of priority p.
func ClassOf(p mantlev1.Priority) int {
	switch p {
	case mantlev1.Priority_PRIORITY_CRITICAL:
		return classCritical
	case mantlev1.Priority_PRIORITY_HIGH:
		return classHigh
	case mantlev1.Priority_PRIORITY_BATCH:
		return classBatch
	default:
		return classNormal
	}
}

// ClassName is the metric label of class c: critical, high, normal or batch.
func ClassName(c int) string { return classNames[c] }

// ErrShuttingDown refuses the waiters left when the dispatcher stops.
var ErrShuttingDown = errors.New("quota service is shutting down")

// Reserver is the one Store operation the queue needs.
type Reserver interface {
	// Reserve takes every bucket's cost, all or nothing, or returns an
	// *ledger.ExhaustedError naming what is short.
	Reserve(ctx context.Context, c ledger.Charge) (ledger.Grant, error)
}

// Config bounds waiting.
type Config struct {
	// Size is how many requests may wait at once; 0 turns waiting off.
	Size int
	// MaxWait caps any wait, whatever the caller's deadline.
	MaxWait time.Duration
	// DeadlineMargin is kept free at the end of the caller's deadline.
	DeadlineMargin time.Duration
	// Weights share contended buckets between tenants of one class; absent tenants and
	// non-positive weights count as 1.
	Weights map[string]float64
}

// weight returns the tenant's fairness weight.
func (c Config) weight(tenant string) float64 {
	if w, ok := c.Weights[tenant]; ok && w > 0 {
		return w
	}
	return 1
}

// Metrics are the queue's instruments, each labelled by class name (ClassName).
type Metrics struct {
	Length *prometheus.GaugeVec
	Wait   *prometheus.HistogramVec
	Shed   *prometheus.CounterVec
}

// Request is what the queue needs to know about a request.
type Request struct {
	Tenant string
	Class  int
	// Tokens is the request's size for fairness between tenants.
	Tokens int64
	// Buckets are the names of the enforced buckets (and budget) the request charges.
	Buckets []string
	Charge  ledger.Charge
}

// Queue admits requests to the Store in priority order. A request is first tried at
// once; when a bucket is short and the caller's deadline leaves room, it waits here, and
// a dispatcher (Run, owned by the quota service's Run) tries the waiting requests again when their
// buckets should have refilled, and whenever capacity comes back (a refund) or the
// queue changes.
//
// # Order
//
// Classes are strict: critical before high before normal before batch. Within a class,
// tenants take turns by weighted fair queuing over tokens: each tenant has a virtual
// time that grows by tokens/weight with every admission from the queue, and the tenant
// with the smallest goes next; a tenant that starts waiting joins at the class's current
// virtual time, so idling earns no credit. Within a tenant and class, requests are first
// in, first out.
//
// # No bypassing
//
// A waiting request names the buckets it is short on. Those buckets are spoken for: no
// request of the same or a lower class, waiting or newly arrived, may charge them until
// the waiter has been served or has left. Without this, a stream of small batch requests
// could keep taking the refill a large critical request waits for, and it would never be
// admitted. Requests that do not touch those buckets are not held up.
//
// # Bounds
//
// A wait never outlasts the caller's deadline (less DeadlineMargin) nor MaxWait; a call
// without a deadline never waits. When the dispatcher learns that a bucket will not
// refill before a waiter's deadline, the waiter is refused at once. The queue holds at
// most Size requests; a newcomer to a full queue displaces the newest waiter of the
// lowest class below its own, or is refused: the lowest class is shed first.
//
// The queue is per replica. Replicas share buckets through the Store but not their
// queues, so priority holds within each replica's traffic.
type Queue struct {
	cfg     Config
	store   Reserver
	clock   clockwork.Clock
	metrics Metrics
	// release returns a grant nobody will use (the caller left while it was granted).
	release func(ledger.Charge)

	waiting atomic.Int64 // len of every tenant queue together; read without mu on the fast path
	kick    chan struct{}
	// onPush and onGrant, when set (tests), are called after a request joins the queue
	// and after one is granted (from the queue or at once), without q.mu held.
	onPush  func()
	onGrant func(adm *Request, fromQueue bool)
	// started is closed once a dispatcher runs.
	started   chan struct{}
	startOnce sync.Once

	mu      sync.Mutex
	running bool
	seq     uint64
	classes [NumClasses]classQueue
	// spoken counts, per bucket and class, the waiters short on that bucket.
	spoken map[string]*[NumClasses]int
}

type classQueue struct {
	tenants map[string]*tenantQueue
	// vtime is the virtual start time of the last admission from this class.
	vtime float64
	// idle keeps the virtual time of tenants whose line emptied, so that leaving and
	// coming back does not reset a tenant that has been served more than others.
	idle map[string]float64
}

type tenantQueue struct {
	waiters []*waiter
	vtime   float64
}

// Waiter states.
const (
	waiting  = iota // in the queue
	trying          // the dispatcher is asking the Store for it
	finished        // an outcome was delivered, or the waiter left
)

type waiter struct {
	adm      *Request
	ctx      context.Context
	seq      uint64
	arrived  time.Time
	giveUpAt time.Time
	nextTry  time.Time
	short    []string
	lastErr  *ledger.ExhaustedError
	state    int
	left     bool // the caller stopped waiting while the dispatcher was trying
	done     chan outcome
}

type outcome struct {
	grant ledger.Grant
	err   error
}

// New returns a queue that admits to store on clock. release returns a grant whose
// caller left before it was delivered. Nobody waits until Run serves the queue.
func New(cfg Config, store Reserver, clock clockwork.Clock, m Metrics, release func(ledger.Charge)) *Queue {
	q := &Queue{
		cfg: cfg, store: store, clock: clock, metrics: m, release: release,
		kick:    make(chan struct{}, 1),
		started: make(chan struct{}),
		spoken:  make(map[string]*[NumClasses]int),
	}
	for c := range q.classes {
		q.classes[c].tenants = make(map[string]*tenantQueue)
		q.classes[c].idle = make(map[string]float64)
	}
	return q
}

// Waiting is how many requests wait now.
func (q *Queue) Waiting() int { return int(q.waiting.Load()) }

// Started is closed once a dispatcher (Run) serves the queue.
func (q *Queue) Started() <-chan struct{} { return q.started }

// Admit asks the Store for adm, waiting in the queue when allowed. It returns the grant
// and how long the request waited.
func (q *Queue) Admit(ctx context.Context, adm *Request) (ledger.Grant, time.Duration, error) {
	w, g, err := q.enter(ctx, adm)
	if w == nil {
		return g, 0, err
	}
	timer := q.clock.NewTimer(w.giveUpAt.Sub(w.arrived))
	defer timer.Stop()
	select {
	case o := <-w.done:
		return o.grant, q.clock.Since(w.arrived), o.err
	case <-timer.Chan():
		if o, ok := q.leave(w); ok {
			return o.grant, q.clock.Since(w.arrived), o.err
		}
		return ledger.Grant{}, q.clock.Since(w.arrived), w.deadlineError(q.clock.Now())
	case <-ctx.Done():
		if o, ok := q.leave(w); ok && o.err == nil {
			q.release(adm.Charge)
		}
		return ledger.Grant{}, q.clock.Since(w.arrived), ctx.Err()
	}
}

// enter tries adm at once and, when it has to wait and may, queues it. It returns the
// waiter to wait on, or (with a nil waiter) the outcome.
func (q *Queue) enter(ctx context.Context, adm *Request) (*waiter, ledger.Grant, error) {
	var refusal *ledger.ExhaustedError
	// The fast path: nobody waits (the common case), or nobody of the same or a higher
	// class waits for what this request needs.
	if q.waiting.Load() == 0 || !q.spokenFor(adm) {
		g, err := q.store.Reserve(ctx, adm.Charge)
		if !errors.As(err, &refusal) {
			if err == nil && q.onGrant != nil {
				q.onGrant(adm, false)
			}
			return nil, g, err
		}
	}

	q.mu.Lock()
	now := q.clock.Now()
	budget := q.waitBudget(ctx)
	switch {
	case refusal == nil && budget <= 0:
		// Held back by a waiter of higher or equal priority, and not allowed to wait.
		q.mu.Unlock()
		return nil, ledger.Grant{}, q.heldBack(adm, now)
	case refusal != nil && (budget <= 0 || refusal.RetryAfter > budget):
		// Not allowed to wait, or the bucket will not refill in time: refuse at once.
		q.mu.Unlock()
		return nil, ledger.Grant{}, refusal
	}
	if int(q.waiting.Load()) >= q.cfg.Size && !q.shedFor(adm.Class, now) {
		q.mu.Unlock()
		return nil, ledger.Grant{}, q.full(refusal)
	}
	w := &waiter{adm: adm, ctx: ctx, arrived: now, giveUpAt: now.Add(budget), nextTry: now, done: make(chan outcome, 1)}
	if refusal != nil {
		w.nextTry, w.lastErr = now.Add(refusal.RetryAfter), refusal
		w.short = refusal.Short
	}
	q.push(w)
	q.mu.Unlock()
	q.Poke()
	if q.onPush != nil {
		q.onPush()
	}
	return w, ledger.Grant{}, nil
}

// waitBudget is how long a caller may wait: its remaining deadline less the margin,
// capped at MaxWait; 0 without a deadline, a dispatcher, or waiting room. The deadline
// is wall-clock time, the one thing here that is not on the injected clock; it is
// turned into a duration once, and the wait itself runs on the injected clock.
func (q *Queue) waitBudget(ctx context.Context) time.Duration {
	deadline, ok := ctx.Deadline()
	if !ok || !q.running || q.cfg.Size == 0 {
		return 0
	}
	return max(min(time.Until(deadline)-q.cfg.DeadlineMargin, q.cfg.MaxWait), 0)
}

// spokenFor reports whether a waiter of the same or a higher class is short on a bucket
// adm charges.
func (q *Queue) spokenFor(adm *Request) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.spokenForLocked(adm)
}

func (q *Queue) spokenForLocked(adm *Request) bool {
	return q.spokenBy(adm, adm.Class)
}

// spokenAboveLocked reports whether a waiter of a strictly higher class is short on a
// bucket adm charges.
func (q *Queue) spokenAboveLocked(adm *Request) bool {
	return q.spokenBy(adm, adm.Class-1)
}

// spokenBy reports whether a waiter of class upTo or higher is short on a bucket adm
// charges. Callers hold q.mu.
func (q *Queue) spokenBy(adm *Request, upTo int) bool {
	for _, b := range adm.Buckets {
		if counts, ok := q.spoken[b]; ok {
			for c := 0; c <= upTo; c++ {
				if counts[c] > 0 {
					return true
				}
			}
		}
	}
	return false
}

// heldBack is the refusal of a request that may not wait and may not bypass a waiter.
func (q *Queue) heldBack(adm *Request, now time.Time) *ledger.ExhaustedError {
	e := &ledger.ExhaustedError{Bucket: "queue", RetryAfter: time.Second, Cause: ledger.CauseQueueFull}
	for c := 0; c <= adm.Class; c++ {
		for _, tq := range q.classes[c].tenants {
			for _, w := range tq.waiters {
				for _, b := range w.short {
					if slices.Contains(adm.Buckets, b) {
						e.Bucket, e.Cause, e.Short = b, ledger.CauseBucket, w.short
						e.RetryAfter = max(w.nextTry.Sub(now), time.Millisecond)
						return e
					}
				}
			}
		}
	}
	return e
}

// full is the refusal of a newcomer to a full queue.
func (q *Queue) full(refusal *ledger.ExhaustedError) *ledger.ExhaustedError {
	e := &ledger.ExhaustedError{Bucket: "queue", RetryAfter: time.Second, Cause: ledger.CauseQueueFull}
	if refusal != nil {
		e.RetryAfter, e.Short = refusal.RetryAfter, refusal.Short
	}
	return e
}

// shedFor displaces the newest waiter of the lowest class below class, and reports
// whether it found one. Callers hold q.mu.
func (q *Queue) shedFor(class int, now time.Time) bool {
	for c := NumClasses - 1; c > class; c-- {
		var victim *waiter
		for _, tq := range q.classes[c].tenants {
			for _, w := range tq.waiters {
				// A waiter the dispatcher is trying right now is left alone.
				if w.state == waiting && (victim == nil || w.seq > victim.seq) {
					victim = w
				}
			}
		}
		if victim != nil {
			q.remove(victim)
			victim.deliver(outcome{err: &ledger.ExhaustedError{Bucket: "queue", RetryAfter: victim.retryEstimate(now), Cause: ledger.CauseShed, Short: victim.short}})
			q.metrics.Shed.WithLabelValues(classNames[c]).Inc()
			return true
		}
	}
	return false
}

// push adds w to its class and tenant. Callers hold q.mu.
func (q *Queue) push(w *waiter) {
	q.seq++
	w.seq = q.seq
	cq := &q.classes[w.adm.Class]
	tq, ok := cq.tenants[w.adm.Tenant]
	if !ok {
		tq = &tenantQueue{vtime: max(cq.idle[w.adm.Tenant], cq.vtime)}
		delete(cq.idle, w.adm.Tenant)
		cq.tenants[w.adm.Tenant] = tq
	}
	tq.waiters = append(tq.waiters, w)
	q.markShort(w, w.short, 1)
	q.waiting.Add(1)
	q.metrics.Length.WithLabelValues(classNames[w.adm.Class]).Inc()
}

// remove takes w out of the queue. Callers hold q.mu.
func (q *Queue) remove(w *waiter) {
	cq := &q.classes[w.adm.Class]
	tq := cq.tenants[w.adm.Tenant]
	if tq == nil {
		return
	}
	i := slices.Index(tq.waiters, w)
	if i < 0 {
		return
	}
	tq.waiters = slices.Delete(tq.waiters, i, i+1)
	if len(tq.waiters) == 0 {
		delete(cq.tenants, w.adm.Tenant)
		if tq.vtime > cq.vtime {
			cq.idle[w.adm.Tenant] = tq.vtime
		}
		if len(cq.idle) > maxIdleTenants {
			// Tags at or below the class's time no longer matter (max() would drop them).
			maps.DeleteFunc(cq.idle, func(_ string, v float64) bool { return v <= cq.vtime })
		}
	}
	q.markShort(w, w.short, -1)
	q.waiting.Add(-1)
	q.metrics.Length.WithLabelValues(classNames[w.adm.Class]).Dec()
}

// markShort adds delta to the spoken counts of buckets for w's class. Callers hold q.mu.
func (q *Queue) markShort(w *waiter, buckets []string, delta int) {
	for _, b := range buckets {
		counts, ok := q.spoken[b]
		if !ok {
			counts = new([NumClasses]int)
			q.spoken[b] = counts
		}
		counts[w.adm.Class] += delta
		if *counts == ([NumClasses]int{}) {
			delete(q.spoken, b)
		}
	}
}

// setShort replaces w's short buckets. Callers hold q.mu.
func (q *Queue) setShort(w *waiter, short []string) {
	q.markShort(w, w.short, -1)
	w.short = short
	q.markShort(w, w.short, 1)
}

// leave takes a waiter whose caller stopped waiting out of the queue. When an outcome
// was already delivered it returns it instead.
func (q *Queue) leave(w *waiter) (outcome, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch w.state {
	case finished:
		return <-w.done, true
	case trying:
		// The dispatcher is asking the Store right now; it will see left and release
		// what it gets.
		w.left = true
	default:
		q.remove(w)
		w.state = finished
	}
	q.Poke() // what w held spoken for is free
	return outcome{}, false
}

func (w *waiter) deliver(o outcome) {
	w.state = finished
	w.done <- o // buffered: never blocks
}

// retryEstimate is when w's buckets are expected to cover it.
func (w *waiter) retryEstimate(now time.Time) time.Duration {
	return max(w.nextTry.Sub(now), time.Millisecond)
}

// deadlineError is the refusal of a waiter whose wait ran out.
func (w *waiter) deadlineError(now time.Time) *ledger.ExhaustedError {
	e := &ledger.ExhaustedError{Bucket: "queue", RetryAfter: w.retryEstimate(now), Cause: ledger.CauseDeadline, Short: w.short}
	if w.lastErr != nil {
		e.Bucket, e.Cost, e.Remaining = w.lastErr.Bucket, w.lastErr.Cost, w.lastErr.Remaining
	}
	return e
}

// Poke wakes the dispatcher without blocking: capacity may have come back.
func (q *Queue) Poke() {
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// Run is the dispatcher. It returns when ctx is done, refusing every waiter: without a
// dispatcher nobody would serve them.
func (q *Queue) Run(ctx context.Context) error {
	q.setRunning(true)
	q.startOnce.Do(func() { close(q.started) })
	// The timer exists only while a waiter needs a wake-up: an idle dispatcher holds no
	// timer, so tests that count a fake clock's waiters see only what is really waiting.
	var timer clockwork.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		next := q.dispatch()
		var wake <-chan time.Time
		switch {
		case next.IsZero() && timer != nil:
			timer.Stop()
		case !next.IsZero() && timer == nil:
			timer = q.clock.NewTimer(max(next.Sub(q.clock.Now()), 0))
			wake = timer.Chan()
		case !next.IsZero():
			timer.Stop()
			timer.Reset(max(next.Sub(q.clock.Now()), 0))
			wake = timer.Chan()
		}
		select {
		case <-ctx.Done():
			q.close()
			return nil
		case <-q.kick:
		case <-wake:
		}
	}
}

// setRunning says whether a dispatcher serves the queue: without one, nobody may wait.
func (q *Queue) setRunning(running bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.running = running
}

func (q *Queue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.running = false
	for c := range q.classes {
		for _, tq := range q.classes[c].tenants {
			for _, w := range slices.Clone(tq.waiters) {
				q.remove(w)
				w.deliver(outcome{err: ErrShuttingDown})
			}
		}
	}
}

// maxIdleTenants bounds the remembered virtual times of tenants that stopped waiting.
const maxIdleTenants = 1024

// maxPasses bounds how often one dispatch goes over the queue: each pass after the first
// follows an admission, which moves a new request to the head of its tenant's line.
const maxPasses = 64

// dispatch tries the waiting requests in order and returns when it should run next
// (zero when nothing waits on time).
func (q *Queue) dispatch() time.Time {
	var next time.Time
	for range maxPasses {
		var progress bool
		next, progress = q.pass()
		if !progress {
			break
		}
	}
	return next
}

// pass goes once over the head of every tenant's line, classes in order and tenants by
// virtual time, and tries each that is due and not spoken for by one before it.
func (q *Queue) pass() (next time.Time, progress bool) {
	q.mu.Lock()
	heads := q.heads()
	q.mu.Unlock()

	// spoken holds the buckets short for waiters already passed over in this pass; a
	// later waiter that charges one of them must not take what they wait for. Waiters of
	// higher classes that are not at the head of their line block it too
	// (spokenAboveLocked).
	spoken := map[string]bool{}
	var unused []ledger.Charge // granted to callers who left; released after the pass
	defer func() {
		for _, c := range unused {
			q.release(c)
		}
	}()
	blocked := func(w *waiter) bool {
		for _, b := range w.adm.Buckets {
			if spoken[b] {
				return true
			}
		}
		return q.spokenAboveLocked(w.adm)
	}
	for _, w := range heads {
		q.mu.Lock()
		if w.state != waiting {
			q.mu.Unlock()
			continue
		}
		now := q.clock.Now()
		if w.nextTry.After(now) || blocked(w) {
			for _, b := range w.short {
				spoken[b] = true
			}
			if w.nextTry.After(now) && (next.IsZero() || w.nextTry.Before(next)) {
				next = w.nextTry
			}
			q.mu.Unlock()
			continue
		}
		w.state = trying
		q.mu.Unlock()

		g, err := q.store.Reserve(w.ctx, w.adm.Charge)

		q.mu.Lock()
		now = q.clock.Now()
		var refusal *ledger.ExhaustedError
		switch {
		case w.left || w.state == finished:
			// The caller left, or was shed or stopped meanwhile: nobody takes this.
			w.state = finished
			q.remove(w)
			if err == nil {
				unused = append(unused, w.adm.Charge)
			}
		case err == nil:
			q.served(w)
			q.remove(w)
			w.deliver(outcome{grant: g})
			progress = true
			if q.onGrant != nil {
				q.mu.Unlock()
				q.onGrant(w.adm, true)
				q.mu.Lock()
			}
		case errors.As(err, &refusal):
			w.state, w.lastErr = waiting, refusal
			w.nextTry = now.Add(refusal.RetryAfter)
			q.setShort(w, refusal.Short)
			if w.nextTry.After(w.giveUpAt) {
				// It will not refill in time: say so now rather than at the deadline.
				q.remove(w)
				w.deliver(outcome{err: w.deadlineError(now)})
				progress = true // its spoken buckets are free
				break
			}
			for _, b := range w.short {
				spoken[b] = true
			}
			if next.IsZero() || w.nextTry.Before(next) {
				next = w.nextTry
			}
		default:
			q.remove(w)
			w.deliver(outcome{err: err})
		}
		q.mu.Unlock()
	}
	return next, progress
}

// heads returns the first waiter of every tenant's line, in dispatch order. Callers
// hold q.mu.
func (q *Queue) heads() []*waiter {
	var heads []*waiter
	for c := range q.classes {
		cq := &q.classes[c]
		start := len(heads)
		for _, tq := range cq.tenants {
			heads = append(heads, tq.waiters[0])
		}
		slices.SortFunc(heads[start:], func(a, b *waiter) int {
			va, vb := cq.tenants[a.adm.Tenant].vtime, cq.tenants[b.adm.Tenant].vtime
			if c := cmp.Compare(va, vb); c != 0 {
				return c
			}
			return cmp.Compare(a.seq, b.seq)
		})
	}
	return heads
}

// served advances the virtual time of w's tenant as w is admitted from the queue.
// Callers hold q.mu, before removing w.
func (q *Queue) served(w *waiter) {
	cq := &q.classes[w.adm.Class]
	tq := cq.tenants[w.adm.Tenant]
	start := max(tq.vtime, cq.vtime)
	tq.vtime = start + float64(max(w.adm.Tokens, 1))/q.cfg.weight(w.adm.Tenant)
	cq.vtime = start
	q.metrics.Wait.WithLabelValues(classNames[w.adm.Class]).Observe(q.clock.Since(w.arrived).Seconds())
}
