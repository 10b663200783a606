package router

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	agentv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/agent/v1"
	cachev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/cache/v1"
	quotav1 "github.com/mantle-mesh/mantle/pkg/api/mantle/quota/v1"
	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/pkg/app"
	"github.com/mantle-mesh/mantle/pkg/formatcheck"
	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/pkg/provider/anthropic"
	"github.com/mantle-mesh/mantle/pkg/provider/openai"
	"github.com/mantle-mesh/mantle/pkg/sim"
	"github.com/mantle-mesh/mantle/services/router/internal/idempotency"
	"github.com/mantle-mesh/mantle/services/router/statuspage"
)

// Module returns the router module: it calls quota, cache, verifier and agent.
func Module(cfg Config) app.Module {
	var r *Router // set by New, used by Reload
	return app.Module{
		Name:      "router",
		Audiences: Audiences,
		Deps:      []string{"quota", "cache", "verifier", "agent"},
		New: func(ctx context.Context, env app.Env) (app.Runnable, error) {
			var run app.Runnable
			var err error
			r, run, err = newModule(ctx, cfg, env, env.Var)
			return run, err
		},
		Reload: func(_ context.Context, block any) error {
			c, ok := block.(Config)
			if !ok {
				return fmt.Errorf("reload: want a router.Config, got %T", block)
			}
			return r.Reload(c)
		},
	}
}

