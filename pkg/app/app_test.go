package app_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/mantle-mesh/mantle/pkg/app"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// waitLimit bounds waits on channels so that a broken implementation fails the test instead
// of hanging it. Nothing waits this long when the code works.
const waitLimit = 10 * time.Second

func TestResolve(t *testing.T) {
	t.Parallel()
	modules := []app.Module{
		{Name: "router", Deps: []string{"quota", "cache"}},
		{Name: "cache"},
		{Name: "quota"},
	}
	tests := []struct {
		name      string
		targets   []string
		addresses map[string]string
		want      []string
		wantErr   []string // substrings of the error
	}{
		{name: "all", targets: []string{"all"}, want: []string{"cache", "quota", "router"}},
		{name: "all with others", targets: []string{"cache", "all"}, want: []string{"cache", "quota", "router"}},
		{name: "one without deps", targets: []string{"quota"}, want: []string{"quota"}},
		{name: "list with spaces", targets: []string{" quota ", "cache"}, want: []string{"cache", "quota"}},
		{name: "comma list with spaces", targets: []string{"cache, quota"}, want: []string{"cache", "quota"}},
		{name: "blank entries are ignored", targets: []string{"cache,", " ", ",quota"}, want: []string{"cache", "quota"}},
		{name: "duplicates", targets: []string{"cache", "cache,cache"}, want: []string{"cache"}},
		{name: "deps in the selection need no address", targets: []string{"router,quota,cache"}, want: []string{"cache", "quota", "router"}},
		{
			name: "deps outside the selection have addresses", targets: []string{"router"},
			addresses: map[string]string{"quota": "quota:9090", "cache": "cache:9090"}, want: []string{"router"},
		},
		{
			name: "one dep in, one dialled", targets: []string{"router", "cache"},
			addresses: map[string]string{"quota": "quota:9090"}, want: []string{"cache", "router"},
		},
		{name: "unknown module", targets: []string{"cache", "cahce"}, wantErr: []string{`unknown module "cahce"`, "all or one of cache, quota, router"}},
		{name: "empty", targets: nil, wantErr: []string{"no module selected"}},
		{name: "only blanks", targets: []string{" , "}, wantErr: []string{"no module selected"}},
		{name: "missing address", targets: []string{"router"}, addresses: map[string]string{"quota": "quota:9090"}, wantErr: []string{"router needs cache", "cache_address"}},
		{name: "empty address", targets: []string{"router", "cache"}, addresses: map[string]string{"quota": ""}, wantErr: []string{"quota_address"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := app.Resolve(modules, tt.targets, tt.addresses)
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatalf("Resolve(%q) = %v, want an error", tt.targets, got)
				}
				for _, want := range tt.wantErr {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not contain %q", err, want)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Resolve(%q): %v", tt.targets, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Resolve(%q) (-want +got):\n%s", tt.targets, diff)
			}
		})
	}
}

// blocker is a test module's gRPC service: Wait blocks until release is closed or the
// call's context ends.
type blocker struct {
	entered  chan struct{} // one value per call that reached the handler
	ids      chan string   // the request id each call's handler saw
	release  chan struct{}
	canceled chan error // the context error of calls that ended without release
}

const blockerService = "mantle.test.v1.Blocker"

var blockerAudiences = rpc.Audiences{"/" + blockerService + "/Wait": rpc.AudienceTenant}

func newBlocker() *blocker {
	return &blocker{entered: make(chan struct{}, 8), ids: make(chan string, 8), release: make(chan struct{}), canceled: make(chan error, 8)}
}

func (b *blocker) desc() *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: blockerService,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Wait",
			Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
				in := new(emptypb.Empty)
				if err := dec(in); err != nil {
					return nil, err
				}
				h := func(ctx context.Context, _ any) (any, error) {
					b.entered <- struct{}{}
					b.ids <- rpc.RequestID(ctx)
					select {
					case <-b.release:
						return wrapperspb.String("done"), nil
					case <-ctx.Done():
						b.canceled <- ctx.Err()
						return nil, ctx.Err()
					}
				}
				return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/" + blockerService + "/Wait"}, h)
			},
		}},
	}
}

