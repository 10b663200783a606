package app

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"slices"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/pkg/tlsconfig"
)

// Module is one service the binary can run. The composition root (cmd/mantle) lists every
// module; --target selects a subset, and dependencies of the selected modules that are not
// selected are dialled at their configured addresses.
type Module struct {
	// Name is the target name: router, cache, quota or verifier.
	Name string
	// Deps names the modules this one calls through gRPC clients. In one process, a module
	// stops before the modules it names (stopInOrder).
	Deps []string
	// Audiences declares the plane of every method the module serves (rpc.Audience); a
	// method without one is refused.
	Audiences rpc.Audiences
	// New builds the service and registers it on env.GRPC (and env.HTTP when it serves
	// HTTP). It must not block; long-running work goes in the returned Runnable.
	New func(ctx context.Context, env Env) (Runnable, error)
	// Reload applies the module's new configuration block without a restart. It is nil for
	// modules that cannot reload; it is called only after New succeeded.
	Reload func(ctx context.Context, block any) error
}

// Runnable is background work a module owns. Run blocks until ctx is done and returns nil
// on a clean stop; an error stops the whole process. When a module built after this one
// fails, Run is called with a context that is already done, so it must then release what
// New acquired and return. A module without background work returns nil from New.
type Runnable interface {
	Run(ctx context.Context) error
}

// RunFunc adapts a function to Runnable.
type RunFunc func(ctx context.Context) error

// Run calls f.
func (f RunFunc) Run(ctx context.Context) error { return f(ctx) }

// Publisher sends an event without blocking the caller. Subjects are
// mantle.events.<kind>; see the events package.
type Publisher interface {
	Publish(ctx context.Context, subject string, msg proto.Message)
}

// Env is what a module receives from the process that hosts it. There are no globals: every
// process (and every test mesh) has its own registry, logger and clock.
type Env struct {
	// GRPC is where a module registers its services: the process's one gRPC server and
	// the in-process channel that the other modules of this process call it through.
	GRPC grpc.ServiceRegistrar
	// HTTP is the process's HTTP mux (already serving /metrics, /healthz and /readyz).
	HTTP *http.ServeMux
	// HTTPErrorShape gives the errors the HTTP listener answers itself under a path
	// prefix (an unknown path, a method not allowed, headers too large) the shape that
	// path's clients parse; OpenAI's elsewhere. Called from New only; nil in an Env built
	// by hand.
	HTTPErrorShape func(pathPrefix string, shape ErrorShape)
	// TLS is the process's mesh certificate and CA (the tls block), for modules whose
	// clients of outside servers present it (the cache's Qdrant client); nil when TLS is
	// off.
	TLS *tlsconfig.Source
	// Dial returns a connection to the named module: an in-process channel when the
	// module runs here, its configured address otherwise. Connections are owned by the app.
	Dial func(module string) (grpc.ClientConnInterface, error)
	Log  *slog.Logger
	// Metrics is the process's registry; never prometheus.DefaultRegisterer.
	Metrics *prometheus.Registry
	Events  Publisher
	Clock   clockwork.Clock
	// NATS is the process's NATS connection for modules that keep state in JetStream
	// (idempotency records, review queues); nil when events are disabled.
	NATS *nats.Conn
	// Auth checks tenant API keys for front doors that are not gRPC (the router's HTTP
	// API, with LoginHTTP); nil when authentication is disabled.
	Auth *rpc.Authenticator
	// Getenv reads the process environment (the secrets the config names by variable);
	// modules call Var, which copes with a hand-built Env that leaves it nil.
	Getenv func(string) string
	// TracerProvider is the process's tracer provider; nil when tracing is off. Modules
	// get their tracer through Tracer, which copes with nil.
	TracerProvider trace.TracerProvider
	// Dependency names an outside dependency the module keeps serving without, degraded
	// (quota without its Redis, say): /readyz stays 200 and lists, one line each, those
	// whose check says why they are degraded; "" is healthy. Nil in an Env built by hand.
	Dependency func(name string, degraded func() string)
}

// Tracer returns the module's tracer, named after its package; a tracer that records
// nothing when tracing is off.
func (e Env) Tracer(name string) trace.Tracer {
	if e.TracerProvider == nil {
		return noop.NewTracerProvider().Tracer(name)
	}
	return e.TracerProvider.Tracer(name)
}

// Var reads the environment variable name through Getenv, or the process environment when
// Getenv is nil.
func (e Env) Var(name string) string {
	if e.Getenv == nil {
		return os.Getenv(name)
	}
	return e.Getenv(name)
}

// module is a built module's background work, with what stopping it in order needs.
type module struct {
	name string
	deps []string // Module.Deps
	r    Runnable
}

// runningModule is a module whose Run is in progress: stop cancels its context, done is
// closed when Run has returned.
type runningModule struct {
	module
	stop func()
	done chan struct{}
}

// stopInOrder stops the modules so that none stops while a module that calls it is still
// running: each round stops, and waits for, the modules no running module names in its
// Deps. Work a module finishes when it stops still reaches the modules it calls: the
// router's cache stores made after their answers land before the cache writes its last
// snapshot or closes its connection to Qdrant. Modules that name each other (there are
// none) stop together.
func stopInOrder(running []*runningModule) {
	left := running
	for len(left) > 0 {
		var now, later []*runningModule
		for _, m := range left {
			called := slices.ContainsFunc(left, func(o *runningModule) bool {
				return o != m && slices.Contains(o.deps, m.name)
			})
			if called {
				later = append(later, m)
			} else {
				now = append(now, m)
			}
		}
		if len(now) == 0 {
			now, later = left, nil
		}
		for _, m := range now {
			m.stop()
		}
		for _, m := range now {
			<-m.done
		}
		left = later
	}
}
