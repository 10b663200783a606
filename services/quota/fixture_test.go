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
)

// testConfig uses round numbers: 1 request and 100 tokens refill per second.
func testConfig() Config {
	cfg := DefaultConfig()
	cfg.DefaultLimits = RateLimits{RPM: 60, TPM: 6000}
	cfg.DefaultMaxOutputTokens = 100
	return cfg
}

type fixture struct {
	svc    *Service
	store  *MemoryStore
	clock  *clockwork.FakeClock
	events *recordingPublisher
	reg    *prometheus.Registry
}

func newFixture(t testing.TB, cfg Config) *fixture {
	t.Helper()
	f := &fixture{
		store:  NewMemoryStore(),
		clock:  clockwork.NewFakeClockAt(t0),
		events: &recordingPublisher{},
		reg:    prometheus.NewRegistry(),
	}
	svc, err := NewService(cfg, Deps{
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

// reserve reserves input+output tokens for tenant and fails the test on error.
func (f *fixture) reserve(t *testing.T, tenant string, input, maxOutput int64) Reserved {
	t.Helper()
	got, err := f.svc.Reserve(context.Background(), ReserveRequest{Tenant: tenant, Model: "gpt-4o", InputTokens: input, MaxOutputTokens: maxOutput})
	if err != nil {
		t.Fatalf("Reserve(%s, %d+%d): %v", tenant, input, maxOutput, err)
	}
	return got
}

// counter returns the value of a counter in the registry, matching all given labels.
func (f *fixture) counter(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	families, err := f.reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("counter %s%v not found", name, labels)
	return 0
}

// openReservations counts the records the store still holds.
func (s *MemoryStore) openReservations() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.reservations)
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

func (p *recordingPublisher) rejections(t *testing.T) []*eventsv1.QuotaRejectionEvent {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*eventsv1.QuotaRejectionEvent
	for _, e := range p.events {
		ev, ok := e.msg.(*eventsv1.QuotaRejectionEvent)
		if !ok || e.subject != "mantle.events.quota" {
			t.Fatalf("published %T on %q, want QuotaRejectionEvent on mantle.events.quota", e.msg, e.subject)
		}
		out = append(out, ev)
	}
	return out
}

// sweepSignallingStore wraps a Store and reports every Sweep, so a test can wait for
// the sweeper goroutine without sleeping.
type sweepSignallingStore struct {
	Store
	swept chan int
}

func (s *sweepSignallingStore) Sweep(ctx context.Context, now time.Time) (int, error) {
	n, err := s.Store.Sweep(ctx, now)
	s.swept <- n
	return n, err
}
