package quota

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/mantle-mesh/mantle/pkg/procusage"
	"github.com/mantle-mesh/mantle/services/quota/internal/memstore"
	"github.com/mantle-mesh/mantle/services/quota/internal/redisstore"
)

// Benchmarks of the hot path: one Reserve and its Settle per op, spread over 64 tenants,
// with limits nobody reaches (refusals are cheaper). Run them with
//
//	go test -run '^$' -bench BenchmarkReserveSettle -benchtime 5s -cpu 2 ./services/quota/
//
// Each reports reserve+settle pairs per second (pairs/s) and the Reserve decision's
// latency percentiles (p50-ns, p99-ns) measured around every call. Under many
// concurrent callers those percentiles include queueing for the CPU and the Redis
// connection; BenchmarkDecisionLatency measures one caller at a time.
func BenchmarkReserveSettle(b *testing.B) {
	b.Run("memory", func(b *testing.B) {
		benchReserveSettle(b, memstore.New(clockwork.NewRealClock()), "", 1)
	})
	b.Run("redis", func(b *testing.B) {
		benchReserveSettle(b, newTestRedisStore(b, clockwork.NewRealClock(), redisstore.Options{ServerTime: true}), "", 16)
	})
	// The same through go-redis's (experimental) auto-pipeliner, as module.go uses it:
	// concurrent decisions share round trips.
	b.Run("redis auto-pipelined", func(b *testing.B) {
		c := newTestRedisClient(b)
		ap, err := c.AutoPipeline()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = ap.Close() })
		benchReserveSettle(b, redisstore.New(c, redisstore.Options{Prefix: testPrefix(b, c), ServerTime: true, Clock: clockwork.NewRealClock(), Scripter: ap}), "", 16)
	})
	// With an upstream key the key's buckets are a second script (another slot).
	b.Run("redis with upstream key", func(b *testing.B) {
		benchReserveSettle(b, newTestRedisStore(b, clockwork.NewRealClock(), redisstore.Options{ServerTime: true}), "k1", 16)
	})
}

func benchReserveSettle(b *testing.B, store stateStore, key string, parallelism int) {
	cfg := DefaultConfig()
	cfg.DefaultLimits = RateLimits{RPM: 1 << 40, TPM: 1 << 50} // never refuse: measure the happy path
	cfg.UpstreamKeys = map[string]RateLimits{"k1": {RPM: 1 << 40, TPM: 1 << 50}}
	svc, err := newService(cfg, serviceDeps{Store: store, Clock: clockwork.NewRealClock(), Metrics: prometheus.NewRegistry(), Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	tenants := make([]string, 64)
	for i := range tenants {
		tenants[i] = fmt.Sprintf("tenant-%d", i)
	}
	var (
		mu        sync.Mutex
		latencies []time.Duration
	)
	var redisCPU func() time.Duration
	if rs, ok := store.(*redisstore.Store); ok {
		redisCPU = func() time.Duration { return redisServerCPU(b, rs.Client()) }
	}
	var redisBefore time.Duration
	if redisCPU != nil {
		redisBefore = redisCPU()
	}
	cpuBefore, cpuOK := procusage.CPU()
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	// parallelism 0 is one caller; otherwise RunParallel's goroutines per CPU.
	run := func(body func(next func() bool)) {
		if parallelism == 0 {
			n := 0
			body(func() bool { n++; return n <= b.N })
			return
		}
		b.SetParallelism(parallelism)
		b.RunParallel(func(pb *testing.PB) { body(pb.Next) })
	}
	run(func(next func() bool) {
		local := make([]time.Duration, 0, 1024)
		i := 0
		for next() {
			tenant := tenants[i%len(tenants)]
			i++
			t0 := time.Now()
			r, err := svc.Reserve(ctx, reserveRequest{Tenant: tenant, Model: "gpt-4o", InputTokens: 500, MaxOutputTokens: 1024, UpstreamKey: key})
			local = append(local, time.Since(t0))
			if err != nil {
				b.Error(err)
				return
			}
			if _, err := svc.Settle(ctx, settleRequest{Tenant: tenant, ReservationID: r.ReservationID, Usage: &tokenUsage{TotalTokens: 800}}); err != nil {
				b.Error(err)
				return
			}
		}
		mu.Lock()
		latencies = append(latencies, local...)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	b.StopTimer()
	// CPU per pair does not depend on what else the machine runs: with it, capacity on
	// dedicated cores is cores / (client + server CPU per pair).
	if cpuAfter, ok := procusage.CPU(); ok && cpuOK {
		b.ReportMetric(float64((cpuAfter-cpuBefore).Microseconds())/float64(b.N), "client-cpu-µs/pair")
	}
	if redisCPU != nil {
		b.ReportMetric(float64((redisCPU()-redisBefore).Microseconds())/float64(b.N), "redis-cpu-µs/pair")
	}
	if len(latencies) == 0 {
		return
	}
	slices.Sort(latencies)
	pct := func(p float64) float64 { return float64(latencies[int(p*float64(len(latencies)-1))].Nanoseconds()) }
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "pairs/s")
	b.ReportMetric(pct(0.50), "p50-ns")
	b.ReportMetric(pct(0.99), "p99-ns")
}

// BenchmarkDecisionLatency is one caller making reserve+settle pairs back to back: the
// latency of a decision when nothing else competes for it.
//
//	go test -run '^$' -bench BenchmarkDecisionLatency -benchtime 5s -cpu 2 ./services/quota/
func BenchmarkDecisionLatency(b *testing.B) {
	b.Run("memory", func(b *testing.B) {
		benchReserveSettle(b, memstore.New(clockwork.NewRealClock()), "", 0)
	})
	b.Run("redis", func(b *testing.B) {
		benchReserveSettle(b, newTestRedisStore(b, clockwork.NewRealClock(), redisstore.Options{ServerTime: true}), "", 0)
	})
}

// redisServerCPU is the CPU time the Redis server has used (INFO cpu).
func redisServerCPU(b *testing.B, c redis.UniversalClient) time.Duration {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for line := range strings.SplitSeq(info, "\n") {
		name, value, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (name == "used_cpu_sys" || name == "used_cpu_user") {
			v, _ := strconv.ParseFloat(value, 64)
			total += v
		}
	}
	return time.Duration(total * float64(time.Second))
}