func newModule(ctx context.Context, cfg Config, env app.Env, getenv func(string) string) (*Router, app.Runnable, error) {
	m, err := newMetrics(env.Metrics)
	if err != nil {
		return nil, nil, err
	}
	missing, err := missingKeys(cfg, getenv)
	if err != nil {
		return nil, nil, err
	}
	for _, k := range missing {
		env.Log.Warn("provider API key variable is unset or empty: every call on this key fails until a restart with it set (router.allow_missing_keys)",
			"provider", k.provider, "key", k.id, "env", k.env)
	}
	// The local L1 fallback uses formatcheck's defaults, which are the verifier's too.
	checker, err := formatcheck.New(formatcheck.DefaultConfig())
	if err != nil {
		return nil, nil, err
	}
	deps := Deps{Events: env.Events, Clock: env.Clock, Log: env.Log, Metrics: m, Checker: checker, Tracer: env.Tracer(TracerName)}
	// A service whose address is Off stays nil: the router skips its steps.
	dial := func(module, address string) (grpc.ClientConnInterface, error) {
		if address == Off {
			return nil, nil
		}
		return env.Dial(module)
	}
	quotaConn, err := dial("quota", cfg.QuotaAddress)
	if err != nil {
		return nil, nil, err
	}
	cacheConn, err := dial("cache", cfg.CacheAddress)
	if err != nil {
		return nil, nil, err
	}
	verifierConn, err := dial("verifier", cfg.VerifierAddress)
	if err != nil {
		return nil, nil, err
	}
	agentConn, err := dial("agent", cfg.AgentAddress)
	if err != nil {
		return nil, nil, err
	}
	if agentConn != nil {
		deps.Tools = agentv1.NewToolServiceClient(agentConn)
		deps.Sessions = agentv1.NewSessionServiceClient(agentConn)
	}
	if quotaConn != nil {
		deps.Quota = quotav1.NewQuotaServiceClient(quotaConn)
	}
	if cacheConn != nil {
		deps.Cache = cachev1.NewCacheServiceClient(cacheConn)
	}
	if verifierConn != nil {
		deps.Verifier = verifierv1.NewVerifierServiceClient(verifierConn)
	} else if deps.Cache != nil {
		// Only verified answers are cached (router.serve), so this router stores none.
		env.Log.Warn("verifier_address is off and the cache is on: this router's answers are unverified and not stored; lookups find only what other routers stored")
	}

	// One transport for every provider: connection reuse matters more than isolation here,
	// and every call carries its own deadline through its context.
	// One HTTP client per provider, each with its provider's dial timeout (providers change
	// only with a restart, so clients are built once).
	httpClients := map[string]*http.Client{}
	sims := newSimHosts(ctx, cfg, env)
	clients := func(p ProviderConfig, mc ModelConfig, keyID string) (provider.Provider, error) {
		httpClient, ok := httpClients[p.Name]
		if !ok {
			httpClient = providerHTTPClient(p)
			httpClients[p.Name] = httpClient
		}
		switch p.Type {
		case ProviderSim:
			base, err := sims.baseURL(p)
			if err != nil {
				return nil, err
			}
			return openai.New(openai.Config{BaseURL: base, HTTPClient: httpClient, Now: env.Clock.Now}), nil
		case ProviderOpenAI, ProviderAnthropic:
			if keyValue(p, keyID, getenv) == "" {
				return missingKeyProvider{env: keyEnv(p, keyID)}, nil
			}
		}
		switch p.Type {
		case ProviderOpenAI:
			return openai.New(openai.Config{BaseURL: p.BaseURL, APIKey: keyValue(p, keyID, getenv), HTTPClient: httpClient, Now: env.Clock.Now}), nil
		case ProviderAnthropic:
			return anthropic.New(anthropic.Config{BaseURL: p.BaseURL, APIKey: keyValue(p, keyID, getenv), HTTPClient: httpClient, Now: env.Clock.Now}), nil
		}
		return nil, fmt.Errorf("unknown provider type %q", p.Type)
	}
	var sweep func(ctx context.Context) error
	switch cfg.Idempotency.Backend {
	case "jetstream":
		if env.NATS == nil {
			sims.stop()
			return nil, nil, fmt.Errorf("idempotency.backend jetstream needs NATS: set events.nats_url or events.embedded")
		}
		js, err := jetstream.New(env.NATS)
		if err != nil {
			sims.stop()
			return nil, nil, fmt.Errorf("idempotency: %w", err)
		}
		store, err := idempotency.NewJetStream(ctx, js, "mantle_idempotency", cfg.Idempotency.TTL, cfg.Idempotency.InflightTTL)
		if err != nil {
			sims.stop()
			return nil, nil, fmt.Errorf("idempotency: %w", err)
		}
		deps.Idempotency = store.LimitPerTenant(cfg.Idempotency.MaxRecordsPerTenant)
	default:
		store := idempotency.NewMemory(cfg.Idempotency.TTL, cfg.Idempotency.InflightTTL, env.Clock).LimitPerTenant(cfg.Idempotency.MaxRecordsPerTenant)
		deps.Idempotency = store
		sweep = func(ctx context.Context) error {
			t := env.Clock.NewTicker(time.Minute)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return nil
				case <-t.Chan():
					store.Sweep()
				}
			}
		}
	}
	r, err := New(cfg, deps, clients)
	if err != nil {
		sims.stop()
		return nil, nil, err
	}
	routerv1.RegisterRouterServiceServer(env.GRPC, &server{router: r})
	(&frontDoor{router: r, auth: env.Auth, log: env.Log}).register(env.HTTP)
	if env.HTTPErrorShape != nil {
		// Anthropic's SDKs parse the listener's own answers under the Messages door too
		// (a path under it that does not exist, GET, headers too large).
		env.HTTPErrorShape(messagesPath, app.ErrorShapeAnthropic)
	}
	statuspage.New(statuspage.Deps{
		Routes: r, Quota: deps.Quota, Cache: deps.Cache, Tools: deps.Tools, Auth: env.Auth, Clock: env.Clock, Log: env.Log,
		Refresh: func() time.Duration { return r.conf().Status.Refresh },
	}).Register(env.HTTP)
	for _, g := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "mantle_router_shed_share", Help: "Share of normal-priority requests the overload shedder refuses now (high: half, batch: twice, critical: none).",
		}, r.shedder.Share),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "mantle_router_cpu_wait_p90_seconds", Help: "P90 wait of runnable goroutines for a CPU over the shedder's last quarter second: the overload signal.",
		}, func() float64 { return r.shedder.Delay().Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "mantle_router_request_cpu_seconds", Help: "CPU a request costs this process, as the overload shedder learnt it while the process kept up (0: not yet).",
		}, func() float64 { return r.shedder.Cost().Seconds() }),
	} {
		if err := env.Metrics.Register(g); err != nil {
			sims.stop()
			return nil, nil, fmt.Errorf("register router metrics: %w", err)
		}
	}
	return r, app.RunFunc(func(ctx context.Context) error {
		shedderDone := make(chan struct{})
		go func() {
			defer close(shedderDone)
			_ = r.shedder.Run(ctx) // returns when ctx ends
		}()
		if sweep != nil {
			_ = sweep(ctx)
		}
		<-ctx.Done()
		<-shedderDone
		r.StopScouts()
		r.WaitStores()
		return sims.stop()
	}), nil
}

// missingKey is a provider key whose environment variable is unset or empty.
type missingKey struct{ provider, id, env string }

