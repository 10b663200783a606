package admission

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/services/quota/internal/ledger"
	"github.com/mantle-mesh/mantle/services/quota/internal/memstore"
)

// Most queue tests drive the dispatcher by hand (manualQueue): they advance the fake
// clock, call dispatch, and then look at who was admitted, with no goroutine racing
// them. TestQueueWaitsForRefill runs the real dispatcher end to end.

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// limits are the buckets requests charge, as quota's service builds them: each
// tenant's RPM and TPM, and an upstream key's TPM when the request names a key.
type limits struct {
	rpm, tpm int64
	keys     map[string]int64
}

// roundLimits are 1 request and 100 tokens a second per tenant.
var roundLimits = limits{rpm: 60, tpm: 6000}

// testConfig is quota's default queue.
func testConfig() Config {
	return Config{Size: 10_000, MaxWait: 30 * time.Second, DeadlineMargin: 10 * time.Millisecond}
}

// tb is what the harness needs of a test: *testing.T and *rapid.T both have it.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
}

// harness is a queue on the memory store whose dispatcher the test calls itself
// (dispatch) unless it runs one (run).
type harness struct {
	q       *Queue
	store   *memstore.Store
	clock   *clockwork.FakeClock
	metrics Metrics
	limits  limits
	pushed  chan struct{}
	ids     int
}

func newHarness(t tb, cfg Config, l limits, store Reserver) *harness {
	t.Helper()
	clock := clockwork.NewFakeClockAt(t0)
	h := &harness{store: memstore.New(clock), clock: clock, limits: l, pushed: make(chan struct{}, 1000)}
	h.metrics = Metrics{
		Length: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "length"}, []string{"priority"}),
		Wait:   prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "wait"}, []string{"priority"}),
		Shed:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shed"}, []string{"priority"}),
	}
	if store == nil {
		store = h.store
	}
	h.q = New(cfg, store, clock, h.metrics, h.release)
	h.q.onPush = func() { h.pushed <- struct{}{} }
	return h
}

// manualQueue is a harness whose queue waits are allowed and whose dispatcher the test
// calls itself.
func manualQueue(t tb, cfg Config, l limits) *harness {
	t.Helper()
	h := newHarness(t, cfg, l, nil)
	h.q.setRunning(true)
	return h
}

// release returns a grant whose caller left, as quota's service does.
func (h *harness) release(c ledger.Charge) {
	if _, err := h.store.Settle(context.Background(), c.Tenant, c.ID, ledger.Actual{}, true); err != nil {
		panic(fmt.Sprintf("release %s: %v", c.ID, err))
	}
	h.q.Poke()
}

// request builds what quota's service hands the queue: tokens on the tenant's RPM and
// TPM buckets, and on key's TPM when key is set.
func (h *harness) request(tenant string, p mantlev1.Priority, tokens int64, key string) *Request {
	h.ids++
	group := ledger.TenantGroup(tenant)
	c := ledger.Charge{ID: fmt.Sprint("r", h.ids), Tenant: tenant, TTL: 2 * time.Minute, Tokens: tokens, Buckets: []ledger.BucketSpec{
		ledger.NewSpec(group, ledger.FieldRPM, ledger.KindRequests, 1, h.limits.rpm, false),
		ledger.NewSpec(group, ledger.FieldTPM, ledger.KindTokens, tokens, h.limits.tpm, false),
	}}
	if key != "" {
		c.Buckets = append(c.Buckets, ledger.NewSpec(ledger.KeyGroup(key), ledger.FieldTPM, ledger.KindTokens, tokens, h.limits.keys[key], false))
	}
	r := &Request{Tenant: tenant, Class: ClassOf(p), Tokens: tokens, Charge: c}
	for _, b := range c.Buckets {
		r.Buckets = append(r.Buckets, b.Name())
	}
	return r
}

// reserve admits tokens for tenant without a deadline (so at once) and fails the test
// when it is refused.
func (h *harness) reserve(t tb, tenant string, tokens int64) ledger.Grant {
	t.Helper()
	g, _, err := h.q.Admit(context.Background(), h.request(tenant, mantlev1.Priority_PRIORITY_NORMAL, tokens, ""))
	if err != nil {
		t.Fatalf("Admit(%s, %d): %v", tenant, tokens, err)
	}
	return g
}

