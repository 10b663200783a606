// Package meshtest runs a whole mantle mesh inside a test process: either as one process
// with --target=all, or as five processes (one per service) wired by address, both on
// 127.0.0.1:0 with an embedded NATS server. Tests send the same requests through both
// shapes to prove the deployment mode changes nothing a caller can see.
package meshtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health/grpc_health_v1"

	"github.com/mantle-mesh/mantle/pkg/app"
	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/natsembed"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/pkg/tlsconfig"
)

// Mode is the deployment shape of a test mesh.
type Mode string

// Modes a test mesh can run in.
const (
	All   Mode = "all"
	Split Mode = "split"
)

// Mesh is a running test mesh.
type Mesh struct {
	// GRPCAddr and HTTPAddr are the router's addresses.
	GRPCAddr string
	HTTPAddr string
	// NATSURL is the embedded NATS server the mesh publishes events to.
	NATSURL string
	// Router is the process that runs the router.
	Router *mesh.Process
	// Processes are the processes by target: "all", or router, cache, quota, verifier and
	// agent.
	Processes map[string]*mesh.Process
}

// Start runs cfg in the given mode until the test ends. cfg's listen addresses, events
// and router service addresses are overridden, and spans are never exported (see StartWith).
func Start(t testing.TB, cfg mesh.Config, mode Mode) *Mesh {
	t.Helper()
	return StartWith(t, cfg, mode, mesh.Options{})
}

// StartWith is Start with process options, for tests that drive the mesh's clock (a fake
// clock shared by the router, its in-process sims and the other services). Logs are
// discarded unless opts.LogOutput says otherwise.
func StartWith(t testing.TB, cfg mesh.Config, mode Mode, opts mesh.Options) *Mesh {
	t.Helper()
	return StartEach(t, cfg, mode, opts, nil)
}

// StartEach is StartWith with a hook that adjusts each process's configuration just
// before it starts (its certificate, its listeners' client authentication): target is
// "all", or router, cache, quota, verifier or agent. each may be nil.
func StartEach(t testing.TB, cfg mesh.Config, mode Mode, opts mesh.Options, each func(target string, c *mesh.Config)) *Mesh {
	t.Helper()
	if each == nil {
		each = func(string, *mesh.Config) {}
	}
	if opts.LogOutput == nil {
		opts.LogOutput = io.Discard
	}
	nats, err := natsembed.Start()
	if err != nil {
		t.Fatalf("embedded nats: %v", err)
	}
	t.Cleanup(nats.Shutdown)
	cfg.Events = mesh.EventsConfig{NATSURL: nats.URL()}
	cfg.Server.GRPCListenAddress = "127.0.0.1:0"
	cfg.Server.HTTPListenAddress = "127.0.0.1:0"
	if cfg.Log.Level == "" {
		cfg.Log.Level = "error"
	}
	// A test mesh never exports to a real collector: spans go to opts.TraceExporter or
	// nowhere, and a configuration with tracing on (deploy's) still runs its tracing code.
	if cfg.Tracing.Enabled && opts.TraceExporter == nil {
		opts.TraceExporter = tracetest.NewNoopExporter()
	}
	m := &Mesh{NATSURL: nats.URL(), Processes: map[string]*mesh.Process{}}
	if mode == All {
		cfg.Target = "all"
		each(cfg.Target, &cfg)
		m.Router = Run(t, cfg, opts)
		m.Processes["all"] = m.Router
	} else {
		for _, svc := range []string{"quota", "cache", "verifier", "agent"} {
			c := cfg
			c.Target = svc
			each(svc, &c)
			p := Run(t, c, opts)
			m.Processes[svc] = p
			switch svc {
			case "quota":
				cfg.Router.QuotaAddress = p.App.GRPCAddr()
			case "cache":
				cfg.Router.CacheAddress = p.App.GRPCAddr()
			case "verifier":
				// The agent, started next, dials it too (confirmation reviews).
				cfg.Router.VerifierAddress = p.App.GRPCAddr()
			case "agent":
				cfg.Router.AgentAddress = p.App.GRPCAddr()
			}
		}
		cfg.Target = "router"
		each(cfg.Target, &cfg)
		m.Router = Run(t, cfg, opts)
		m.Processes["router"] = m.Router
	}
	m.GRPCAddr = m.Router.App.GRPCAddr()
	m.HTTPAddr = m.Router.App.HTTPAddr()
	return m
}

// OperatorKey is the operator key of every test mesh with authentication on.
const OperatorKey = "sk-operator-test"

// meshSecretEnv names the variable the test processes read the shared mesh secret from.
const meshSecretEnv = "MANTLE_TEST_MESH_SECRET"

