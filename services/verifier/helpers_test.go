package verifier

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"

	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/pkg/app"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// testTenantHeader stands in for the API key the real auth interceptor (pkg/rpc)
// authenticates: the test interceptor below copies it into the context with rpc.WithTenant.
const testTenantHeader = "x-test-tenant"

var testNow = time.Date(2026, 5, 4, 12, 0, 0, 0, time.UTC)

// waitFor bounds how long a test waits for something another goroutine does; it is a
// failure deadline, never a pause.
const waitFor = 20 * time.Second

// testOperatorHeader stands in for an operator key.
const testOperatorHeader = "x-test-operator"

func authForTest(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get(testTenantHeader); len(v) > 0 {
			ctx = rpc.WithTenant(ctx, v[0])
		}
		if v := md.Get(testOperatorHeader); len(v) > 0 {
			ctx = rpc.WithCaller(ctx, rpc.Caller{Kind: rpc.CallerOperator, Name: v[0]})
		}
	}
	return handler(ctx, req)
}

func asOperator(name string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), testOperatorHeader, name)
}

func asTenant(tenant string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), testTenantHeader, tenant)
}

// published is one event a recorder saw.
type published struct {
	subject string
	msg     proto.Message
}

// recorder is an events publisher for tests: it keeps every event and lets a test wait for
// the next one on a subject.
type recorder struct {
	mu     sync.Mutex
	events []published
	notify chan struct{} // closed and replaced on every publish
}

func newRecorder() *recorder { return &recorder{notify: make(chan struct{})} }

func (r *recorder) Publish(_ context.Context, subject string, msg proto.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, published{subject: subject, msg: proto.Clone(msg)})
	close(r.notify)
	r.notify = make(chan struct{})
}

// wait returns the n-th (1-based) event on subject, waiting for it.
func (r *recorder) wait(t *testing.T, subject string, n int) proto.Message {
	t.Helper()
	deadline := time.After(waitFor)
	for {
		r.mu.Lock()
		seen := 0
		for _, e := range r.events {
			if e.subject == subject {
				if seen++; seen == n {
					r.mu.Unlock()
					return e.msg
				}
			}
		}
		notify := r.notify
		r.mu.Unlock()
		select {
		case <-notify:
		case <-deadline:
			t.Fatalf("no event #%d on %s within %s", n, subject, waitFor)
		}
	}
}

// testServer is a verifier module served over bufconn with its background work running.
type testServer struct {
	client verifierv1.VerifierServiceClient
	module *module
	clock  *clockwork.FakeClock
	events *recorder
}

type serverOptions struct {
	nats  *nats.Conn
	clock *clockwork.FakeClock
	// dial reaches other modules (the router, for the L3 judge).
	dial func(module string) (grpc.ClientConnInterface, error)
	// log receives the module's log; discarded when nil.
	log *slog.Logger
}

// startServer builds the verifier module like the app does, serves it over bufconn, runs
// its background work, and stops everything when the test ends.
func startServer(t *testing.T, cfg Config, opts serverOptions) *testServer {
	t.Helper()
	clock := opts.clock
	if clock == nil {
		clock = clockwork.NewFakeClockAt(testNow)
	}
	events := newRecorder()
	srv := grpc.NewServer(grpc.UnaryInterceptor(authForTest))
	log := opts.log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	runnable, err := Module(cfg).New(context.Background(), app.Env{
		GRPC:    srv,
		Log:     log,
		Metrics: prometheus.NewRegistry(),
		Clock:   clock,
		Events:  events,
		NATS:    opts.nats,
		Dial:    opts.dial,
	})
	if err != nil {
		t.Fatalf("Module.New: %v", err)
	}
	m, ok := runnable.(*module)
	if !ok {
		t.Fatalf("Module.New returned %T, want *module", runnable)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- m.Run(ctx) }()

	lis := bufconn.Listen(1 << 20)
	// The serving goroutine is owned by the test and exits when Stop closes the listener.
	serveDone := make(chan error, 1)
	go func() { serveDone <- srv.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("grpc.NewClient: %v", err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
		if err := <-serveDone; err != nil {
			t.Errorf("Serve: %v", err)
		}
		cancel()
		if err := <-runDone; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return &testServer{client: verifierv1.NewVerifierServiceClient(conn), module: m, clock: clock, events: events}
}
