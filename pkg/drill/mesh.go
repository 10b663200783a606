package drill

import (
	"context"
	"errors"
	"fmt"
	"github.com/mantle-mesh/mantle/pkg/natsembed"
	"io"
	"math"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/app"
	"github.com/mantle-mesh/mantle/pkg/events"
	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/services/quota"
	"github.com/mantle-mesh/mantle/services/router"
)

// SimKeyEnv names the environment variable the drill's providers read their API key from.
// The simulator ignores keys; the variable exists because providers of type openai must name
// one, and it is normally unset.
const SimKeyEnv = "MANTLE_DRILL_SIM_KEY"

// minHopReserve keeps the router's reserve above what a loopback hop really costs, however
// strongly time is scaled.
const minHopReserve = 5 * time.Millisecond

// MeshConfig is the mesh configuration the drill runs scenario s with at time scale scale,
// with every model reached over the OpenAI API at simBaseURL (a simulator the drill runs, so
// it can count upstream calls and duplicate billing). Every module runs in one process on
// 127.0.0.1 with embedded NATS; the quota service is configured not to limit the drill's
// tenant, since the drill is about provider faults, not tenant quotas. A tool storm's mesh
// also has the agent's tool registry, at a placeholder address that a run replaces with
// its tool backends'.
func (s *Scenario) MeshConfig(simBaseURL string, scale float64) mesh.Config {
	cfg := mesh.Default()
	cfg.Target = "all"
	cfg.Server.GRPCListenAddress = "127.0.0.1:0"
	cfg.Server.HTTPListenAddress = "127.0.0.1:0"
	cfg.Server.GracefulShutdownTimeout = 5 * time.Second
	cfg.Events.Embedded = true
	cfg.Log = mesh.LogConfig{Level: "error", Format: "text"}
	cfg.Quota.DefaultLimits = quota.RateLimits{RPM: 1_000_000_000, TPM: 1_000_000_000_000}
	// The quota service keeps the retry budget all router replicas share; it gets the
	// scenario's budget, its window scaled like the router's (quota counts whole seconds).
	qb := &cfg.Quota.RetryBudget
	qb.Ratio, qb.Floor, qb.FormatOnlyAbove = s.Router.RetryBudget.Ratio, s.Router.RetryBudget.Floor, s.Router.RetryBudget.FormatOnlyAbove
	if w := s.Router.RetryBudget.Window; w > 0 {
		qb.Window = max(time.Second, scaler(scale).d(w).Round(time.Second))
	}

	sc := scaler(scale)
	r := &cfg.Router
	r.DefaultBudget = sc.d(s.Budget)
	r.HopReserve = max(sc.d(s.Router.HopReserve), minHopReserve)
	// The drill's load generator and simulator share the mesh's process, and its slow
	// scenarios keep many requests in flight: the CPU they use is not the router's
	// overload, and a drill measures what providers' faults do, not shedding. The shedder
	// still measures the wait for a CPU (a limit no wait reaches), so that the breakers
	// get no verdict from timeouts while the machine starves the process.
	r.Overload.MaxSchedulingDelay = time.Hour
	r.FirstTokenTimeout = sc.d(r.FirstTokenTimeout)
	r.StallTimeout = sc.d(r.StallTimeout)
	r.Retry = s.Router.Retry
	r.Retry.BackoffBase = sc.d(r.Retry.BackoffBase)
	r.Retry.BackoffCap = sc.d(r.Retry.BackoffCap)
	r.Retry.MaxRetryAfter = sc.d(r.Retry.MaxRetryAfter)
	r.RetryBudget = s.Router.RetryBudget
	r.RetryBudget.Window = sc.d(r.RetryBudget.Window)
	r.HedgeBudget = s.Router.HedgeBudget
	r.HedgeBudget.Window = sc.d(r.HedgeBudget.Window)
	r.Breaker = s.Router.Breaker
	r.Breaker.Window = sc.d(r.Breaker.Window)
	r.Breaker.SlowCall = sc.d(r.Breaker.SlowCall)
	r.Breaker.OpenDuration = sc.d(r.Breaker.OpenDuration)
	r.Breaker.MaxOpenDuration = sc.d(r.Breaker.MaxOpenDuration)
	if r.Breaker.ScoutInterval > 0 { // 0 follows open_duration and a negative one is off: kept as they are
		r.Breaker.ScoutInterval = sc.d(r.Breaker.ScoutInterval)
	}
	r.Providers, r.Models = nil, nil
	for _, m := range s.Models {
		provider := "sim-" + m.Name
		r.Providers = append(r.Providers, router.ProviderConfig{
			Name:    provider,
			Type:    router.ProviderOpenAI,
			BaseURL: simBaseURL,
			// Key ids name upstream keys across the mesh (quota counts retries and
			// rate limits per key id), so each model's key has its own.
			Keys:           []router.KeyConfig{{ID: m.Name + "-key", Env: SimKeyEnv}},
			Timeout:        sc.d(m.Timeout),
			MaxConcurrency: m.MaxConcurrency,
		})
		r.Models = append(r.Models, router.ModelConfig{
			Name:                  m.Name,
			Provider:              provider,
			ContextWindow:         128_000,
			InputPricePerMillion:  m.InputPricePerMillion,
			OutputPricePerMillion: m.OutputPricePerMillion,
			FormatStability:       m.FormatStability,
			Tier:                  m.Tier,
			AcceptsPrefill:        m.AcceptsPrefill,
		})
	}
	route := router.RouteConfig{
		Name:              RouteName,
		Scenario:          s.Name,
		Candidates:        s.Route.Candidates,
		Budget:            sc.d(s.Budget),
		FirstTokenTimeout: sc.d(s.Route.FirstTokenTimeout),
		StallTimeout:      sc.d(s.Route.StallTimeout),
		Hedge:             s.Route.Hedge,
		Ladder:            s.Route.Ladder,
	}
	route.Hedge.MinDelay = sc.d(route.Hedge.MinDelay)
	route.Hedge.MaxDelay = sc.d(route.Hedge.MaxDelay)
	r.Routes = []router.RouteConfig{route}
	if s.Tools != nil {
		s.addTools(&cfg, toolsPlaceholderURL, scale, s.Load.Rate)
	}
	return cfg
}

