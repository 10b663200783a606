package quota

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	"github.com/mantle-mesh/mantle/services/quota/internal/memstore"
	"github.com/mantle-mesh/mantle/services/quota/internal/redisstore"
)

// testConfig uses round numbers: 1 request and 100 tokens refill per second.
func testConfig() Config {
	cfg := DefaultConfig()
	cfg.DefaultLimits = RateLimits{RPM: 60, TPM: 6000}
	cfg.DefaultMaxOutputTokens = 100
	return cfg
}

// backend makes Stores of one kind for the shared test suite. Every store decides at
// the fixture's fake clock: redisstore.Store passes it to its scripts instead of Redis TIME.
type backend struct {
	name     string
	newStore func(t testing.TB, clock clockwork.Clock) stateStore
}

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

var memoryBackend = backend{name: "memory", newStore: func(_ testing.TB, clock clockwork.Clock) stateStore { return memstore.New(clock) }}

// redisBackend stores in the test Redis under a prefix of its own (see redisForTest).
var redisBackend = backend{name: "redis", newStore: func(t testing.TB, clock clockwork.Clock) stateStore {
	return newTestRedisStore(t, clock, redisstore.Options{})
}}

// redisScriptsBackend is redisBackend sending EVALSHA, as it does to a Redis without
// functions (before 7.0).
var redisScriptsBackend = backend{name: "redis scripts", newStore: func(t testing.TB, clock clockwork.Clock) stateStore {
	s := newTestRedisStore(t, clock, redisstore.Options{})
	s.SendScripts()
	return s
}}

// eachBackend runs f once per backend, as parallel subtests named after the backend.
func eachBackend(t *testing.T, f func(t *testing.T, b backend)) {
	t.Helper()
	for _, b := range []backend{memoryBackend, redisBackend, redisScriptsBackend} {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			f(t, b)
		})
	}
}

type fixture struct {
	svc    *service
	store  stateStore
	clock  *clockwork.FakeClock
	events *recordingPublisher
	reg    *prometheus.Registry
}

// newFixture builds a Service on the memory backend.
func newFixture(t testing.TB, cfg Config) *fixture {
	t.Helper()
	return newFixtureOn(t, memoryBackend, cfg)
}

func newFixtureOn(t testing.TB, b backend, cfg Config) *fixture {
	t.Helper()
	clock := clockwork.NewFakeClockAt(t0)
	return newFixtureWith(t, b.newStore(t, clock), clock, cfg)
}

// tb is what fixtures need of a test: *testing.T and *rapid.T both have it.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
}

func newFixtureWith(t tb, store stateStore, clock *clockwork.FakeClock, cfg Config) *fixture {
	t.Helper()
	f := &fixture{
		store:  store,
		clock:  clock,
		events: &recordingPublisher{},
		reg:    prometheus.NewRegistry(),
	}
	svc, err := newService(cfg, serviceDeps{
		Store:   f.store,
		Clock:   f.clock,
		Metrics: f.reg,
		Log:     slog.New(slog.DiscardHandler),
		Events:  f.events,
	})
	if err != nil {
		t.Fatalf("NewService: %v", err)
	}
	f.svc = svc
	return f
}

// run starts the Service's background work (sweeper, dispatcher) until the test ends.
func (f *fixture) run(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v, want nil after cancel", err)
		}
	})
	select {
	case <-f.svc.queue.Started():
	case err := <-done:
		t.Fatalf("Run returned %v before the dispatcher started", err)
	}
}

// reserve reserves input+output tokens for tenant and fails the test on error.
func (f *fixture) reserve(t testing.TB, tenant string, input, maxOutput int64) reserveOutcome {
	t.Helper()
	got, err := f.svc.Reserve(context.Background(), reserveRequest{Tenant: tenant, Model: "gpt-4o", InputTokens: input, MaxOutputTokens: maxOutput})
	if err != nil {
		t.Fatalf("Reserve(%s, %d+%d): %v", tenant, input, maxOutput, err)
	}
	return got
}

// counter returns the value of a counter in the registry, matching all given labels.
func (f *fixture) counter(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	families, err := f.reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
		total, found := 0.0, false
	metrics:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				ok := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						ok = true
					}
				}
				if !ok {
					continue metrics
				}
			}
			found = true
			total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
		if found {
			return total
		}
	}
	t.Fatalf("metric %s%v not found", name, labels)
	return 0
}

type publishedEvent struct {
	subject string
	msg     proto.Message
}

// recordingPublisher is a hand-written app.Publisher that keeps what it was given.
type recordingPublisher struct {
	mu     sync.Mutex
	events []publishedEvent
}

func (p *recordingPublisher) Publish(_ context.Context, subject string, msg proto.Message) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.events = append(p.events, publishedEvent{subject, msg})
}

// rejections returns the QuotaRejectionEvents published on mantle.events.quota.
func (p *recordingPublisher) rejections(t testing.TB) []*eventsv1.QuotaRejectionEvent {
	t.Helper()
	return eventsOf[*eventsv1.QuotaRejectionEvent](t, p, "mantle.events.quota")
}

// nearLimits returns the QuotaNearLimitEvents published on mantle.events.quota.near_limit.
func (p *recordingPublisher) nearLimits(t testing.TB) []*eventsv1.QuotaNearLimitEvent {
	t.Helper()
	return eventsOf[*eventsv1.QuotaNearLimitEvent](t, p, "mantle.events.quota.near_limit")
}

func eventsOf[E proto.Message](t testing.TB, p *recordingPublisher, subject string) []E {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []E
	for _, e := range p.events {
		if ev, ok := e.msg.(E); ok {
			if e.subject != subject {
				t.Fatalf("published %T on %q, want %q", e.msg, e.subject, subject)
			}
			out = append(out, ev)
		}
	}
	return out
}

// sweepSignallingStore wraps a Store and reports every Sweep, so a test can wait for
// the sweeper goroutine without sleeping.
type sweepSignallingStore struct {
	stateStore
	swept chan int
}

func (s *sweepSignallingStore) Sweep(ctx context.Context) (int, error) {
	n, err := s.stateStore.Sweep(ctx)
	s.swept <- n
	return n, err
}
