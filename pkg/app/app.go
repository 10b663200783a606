// Package app runs any subset of mantle's modules in one process: one gRPC server that
// every selected module registers on, one HTTP server for /metrics, /healthz, /readyz (and
// the router's OpenAI-compatible front door), and a Dial function that reaches a module
// through an in-process channel when it runs here and at its configured address otherwise.
// That is the only place where the single-binary and the split deployments differ.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/stats"

	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/pkg/tlsconfig"
)

// TargetAll selects every module.
const TargetAll = "all"

// Config is the process-level configuration the app needs.
type Config struct {
	// Targets are module names or "all".
	Targets           []string
	GRPCListenAddress string
	HTTPListenAddress string
	// DebugListenAddress serves pprof and expvar on a listener of its own (debug.go); empty:
	// off. An address without a host is bound to loopback.
	DebugListenAddress string
	// MetricsOnDebug serves /metrics on the debug listener instead of the public one.
	MetricsOnDebug          bool
	GracefulShutdownTimeout time.Duration
	// ShutdownDelay keeps serving after health turns NOT_SERVING and /readyz 503, so load
	// balancers and Kubernetes stop sending traffic before the listeners close.
	ShutdownDelay time.Duration
	// Addresses are where modules that do not run in this process are dialled.
	Addresses map[string]string
	// MaxMessageBytes bounds received gRPC messages.
	MaxMessageBytes int
	// GRPCReflection serves gRPC reflection, to operators only (rpc.ReflectionAudiences).
	GRPCReflection bool
	// HTTP bounds the HTTP listener's connections.
	HTTP HTTPLimits
}

// Deps are the process-wide collaborators shared by every module.
type Deps struct {
	Log           *slog.Logger
	Metrics       *prometheus.Registry
	Events        Publisher
	Clock         clockwork.Clock
	Authenticator *rpc.Authenticator
	// NATS is handed to modules as Env.NATS; nil when events are disabled.
	NATS *nats.Conn
	// TracerProvider is the process's own provider (never the global one); nil turns
	// tracing off: no spans, and gRPC carries only the trace id.
	TracerProvider trace.TracerProvider
	// TLS secures both listeners and every connection to a remote module; its zero value
	// leaves them in plaintext.
	TLS TLS
	// Getenv reads the process environment for modules (secrets named in the config); nil
	// means os.Getenv (Env.Var). Tests and tools that start a mesh in-process inject their own.
	Getenv func(string) string
}

// TLS is a process's transport security: one certificate source for its listeners and
// for the connections it makes to the modules that run elsewhere.
type TLS struct {
	// Source holds the certificate and the mesh CA; nil means plaintext everywhere.
	Source *tlsconfig.Source
	// GRPCClientAuth and HTTPClientAuth say what each listener asks of its clients.
	GRPCClientAuth, HTTPClientAuth tlsconfig.ClientAuth
	// ServerName, when set, is the name expected in the certificates of the modules
	// dialled; otherwise the host of their address is.
	ServerName string
}

// App is a running process: listeners are bound by New, served by Run.
type App struct {
	cfg      Config
	deps     Deps
	grpc     *grpc.Server
	health   *health.Server
	mux      *http.ServeMux
	http     *http.Server
	grpcLis  net.Listener
	httpLis  net.Listener
	debug    *http.Server // nil when the debug listener is off
	debugLis net.Listener
	// shapes are the error shapes of the HTTP listener's paths (Env.HTTPErrorShape).
	shapes   errorShapes
	selected []string
	all      bool // every module runs here
	run      []module
	reload   map[string]func(context.Context, any) error
	ready    atomic.Bool
	// dependencies are those modules named with Env.Dependency.
	depMu        sync.Mutex
	dependencies []dependency

	// local carries calls between modules of this process (local.go).
	local *localConn

	connMu sync.Mutex
	conns  map[string]*grpc.ClientConn
}