// scaler multiplies scenario durations into wall-clock durations.
type scaler float64

func (s scaler) d(d time.Duration) time.Duration {
	return time.Duration(math.Round(float64(d) * float64(s)))
}

// inProcessMesh is a mesh the drill started for one side of a run.
type inProcessMesh struct {
	proc    *mesh.Process
	url     string // the OpenAI-compatible chat completions URL
	cancel  context.CancelFunc
	stopped chan error
}

// startMesh starts cfg in this process and returns once it serves.
func startMesh(ctx context.Context, cfg mesh.Config, logOutput io.Writer) (*inProcessMesh, error) {
	p, err := mesh.Start(ctx, cfg, mesh.Options{LogOutput: logOutput, Getenv: simKeyEnv, EmbeddedNATS: natsembed.Launch})
	if err != nil {
		return nil, fmt.Errorf("drill: start mesh: %w", err)
	}
	// The mesh lives until stop, not until the caller's context ends, so that stop can
	// always wait for its clean exit.
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m := &inProcessMesh{proc: p, cancel: cancel, stopped: make(chan error, 1),
		url: "http://" + p.App.HTTPAddr() + "/v1/chat/completions"}
	go func() { m.stopped <- p.Run(runCtx) }()
	if err := waitServing(ctx, p.App.GRPCAddr()); err != nil {
		_ = m.stop()
		return nil, err
	}
	return m, nil
}

func (m *inProcessMesh) stop() error {
	m.cancel()
	if err := <-m.stopped; err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("drill: mesh: %w", err)
	}
	return nil
}

