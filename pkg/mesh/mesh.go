package mesh

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"reflect"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/mantle-mesh/mantle/pkg/app"
	"github.com/mantle-mesh/mantle/pkg/events"
	"github.com/mantle-mesh/mantle/pkg/logredact"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/pkg/telemetry"
	"github.com/mantle-mesh/mantle/pkg/tlsconfig"
	"github.com/mantle-mesh/mantle/services/agent"
	"github.com/mantle-mesh/mantle/services/cache"
	"github.com/mantle-mesh/mantle/services/quota"
	"github.com/mantle-mesh/mantle/services/router"
	"github.com/mantle-mesh/mantle/services/verifier"
)

// Modules lists every module the binary can run.
func Modules(c Config) []app.Module {
	return []app.Module{
		router.Module(c.Router),
		cache.Module(c.Cache),
		quota.Module(c.Quota),
		verifier.Module(c.Verifier),
		agent.Module(c.Agent, agentOptions(c)...),
	}
}

// agentOptions are the agent's module options that follow from the router block: with
// verifier_address off, nobody confirms action outcomes.
func agentOptions(c Config) []agent.ModuleOption {
	if c.Router.VerifierAddress == router.Off {
		return []agent.ModuleOption{agent.WithoutVerifier()}
	}
	return nil
}

// Options are process-level choices that are not configuration: where logs go, which
// clock runs timers, how the environment is read. Tests set them; main uses the defaults.
type Options struct {
	LogOutput io.Writer
	Clock     clockwork.Clock
	Getenv    func(string) string
	// TraceExporter replaces the OTLP exporter when tracing.enabled is true: tests pass an
	// in-memory one, which receives every span as it ends.
	TraceExporter sdktrace.SpanExporter
	// TuneRuntime applies the runtime block to this process (its garbage collector and
	// memory limit are the whole process's): for a process that exists to serve mantle,
	// not for tests or tools that start a mesh inside another program.
	TuneRuntime bool
	// RouteLibraryLogs sends the lines libraries log on their own (go-redis) through the
	// process logger, in log.format. Their loggers are the whole process's: for a
	// process that exists to serve mantle, not for programs that start several meshes.
	RouteLibraryLogs bool
	// EmbeddedNATS starts the in-process NATS server that events.embedded asks for (mantle
	// dev, the drills and tests pass one). Without it events.embedded is refused: a serving
	// process keeps its events, review queue and idempotency records in a real NATS.
	// natsembed.Launch is the one there is.
	EmbeddedNATS func() (url string, shutdown func(), err error)
}

// Process is a configured mantle process with its listeners bound.
type Process struct {
	App    *app.App
	Log    *slog.Logger
	Events *events.Publisher // nil when events are disabled
	// Metrics is the process's registry, the one /metrics serves (tests read it).
	Metrics *prometheus.Registry
	cleanup []func()
	ran     bool
	clock   clockwork.Clock
	current Config
	// publisher gets the reload events; events.Discard when NATS is not configured.
	publisher app.Publisher
	// heapFloor paces the collector while Run serves; nil without one.
	heapFloor *heapFloor
}