// module registers the blocker; dial, when set, receives the module's Dial function.
func (b *blocker) module(name string, deps []string, dial *func(string) (grpc.ClientConnInterface, error)) app.Module {
	return app.Module{Name: name, Deps: deps, Audiences: blockerAudiences, New: func(_ context.Context, env app.Env) (app.Runnable, error) {
		env.GRPC.RegisterService(b.desc(), b)
		if dial != nil {
			*dial = env.Dial
		}
		return nil, nil
	}}
}

func wait(ctx context.Context, conn grpc.ClientConnInterface) (string, error) {
	out := new(wrapperspb.StringValue)
	err := conn.Invoke(ctx, "/"+blockerService+"/Wait", new(emptypb.Empty), out)
	return out.GetValue(), err
}

func testConfig(targets ...string) app.Config {
	return app.Config{
		Targets:                 targets,
		GRPCListenAddress:       "127.0.0.1:0",
		HTTPListenAddress:       "127.0.0.1:0",
		GracefulShutdownTimeout: waitLimit,
	}
}

func testDeps() app.Deps {
	return app.Deps{Log: slog.New(slog.DiscardHandler), Metrics: prometheus.NewRegistry(), Clock: clockwork.NewRealClock()}
}

type running struct {
	app    *app.App
	conn   *grpc.ClientConn
	cancel context.CancelFunc
	done   chan error // Run's result
}

// start builds and runs an app until the test ends, and waits until it reports SERVING.
func start(t *testing.T, cfg app.Config, modules []app.Module) *running {
	t.Helper()
	a, err := app.New(context.Background(), cfg, modules, testDeps())
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{app: a, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(waitLimit):
			t.Error("Run did not return after cancel")
		}
	})
	r.conn, err = grpc.NewClient(a.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.conn.Close() })
	stream, stop := watchHealth(t, r.conn, blockerService)
	defer stop()
	awaitHealth(t, stream, grpc_health_v1.HealthCheckResponse_SERVING)
	return r
}

// watchHealth opens a health Watch on service. The returned stop must be called before
// the app shuts down: graceful stop waits for open streams.
func watchHealth(t *testing.T, conn *grpc.ClientConn, service string) (grpc_health_v1.Health_WatchClient, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := grpc_health_v1.NewHealthClient(conn).Watch(ctx, &grpc_health_v1.HealthCheckRequest{Service: service}, grpc.WaitForReady(true))
	if err != nil {
		cancel()
		t.Fatalf("health watch: %v", err)
	}
	return stream, cancel
}

func awaitHealth(t *testing.T, stream grpc_health_v1.Health_WatchClient, want grpc_health_v1.HealthCheckResponse_ServingStatus) {
	t.Helper()
	for {
		res, err := stream.Recv()
		if err != nil {
			t.Fatalf("health watch ended before %v: %v", want, err)
		}
		if res.GetStatus() == want {
			return
		}
	}
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return res.StatusCode, string(body)
}

type callResult struct {
	answer string
	err    error
}