// run starts the dispatcher until the test ends.
func (h *harness) run(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.q.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v, want nil after cancel", err)
		}
	})
	<-h.q.Started()
}

// longDeadline is a context whose deadline never limits a wait (MaxWait does).
func longDeadline(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	t.Cleanup(cancel)
	return ctx
}

type result struct {
	grant  ledger.Grant
	waited time.Duration
	err    error
}

// start calls Admit in a goroutine and returns its result channel.
func (h *harness) start(ctx context.Context, r *Request) <-chan result {
	ch := make(chan result, 1)
	go func() {
		g, waited, err := h.q.Admit(ctx, r)
		ch <- result{g, waited, err}
	}()
	return ch
}

// enqueue starts r and waits until it waits in the queue.
func (h *harness) enqueue(t *testing.T, ctx context.Context, name string, r *Request) <-chan result {
	t.Helper()
	ch := h.start(ctx, r)
	select {
	case <-h.pushed:
	case res := <-ch:
		t.Fatalf("%s was decided at once (%+v), want it queued", name, res)
	case <-time.After(10 * time.Second): // a failure timeout, not a wait
		t.Fatalf("%s was not queued", name)
	}
	return ch
}

// dispatchAfter advances the clock and runs one dispatch.
func (h *harness) dispatchAfter(d time.Duration) {
	h.clock.Advance(d)
	h.q.dispatch()
}

// await returns the result of a request the test expects to be decided by now.
func await(t *testing.T, name string, ch <-chan result) result {
	t.Helper()
	select {
	case res := <-ch:
		return res
	case <-time.After(10 * time.Second): // a failure timeout, not a wait
		t.Fatalf("%s is still waiting", name)
		return result{}
	}
}

// tokensLeft is what the grant left in the tenant's TPM bucket.
func tokensLeft(t *testing.T, g ledger.Grant, tenant string) int64 {
	t.Helper()
	for _, l := range g.Levels {
		if l.Group == ledger.TenantGroup(tenant) && l.Field == ledger.FieldTPM {
			return l.Remaining
		}
	}
	t.Fatalf("grant %+v has no TPM level of %s", g, tenant)
	return 0
}

// value reads a counter or gauge.
func value(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue() + m.GetGauge().GetValue()
}

func TestClassOf(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		p    mantlev1.Priority
		want string
	}{
		{mantlev1.Priority_PRIORITY_CRITICAL, "critical"},
		{mantlev1.Priority_PRIORITY_HIGH, "high"},
		{mantlev1.Priority_PRIORITY_NORMAL, "normal"},
		{mantlev1.Priority_PRIORITY_UNSPECIFIED, "normal"},
		{mantlev1.Priority_PRIORITY_BATCH, "batch"},
		{mantlev1.Priority(99), "normal"},
	} {
		if got := ClassName(ClassOf(tc.p)); got != tc.want {
			t.Errorf("class of %v = %s, want %s", tc.p, got, tc.want)
		}
	}
}

func TestQueueWaitsForRefill(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(), roundLimits, nil)
	h.run(t)
	h.reserve(t, "acme", 6000) // empty: 100 tokens a second come back

	ch := h.enqueue(t, longDeadline(t), "r1", h.request("acme", mantlev1.Priority_PRIORITY_NORMAL, 250, ""))
	h.clock.Advance(2500 * time.Millisecond)
	res := await(t, "r1", ch)
	if res.err != nil {
		t.Fatalf("after the refill: %v, want granted", res.err)
	}
	if left := tokensLeft(t, res.grant, "acme"); res.waited != 2500*time.Millisecond || left != 0 {
		t.Errorf("waited %v with %d tokens left, want 2.5s and 0", res.waited, left)
	}
	var m dto.Metric
	if err := h.metrics.Wait.WithLabelValues("normal").(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	if n, sum := m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum(); n != 1 || sum != 2.5 {
		t.Errorf("normal's queue wait: %d observations summing to %vs, want one of 2.5s", n, sum)
	}
}

