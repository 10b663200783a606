package quota

import (
	"context"
	"fmt"
	"log/slog"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	quotav1 "github.com/mantle-mesh/mantle/pkg/api/mantle/quota/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/app"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/quota/internal/redistest"
)

// The tenant's limits in the wiring test: 100 tokens a request makes both buckets bind
// at 60 requests a minute.
const (
	wiringRPM      = 60
	wiringTPM      = 6000
	wiringTokens   = 100
	wiringReplicas = 3
	wiringRouters  = 2
	wiringStep     = 500 * time.Millisecond
	// Each router sends this many requests per step, spread over the replicas: 720 a
	// minute, twelve times the limit.
	wiringPerStep = 3
)

// degradations forwards DegradationEvents to a channel and drops every other event (a
// refusal publishes one each, far more than a channel should hold). It never blocks, as
// a Publisher must not: events beyond the channel's room are counted in overflow.
type degradations struct {
	ch       chan *eventsv1.DegradationEvent
	overflow atomic.Int64
}

func (d *degradations) Publish(_ context.Context, _ string, msg proto.Message) {
	if ev, ok := msg.(*eventsv1.DegradationEvent); ok {
		select {
		case d.ch <- ev:
		default:
			d.overflow.Add(1)
		}
	}
}

// wiringReplica is one quota replica as the module builds it, serving gRPC.
type wiringReplica struct {
	client   quotav1.QuotaServiceClient
	reg      *prometheus.Registry
	degraded func() string // what the module named with env.Dependency
}

type wiring struct {
	clock    *clockwork.FakeClock
	replicas []*wiringReplica
	events   *degradations
	// admitted counts grants per window since t0, from the routers' own answers.
	mu       sync.Mutex
	admitted map[int]int64
	tokens   map[int]int64
}

// newWiring starts wiringReplicas quota modules on the Redis at addr, under one fresh
// prefix, as production builds them (module: FailoverStore over redisstore.Store over its own
// client) except for the decision clock: the test's fake clock, so that windows are
// exact.
func newWiring(t *testing.T, addr, prefix string) *wiring {
	t.Helper()
	return newWiringAuth(t, addr, prefix, nil)
}

// newWiringAuth is newWiring with the production interceptor chain in front of each
// replica when authn is set, so that calls carry their caller (the service and the tenant
// it acts for) as in production.
func newWiringAuth(t *testing.T, addr, prefix string, authn *rpc.Authenticator) *wiring {
	t.Helper()
	w := &wiring{
		clock:    clockwork.NewFakeClockAt(t0),
		events:   &degradations{ch: make(chan *eventsv1.DegradationEvent, 64)},
		admitted: map[int]int64{},
		tokens:   map[int]int64{},
	}
	cfg := DefaultConfig()
	cfg.DefaultLimits = RateLimits{RPM: wiringRPM, TPM: wiringTPM}
	cfg.Backend = backendRedis
	cfg.Redis.Address, cfg.Redis.KeyPrefix, cfg.Redis.Replicas = addr, prefix, wiringReplicas
	cfg.Redis.Timeout, cfg.Redis.DialTimeout = 2*time.Second, 2*time.Second
	ctx, cancel := context.WithCancel(context.Background())
	var runs sync.WaitGroup
	t.Cleanup(func() { cancel(); runs.Wait() })
	for i := range wiringReplicas {
		r := &wiringReplica{reg: prometheus.NewRegistry()}
		lis := bufconn.Listen(1 << 20)
		var opts []grpc.ServerOption
		if authn != nil {
			chain, err := rpc.ServerInterceptors(slog.New(slog.DiscardHandler), r.reg, authn, audiences)
			if err != nil {
				t.Fatal(err)
			}
			opts = chain.ServerOptions()
		}
		srv := grpc.NewServer(opts...)
		env := app.Env{
			GRPC: srv, Log: slog.New(slog.DiscardHandler), Metrics: r.reg, Events: w.events, Clock: w.clock,
			Dependency: func(name string, degraded func() string) {
				if name == "quota.redis" {
					r.degraded = degraded
				}
			},
		}
		run, err := module(cfg, replicaClock).New(ctx, env)
		if err != nil {
			t.Fatal(err)
		}
		if r.degraded == nil {
			t.Fatal("the module named no quota.redis dependency")
		}
		go func() { _ = srv.Serve(lis) }()
		t.Cleanup(srv.Stop)
		runs.Go(func() {
			if err := run.Run(ctx); err != nil {
				t.Errorf("replica %d: Run = %v", i, err)
			}
		})
		r.client = dialBufconn(t, lis)
		w.replicas = append(w.replicas, r)
	}
	// Every replica's probe, flush and sweep tickers: each has made its first contact
	// with Redis.
	if err := w.clock.BlockUntilContext(ctx, 3*wiringReplicas); err != nil {
		t.Fatal(err)
	}
	return w
}