func TestAppServesThenDrainsInFlightCalls(t *testing.T) {
	t.Parallel()
	b := newBlocker()
	r := start(t, testConfig("blocker"), []app.Module{b.module("blocker", nil, nil)})

	if diff := cmp.Diff([]string{"blocker"}, r.app.Targets()); diff != "" {
		t.Errorf("Targets (-want +got):\n%s", diff)
	}
	for path, want := range map[string]string{"/readyz": "ready\n", "/healthz": "ok\n"} {
		if code, body := httpGet(t, "http://"+r.app.HTTPAddr()+path); code != http.StatusOK || body != want {
			t.Errorf("GET %s = %d %q, want 200 %q", path, code, body, want)
		}
	}
	for _, service := range []string{"", blockerService} {
		res, err := grpc_health_v1.NewHealthClient(r.conn).Check(context.Background(), &grpc_health_v1.HealthCheckRequest{Service: service})
		if err != nil || res.GetStatus() != grpc_health_v1.HealthCheckResponse_SERVING {
			t.Errorf("health of %q = %v, %v; want SERVING", service, res.GetStatus(), err)
		}
	}

	watch, stopWatch := watchHealth(t, r.conn, "")
	defer stopWatch()
	awaitHealth(t, watch, grpc_health_v1.HealthCheckResponse_SERVING)

	inFlight := make(chan callResult, 1)
	go func() {
		answer, err := wait(context.Background(), r.conn)
		inFlight <- callResult{answer, err}
	}()
	<-b.entered

	r.cancel()
	awaitHealth(t, watch, grpc_health_v1.HealthCheckResponse_NOT_SERVING)
	stopWatch()

	select {
	case err := <-r.done:
		t.Fatalf("Run returned %v while a call was in flight", err)
	case res := <-inFlight:
		t.Fatalf("in-flight call ended before it was released: %q, %v", res.answer, res.err)
	default:
	}

	close(b.release)
	select {
	case res := <-inFlight:
		if res.err != nil || res.answer != "done" {
			t.Errorf("in-flight call = %q, %v; want done, nil", res.answer, res.err)
		}
	case <-time.After(waitLimit):
		t.Fatal("in-flight call did not complete after release")
	}
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
		r.done <- err // for the cleanup
	case <-time.After(waitLimit):
		t.Fatal("Run did not return after the in-flight call completed")
	}
}

func TestAppCutsCallsPastShutdownTimeout(t *testing.T) {
	t.Parallel()
	b := newBlocker()
	cfg := testConfig("blocker")
	cfg.GracefulShutdownTimeout = 50 * time.Millisecond
	r := start(t, cfg, []app.Module{b.module("blocker", nil, nil)})

	inFlight := make(chan callResult, 1)
	go func() {
		answer, err := wait(context.Background(), r.conn)
		inFlight <- callResult{answer, err}
	}()
	<-b.entered
	r.cancel()

	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
		r.done <- err
	case <-time.After(waitLimit):
		t.Fatal("Run did not return after the shutdown timeout")
	}
	select {
	case err := <-b.canceled:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("handler context ended with %v, want context.Canceled", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("the handler's context was not cancelled")
	}
	res := <-inFlight
	if status.Code(res.err) != codes.Unavailable {
		t.Errorf("cut call = %q, %v; want Unavailable", res.answer, res.err)
	}
}

func TestAppMetrics(t *testing.T) {
	t.Parallel()
	r := start(t, testConfig("blocker"), []app.Module{newBlocker().module("blocker", nil, nil)})
	if _, err := grpc_health_v1.NewHealthClient(r.conn).Check(context.Background(), &grpc_health_v1.HealthCheckRequest{}); err != nil {
		t.Fatalf("health check: %v", err)
	}
	code, body := httpGet(t, "http://"+r.app.HTTPAddr()+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics = %d", code)
	}
	for _, want := range []string{
		"\ngo_goroutines ",
		`grpc_server_handled_total{grpc_code="OK",grpc_method="Check",grpc_service="grpc.health.v1.Health",grpc_type="unary"} 1`,
		`grpc_server_handling_seconds_bucket{grpc_method="Check"`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics does not contain %q", want)
		}
	}
}