func TestQueueServesHigherClassesFirst(t *testing.T) {
	t.Parallel()
	h := manualQueue(t, testConfig(), roundLimits)
	h.reserve(t, "acme", 6000)
	ctx := longDeadline(t)
	// Arrivals in reverse priority order, each needing 10s of refill.
	batch := h.enqueue(t, ctx, "batch", h.request("acme", mantlev1.Priority_PRIORITY_BATCH, 1000, ""))
	normal := h.enqueue(t, ctx, "normal", h.request("acme", mantlev1.Priority_PRIORITY_UNSPECIFIED, 1000, ""))
	critical := h.enqueue(t, ctx, "critical", h.request("acme", mantlev1.Priority_PRIORITY_CRITICAL, 1000, ""))

	for i, want := range []struct {
		name string
		ch   <-chan result
	}{{"critical", critical}, {"normal", normal}, {"batch", batch}} {
		h.dispatchAfter(10 * time.Second)
		res := await(t, want.name, want.ch)
		if res.err != nil || res.waited != time.Duration(i+1)*10*time.Second {
			t.Fatalf("%s: waited %v, err %v; want granted after %ds", want.name, res.waited, res.err, (i+1)*10)
		}
		if got, wantWaiting := h.q.Waiting(), 2-i; got != wantWaiting {
			t.Fatalf("after %s: %d waiting, want %d", want.name, got, wantWaiting)
		}
	}
}

func TestQueueLowerClassCannotTakeWhatAHigherWaitsFor(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.MaxWait = 2 * time.Minute
	h := manualQueue(t, cfg, roundLimits)
	h.reserve(t, "acme", 6000)
	ctx := longDeadline(t)
	// A large critical request waits 50s for 5000 tokens.
	critical := h.enqueue(t, ctx, "critical", h.request("acme", mantlev1.Priority_PRIORITY_CRITICAL, 5000, ""))

	h.clock.Advance(10 * time.Second) // 1000 tokens are back: plenty for a small request
	// Without a deadline a small batch request is refused at once, told to come back
	// when the critical one is due...
	_, _, err := h.q.Admit(context.Background(), h.request("acme", mantlev1.Priority_PRIORITY_BATCH, 100, ""))
	if e, ok := errors.AsType[*ledger.ExhaustedError](err); !ok || e.Bucket != "tenant:acme:tpm" || e.RetryAfter != 40*time.Second {
		t.Fatalf("batch without deadline: err = %v, want held back on tenant:acme:tpm for 40s", err)
	}
	// ... and with one it waits behind it.
	batch := h.enqueue(t, ctx, "batch", h.request("acme", mantlev1.Priority_PRIORITY_BATCH, 100, ""))
	// So does a request of the same class.
	second := h.enqueue(t, ctx, "critical-2", h.request("acme", mantlev1.Priority_PRIORITY_CRITICAL, 100, ""))
	h.q.dispatch()
	if got := h.q.Waiting(); got != 3 {
		t.Fatalf("%d waiting, want all 3: nobody may take the critical request's tokens", got)
	}
	h.dispatchAfter(40 * time.Second)
	if res := await(t, "critical", critical); res.err != nil || res.waited != 50*time.Second {
		t.Fatalf("critical: %+v, want granted after 50s", res)
	}
	h.dispatchAfter(time.Second)
	if res := await(t, "critical-2", second); res.err != nil {
		t.Fatalf("critical-2: %v", res.err)
	}
	h.dispatchAfter(time.Second)
	if res := await(t, "batch", batch); res.err != nil {
		t.Fatalf("batch: %v", res.err)
	}
	// A request on another tenant's buckets was never held up.
	if _, _, err := h.q.Admit(context.Background(), h.request("beta", mantlev1.Priority_PRIORITY_BATCH, 100, "")); err != nil {
		t.Errorf("another tenant: %v, want granted", err)
	}
}

func TestQueueSharesAContendedKeyByWeight(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Weights = map[string]float64{"heavy": 3}
	cfg.MaxWait = 10 * time.Minute
	h := manualQueue(t, cfg, limits{rpm: 10_000, tpm: 10_000_000, keys: map[string]int64{"shared": 6000}}) // the key: 100 tokens a second
	ctx := longDeadline(t)
	if _, _, err := h.q.Admit(ctx, h.request("drain", mantlev1.Priority_PRIORITY_NORMAL, 6000, "shared")); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		for _, tenant := range []string{"light", "heavy"} {
			h.enqueue(t, ctx, fmt.Sprintf("%s-%d", tenant, i), h.request(tenant, mantlev1.Priority_PRIORITY_NORMAL, 100, "shared"))
		}
	}
	// One request fits per second; after 20 of them, weights 3:1 give 15 and 5.
	for range 20 {
		h.dispatchAfter(time.Second)
	}
	granted := map[string]int{"light": 20, "heavy": 20}
	h.q.mu.Lock()
	for tenant, tq := range h.q.classes[classNormal].tenants {
		granted[tenant] -= len(tq.waiters)
	}
	h.q.mu.Unlock()
	if granted["heavy"]+granted["light"] != 20 || granted["heavy"] < 14 || granted["heavy"] > 16 {
		t.Errorf("granted %v in 20 seconds, want 20 split about 15:5", granted)
	}
}

