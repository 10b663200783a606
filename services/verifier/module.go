package verifier

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/pkg/app"
	"github.com/mantle-mesh/mantle/pkg/events"
	"github.com/mantle-mesh/mantle/services/verifier/internal/review"
	"github.com/mantle-mesh/mantle/services/verifier/internal/semantic"
)

// Module returns the verifier module. It calls no other module, except the router when the
// L3 judge is enabled (dialled lazily, so there is no dependency cycle at start).
//
// With env.NATS set, review state lives in a JetStream KV bucket and review requests travel
// through a disk spool and a JetStream work-queue stream; without it, both are in memory.
func Module(cfg Config) app.Module {
	return app.Module{
		Name:      ServiceName,
		Audiences: Audiences,
		New: func(_ context.Context, env app.Env) (app.Runnable, error) {
			m, err := build(cfg, env, env.Var)
			if err != nil {
				return nil, fmt.Errorf("verifier: %w", err)
			}
			verifierv1.RegisterVerifierServiceServer(env.GRPC, m.server)
			return m, nil
		},
	}
}

// module is a built verifier: the domain, the review service, their gRPC adapter and the
// background work that Run owns.
type module struct {
	verifier *Verifier
	reviews  *review.Service
	queue    *review.Queue // nil without NATS
	server   *Server
	clock    clockwork.Clock
	log      *slog.Logger
	// sweepInterval is how often review deadlines are checked.
	sweepInterval time.Duration
	cleanup       func()
}

func build(cfg Config, env app.Env, getenv func(string) string) (*module, error) {
	log := env.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("service", ServiceName)
	clock := env.Clock
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	// A nil *Registry must not become a non-nil Registerer interface.
	var reg prometheus.Registerer
	if env.Metrics != nil {
		reg = env.Metrics
	}
	var pub Publisher = discard{}
	if env.Events != nil {
		pub = env.Events
	}

	deps := Deps{Clock: clock, Metrics: reg, Events: pub, Log: log}
	if cfg.L3.Enabled && cfg.L3.Judge.Enabled {
		conn, err := env.Dial("router")
		if err != nil {
			return nil, fmt.Errorf("l3.judge: %w", err)
		}
		j := cfg.L3.Judge
		deps.Judge = semantic.NewRouterJudge(semantic.JudgeConfig{
			Route: j.Route, Scenario: j.Scenario, Timeout: j.Timeout, MaxTokens: int32(j.MaxTokens),
			PerMinute: j.PerMinute, APIKey: getenv(j.APIKeyEnv),
		}, routerv1.NewRouterServiceClient(conn), clock)
	}
	v, err := NewWithDeps(cfg, deps)
	if err != nil {
		return nil, err
	}
	m := &module{verifier: v, clock: clock, log: log, sweepInterval: cfg.Review.SweepInterval, cleanup: func() {}}
	if err := m.buildReviews(cfg, env.NATS, pub, reg); err != nil {
		return nil, err
	}
	m.server = NewServer(v, m.reviews, log)
	return m, nil
}

