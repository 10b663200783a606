package quota

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/mantle-mesh/mantle/pkg/app"
)

func testEnv() app.Env {
	return app.Env{
		GRPC:    grpc.NewServer(),
		Log:     slog.New(slog.DiscardHandler),
		Metrics: prometheus.NewRegistry(),
		Events:  &recordingPublisher{},
		Clock:   clockwork.NewFakeClockAt(t0),
	}
}

func TestModule(t *testing.T) {
	t.Parallel()
	t.Run("registers the service and returns the sweeper", func(t *testing.T) {
		t.Parallel()
		env := testEnv()
		m := Module(DefaultConfig())
		if m.Name != "quota" || len(m.Deps) != 0 {
			t.Errorf("module = %q with deps %v, want quota with none", m.Name, m.Deps)
		}
		run, err := m.New(context.Background(), env)
		if err != nil {
			t.Fatal(err)
		}
		srv := env.GRPC.(*grpc.Server)
		if _, ok := srv.GetServiceInfo()["mantle.quota.v1.QuotaService"]; !ok {
			t.Errorf("services registered: %v, want mantle.quota.v1.QuotaService", srv.GetServiceInfo())
		}
		if run == nil {
			t.Fatal("Runnable is nil, want the sweeper and dispatcher")
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- run.Run(ctx) }()
		if err := env.Clock.(*clockwork.FakeClock).BlockUntilContext(ctx, 1); err != nil { // the sweeper's ticker
			t.Fatal(err)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v, want nil after cancel", err)
		}
	})
	t.Run("redis backend", func(t *testing.T) {
		t.Parallel()
		env := testEnv()
		c := newTestRedisClient(t)
		cfg := DefaultConfig()
		cfg.Backend, cfg.Redis.Address, cfg.Redis.KeyPrefix = backendRedis, redisAddrForTest(t), testPrefix(t, c)
		cfg.Redis.AutoPipeline = true
		run, err := Module(cfg).New(context.Background(), env)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- run.Run(ctx) }()
		// The probe, flush and sweep tickers: the module runs the store's loop too.
		if err := env.Clock.(*clockwork.FakeClock).BlockUntilContext(ctx, 3); err != nil {
			t.Fatal(err)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v, want nil after cancel (the client closes cleanly)", err)
		}
	})
	t.Run("redis unreachable at start", func(t *testing.T) {
		t.Parallel()
		env := testEnv()
		var logs lockedBuffer
		env.Log = slog.New(slog.NewJSONHandler(&logs, nil))
		var degraded func() string
		env.Dependency = func(name string, check func() string) {
			if name == "quota.redis" {
				degraded = check
			}
		}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := lis.Addr().String()
		_ = lis.Close() // nothing listens there now: connections are refused
		cfg := DefaultConfig()
		cfg.Backend, cfg.Redis.Address = backendRedis, addr
		run, err := Module(cfg).New(context.Background(), env)
		if err != nil {
			t.Fatalf("New = %v, want the module to start without Redis", err)
		}
		if degraded == nil {
			t.Fatal("the module named no quota.redis dependency")
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- run.Run(ctx) }()
		defer func() { cancel(); <-done }()
		// The tickers start after the first contact.
		if err := env.Clock.(*clockwork.FakeClock).BlockUntilContext(ctx, 3); err != nil {
			t.Fatal(err)
		}
		if reason := degraded(); !strings.Contains(reason, "redis unreachable") || !strings.Contains(reason, "limit/1") {
			t.Errorf("Degradation = %q, want Redis unreachable and the local limit", reason)
		}
		if !strings.Contains(logs.String(), `"level":"WARN","msg":"redis unreachable at start`) {
			t.Errorf("log = %s, want a warning that Redis is unreachable at start", logs.String())
		}
		families, err := env.Metrics.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var gauge float64 = -1
		for _, f := range families {
			if f.GetName() == "mantle_quota_backend_fallback" {
				gauge = f.GetMetric()[0].GetGauge().GetValue()
			}
		}
		if gauge != 1 {
			t.Errorf("mantle_quota_backend_fallback = %v, want 1", gauge)
		}
	})
	t.Run("redis password comes from the environment", func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.Backend, cfg.Redis.Address, cfg.Redis.PasswordEnv = backendRedis, "127.0.0.1:1", "MANTLE_TEST_NO_SUCH_VARIABLE"
		_, err := Module(cfg).New(context.Background(), testEnv())
		if err == nil || !strings.Contains(err.Error(), "MANTLE_TEST_NO_SUCH_VARIABLE is unset or empty") {
			t.Errorf("err = %v, want the missing variable named", err)
		}
	})
	t.Run("refuses an invalid config", func(t *testing.T) {
		t.Parallel()
		cfg := DefaultConfig()
		cfg.ReservationTTL = 0
		_, err := Module(cfg).New(context.Background(), testEnv())
		if err == nil || !strings.Contains(err.Error(), "reservation_ttl: must be positive") {
			t.Errorf("err = %v, want it to name reservation_ttl", err)
		}
	})
}

// lockedBuffer is a bytes.Buffer that a logger may write while the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