// Resolve expands targets (module names or "all"; an element may itself be a comma list,
// as --target is) into the sorted, de-duplicated module names, and checks that every
// dependency outside the selection has an address.
func Resolve(modules []Module, targets []string, addresses map[string]string) ([]string, error) {
	byName := make(map[string]Module, len(modules))
	for _, m := range modules {
		byName[m.Name] = m
	}
	var selected []string
	for _, t := range splitTargets(targets) {
		switch {
		case t == TargetAll:
			for _, m := range modules {
				selected = append(selected, m.Name)
			}
		case byName[t].Name != "":
			selected = append(selected, t)
		default:
			return nil, fmt.Errorf("target: unknown module %q (want all or one of %s)", t, strings.Join(Names(modules), ", "))
		}
	}
	if len(selected) == 0 {
		return nil, errors.New("target: no module selected")
	}
	slices.Sort(selected)
	selected = slices.Compact(selected)
	for _, name := range selected {
		for _, dep := range byName[name].Deps {
			if !slices.Contains(selected, dep) && addresses[dep] == "" {
				return nil, fmt.Errorf("target: %s needs %s, which is not part of this process: set %s_address", name, dep, dep)
			}
		}
	}
	return selected, nil
}

// splitTargets splits comma lists and drops blanks.
func splitTargets(targets []string) []string {
	var out []string
	for _, t := range targets {
		for _, part := range strings.Split(t, ",") {
			if part = strings.TrimSpace(part); part != "" {
				out = append(out, part)
			}
		}
	}
	return out
}

// Names lists module names.
func Names(modules []Module) []string {
	names := make([]string, 0, len(modules))
	for _, m := range modules {
		names = append(names, m.Name)
	}
	sort.Strings(names)
	return names
}

// New binds the listeners and builds the selected modules.
func New(ctx context.Context, cfg Config, modules []Module, deps Deps) (*App, error) {
	selected, err := Resolve(modules, cfg.Targets, cfg.Addresses)
	if err != nil {
		return nil, err
	}
	audiences, err := moduleAudiences(modules)
	if err != nil {
		return nil, err
	}
	if cfg.GRPCReflection {
		if audiences, err = rpc.Merge(audiences, rpc.ReflectionAudiences); err != nil {
			return nil, err
		}
	}
	if deps.Authenticator, err = serviceIdentity(deps.Authenticator, selected, modules); err != nil {
		return nil, err
	}
	if deps.Authenticator, err = deps.Authenticator.Instrumented(deps.Log, deps.Metrics, deps.Clock); err != nil {
		return nil, err
	}
	chain, err := rpc.ServerInterceptors(deps.Log, deps.Metrics, deps.Authenticator, audiences)
	if err != nil {
		return nil, err
	}
	opts := chain.ServerOptions()
	if cfg.MaxMessageBytes > 0 {
		opts = append(opts, grpc.MaxRecvMsgSize(cfg.MaxMessageBytes))
	}
	if deps.TracerProvider != nil {
		opts = append(opts, rpc.TracingServerOption(deps.TracerProvider))
	}
	if src := deps.TLS.Source; src != nil {
		opts = append(opts, grpc.Creds(src.GRPCServerCredentials(deps.TLS.GRPCClientAuth)))
	}
	a := &App{
		cfg:      cfg,
		deps:     deps,
		grpc:     grpc.NewServer(opts...),
		health:   health.NewServer(),
		mux:      http.NewServeMux(),
		selected: selected,
		all:      len(selected) == len(modules),
		conns:    map[string]*grpc.ClientConn{},
		reload:   map[string]func(context.Context, any) error{},
	}
	if err := deps.Metrics.Register(collectors.NewGoCollector()); err != nil {
		return nil, fmt.Errorf("register go collector: %w", err)
	}
	if a.grpcLis, err = net.Listen("tcp", cfg.GRPCListenAddress); err != nil {
		return nil, fmt.Errorf("server.grpc_listen_address: %w", err)
	}
	if a.httpLis, err = net.Listen("tcp", cfg.HTTPListenAddress); err != nil {
		a.grpcLis.Close()
		return nil, fmt.Errorf("server.http_listen_address: %w", err)
	}
	if cfg.DebugListenAddress != "" {
		if a.debugLis, err = net.Listen("tcp", debugListenAddress(cfg.DebugListenAddress)); err != nil {
			a.closeListeners()
			return nil, fmt.Errorf("server.debug_listen_address: %w", err)
		}
	}
	// /metrics names tenants, models and keys: a deployment may keep it off the public
	// listener and serve it beside the profiler, for operators and the scraper only.
	metrics := promhttp.HandlerFor(deps.Metrics, promhttp.HandlerOpts{Registry: deps.Metrics})
	switch {
	case cfg.MetricsOnDebug && a.debugLis == nil:
		a.closeListeners()
		return nil, errors.New("server.metrics_on_debug_listener: needs server.debug_listen_address")
	case cfg.MetricsOnDebug:
		a.debug = newDebugServer(metrics, deps.Authenticator)
	default:
		a.mux.Handle("GET /metrics", metrics)
		if a.debugLis != nil {
			a.debug = newDebugServer(nil, deps.Authenticator)
		}
	}
	if src := deps.TLS.Source; src != nil && a.debug != nil {
		// Operator keys and profiles cross the network: the debug listener speaks TLS with
		// the process certificate, and asks clients for one as the HTTP listener does.
		a.debug.TLSConfig = src.ServerConfig(deps.TLS.HTTPClientAuth, "h2", "http/1.1")
	}
	registrar := a.localChannel(chain)
	grpc_health_v1.RegisterHealthServer(a.grpc, a.health)
	if cfg.GRPCReflection {
		reflection.Register(a.grpc)
	}
	a.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	a.mux.HandleFunc("GET /readyz", a.serveReady)
	a.http = newHTTPServer(a.mux, cfg.HTTP, &a.shapes)
	if src := deps.TLS.Source; src != nil {
		a.http.TLSConfig = src.ServerConfig(deps.TLS.HTTPClientAuth, "h2", "http/1.1")
	}

	env := Env{GRPC: registrar, HTTP: a.mux, HTTPErrorShape: a.shapes.add, TLS: deps.TLS.Source, Dial: a.dial, Log: deps.Log, Metrics: deps.Metrics, Events: deps.Events, Clock: deps.Clock, Auth: deps.Authenticator, NATS: deps.NATS, TracerProvider: deps.TracerProvider, Dependency: a.addDependency, Getenv: deps.Getenv}
	for _, m := range modules {
		if !slices.Contains(selected, m.Name) {
			continue
		}
		r, err := m.New(ctx, env.with(deps.Log.With("module", m.Name)))
		if err != nil {
			a.abort()
			return nil, fmt.Errorf("%s: %w", m.Name, err)
		}
		if r != nil {
			a.run = append(a.run, module{name: m.Name, deps: m.Deps, r: r})
		}
		if m.Reload != nil {
			a.reload[m.Name] = m.Reload
		}
	}
	return a, nil
}

