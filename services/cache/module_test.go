package cache

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/mantle-mesh/mantle/pkg/app"
)

// moduleEnv is an app.Env with a fake clock and a registry of its own.
func moduleEnv(t testing.TB) (app.Env, *prometheus.Registry, *clockwork.FakeClock) {
	t.Helper()
	reg := prometheus.NewRegistry()
	clock := clockwork.NewFakeClockAt(epoch)
	return app.Env{
		GRPC:    grpc.NewServer(),
		HTTP:    http.NewServeMux(),
		Log:     slog.New(slog.DiscardHandler),
		Metrics: reg,
		Clock:   clock,
	}, reg, clock
}

// TestSnapshotAcrossRestarts runs the module with a snapshot path: the running module
// writes a snapshot on its interval and when it stops, and a new module reads it back.
func TestSnapshotAcrossRestarts(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.Embedded.SnapshotPath = filepath.Join(t.TempDir(), "cache.snap")
	cfg.Embedded.SnapshotInterval = time.Minute

	env, reg, clock := moduleEnv(t)
	r, err := build(context.Background(), cfg, env, os.Getenv)
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	f := fixture{svc: r.svc, clock: clock, reg: reg, index: r.embedded}
	f.mustStore(t, "acme", answer(basePrompt(question)))

	tasks := make(chan string, 10)
	r.done = func(task string) { tasks <- task }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	if err := clock.BlockUntilContext(t.Context(), 2); err != nil { // lease and snapshot tickers
		t.Fatal(err)
	}
	clock.Advance(time.Minute)
	for task := <-tasks; task != "snapshot"; task = <-tasks {
		// the lease sweep (every 30s) runs too
	}
	if _, err := os.Stat(cfg.Embedded.SnapshotPath); err != nil {
		t.Fatalf("no snapshot after the interval: %v", err)
	}
	f.mustStore(t, "acme", answer(basePrompt("What is your refund policy?")))
	cancel() // the last snapshot, written on the way out, has both entries
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}

	env2, reg2, clock2 := moduleEnv(t)
	clock2.Advance(30 * time.Minute)
	r2, err := build(context.Background(), cfg, env2, os.Getenv)
	if err != nil {
		t.Fatalf("build after restart: %v", err)
	}
	if got := metricValue(t, reg2, "mantle_cache_snapshot_loads_total", map[string]string{"result": "loaded"}); got != 1 {
		t.Errorf("loaded snapshots = %v, want 1", got)
	}
	g := fixture{svc: r2.svc, clock: clock2, reg: reg2, index: r2.embedded}
	for _, q := range []string{question, "what is your refund policy", "How can I reset my password"} {
		if _, hit := g.lookup(t, "acme", basePrompt(q)); !hit {
			t.Errorf("after a restart, %q missed", q)
		}
	}
}

// TestSnapshotThatCannotBeReadStartsEmpty: garbage, a format 1 snapshot and one over
// snapshot_max_bytes each leave an empty cache, counted as refused, not a failed start.
func TestSnapshotThatCannotBeReadStartsEmpty(t *testing.T) {
	t.Parallel()
	for name, data := range map[string][]byte{
		"garbage":    []byte("garbage"),
		"format 1":   oldFormatSnapshot(t),
		"over limit": append([]byte(snapshotMagic), make([]byte, 1<<20)...),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := DefaultConfig()
			cfg.Embedded.SnapshotPath = filepath.Join(t.TempDir(), "cache.snap")
			cfg.Embedded.SnapshotMaxBytes = 1 << 20
			if err := os.WriteFile(cfg.Embedded.SnapshotPath, data, 0o600); err != nil {
				t.Fatal(err)
			}
			env, reg, _ := moduleEnv(t)
			r, err := build(context.Background(), cfg, env, os.Getenv)
			if err != nil {
				t.Fatalf("build with an unreadable snapshot: %v; want an empty cache", err)
			}
			if r.embedded.Len() != 0 {
				t.Errorf("Len() = %d, want 0", r.embedded.Len())
			}
			if got := metricValue(t, reg, "mantle_cache_snapshot_loads_total", map[string]string{"result": "refused"}); got != 1 {
				t.Errorf("refused loads = %v, want 1", got)
			}
		})
	}
}

func TestBuildRefusesBadEmbedderConfig(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.Embedder.Kind = EmbedderOpenAI // without base_url and model
	env, _, _ := moduleEnv(t)
	_, err := build(context.Background(), cfg, env, os.Getenv)
	if err == nil || !strings.Contains(err.Error(), "embedder.base_url") {
		t.Errorf("build error = %v, want one naming embedder.base_url", err)
	}
}

// TestModuleBoundsTheIndexByBytes: cache.max_bytes reaches the index the module builds,
// and stores through the service evict the oldest answers to stay under it.
func TestModuleBoundsTheIndexByBytes(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.MaxBytes = 1 << 20
	env, reg, clock := moduleEnv(t)
	r, err := build(context.Background(), cfg, env, os.Getenv)
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	f := fixture{svc: r.svc, clock: clock, reg: reg, index: r.embedded}
	const answers = 300 // about 1.4 MiB of 4 KB answers with their bookkeeping
	for i := range answers {
		req := answer(basePrompt(fmt.Sprintf("What does order form %d need?", i)))
		req.Content = strings.Repeat("long answer ", 350)
		f.mustStore(t, "acme", req)
	}
	if got := r.embedded.Bytes(); got > cfg.MaxBytes {
		t.Errorf("the index holds %d bytes, over max_bytes %d", got, cfg.MaxBytes)
	}
	if n := r.embedded.Len(); n == 0 || n >= answers {
		t.Errorf("the index holds %d of %d answers, want some evicted and some kept", n, answers)
	}
	if r.embedded.Evictions() == 0 {
		t.Error("no eviction counted")
	}
}
