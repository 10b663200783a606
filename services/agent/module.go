package agent

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	agentv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/agent/v1"
	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/pkg/app"
	"github.com/mantle-mesh/mantle/pkg/events"
	"github.com/mantle-mesh/mantle/pkg/formatcheck"
	"github.com/mantle-mesh/mantle/pkg/resilience"
)

// ModuleOption changes how Module builds the agent.
type ModuleOption func(*moduleOptions)

type moduleOptions struct {
	withoutVerifier bool
}

// WithoutVerifier builds an agent that has no verifier to confirm action outcomes (the
// configuration says router.verifier_address: off): it neither dials nor needs one, and
// warns at start that an action whose outcome becomes unknown stays pending_confirmation,
// never retried and never marked done, since nobody can confirm it.
func WithoutVerifier() ModuleOption {
	return func(o *moduleOptions) { o.withoutVerifier = true }
}

// Module returns the agent module. It calls the verifier (confirmation reviews of actions
// whose outcome is unknown) unless built WithoutVerifier; the router calls it.
func Module(cfg Config, opts ...ModuleOption) app.Module {
	var o moduleOptions
	for _, opt := range opts {
		opt(&o)
	}
	deps := []string{"verifier"}
	if o.withoutVerifier {
		deps = nil
	}
	var m *module // set by New, used by Reload
	return app.Module{
		Name:      ServiceName,
		Audiences: Audiences,
		Deps:      deps,
		New: func(ctx context.Context, env app.Env) (app.Runnable, error) {
			built, err := build(ctx, cfg, env, o)
			if err != nil {
				return nil, fmt.Errorf("agent: %w", err)
			}
			m = built
			agentv1.RegisterToolServiceServer(env.GRPC, &toolServer{tools: m.tools, log: m.log, sessions: m.sessions.m})
			agentv1.RegisterSessionServiceServer(env.GRPC, m.sessions)
			return m, nil
		},
		Reload: func(_ context.Context, block any) error {
			c, ok := block.(Config)
			if !ok {
				return fmt.Errorf("reload: want an agent.Config, got %T", block)
			}
			return m.tools.Reload(c)
		},
	}
}

// module is a built agent: its gRPC servers and the background work Run owns.
type module struct {
	tools    *Tools
	sessions *sessionServer
	// sweep is the session store's background work (nil when it has none).
	sweep app.Runnable
	log   *slog.Logger
}

func build(ctx context.Context, cfg Config, env app.Env, o moduleOptions) (*module, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
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
	var actions actionStore = newMemoryActions(cfg.Idempotency.TTL, clock)
	if cfg.Idempotency.Backend == IdempotencyJetStream {
		if env.NATS == nil {
			log.Warn("agent.idempotency.backend is jetstream and this process has no NATS: action tools are refused, query tools are served")
			actions = unavailableActions{}
		} else {
			js, err := jetstream.New(env.NATS)
			if err != nil {
				return nil, fmt.Errorf("idempotency: %w", err)
			}
			actions = newJetStreamActions(js, cfg.Idempotency.Bucket, cfg.Idempotency.TTL)
		}
	}
	var confirm confirmer = noConfirmer{}
	if o.withoutVerifier {
		log.Warn(warnNoVerifier, "reason", "router.verifier_address is off")
	} else {
		confirm = dialConfirmer(env, log)
	}
	tools, err := NewTools(cfg, ToolsDeps{
		Clock: clock, Log: log, Metrics: reg, Getenv: env.Var, Actions: actions, Confirm: confirm, Events: env.Events,
	})
	if err != nil {
		return nil, err
	}
	sessions, sweep, err := newSessions(ctx, cfg.Sessions, env)
	if err != nil {
		tools.Close()
		return nil, err
	}
	return &module{tools: tools, sessions: sessions, sweep: sweep, log: log}, nil
}

// Run owns the module's background work until ctx is done, then closes the backends.
func (m *module) Run(ctx context.Context) error {
	if m.sweep != nil {
		_ = m.sweep.Run(ctx) // returns when ctx is done
	}
	<-ctx.Done()
	m.tools.Close()
	return nil
}

// ToolsDeps are what Tools needs besides its configuration.
type ToolsDeps struct {
	Clock   clockwork.Clock
	Log     *slog.Logger
	Metrics prometheus.Registerer
	Getenv  func(string) string
	// Rand returns uniform numbers in [0, 1) for backoff and breaker jitter; nil uses
	// math/rand/v2.
	Rand    func() float64
	Actions actionStore
	Confirm confirmer
	// Events receives tool breaker transitions (mantle.events.tool.breaker); nil for none.
	Events app.Publisher
	// NewBackend builds a tool's backend; nil builds HTTP and MCP backends.
	NewBackend func(cfg ToolConfig, maxResultBytes int) (backend, error)
}