// window is the number of the window (minute since t0) now falls in.
func (w *wiring) window() int { return int(w.clock.Since(t0) / time.Minute) }

// drive runs the routers for d: every step each router sends its requests at once,
// round robin over the replicas, and the test counts what was granted; then the clock
// moves a step.
func (w *wiring) drive(t *testing.T, d time.Duration) {
	t.Helper()
	for range d / wiringStep {
		win := w.window()
		var wg sync.WaitGroup
		for r := range wiringRouters {
			for j := range wiringPerStep {
				replica := w.replicas[(r*wiringPerStep+j)%wiringReplicas]
				wg.Go(func() {
					resp, err := replica.client.Reserve(context.Background(), &quotav1.ReserveRequest{
						Quality: &mantlev1.QualityContext{RequestId: fmt.Sprintf("router-%d", r), Tenant: "acme"},
						Model:   "m", InputTokens: wiringTokens - 1, MaxOutputTokens: 1,
					})
					if status.Code(err) == codes.ResourceExhausted {
						return
					}
					if err != nil {
						t.Errorf("router %d: %v", r, err)
						return
					}
					w.mu.Lock()
					w.admitted[win]++
					w.tokens[win] += resp.GetReservedTokens()
					w.mu.Unlock()
				})
			}
		}
		wg.Wait()
		w.clock.Advance(wiringStep)
	}
}

// check asserts the bucket's promise on every window so far: at most 1.05 x the limit
// plus the bucket's burst (its capacity, one limit) in any window, and, counted from
// the start, never more than one burst plus 1.05 x the limit per window elapsed. It
// also asserts that windows in which all was well admitted nearly the limit, so that a
// store refusing everything cannot pass.
func (w *wiring) check(t *testing.T, healthy map[int]bool) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	var total, totalTokens int64
	for win := range w.window() {
		n, tok := w.admitted[win], w.tokens[win]
		total, totalTokens = total+n, totalTokens+tok
		t.Logf("window %d: %d requests, %d tokens admitted", win, n, tok)
		if limit := int64(wiringRPM*105/100 + wiringRPM); n > limit {
			t.Errorf("window %d: %d requests admitted, want at most 1.05 x %d + a burst of %d", win, n, wiringRPM, wiringRPM)
		}
		if limit := int64(wiringTPM*105/100 + wiringTPM); tok > limit {
			t.Errorf("window %d: %d tokens admitted, want at most 1.05 x %d + a burst of %d", win, tok, wiringTPM, wiringTPM)
		}
		elapsed := int64(win + 1)
		if limit := wiringRPM + elapsed*wiringRPM*105/100; total > limit {
			t.Errorf("windows 0-%d: %d requests admitted, want at most a burst of %d + 1.05 x %d per window", win, total, wiringRPM, wiringRPM)
		}
		if limit := wiringTPM + elapsed*wiringTPM*105/100; totalTokens > limit {
			t.Errorf("windows 0-%d: %d tokens admitted, want at most a burst of %d + 1.05 x %d per window", win, totalTokens, wiringTPM, wiringTPM)
		}
		if healthy[win] && n < wiringRPM*95/100 {
			t.Errorf("window %d: %d requests admitted under demand twelve times the limit, want about %d", win, n, wiringRPM)
		}
	}
}