func TestQueueFullShedsTheLowestClass(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Size = 2
	h := manualQueue(t, cfg, roundLimits)
	h.reserve(t, "acme", 6000)
	ctx := longDeadline(t)
	batch := h.enqueue(t, ctx, "batch", h.request("acme", mantlev1.Priority_PRIORITY_BATCH, 100, ""))
	normal := h.enqueue(t, ctx, "normal", h.request("acme", mantlev1.Priority_PRIORITY_NORMAL, 100, ""))
	critical := h.enqueue(t, ctx, "critical", h.request("acme", mantlev1.Priority_PRIORITY_CRITICAL, 100, ""))

	res := await(t, "batch", batch)
	if e, ok := errors.AsType[*ledger.ExhaustedError](res.err); !ok || e.Cause != ledger.CauseShed || e.Bucket != "queue" {
		t.Fatalf("batch: err = %v, want shed from the queue", res.err)
	}
	// Nothing lower than a newcomer batch request is left to displace.
	_, _, err := h.q.Admit(ctx, h.request("acme", mantlev1.Priority_PRIORITY_BATCH, 100, ""))
	if e, ok := errors.AsType[*ledger.ExhaustedError](err); !ok || e.Cause != ledger.CauseQueueFull {
		t.Fatalf("batch-2: err = %v, want queue full", err)
	}
	if got := value(t, h.metrics.Shed.WithLabelValues("batch")); got != 1 {
		t.Errorf("shed counter = %v, want 1", got)
	}
	if got := value(t, h.metrics.Length.WithLabelValues("batch")); got != 0 {
		t.Errorf("batch queue length = %v, want 0 after the shed", got)
	}
	h.dispatchAfter(2 * time.Second)
	for name, ch := range map[string]<-chan result{"critical": critical, "normal": normal} {
		if res := await(t, name, ch); res.err != nil {
			t.Errorf("%s: %v", name, res.err)
		}
	}
}

func TestQueueWaitsNeverOutlastTheDeadline(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.MaxWait = 5 * time.Second
	h := manualQueue(t, cfg, roundLimits)
	h.reserve(t, "acme", 6000)
	ctx := longDeadline(t)

	t.Run("a wait longer than the budget is refused at once", func(t *testing.T) {
		_, _, err := h.q.Admit(ctx, h.request("acme", mantlev1.Priority_PRIORITY_CRITICAL, 600, "")) // 6s
		if e, ok := errors.AsType[*ledger.ExhaustedError](err); !ok || e.RetryAfter != 6*time.Second || e.EffectiveCause() != ledger.CauseBucket {
			t.Fatalf("err = %v, want exhausted with retry after 6s", err)
		}
	})
	t.Run("the caller's deadline bounds the wait too", func(t *testing.T) {
		short, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, _, err := h.q.Admit(short, h.request("acme", mantlev1.Priority_PRIORITY_CRITICAL, 300, "")) // 3s
		if !errors.Is(err, ledger.ErrExhausted) {
			t.Fatalf("err = %v, want exhausted at once", err)
		}
	})
	t.Run("a waiter gives up when its budget runs out", func(t *testing.T) {
		// critical is due at 4s; high waits behind it, and once critical has taken the
		// refill, high would be due at 6s: past its 5s budget. The dispatcher says so
		// at once instead of letting it wait out its budget.
		critical := h.enqueue(t, ctx, "critical", h.request("acme", mantlev1.Priority_PRIORITY_CRITICAL, 400, ""))
		high := h.enqueue(t, ctx, "high", h.request("acme", mantlev1.Priority_PRIORITY_HIGH, 200, ""))
		h.dispatchAfter(4 * time.Second)
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
		h.dispatchAfter(time.Minute) // refill completely
		h.reserve(t, "acme", 6000)
		w := h.enqueue(t, ctx, "timer", h.request("acme", mantlev1.Priority_PRIORITY_NORMAL, 300, "")) // due at 3s
		h.clock.Advance(5 * time.Second)                                                               // no dispatch: the budget ends first
		res := await(t, "timer", w)
		if e, ok := errors.AsType[*ledger.ExhaustedError](res.err); !ok || e.Cause != ledger.CauseDeadline || res.waited != 5*time.Second {
			t.Fatalf("timer: err = %v after %v, want refused at its 5s budget, having waited 5s", res.err, res.waited)
		}
		if h.q.Waiting() != 0 {
			t.Errorf("%d still waiting, want 0", h.q.Waiting())
		}
	})
}

