package mesh_test

import (
	"context"
	"io"
	"math"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/jonboulle/clockwork"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/services/router"
)

// TestReloadForcesALevel is the operator's move during an outage: force a route to its
// template without a restart, then lift it again.
func TestReloadForcesALevel(t *testing.T) {
	cfg := testConfig()
	m := meshtest.Start(t, cfg, meshtest.All)
	client := routerv1.NewRouterServiceClient(meshtest.Dial(t, m.GRPCAddr))
	ctx := authed(acmeKey)
	ask := func() *routerv1.CompleteResponse {
		t.Helper()
		resp, err := client.Complete(ctx, &routerv1.CompleteRequest{Request: ask("chat", "Where is my parcel?")})
		if err != nil {
			t.Fatalf("Complete: %v", err)
		}
		return resp
	}
	if got := ask().Quality.FallbackLevel; got == mantlev1.FallbackLevel_FALLBACK_LEVEL_TEMPLATE {
		t.Fatalf("before the reload the route answered at %v", got)
	}

	forced := cfg
	forced.Router.Routes = []router.RouteConfig{{
		Name: "chat", Scenario: "chat", Candidates: []string{"broken", "backup"},
		Ladder: router.LadderConfig{Template: "We are on it and will reply by e-mail.", Notice: "Degraded service", ForceLevel: router.ForceTemplate},
	}}
	if err := m.Router.Reload(context.Background(), forced); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	resp := ask()
	qc := resp.Quality
	if qc.FallbackLevel != mantlev1.FallbackLevel_FALLBACK_LEVEL_TEMPLATE || !strings.Contains(resp.Message.Content, "e-mail") || qc.UserNotice != "Degraded service" || len(qc.Attempts) != 0 {
		t.Errorf("forced answer: level %v content %q notice %q attempts %d", qc.FallbackLevel, resp.Message.Content, qc.UserNotice, len(qc.Attempts))
	}

	bad := forced
	bad.Router.Models = append(bad.Router.Models, router.ModelConfig{Name: "new", Provider: "sim"})
	if err := m.Router.Reload(context.Background(), bad); err == nil || !strings.Contains(err.Error(), "restart") {
		t.Errorf("reload with a new model = %v, want an error saying it needs a restart", err)
	}
	if got := ask().Quality.FallbackLevel; got != mantlev1.FallbackLevel_FALLBACK_LEVEL_TEMPLATE {
		t.Errorf("after a rejected reload the level is %v, want the last good (template)", got)
	}

	if err := m.Router.Reload(context.Background(), cfg); err != nil {
		t.Fatalf("Reload back: %v", err)
	}
	if got := ask().Quality.FallbackLevel; got == mantlev1.FallbackLevel_FALLBACK_LEVEL_TEMPLATE {
		t.Errorf("after lifting the force the route still answers at %v", got)
	}
}

// TestWatchConfigReloadsOnChange drives the watcher with a fake clock.
func TestWatchConfigReloadsOnChange(t *testing.T) {
	clock := clockwork.NewFakeClock()
	cfg := testConfig()
	cfg.Server.GRPCListenAddress, cfg.Server.HTTPListenAddress = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Log.Level = "error"
	p, err := mesh.Start(context.Background(), cfg, mesh.Options{LogOutput: io.Discard, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- p.Run(runCtx) }()
	defer func() { stop(); <-ran }()
	next := cfg
	next.Router.Routes = []router.RouteConfig{{Name: "chat", Candidates: []string{"backup"}, Ladder: router.LadderConfig{Template: "t", ForceLevel: router.ForceTemplate}}}
	loads := make(chan struct{}, 10)
	hup := make(chan os.Signal, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.WatchConfig(ctx, func() (mesh.Config, error) { loads <- struct{}{}; return next, nil }, time.Hour, hup)
	}()
	hup <- syscall.SIGHUP // as an operator would; the hourly check never fires on the fake clock
	<-loads
	cancel()
	<-done
	client := routerv1.NewRouterServiceClient(meshtest.Dial(t, p.App.GRPCAddr()))
	resp, err := client.DescribeRoutes(authed(meshtest.OperatorKey), &routerv1.DescribeRoutesRequest{Route: "chat"}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Routes[0].LadderLevel; got != mantlev1.FallbackLevel_FALLBACK_LEVEL_TEMPLATE {
		t.Errorf("after the watched reload the chat route is at %v, want TEMPLATE", got)
	}
}

// TestRunKeepsTheHeapFloor: a process that serves (mantle serve, mantle dev) raises GOGC
// above gc_percent while Run serves, and puts gc_percent back when Run returns. It changes
// the test process's collector; it is not parallel, so no other test runs meanwhile.
func TestRunKeepsTheHeapFloor(t *testing.T) {
	t.Setenv("AUTOMEMLIMIT", "off") // the memory limit library reads it from the process: no cgroup limit here
	// Cleanups, not defers: they run after the one below that stops the floor.
	gcBefore, limitBefore := debug.SetGCPercent(100), debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() { debug.SetGCPercent(gcBefore); debug.SetMemoryLimit(limitBefore) })
	cfg := testConfig()
	cfg.Server.GRPCListenAddress, cfg.Server.HTTPListenAddress = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Log.Level = "error"
	cfg.Runtime.GCPercent = 150
	cfg.Runtime.GCMinHeapMiB = 1 << 16 // 64 GiB: over any test's live heap
	p, err := mesh.Start(context.Background(), cfg, mesh.Options{LogOutput: io.Discard, TuneRuntime: true, Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	if got := gogc(); got != 150 {
		p.Close()
		t.Fatalf("after Start GOGC = %d, want gc_percent 150 (the floor starts with Run)", got)
	}
	runCtx, stopRun := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- p.Run(runCtx) }()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		stopRun()
		return <-ran
	}
	// On a failure below too: a floor left running would raise GOGC for the tests after.
	t.Cleanup(func() { _ = stop() })
	// Run sets the floor before it serves: once a call is answered, GOGC is raised.
	client := routerv1.NewRouterServiceClient(meshtest.Dial(t, p.App.GRPCAddr()))
	ctx, cancel := context.WithTimeout(authed(meshtest.OperatorKey), 30*time.Second)
	defer cancel()
	if _, err := client.DescribeRoutes(ctx, &routerv1.DescribeRoutesRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	if got := gogc(); got <= 150 {
		t.Errorf("while serving GOGC = %d, want it raised over gc_percent 150 by a 64 GiB floor", got)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := gogc(); got != 150 {
		t.Errorf("after Run GOGC = %d, want gc_percent 150 back", got)
	}
}

// gogc reads GOGC as the runtime has it.
func gogc() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}