// secure gives a configuration with authentication on what a deployment has: an
// operator key (OperatorKey) and a mesh secret shared by every process of the test,
// read from the environment as production reads it, unless cfg configures its own or
// runs every module.
func secure(cfg *mesh.Config, opts *mesh.Options) {
	if len(cfg.Auth.Tenants) == 0 && len(cfg.Auth.Operators) == 0 {
		return
	}
	if len(cfg.Auth.Operators) == 0 {
		cfg.Auth.Operators = []rpc.TenantKey{{ID: "test-operator", KeySHA256: rpc.HashKey(OperatorKey)}}
	}
	// A process that runs every module makes up its own secret.
	if cfg.Target == "all" || cfg.Auth.MeshSecretEnv != "" || cfg.Auth.MeshSecretFile != "" {
		return
	}
	cfg.Auth.MeshSecretEnv = meshSecretEnv
	getenv := app.Env{Getenv: opts.Getenv}.Var // nil: the process environment
	opts.Getenv = func(name string) string {
		if name == meshSecretEnv {
			return "test-mesh-secret-0123456789abcdef0123456789abcdef"
		}
		return getenv(name)
	}
}

// Run starts one process, waits until its health check answers SERVING, and stops it
// (waiting for a clean exit) when the test ends. With authentication on, it adds an
// operator key and the test mesh's shared secret (see OperatorKey).
func Run(t testing.TB, cfg mesh.Config, opts mesh.Options) *mesh.Process {
	t.Helper()
	p, _ := RunStoppable(t, cfg, opts)
	return p
}

// RunStoppable is Run that also returns stop, which stops the process (as a crash or a
// rolling restart would) and waits for it to exit; the test's end calls it too, and a
// second call does nothing.
func RunStoppable(t testing.TB, cfg mesh.Config, opts mesh.Options) (*mesh.Process, func()) {
	t.Helper()
	secure(&cfg, &opts)
	p, err := mesh.Start(context.Background(), cfg, opts)
	if err != nil {
		t.Fatalf("start %s: %v", cfg.Target, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	// A process that fails as it starts never serves: the wait for its health ends with it.
	wait, endWait := context.WithCancel(context.Background())
	defer endWait()
	exited := make(chan struct{}) // closed when Run has returned runErr
	var runErr error
	go func() {
		defer close(exited)
		runErr = p.Run(ctx)
		endWait()
	}()
	stop := sync.OnceFunc(func() {
		cancel()
		<-exited
		if runErr != nil && !errors.Is(runErr, context.Canceled) {
			t.Errorf("%s stopped with: %v", cfg.Target, runErr)
		}
	})
	t.Cleanup(stop)
	if err := waitServing(wait, p.App.GRPCAddr(), cfg.TLS); err != nil {
		select {
		case <-exited:
			t.Fatalf("%s exited before it served: %v", cfg.Target, runErr)
		default:
			t.Fatalf("%s: %v", cfg.Target, err)
		}
	}
	return p, stop
}

// waitServing asks the process's health, until it answers or ctx ends, as the process
// itself would call it: with its own certificate when it runs TLS.
func waitServing(ctx context.Context, addr string, tlsCfg tlsconfig.Config) error {
	creds := insecure.NewCredentials()
	if tlsCfg.Enabled() {
		src, err := tlsconfig.FromConfig(tlsCfg, tlsconfig.Options{Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			return fmt.Errorf("tls of %s: %w", addr, err)
		}
		creds = src.GRPCClientCredentials(tlsCfg.ServerName)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return fmt.Errorf("dial %s: %w", addr, err)
	}
	defer conn.Close()
	ctx, cancel := withCallTimeout(ctx)
	defer cancel()
	// WaitForReady queues the check until the server accepts it: no polling, no sleeping.
	res, err := grpc_health_v1.NewHealthClient(conn).Check(ctx, &grpc_health_v1.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("health of %s: %w", addr, err)
	}
	if res.Status != grpc_health_v1.HealthCheckResponse_SERVING {
		return fmt.Errorf("health of %s: %v", addr, res.Status)
	}
	return nil
}

// Dial connects to addr in plaintext for the duration of the test.
func Dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	return DialWith(t, addr, insecure.NewCredentials())
}

// DialWith connects to addr with creds for the duration of the test. A call made without
// a deadline gets CallTimeout, so that a request the mesh never answers fails its test
// instead of hanging the package until the binary's timeout.
func DialWith(t testing.TB, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds),
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			ctx, cancel := withCallTimeout(ctx)
			defer cancel()
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			ctx, cancel := withCallTimeout(ctx)
			s, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil {
				cancel()
				return nil, err
			}
			context.AfterFunc(s.Context(), cancel) // the stream's end releases the timer
			return s, nil
		}))
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// CallTimeout bounds a test's gRPC call that has no deadline of its own: far beyond what
// any call of the test mesh takes under the race detector on a loaded machine.
const CallTimeout = 2 * time.Minute

func withCallTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, CallTimeout)
}