func TestQueueCallerCancels(t *testing.T) {
	t.Parallel()
	h := manualQueue(t, testConfig(), roundLimits)
	h.reserve(t, "acme", 6000)
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	ch := h.enqueue(t, ctx, "gone", h.request("acme", mantlev1.Priority_PRIORITY_NORMAL, 100, ""))
	cancel()
	if res := await(t, "gone", ch); !errors.Is(res.err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", res.err)
	}
	if h.q.Waiting() != 0 {
		t.Errorf("%d waiting after the cancel, want 0", h.q.Waiting())
	}
}

func TestQueueShutdownRefusesWaiters(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(), roundLimits, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.q.Run(ctx) }()
	<-h.q.Started()
	h.reserve(t, "acme", 6000)
	ch := h.enqueue(t, longDeadline(t), "r", h.request("acme", mantlev1.Priority_PRIORITY_NORMAL, 100, ""))
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if res := await(t, "r", ch); !errors.Is(res.err, ErrShuttingDown) {
		t.Fatalf("err = %v, want ErrShuttingDown", res.err)
	}
	// With no dispatcher nobody may wait.
	_, _, err := h.q.Admit(longDeadline(t), h.request("acme", mantlev1.Priority_PRIORITY_CRITICAL, 100, ""))
	if !errors.Is(err, ledger.ErrExhausted) {
		t.Errorf("after shutdown: err = %v, want refused at once", err)
	}
}

// gateStore holds the dispatcher inside Reserve, after the grant, until the test lets
// it go: the moment a caller may leave while its request is being granted.
type gateStore struct {
	Reserver
	armed   chan struct{} // one value arms the gate for one Reserve
	entered chan struct{}
	proceed chan struct{}
}

func (g *gateStore) Reserve(ctx context.Context, c ledger.Charge) (ledger.Grant, error) {
	gr, err := g.Reserver.Reserve(ctx, c)
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
	gate := &gateStore{armed: make(chan struct{}, 1), entered: make(chan struct{}), proceed: make(chan struct{})}
	h := newHarness(t, testConfig(), roundLimits, gate)
	gate.Reserver = h.store
	h.q.setRunning(true)
	h.reserve(t, "acme", 6000)

	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	ch := h.enqueue(t, ctx, "leaver", h.request("acme", mantlev1.Priority_PRIORITY_NORMAL, 100, ""))
	gate.armed <- struct{}{}
	h.clock.Advance(time.Second)
	dispatched := make(chan struct{})
	go func() {
		h.q.dispatch()
		close(dispatched)
	}()
	<-gate.entered // granted in the store, not yet delivered
	cancel()
	if res := await(t, "leaver", ch); !errors.Is(res.err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", res.err)
	}
	close(gate.proceed)
	<-dispatched
	if n := h.store.OpenReservations(); n != 1 {
		t.Errorf("%d reservations open, want only the first: the unused grant released", n)
	}
	// The 100 tokens came back: they are there to take again. (The request bucket
	// refilled its one request in the second that passed.)
	g := h.reserve(t, "acme", 100)
	var requestsLeft int64 = -1
	for _, l := range g.Levels {
		if l.Field == ledger.FieldRPM {
			requestsLeft = l.Remaining
		}
	}
	if left := tokensLeft(t, g, "acme"); left != 0 || requestsLeft != 59 {
		t.Errorf("levels = %+v, want the released 100 tokens taken again and 59 requests left", g.Levels)
	}
}