// waitServing blocks until the gRPC health check at addr says SERVING. WaitForReady queues
// the check until the server accepts connections, so nothing polls.
func waitServing(ctx context.Context, addr string) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("drill: dial mesh: %w", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := grpc_health_v1.NewHealthClient(conn).Check(ctx, &grpc_health_v1.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("drill: mesh health: %w", err)
	}
	if res.Status != grpc_health_v1.HealthCheckResponse_SERVING {
		return fmt.Errorf("drill: mesh health: %s", res.Status)
	}
	return nil
}

// breakerWatch collects the mesh's breaker transition events from NATS.
type breakerWatch struct {
	nc   *nats.Conn
	sub  *nats.Subscription
	msgs chan *nats.Msg
	done chan struct{}
	out  chan breakerEvents

	once   sync.Once
	result breakerEvents
}

type breakerEvents struct {
	events    []*eventsv1.BreakerTransitionEvent
	malformed int
}

// watchBreakers subscribes to breaker events on nc. Its goroutine runs until stop.
func watchBreakers(nc *nats.Conn) (*breakerWatch, error) {
	w := &breakerWatch{nc: nc, msgs: make(chan *nats.Msg, 4096), done: make(chan struct{}), out: make(chan breakerEvents, 1)}
	sub, err := nc.ChanSubscribe(events.SubjectBreaker, w.msgs)
	if err != nil {
		return nil, fmt.Errorf("drill: subscribe to breaker events: %w", err)
	}
	// The subscription must be known to the server before the load starts, or the first
	// transitions could be published before anyone listens.
	if err := nc.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("drill: subscribe to breaker events: %w", err)
	}
	w.sub = sub
	go w.collect()
	return w, nil
}

func (w *breakerWatch) collect() {
	var got breakerEvents
	add := func(m *nats.Msg) {
		ev := &eventsv1.BreakerTransitionEvent{}
		if err := proto.Unmarshal(m.Data, ev); err != nil {
			got.malformed++
			return
		}
		got.events = append(got.events, ev)
	}
	for {
		select {
		case m := <-w.msgs:
			add(m)
		case <-w.done:
			for {
				select {
				case m := <-w.msgs:
					add(m)
				default:
					w.out <- got
					return
				}
			}
		}
	}
}

// stop ends the subscription and returns the events in the order they were published.
// A channel subscription is fed by the connection's reader itself, and the server answers
// Flush's ping only after relaying everything published on this connection before it (the
// in-process mesh publishes on this connection), so after Flush and Unsubscribe every
// event is in the channel and the collector can drain it without waiting.
// It may be called more than once; later calls return the same events.
func (w *breakerWatch) stop(ctx context.Context) breakerEvents {
	w.once.Do(func() {
		flushEvents(ctx, w.nc)
		_ = w.sub.Unsubscribe()
		close(w.done)
		w.result = <-w.out
	})
	return w.result
}

// levelOf maps the wire level to the ladder's L0..L3 (-1 for unspecified).
func levelOf(l mantlev1.FallbackLevel) int {
	switch l {
	case mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY:
		return 0
	case mantlev1.FallbackLevel_FALLBACK_LEVEL_BACKUP_MODEL:
		return 1
	case mantlev1.FallbackLevel_FALLBACK_LEVEL_CACHED_APPROXIMATE:
		return 2
	case mantlev1.FallbackLevel_FALLBACK_LEVEL_TEMPLATE:
		return 3
	}
	return -1
}

// simKeyEnv is the process environment with SimKeyEnv set: the simulator ignores keys, and
// the router refuses to start with a provider key whose variable is empty.
func simKeyEnv(name string) string {
	if name == SimKeyEnv {
		return "sk-drill-sim"
	}
	return app.Env{}.Var(name)
}

// flushEvents waits until the server has relayed everything published on nc so far.
// FlushWithContext refuses a context without a deadline (and flushes nothing), so the
// wait gets one.
func flushEvents(ctx context.Context, nc *nats.Conn) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = nc.FlushWithContext(ctx)
}