func TestAppDial(t *testing.T) {
	t.Parallel()
	b := newBlocker()
	var dial func(string) (grpc.ClientConnInterface, error)
	cfg := testConfig("blocker")
	cfg.Addresses = map[string]string{"remote": "192.0.2.1:9090"} // TEST-NET-1: never dialled
	r := start(t, cfg, []app.Module{b.module("blocker", []string{"remote"}, &dial)})

	local, err := dial("blocker")
	if err != nil {
		t.Fatalf(`Dial("blocker"): %v`, err)
	}
	if _, isConn := local.(*grpc.ClientConn); isConn {
		t.Errorf(`Dial("blocker") = a network connection, want the in-process channel`)
	}
	// The in-process channel reaches the module through the server's interceptor chain:
	// the request id travels as metadata and the call is counted like any other.
	close(b.release)
	ctx := rpc.WithRequestID(context.Background(), "req_local")
	if answer, err := wait(ctx, local); err != nil || answer != "done" {
		t.Errorf("call over Dial(blocker) = %q, %v; want done", answer, err)
	}
	if id := <-b.ids; id != "req_local" {
		t.Errorf("the handler saw request id %q, want req_local", id)
	}
	_, body := httpGet(t, "http://"+r.app.HTTPAddr()+"/metrics")
	if want := `grpc_server_handled_total{grpc_code="OK",grpc_method="Wait",grpc_service="` + blockerService + `",grpc_type="unary"} 1`; !strings.Contains(body, want) {
		t.Errorf("/metrics does not count the in-process call: no %q", want)
	}
	if again, _ := dial("blocker"); again != local {
		t.Error(`a second Dial("blocker") made a new channel; want the shared one`)
	}

	remote, err := dial("remote")
	if err != nil {
		t.Fatalf(`Dial("remote"): %v`, err)
	}
	if got := remote.(*grpc.ClientConn).Target(); got != "192.0.2.1:9090" {
		t.Errorf(`Dial("remote") target = %s, want the configured address`, got)
	}

	if _, err := dial("nowhere"); err == nil || !strings.Contains(err.Error(), "nowhere") {
		t.Errorf(`Dial("nowhere") = %v, want an error naming the module`, err)
	}

	r.cancel()
	select {
	case <-r.done:
	case <-time.After(waitLimit):
		t.Fatal("Run did not return")
	}
	r.done <- nil
	if s := remote.(*grpc.ClientConn).GetState(); s != connectivity.Shutdown {
		t.Errorf("connection to %s is %v after Run returned, want Shutdown", remote.(*grpc.ClientConn).Target(), s)
	}
}

func TestAppStopsWhenAModuleFails(t *testing.T) {
	t.Parallel()
	b := newBlocker()
	failing := app.Module{Name: "failing", New: func(context.Context, app.Env) (app.Runnable, error) {
		return app.RunFunc(func(context.Context) error { return errors.New("disk full") }), nil
	}}
	a, err := app.New(context.Background(), testConfig("all"), []app.Module{b.module("blocker", nil, nil), failing}, testDeps())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(context.Background()) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "disk full") {
			t.Errorf("Run = %v, want the module's error", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("Run kept serving after a module failed")
	}
}

func TestNewReleasesEverythingWhenAModuleFails(t *testing.T) {
	t.Parallel()
	// Reserve a port so the test can check that New closed its listener.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()

	stopped := make(chan error, 1)
	first := app.Module{Name: "first", New: func(context.Context, app.Env) (app.Runnable, error) {
		return app.RunFunc(func(ctx context.Context) error {
			<-ctx.Done()
			stopped <- ctx.Err()
			return nil
		}), nil
	}}
	second := app.Module{Name: "second", New: func(context.Context, app.Env) (app.Runnable, error) {
		return nil, fmt.Errorf("bad config")
	}}
	cfg := testConfig("all")
	cfg.GRPCListenAddress = addr
	_, err = app.New(context.Background(), cfg, []app.Module{first, second}, testDeps())
	if err == nil || err.Error() != "second: bad config" {
		t.Fatalf("New = %v, want second: bad config", err)
	}
	select {
	case err := <-stopped:
		if err == nil {
			t.Error("first module's Run got a live context")
		}
	default:
		t.Error("the module built before the failure was not stopped")
	}
	l, err = net.Listen("tcp", addr)
	if err != nil {
		t.Errorf("gRPC listener still bound after New failed: %v", err)
	} else {
		l.Close()
	}
}