// fallbacks is mantle_quota_backend_fallbacks_total summed over the replicas.
func (w *wiring) fallbacks(t *testing.T) float64 {
	t.Helper()
	var sum float64
	for _, r := range w.replicas {
		families, err := r.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() == "mantle_quota_backend_fallbacks_total" {
				sum += metricValue(f.GetMetric()[0])
			}
		}
	}
	return sum
}

func metricValue(m *dto.Metric) float64 {
	if c := m.GetCounter(); c != nil {
		return c.GetValue()
	}
	return m.GetGauge().GetValue()
}

// awaitDegradations returns the next n degradation events.
func (w *wiring) awaitDegradations(t *testing.T, n int) []*eventsv1.DegradationEvent {
	t.Helper()
	var out []*eventsv1.DegradationEvent
	for len(out) < n {
		select {
		case ev := <-w.events.ch:
			out = append(out, ev)
		case <-time.After(10 * time.Second): // a failure timeout, not a wait
			t.Fatalf("%d of %d degradation events", len(out), n)
		}
	}
	return out
}

// Three quota replicas built as the module builds them share one Redis; two routers
// send one tenant twelve times its limit. Counted from the routers' grants, every
// window, the first included, stays within 1.05 x the limit plus the burst, and no
// refusal sends a replica to its local limiter.
func TestProductionWiringHoldsTheLimit(t *testing.T) {
	t.Parallel()
	c := newTestRedisClient(t)
	w := newWiring(t, redisAddrForTest(t), testPrefix(t, c))
	w.drive(t, 4*time.Minute)
	w.check(t, map[int]bool{1: true, 2: true, 3: true})
	if n := w.fallbacks(t); n != 0 {
		t.Errorf("%v switches to the local limiter while Redis answered every call", n)
	}
	select {
	case ev := <-w.events.ch:
		t.Errorf("degradation event while Redis answered: %v (and %d more)", ev, len(w.events.ch)+int(w.events.overflow.Load()))
	default:
	}
	for i, r := range w.replicas {
		if reason := r.degraded(); reason != "" {
			t.Errorf("replica %d reports itself degraded: %s", i, reason)
		}
	}
}