// Start validates cfg, connects (or starts) NATS, binds listeners and builds the modules.
// Run serves; Close releases what Start acquired if Run is never called.
func Start(ctx context.Context, cfg Config, opts Options) (*Process, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid configuration:\n%w", err)
	}
	if opts.LogOutput == nil {
		opts.LogOutput = os.Stderr
	}
	if opts.Clock == nil {
		opts.Clock = clockwork.NewRealClock()
	}
	if opts.Getenv == nil {
		opts.Getenv = app.Env{}.Var // the process environment, read in that one place
	}
	log := NewLogger(cfg.Log, opts.LogOutput, cfg.secretValues(opts.Getenv)...)
	p := &Process{Log: log, clock: opts.Clock, current: cfg}
	if opts.RouteLibraryLogs {
		quota.RouteRedisLogs(log.With("service", "quota"))
	}
	if opts.TuneRuntime {
		p.heapFloor = tuneRuntime(cfg.Runtime, cfg.requestServices(), opts.Getenv, nil, log)
	}
	reg := prometheus.NewRegistry()

	authn, err := newAuthenticator(cfg.Auth, cfg.TLS.Enabled(), opts.Getenv, log)
	if err != nil {
		return nil, err
	}
	var tlsMetrics *tlsconfig.Metrics
	if cfg.TLS.Enabled() || cfg.Events.TLS.Enabled {
		if tlsMetrics, err = tlsconfig.NewMetrics(reg); err != nil {
			return nil, err
		}
	}
	tlsOpts := tlsconfig.Options{Clock: opts.Clock, Log: log, Metrics: tlsMetrics}
	transport, err := transportSecurity(cfg.TLS, tlsOpts)
	if err != nil {
		return nil, err
	}
	var tp trace.TracerProvider // nil: tracing off
	if cfg.Tracing.Enabled {
		provider, err := telemetry.NewTracerProvider(ctx, cfg.Tracing, telemetry.ServiceName(cfg.Tracing.ServiceName, cfg.Targets()), opts.TraceExporter)
		if err != nil {
			return nil, fmt.Errorf("tracing: %w", err)
		}
		// First in, so last out: spans of everything below (modules, events) are flushed.
		p.cleanup = append(p.cleanup, func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := provider.Shutdown(ctx); err != nil {
				log.Warn("spans not flushed on shutdown", "err", err)
			}
		})
		tp = provider
	}
	var publisher app.Publisher = events.Discard{Log: log}
	var natsConn *nats.Conn
	natsURL := cfg.Events.NATSURL
	if cfg.Events.Embedded {
		if opts.EmbeddedNATS == nil {
			p.Close()
			return nil, errors.New("events.embedded: this command has no embedded NATS server (its JetStream data would vanish at shutdown); set events.nats_url to a NATS server with JetStream, or use mantle dev")
		}
		url, shutdown, err := opts.EmbeddedNATS()
		if err != nil {
			p.Close()
			return nil, err
		}
		p.cleanup = append(p.cleanup, shutdown)
		natsURL = url
		log.Warn("events.embedded: an in-process NATS server keeps the review queue, idempotency records and rules in a temporary directory deleted at shutdown")
	}
	if natsURL != "" {
		var evOpts []events.Option
		if tp != nil {
			evOpts = append(evOpts, events.WithTracerProvider(tp))
		}
		natsTLS, err := tlsconfig.FromClientConfig("nats", cfg.Events.TLS, tlsOpts)
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("events.%w", err)
		}
		if natsTLS != nil {
			evOpts = append(evOpts, events.WithTLS(natsTLS, cfg.Events.TLS.ServerName))
		}
		pub, err := events.Connect(ctx, natsURL, log, reg, evOpts...)
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("events.nats_url: %w", err)
		}
		// Closed before the embedded server shuts down: cleanups run in reverse.
		p.cleanup = append(p.cleanup, pub.Close)
		p.Events, publisher, natsConn = pub, pub, pub.Conn()
	} else {
		log.Info("events disabled: set events.nats_url or events.embedded")
	}

	p.publisher, p.Metrics = publisher, reg
	a, err := app.New(ctx, app.Config{
		Targets:                 cfg.Targets(),
		GRPCListenAddress:       cfg.Server.GRPCListenAddress,
		HTTPListenAddress:       cfg.Server.HTTPListenAddress,
		DebugListenAddress:      cfg.Server.DebugListenAddress,
		MetricsOnDebug:          cfg.Server.MetricsOnDebugListener,
		GracefulShutdownTimeout: cfg.Server.GracefulShutdownTimeout,
		ShutdownDelay:           cfg.Server.ShutdownDelay,
		Addresses:               cfg.Addresses(),
		MaxMessageBytes:         cfg.Server.MaxMessageBytes,
		GRPCReflection:          cfg.Server.GRPCReflection,
		HTTP: app.HTTPLimits{
			ReadHeaderTimeout: cfg.Server.ReadHeaderTimeout, BodyReadTimeout: cfg.Server.BodyReadTimeout,
			IdleTimeout: cfg.Server.IdleTimeout, MaxHeaderBytes: cfg.Server.MaxHeaderBytes,
		},
	}, Modules(cfg), app.Deps{Log: log, Metrics: reg, Events: publisher, Clock: opts.Clock, Authenticator: authn, NATS: natsConn, TracerProvider: tp, TLS: transport, Getenv: opts.Getenv})
	if err != nil {
		p.Close()
		return nil, err
	}
	p.App = a
	return p, nil
}

// Run serves until ctx is done, then shuts down and releases everything.
func (p *Process) Run(ctx context.Context) error {
	p.ran = true
	defer p.Close()
	if p.heapFloor != nil {
		defer p.heapFloor.start()()
	}
	return p.App.Run(ctx)
}