// TestAppShutdownDelay checks that after a stop signal the app reports not ready but keeps
// accepting calls for ShutdownDelay, so load balancers can take it out of rotation first.
func TestAppShutdownDelay(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClock()
	cfg := testConfig("blocker")
	cfg.ShutdownDelay = 5 * time.Second
	deps := testDeps()
	deps.Clock = clock
	b := newBlocker()
	a, err := app.New(context.Background(), cfg, []app.Module{b.module("blocker", nil, nil)}, deps)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	if code, _ := httpGet(t, "http://"+a.HTTPAddr()+"/readyz"); code != http.StatusOK {
		t.Fatalf("readyz before stop = %d, want 200", code)
	}

	cancel()
	// Run is now waiting on the fake clock: the delay has begun.
	if err := clock.BlockUntilContext(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	if code, _ := httpGet(t, "http://"+a.HTTPAddr()+"/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("readyz during the delay = %d, want 503", code)
	}
	conn, err := grpc.NewClient(a.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	res, err := grpc_health_v1.NewHealthClient(conn).Check(context.Background(), &grpc_health_v1.HealthCheckRequest{})
	if err != nil || res.GetStatus() != grpc_health_v1.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health during the delay = %v, %v; want NOT_SERVING and still answering", res.GetStatus(), err)
	}
	select {
	case err := <-done:
		t.Fatalf("Run returned %v before the delay passed", err)
	default:
	}

	clock.Advance(5 * time.Second)
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("Run did not return after the delay")
	}
}

// A dependency a module serves without is visible in /readyz while degraded, and the
// process stays ready: traffic keeps coming to a replica that still serves.
func TestReadyzListsDegradedDependencies(t *testing.T) {
	t.Parallel()
	var reason atomic.Value
	reason.Store("")
	b := newBlocker()
	m := b.module("blocker", nil, nil)
	inner := m.New
	m.New = func(ctx context.Context, env app.Env) (app.Runnable, error) {
		env.Dependency("blocker.store", func() string { return reason.Load().(string) })
		env.Dependency("blocker.other", func() string { return "" })
		return inner(ctx, env)
	}
	r := start(t, testConfig("blocker"), []app.Module{m})
	url := "http://" + r.app.HTTPAddr() + "/readyz"
	for _, tt := range []struct {
		reason, want string
	}{
		{"", "ready\n"},
		{"store unreachable since 12:00\nlocal limits", "ready\ndegraded blocker.store: store unreachable since 12:00 local limits\n"},
		{"", "ready\n"},
	} {
		reason.Store(tt.reason)
		if code, body := httpGet(t, url); code != http.StatusOK || body != tt.want {
			t.Errorf("reason %q: GET /readyz = %d %q, want 200 %q", tt.reason, code, body, tt.want)
		}
	}
}

// TestAppStopsACallerBeforeWhatItCalls: at shutdown a module stops only once the modules
// that call it (their Module.Deps name it) have returned from Run, whatever the order the
// modules were built in, so that work a caller finishes as it stops (the router's cache
// stores made after their answers) still reaches a running module.
func TestAppStopsACallerBeforeWhatItCalls(t *testing.T) {
	t.Parallel()
	calleeCtx := make(chan context.Context, 1)
	calleeLive := make(chan bool, 1)
	callee := app.Module{Name: "callee", New: func(context.Context, app.Env) (app.Runnable, error) {
		return app.RunFunc(func(ctx context.Context) error {
			calleeCtx <- ctx
			<-ctx.Done()
			return nil
		}), nil
	}}
	caller := app.Module{Name: "caller", Deps: []string{"callee"}, New: func(context.Context, app.Env) (app.Runnable, error) {
		return app.RunFunc(func(ctx context.Context) error {
			<-ctx.Done()
			c := <-calleeCtx
			calleeLive <- c.Err() == nil
			return nil
		}), nil
	}}
	a, err := app.New(context.Background(), testConfig("all"), []app.Module{callee, caller}, testDeps())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("Run did not return after the stop")
	}
	if !<-calleeLive {
		t.Error("the callee was stopped while its caller was still stopping")
	}
}