// The same wiring through a Redis that goes away twice: cut off (it keeps its data),
// then killed and replaced by an empty one. During each outage the replicas hold the
// limit together, each with its share; when Redis is back, what they admitted locally
// is handed over (kept data) or the buckets restart empty (lost data), so that no
// window admits the limit twice over.
func TestProductionWiringThroughRedisOutages(t *testing.T) {
	t.Parallel()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server is not installed: this test kills and restarts its own")
	}
	startRedis := func() (string, *exec.Cmd) {
		t.Helper()
		addr, cmd, err := redistest.StartServer(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return addr, cmd
	}
	addr, server := startRedis()
	proxy := startFlakyProxy(t, addr)
	w := newWiring(t, proxy.addr(), "mantle-test:outage:")
	healthy := map[int]bool{1: true}

	w.drive(t, 2*time.Minute)

	// A partition: Redis keeps its data but nobody reaches it.
	proxy.setCut(true)
	w.drive(t, 2*time.Minute)
	for i, r := range w.replicas {
		if reason := r.degraded(); !strings.Contains(reason, "redis unreachable") || !strings.Contains(reason, "limit/3") {
			t.Errorf("replica %d during the outage: Degradation %q, want it to say Redis is unreachable and limit/3", i, reason)
		}
	}
	for _, ev := range w.awaitDegradations(t, wiringReplicas) {
		if !strings.Contains(ev.GetReason(), "unreachable") {
			t.Errorf("event %q, want the outage", ev.GetReason())
		}
	}
	proxy.setCut(false)
	w.clock.Advance(time.Second) // the probe
	for _, ev := range w.awaitDegradations(t, wiringReplicas) {
		if !strings.Contains(ev.GetReason(), "recovered") {
			t.Errorf("event %q, want the recovery", ev.GetReason())
		}
	}
	w.drive(t, 2*time.Minute-time.Second)
	healthy[5] = true

	// Killed, and replaced by an empty Redis.
	_ = server.Process.Kill()
	_ = server.Wait()
	proxy.setCut(true)
	w.drive(t, 2*time.Minute)
	w.awaitDegradations(t, wiringReplicas)
	addr, _ = startRedis()
	proxy.retarget(addr)
	proxy.setCut(false)
	w.clock.Advance(time.Second)
	for _, ev := range w.awaitDegradations(t, wiringReplicas) {
		if !strings.Contains(ev.GetReason(), "recovered") {
			t.Errorf("event %q, want the recovery", ev.GetReason())
		}
	}
	// The recreated bucket starts empty and refills at its rate: a second after the
	// restore it holds one request, not sixty.
	resp, err := w.replicas[0].client.Reserve(context.Background(), &quotav1.ReserveRequest{
		Quality: &mantlev1.QualityContext{RequestId: "probe", Tenant: "acme"}, Model: "m", InputTokens: wiringTokens - 1, MaxOutputTokens: 1,
	})
	if err == nil {
		w.mu.Lock()
		w.admitted[w.window()]++
		w.tokens[w.window()] += resp.GetReservedTokens()
		w.mu.Unlock()
		if got := resp.GetLimits().GetRemainingRequests(); got > 2 {
			t.Errorf("right after the empty Redis came back: %d requests remain, want the bucket restarted empty", got)
		}
	} else if status.Code(err) != codes.ResourceExhausted {
		t.Fatal(err)
	}
	w.drive(t, 2*time.Minute-time.Second)
	healthy[9] = true
	w.check(t, healthy)
}

// TestProductionWiringSharesTheTenantRetryShare: a tenant's share of the retry budget is
// counted in Redis beside the budget, so a loop of retries spread over the quota replicas
// gets the share once, not once per replica; another tenant's retries still pass.
func TestProductionWiringSharesTheTenantRetryShare(t *testing.T) {
	t.Parallel()
	c := newTestRedisClient(t)
	secret := rpc.NewMeshSecret()
	authn, err := rpc.NewAuthenticator([]rpc.TenantKey{
		{ID: "greedy", KeySHA256: rpc.HashKey("sk-greedy")}, {ID: "other", KeySHA256: rpc.HashKey("sk-other")},
	}, nil, rpc.WithMeshSecret(secret))
	if err != nil {
		t.Fatal(err)
	}
	w := newWiringAuth(t, redisAddrForTest(t), testPrefix(t, c), authn)
	// The router's call, on behalf of a tenant.
	asRouter := func(tenant string) context.Context {
		return metadata.AppendToOutgoingContext(context.Background(),
			rpc.MetadataMeshSecret, secret, rpc.MetadataService, "router", rpc.MetadataOnBehalfOf, tenant)
	}
	// The default budget: floor 10, tenant_share 0.5, so 5 retries for one tenant while
	// no requests are counted, across every replica.
	granted := 0
	for i := range 30 {
		resp, err := w.replicas[i%wiringReplicas].client.AcquireRetry(asRouter("greedy"), &quotav1.AcquireRetryRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetGranted() {
			granted++
		} else if resp.GetBudget() != "retry:tenant:greedy" {
			t.Fatalf("retry %d refused by %q, want the tenant's share", i, resp.GetBudget())
		}
	}
	if granted != 5 {
		t.Errorf("greedy got %d retries over %d replicas, want 5: the share is the mesh's, not each replica's", granted, wiringReplicas)
	}
	for i := range wiringReplicas {
		resp, err := w.replicas[i].client.AcquireRetry(asRouter("other"), &quotav1.AcquireRetryRequest{})
		if err != nil || !resp.GetGranted() {
			t.Errorf("other tenant's retry on replica %d: %v, %v; want granted", i, resp, err)
		}
	}
}