// missingKeys lists the provider keys whose variables are unset or empty, or refuses them
// all by name unless allow_missing_keys is set: a key that is missing would otherwise
// start silently and fail every call with 401.
func missingKeys(cfg Config, getenv func(string) string) ([]missingKey, error) {
	var missing []missingKey
	var errs []error
	for i, p := range cfg.Providers {
		if p.Type == ProviderSim {
			continue
		}
		for j, k := range p.Keys {
			if getenv(k.Env) != "" {
				continue
			}
			missing = append(missing, missingKey{provider: p.Name, id: k.ID, env: k.Env})
			errs = append(errs, fmt.Errorf("providers[%d].keys[%d].env: environment variable %s (key %s of provider %s) is unset or empty; set it, or set router.allow_missing_keys to start without it",
				i, j, k.Env, k.ID, p.Name))
		}
	}
	if len(errs) > 0 && !cfg.AllowMissingKeys {
		return nil, errors.Join(errs...)
	}
	return missing, nil
}

// missingKeyProvider stands for a key whose variable was missing at start: every call
// fails at once with an auth error and nothing is sent.
type missingKeyProvider struct{ env string }

func (m missingKeyProvider) err() error {
	return &provider.Error{Class: mantlev1.ErrorClass_ERROR_CLASS_AUTH, Message: "API key variable " + m.env + " was unset or empty at start"}
}

func (m missingKeyProvider) Complete(context.Context, provider.Request) (provider.Response, error) {
	return provider.Response{}, m.err()
}

func (m missingKeyProvider) Stream(context.Context, provider.Request) (provider.Stream, error) {
	return nil, m.err()
}

// keyEnv is the environment variable of key keyID of p.
func keyEnv(p ProviderConfig, keyID string) string {
	for _, k := range p.Keys {
		if k.ID == keyID {
			return k.Env
		}
	}
	return ""
}

func keyValue(p ProviderConfig, keyID string, getenv func(string) string) string {
	for _, k := range p.Keys {
		if k.ID == keyID {
			return getenv(k.Env)
		}
	}
	return ""
}

// simHosts runs one in-process sim server per sim provider, on loopback, so sim models are
// reached through the real OpenAI adapter and HTTP stack.
type simHosts struct {
	ctx    context.Context
	cancel context.CancelFunc
	cfg    Config
	env    app.Env
	urls   map[string]string
	waits  []func() error
}

func newSimHosts(ctx context.Context, cfg Config, env app.Env) *simHosts {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	return &simHosts{ctx: ctx, cancel: cancel, cfg: cfg, env: env, urls: map[string]string{}}
}

func (s *simHosts) baseURL(p ProviderConfig) (string, error) {
	if u, ok := s.urls[p.Name]; ok {
		return u, nil
	}
	def, ok := s.cfg.simProfile(orDefault(p.SimProfile, "fast"))
	if !ok {
		return "", fmt.Errorf("providers %s: unknown sim_profile %q (have %v)", p.Name, p.SimProfile, s.cfg.simProfileNames())
	}
	models := map[string]sim.Profile{}
	for _, m := range s.cfg.Models {
		if m.Provider != p.Name {
			continue
		}
		prof := def
		if m.SimProfile != "" {
			if prof, ok = s.cfg.simProfile(m.SimProfile); !ok {
				return "", fmt.Errorf("models %s: unknown sim_profile %q (have %v)", m.Name, m.SimProfile, s.cfg.simProfileNames())
			}
		}
		models[orDefault(m.Upstream, m.Name)] = prof
	}
	srv := sim.NewServer(sim.ServerConfig{Models: models, Default: def, Clock: s.env.Clock, Seed: p.SimSeed, Log: s.env.Log})
	bound, wait, err := sim.Start(s.ctx, "127.0.0.1:0", srv, s.env.Log.With("sim", p.Name))
	if err != nil {
		return "", err
	}
	s.waits = append(s.waits, wait)
	s.urls[p.Name] = "http://" + bound + "/v1"
	return s.urls[p.Name], nil
}

func (s *simHosts) stop() error {
	s.cancel()
	var first error
	for _, w := range s.waits {
		if err := w(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// providerHTTPClient is the HTTP client of one provider's calls: pooled connections, and a
// dial timeout of its own (dial_timeout) so that an unreachable provider fails fast and the
// request fails over within its budget. The call's own timeout comes from the request's
// context. Redirects are failures naming their target, not followed
// (provider.RefuseRedirects).
func providerHTTPClient(p ProviderConfig) *http.Client {
	dial := p.dialTimeout()
	return &http.Client{Transport: &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: dial, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout: dial,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   true,
	}, CheckRedirect: provider.RefuseRedirects}
}