func (e Env) with(log *slog.Logger) Env { e.Log = log; return e }

// moduleAudiences merges the modules' audience tables: every module's, not only the
// selected ones', so that a method is never unknown for want of its module here.
func moduleAudiences(modules []Module) (rpc.Audiences, error) {
	tables := make([]rpc.Audiences, 0, len(modules))
	for _, m := range modules {
		tables = append(tables, m.Audiences)
	}
	return rpc.Merge(tables...)
}

// serviceIdentity returns the authenticator the process uses. With authentication on,
// modules call each other as services. A process that runs some modules must prove that
// to the others: a shared mesh secret, or mTLS client certificates. Calls between modules
// of one process have no peer certificate, so a process that runs more than one module
// and has no mesh secret makes up one of its own for them (no other process knows it;
// with mTLS, other processes identify its calls by the certificate first).
func serviceIdentity(authn *rpc.Authenticator, selected []string, modules []Module) (*rpc.Authenticator, error) {
	if !authn.Enabled() || authn.HasMeshSecret() {
		return authn, nil
	}
	if len(selected) < len(modules) && !authn.HasServiceIdentity() {
		return nil, errors.New("auth: modules run in separate processes, so they need a service identity to call each other: set auth.mesh_secret_env or auth.mesh_secret_file (the same secret in every process), or mTLS client certificates (tls)")
	}
	if len(selected) > 1 {
		return authn.WithProcessSecret(), nil
	}
	return authn, nil
}

// clientIdentity is what this process's calls to other services present.
func (a *App) clientIdentity() rpc.ClientIdentity {
	c := a.deps.Authenticator.ClientIdentity(a.serviceName())
	if a.deps.TracerProvider != nil {
		c = c.WithTracing()
	}
	return c
}

// localChannel builds a.local and returns the registrar modules register on: the gRPC
// server and the in-process channel both.
func (a *App) localChannel(chain rpc.Interceptors) grpc.ServiceRegistrar {
	var clientStats, serverStats stats.Handler
	identity := a.clientIdentity()
	if tp := a.deps.TracerProvider; tp != nil {
		clientStats, serverStats = rpc.TracingClientHandler(tp), rpc.TracingServerHandler(tp)
	}
	local := newLocalConn(chain, identity, clientStats, serverStats)
	a.local = local
	return registrars{a.grpc, local}
}