// Reload validates cfg and hands every module running here its new block. Process-level
// settings (listeners, auth, events, tracing, log, targets) apply only after a restart; a
// change to them is reported and otherwise ignored. Either way the outcome is logged and
// published (mantle.events.config.reloaded with the changed paths, or
// mantle.events.config.rejected with the reason, the running configuration kept).
func (p *Process) Reload(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		err = fmt.Errorf("invalid configuration, keeping the running one:\n%w", err)
		p.reloadRejected(ctx, err)
		return err
	}
	changes := diffConfig(p.current, cfg)
	if restart := restartPaths(changes); len(restart) > 0 {
		p.Log.WarnContext(ctx, "server, auth, events, tracing, log and target settings change only with a restart", "paths", restart)
	}
	err := p.App.Reload(ctx, map[string]any{"router": cfg.Router, "cache": cfg.Cache, "quota": cfg.Quota, "verifier": cfg.Verifier, "agent": cfg.Agent})
	if err != nil {
		p.reloadRejected(ctx, err)
		return err
	}
	p.current = cfg
	p.reloadAccepted(ctx, changes)
	return nil
}

// WatchConfig reloads the configuration whenever load returns one that differs from the
// running one: every interval on the process clock, and at once when trigger fires (SIGHUP).
// A configuration that does not validate or reload is logged and the running one kept.
func (p *Process) WatchConfig(ctx context.Context, load func() (Config, error), interval time.Duration, trigger <-chan os.Signal) {
	var tick <-chan time.Time // nil (never) when the interval is 0: SIGHUP only
	if interval > 0 {
		ticker := p.clock.NewTicker(interval)
		defer ticker.Stop()
		tick = ticker.Chan()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
		case <-trigger:
		}
		cfg, err := load()
		if err != nil {
			p.Log.Error("configuration not reloaded", "err", err)
			continue
		}
		if reflect.DeepEqual(cfg, p.current) {
			continue
		}
		_ = p.Reload(ctx, cfg) // Reload logs and publishes its outcome
	}
}

// Close releases what Start acquired, in reverse order. After Run it only releases what
// surrounds the app (events, embedded NATS); Run has released the app itself.
func (p *Process) Close() {
	if p.App != nil && !p.ran {
		p.ran = true
		p.App.Close()
	}
	for i := len(p.cleanup) - 1; i >= 0; i-- {
		p.cleanup[i]()
	}
	p.cleanup = nil
}

// NewLogger builds the process logger: every line logged with a request's context carries
// its trace_id, request_id and tenant (rpc.LogHandler), and secrets (the given values and
// the API key shapes logredact knows) and, unless c.DebugBodies, prompt bodies are redacted.
func NewLogger(c LogConfig, w io.Writer, secrets ...string) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(c.Level)) // validated; info on the zero value
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewJSONHandler(w, opts)
	if c.Format == "text" {
		h = slog.NewTextHandler(w, opts)
	}
	h = logredact.New(logredact.Options{DebugBodies: c.DebugBodies, Secrets: secrets}).Handler(h)
	return slog.New(rpc.LogHandler(h))
}

// newAuthenticator builds the process's authenticator; nil when authentication is off,
// which is said at warn (Validate allowed it: loopback listeners only, or auth.disabled).
//
// With TLS on, a caller's service identity comes first from its verified client
// certificate (spiffe://mantle/<service>), and the mesh secret stays the fallback for
// callers without one.
func newAuthenticator(cfg AuthConfig, tlsOn bool, getenv func(string) string, log *slog.Logger) (*rpc.Authenticator, error) {
	opts := []rpc.AuthOption{rpc.WithOperators(cfg.Operators, getenv)}
	if tlsOn {
		opts = append(opts, rpc.WithServiceSource(rpc.PeerCertificateService))
	}
	secret, err := cfg.meshSecret(getenv)
	if err != nil {
		return nil, err
	}
	if secret != "" {
		opts = append(opts, rpc.WithMeshSecret(secret))
	}
	authn, err := rpc.NewAuthenticator(cfg.Tenants, getenv, opts...)
	if err != nil {
		return nil, fmt.Errorf("auth.%w", err)
	}
	switch {
	case cfg.Disabled:
		log.Warn("authentication is disabled (auth.disabled): every caller may call every RPC as any tenant")
	case !authn.Enabled():
		log.Warn("authentication is off: no auth.tenants configured; listening on loopback only")
	}
	return authn, nil
}

// transportSecurity loads the tls block; its zero value (plaintext) when TLS is off.
func transportSecurity(c tlsconfig.Config, opts tlsconfig.Options) (app.TLS, error) {
	if !c.Enabled() {
		return app.TLS{}, nil
	}
	src, err := tlsconfig.FromConfig(c, opts)
	if err != nil {
		return app.TLS{}, err
	}
	return app.TLS{Source: src, GRPCClientAuth: c.GRPCClientAuth, HTTPClientAuth: c.HTTPClientAuth, ServerName: c.ServerName}, nil
}