// buildReviews wires the review service: JetStream (KV state, spool, work queue) when nc is
// set, memory otherwise.
func (m *module) buildReviews(cfg Config, nc *nats.Conn, pub Publisher, reg prometheus.Registerer) error {
	rc := cfg.Review
	svcCfg := review.Config{Lease: rc.Lease, MaxLease: rc.MaxLease}
	if nc == nil {
		m.reviews = review.NewService(svcCfg, review.NewStore(review.NewMemoryKV(), nil), m.clock, pub, m.verifier.rules, m.log)
		m.verifier.SetReviewSink(directSink{m.reviews})
		return nil
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	kv := review.NewLazyJetStreamKV(js, jetstream.KeyValueConfig{
		Bucket: rc.Bucket, Description: "mantle review state and audit trail",
		TTL: rc.Retention, Storage: jetstream.FileStorage, History: 1,
	})
	// Approved rules are configuration: their bucket keeps them until deleted.
	rulesKV := review.NewLazyJetStreamKV(js, jetstream.KeyValueConfig{
		Bucket: rc.Bucket + "_rules", Description: "mantle draft L2 rules from review decisions",
		Storage: jetstream.FileStorage, History: 1,
	})
	m.reviews = review.NewService(svcCfg, review.NewStore(kv, rulesKV), m.clock, pub, m.verifier.rules, m.log)
	dir := rc.SpoolDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "mantle-review-spool-"); err != nil {
			return fmt.Errorf("review.spool_dir: %w", err)
		}
		m.log.Warn("review requests are spooled in a temporary directory and lost on restart: set review.spool_dir", "dir", dir)
		m.cleanup = func() {
			// Only an empty temporary spool is removed; one with records stays for an operator.
			_ = os.Remove(dir)
		}
	}
	spool, err := events.OpenSpool(dir, events.SpoolLimits{})
	if err != nil {
		return fmt.Errorf("review.spool_dir: %w", err)
	}
	if n := spool.Len(); n > 0 {
		m.log.Info("review requests recovered from the spool", "dir", dir, "requests", n)
	}
	if reg != nil {
		if err := spool.Instrument(reg); err != nil {
			return fmt.Errorf("review spool: %w", err)
		}
	}
	m.queue = review.NewQueue(review.QueueConfig{
		Stream: rc.Stream, Consumer: rc.Consumer, AckWait: maxReviewTimeout(cfg) + rc.Lease,
	}, js, spool, m.reviews, m.clock, m.log)
	m.verifier.SetReviewSink(m.queue)
	return nil
}

// maxReviewTimeout is the longest deadline any scenario gives a review.
func maxReviewTimeout(cfg Config) time.Duration {
	d := cfg.Review.Timeout
	for _, sc := range cfg.Scenarios {
		d = max(d, sc.ReviewTimeout)
	}
	return d
}

// directSink opens reviews straight in the review service (memory mode).
type directSink struct{ svc *review.Service }

func (d directSink) Enqueue(ctx context.Context, ev *eventsv1.ReviewRequestEvent) error {
	_, _, err := d.svc.Open(ctx, review.FromEvent(ev))
	return err
}

// Run runs the verifier's background work until ctx is done: L3 workers, rule file reloads,
// the review queue, and the deadline sweeper.
func (m *module) Run(ctx context.Context) error {
	defer m.cleanup()
	var wg sync.WaitGroup
	wg.Go(func() { _ = m.verifier.Run(ctx) })
	if m.queue != nil {
		wg.Go(func() { _ = m.queue.Run(ctx) })
	}
	wg.Go(func() { m.sweepLoop(ctx) })
	wg.Wait()
	return nil
}

// sweepLoop times out overdue reviews every sweep interval, acknowledges queue messages of
// reviews other replicas finished, and loads the approved draft rules once the store is
// reachable.
func (m *module) sweepLoop(ctx context.Context) {
	t := m.clock.NewTicker(m.sweepInterval)
	defer t.Stop()
	approvedLoaded := false
	for {
		if !approvedLoaded {
			approvedLoaded = m.loadApproved(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
		}
		if n, err := m.reviews.Sweep(ctx); err != nil {
			m.log.WarnContext(ctx, "review deadlines not checked", "err", err)
		} else if n > 0 {
			m.log.InfoContext(ctx, "reviews timed out; default actions applied", "reviews", n)
		}
		if m.queue != nil {
			m.queue.Reconcile(ctx)
		}
	}
}

// loadApproved makes the approved draft rules in the store live; false means "try again".
func (m *module) loadApproved(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	approved, err := m.reviews.ApprovedRules(ctx)
	if err != nil {
		m.log.DebugContext(ctx, "approved rules not loaded yet", "err", err)
		return false
	}
	if len(approved) == 0 {
		return true
	}
	if err := m.verifier.rules.setApproved(approved); err != nil {
		m.log.ErrorContext(ctx, "approved draft rules rejected; they stay out of the live set", "err", err)
	}
	return true
}