// NewTools builds the tool gateway of cfg (validated).
func NewTools(cfg Config, deps ToolsDeps) (*Tools, error) {
	if deps.Rand == nil {
		deps.Rand = rand.Float64
	}
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	if deps.Actions == nil {
		deps.Actions = newMemoryActions(cfg.Idempotency.TTL, deps.Clock)
	}
	if deps.Confirm == nil {
		deps.Confirm = noConfirmer{}
	}
	m, err := newMetrics(deps.Metrics)
	if err != nil {
		return nil, err
	}
	checker, err := formatcheck.New(formatcheck.DefaultConfig())
	if err != nil {
		return nil, err
	}
	t := &Tools{
		stale: newStaleStore(cfg.Stale.MaxEntries, cfg.Stale.MaxBytes), actions: deps.Actions, confirm: deps.Confirm,
		checker: checker, clock: deps.Clock, rand: deps.Rand, log: deps.Log, metrics: m, stats: map[string]*toolStats{},
	}
	newBackend := deps.NewBackend
	if newBackend == nil {
		newBackend = func(tc ToolConfig, maxBytes int) (backend, error) { return defaultBackend(tc, maxBytes, deps.Getenv) }
	}
	t.deps = toolDeps{
		clock: deps.Clock, rand: deps.Rand, getenv: deps.Getenv, newBackend: newBackend, stats: t.statsOf,
		onTransition: func(name, kind string, tr resilience.Transition) {
			m.breaker.WithLabelValues(name, tr.To.String()).Inc()
			deps.Log.Warn("tool breaker transition", "tool", name, "from", tr.From.String(), "to", tr.To.String(), "reason", tr.Reason)
			if deps.Events != nil {
				deps.Events.Publish(context.Background(), events.SubjectToolBreaker, toolBreakerEvent(name, kind, tr))
			}
		},
	}
	reg, _, err := buildRegistry(cfg, nil, t.deps)
	if err != nil {
		return nil, err
	}
	t.reg.Store(reg)
	return t, nil
}

// Reload swaps in the registry of cfg. Tools whose configuration did not change keep
// their breakers, bulkheads, budgets and connections; the results of removed or changed
// tools leave the stale store.
func (t *Tools) Reload(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	t.reloadMu.Lock()
	defer t.reloadMu.Unlock()
	prev := t.reg.Load()
	next, retired, err := buildRegistry(cfg, prev, t.deps)
	if err != nil {
		return err
	}
	t.reg.Store(next)
	for _, old := range retired {
		t.stale.dropTool(old.cfg.Name)
		// Calls in flight on the old backend end with their own contexts; closing only
		// drops idle connections and sessions.
		old.backend.close()
	}
	if next.revision != prev.revision {
		t.log.Info("tool registry reloaded", "tools", len(next.names), "revision", next.revision)
	}
	return nil
}

// Close releases every backend's connections.
func (t *Tools) Close() {
	for _, tl := range t.reg.Load().tools {
		tl.backend.close()
	}
}

// warnNoVerifier is the warning of an agent that has no verifier to confirm with.
const warnNoVerifier = "no verifier to confirm action outcomes: an action whose outcome becomes unknown stays pending_confirmation, " +
	"never retried and never marked done, until a verifier can open its confirmation and a person decides"

// dialConfirmer returns the verifier's review queue as the confirmer of unknown action
// outcomes, or noConfirmer, with a warning, when this process cannot reach a verifier.
func dialConfirmer(env app.Env, log *slog.Logger) confirmer {
	if env.Dial == nil {
		log.Warn(warnNoVerifier, "reason", "this process has no way to dial one")
		return noConfirmer{}
	}
	conn, err := env.Dial("verifier")
	if err != nil {
		log.Warn(warnNoVerifier, "err", err)
		return noConfirmer{}
	}
	return verifierConfirmer{client: verifierv1.NewVerifierServiceClient(conn)}
}

// noConfirmer cannot open confirmations: the verifier is not reachable from this module.
type noConfirmer struct{}

func (noConfirmer) open(context.Context, Confirmation) (string, error) {
	return "", fmt.Errorf("no verifier to confirm the outcome")
}

func (noConfirmer) get(context.Context, string, string) (Decision, string, error) {
	return DecisionPending, "", fmt.Errorf("no verifier to confirm the outcome")
}