// registrars registers every service on each of its registrars.
type registrars []grpc.ServiceRegistrar

func (r registrars) RegisterService(desc *grpc.ServiceDesc, impl any) {
	for _, reg := range r {
		reg.RegisterService(desc, impl)
	}
}

// serviceName is the name this process's calls to other services carry: like a
// certificate, a service identity belongs to the process, so it names the modules that
// run here ("router"; "cache_quota"), or "mantle" when all of them do.
func (a *App) serviceName() string {
	if a.all {
		return "mantle"
	}
	return strings.Join(a.selected, "_")
}

// GRPCAddr is the bound gRPC address.
func (a *App) GRPCAddr() string { return a.grpcLis.Addr().String() }

// HTTPAddr is the bound HTTP address.
func (a *App) HTTPAddr() string { return a.httpLis.Addr().String() }

// Targets are the modules this process runs.
func (a *App) Targets() []string { return slices.Clone(a.selected) }

// Run serves until ctx is done or a module fails, then shuts down gracefully: health goes
// NOT_SERVING and /readyz 503 first, in-flight calls drain within the shutdown timeout,
// then modules stop, each before the modules it calls.
func (a *App) Run(ctx context.Context) error {
	// A module that fails stops the process like a cancelled ctx does.
	ctx, moduleFailed := context.WithCancel(ctx)
	defer moduleFailed()
	g, gctx := errgroup.WithContext(ctx)
	var modules errgroup.Group
	running := make([]*runningModule, 0, len(a.run))
	defer func() {
		for _, r := range running {
			r.stop()
		}
	}()
	for _, m := range a.run {
		modCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
		r := &runningModule{module: m, stop: stop, done: make(chan struct{})}
		running = append(running, r)
		modules.Go(func() error {
			defer close(r.done)
			err := m.r.Run(modCtx)
			if err != nil {
				a.deps.Log.Error("module failed; shutting down", "module", m.name, "err", err)
				moduleFailed()
			}
			return err
		})
	}
	g.Go(func() error {
		if err := a.grpc.Serve(a.grpcLis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("grpc server: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		serve := a.http.Serve
		if a.http.TLSConfig != nil {
			// The certificate comes from TLSConfig, which reads the current files.
			serve = func(l net.Listener) error { return a.http.ServeTLS(l, "", "") }
		}
		if err := serve(a.httpLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http server: %w", err)
		}
		return nil
	})
	if a.debug != nil {
		debugTLS := a.debug.TLSConfig != nil // read before Serve, which sets up HTTP/2 in it
		g.Go(func() error {
			serve := a.debug.Serve
			if debugTLS {
				serve = func(l net.Listener) error { return a.debug.ServeTLS(l, "", "") }
			}
			if err := serve(a.debugLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("debug server: %w", err)
			}
			return nil
		})
		a.deps.Log.Info("debug listener serving pprof and expvar", "debug", a.DebugAddr(), "tls", debugTLS, "operator_key", a.deps.Authenticator.Enabled())
	}
	a.setServing(true)
	a.deps.Log.Info("mantle serving", "targets", strings.Join(a.selected, ","), "grpc", a.GRPCAddr(), "http", a.HTTPAddr(), "tls", a.deps.TLS.Source != nil)

	<-gctx.Done()
	a.setServing(false)
	if d := a.cfg.ShutdownDelay; d > 0 && ctx.Err() != nil {
		a.deps.Log.Info("not ready; draining before shutdown", "delay", d)
		<-a.deps.Clock.After(d)
	}
	a.shutdown()
	stopInOrder(running)
	err := errors.Join(g.Wait(), modules.Wait())
	a.closeConns()
	return err
}

func (a *App) shutdown() {
	timeout := a.cfg.GracefulShutdownTimeout
	if timeout <= 0 {
		timeout = 15 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	done := make(chan struct{})
	go func() {
		a.grpc.GracefulStop()
		close(done)
	}()
	if a.debug != nil {
		a.debug.Close() // a profile in progress is cut: it is no request of the service's
	}
	if err := a.http.Shutdown(ctx); err != nil {
		a.deps.Log.Warn("http shutdown did not drain in time", "err", err)
		a.http.Close()
	}
	select {
	case <-done:
	case <-ctx.Done():
		a.deps.Log.Warn("grpc shutdown did not drain in time; closing remaining calls")
		a.grpc.Stop()
		<-done
	}
}

func (a *App) setServing(serving bool) {
	a.ready.Store(serving)
	st := grpc_health_v1.HealthCheckResponse_NOT_SERVING
	if serving {
		st = grpc_health_v1.HealthCheckResponse_SERVING
	}
	a.health.SetServingStatus("", st)
	for name := range a.grpc.GetServiceInfo() {
		a.health.SetServingStatus(name, st)
	}
}

func (a *App) serveReady(w http.ResponseWriter, _ *http.Request) {
	if !a.ready.Load() {
		http.Error(w, "not ready", http.StatusServiceUnavailable)
		return
	}
	// Ready either way: a degraded dependency is served around, and said.
	fmt.Fprintln(w, "ready")
	for _, d := range a.degraded() {
		fmt.Fprintf(w, "degraded %s: %s\n", d.name, d.reason)
	}
}

type dependency struct {
	name  string
	check func() string
}

// addDependency is Env.Dependency.
func (a *App) addDependency(name string, check func() string) {
	a.depMu.Lock()
	defer a.depMu.Unlock()
	a.dependencies = append(a.dependencies, dependency{name: name, check: check})
}

// degraded lists the dependencies that are degraded now, by name, with their reasons.
func (a *App) degraded() []struct{ name, reason string } {
	a.depMu.Lock()
	deps := slices.Clone(a.dependencies)
	a.depMu.Unlock()
	var out []struct{ name, reason string }
	for _, d := range deps {
		if reason := d.check(); reason != "" {
			out = append(out, struct{ name, reason string }{d.name, strings.ReplaceAll(reason, "\n", " ")})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// dial returns the in-process channel for a module of this process, and a shared
// connection to the configured address for any other.
func (a *App) dial(module string) (grpc.ClientConnInterface, error) {
	if slices.Contains(a.selected, module) {
		return a.local, nil
	}
	addr := a.cfg.Addresses[module]
	if addr == "" {
		return nil, fmt.Errorf("dial %s: no address configured", module)
	}
	a.connMu.Lock()
	defer a.connMu.Unlock()
	if cc, ok := a.conns[addr]; ok {
		return cc, nil
	}
	creds := insecure.NewCredentials()
	if src := a.deps.TLS.Source; src != nil {
		creds = src.GRPCClientCredentials(a.deps.TLS.ServerName)
	}
	opts := append(a.clientIdentity().DialOptions(), grpc.WithTransportCredentials(creds))
	if a.deps.TracerProvider != nil {
		opts = append(opts, rpc.TracingDialOption(a.deps.TracerProvider))
	}
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s at %s: %w", module, addr, err)
	}
	a.conns[addr] = cc
	return cc, nil
}

func (a *App) closeConns() {
	a.connMu.Lock()
	defer a.connMu.Unlock()
	for addr, cc := range a.conns {
		cc.Close()
		delete(a.conns, addr)
	}
}

func (a *App) closeListeners() {
	a.grpcLis.Close()
	a.httpLis.Close()
	if a.debugLis != nil {
		a.debugLis.Close()
	}
}

// Reload hands each module that runs here and can reload its new configuration block.
// Every module is tried; the errors are joined, named by module.
func (a *App) Reload(ctx context.Context, blocks map[string]any) error {
	var errs []error
	for _, name := range a.selected {
		reload, ok := a.reload[name]
		if !ok {
			a.deps.Log.Warn("module cannot reload; its new configuration applies after a restart", "module", name)
			continue
		}
		block, ok := blocks[name]
		if !ok {
			continue
		}
		if err := reload(ctx, block); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// Close releases an App whose Run will never be called (Run releases everything itself).
func (a *App) Close() { a.abort() }

// abort releases what New acquired when a module fails to build: the listeners, the
// connections modules dialled, and the modules already built, whose Run is called with a
// done context so they release what their New started (the router's sim servers, say).
func (a *App) abort() {
	a.closeListeners()
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for _, m := range a.run {
		if err := m.r.Run(done); err != nil {
			a.deps.Log.Warn("stopping a module after a failed start", "err", err)
		}
	}
	a.closeConns()
}
