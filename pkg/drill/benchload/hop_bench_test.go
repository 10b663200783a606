package benchload

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/procusage"
	"github.com/mantle-mesh/mantle/pkg/sim"
)

// BenchmarkRequest sends one request at a time through each mode, all in this process: the
// instant upstream, the hop and the client. Its allocations per request are a steady
// figure where bench-load's latencies are not; a mode's own share is its figure less
// direct's, which pays for the client and the upstream. The request carries no
// temperature, so the cache declines it and nothing is stored.
//
//	go test -run '^$' -bench BenchmarkRequest -benchmem -count 6 ./pkg/drill/benchload/ | benchstat -
func BenchmarkRequest(b *testing.B) {
	benchmarkRequests(b, Config{}, false, Modes())
}

// BenchmarkStoredRequest is BenchmarkRequest with a new prompt at temperature 0 every
// time, as bench-load --temperature 0 sends: the whole mesh looks each up, misses, and
// stores the answer after it has gone out.
func BenchmarkStoredRequest(b *testing.B) {
	zero := 0.0
	benchmarkRequests(b, Config{Temperature: &zero}, true, []Mode{Direct, All})
}

// BenchmarkStreamedRequest is BenchmarkRequest with the answer streamed (bench-load
// --stream): the upstream sends it in pieces, and each mode relays them to the end.
func BenchmarkStreamedRequest(b *testing.B) {
	benchmarkRequests(b, Config{Stream: true}, false, Modes())
}

// benchmarkRequests sends cfg's requests one at a time through each of modes; unique
// makes every prompt a new one (the body is then built per request, in every mode alike).
func benchmarkRequests(b *testing.B, cfg Config, unique bool, modes []Mode) {
	ctx, cancel := context.WithCancel(context.Background())
	log := slog.New(slog.DiscardHandler)
	upstreamAddr, waitUpstream, err := sim.Start(ctx, "127.0.0.1:0", sim.NewServer(sim.ServerConfig{Log: log}), log)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cancel(); _ = waitUpstream() })
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: time.Minute}}
	b.Cleanup(c.CloseIdleConnections)
	payload := body(cfg, 0)

	for _, mode := range modes {
		b.Run(string(mode), func(b *testing.B) {
			url := "http://" + upstreamAddr + "/v1/chat/completions"
			if mode != Direct {
				h, err := startHop(ctx, mode, upstreamAddr, mesh.Default(), false, io.Discard)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() {
					if err := h.stop(); err != nil {
						b.Error(err)
					}
				})
				url = h.endpoint()
			}
			b.ReportAllocs()
			created := goroutinesCreated()
			cpu, _ := procusage.CPU()
			switches, _ := procusage.Switches()
			for i := 0; b.Loop(); i++ {
				if unique {
					payload = body(cfg, i)
				}
				if _, _, err := send(ctx, c, url, payload); err != nil {
					b.Fatal(err)
				}
			}
			// Every goroutine a request starts is a hand-off that, on a process with idle
			// CPUs, wakes a thread: a cost per request that shows most at low rates.
			b.ReportMetric(float64(goroutinesCreated()-created)/float64(b.N), "goroutines/op")
			// The process's CPU: the client's, the upstream's and the hop's. A mode's own is
			// its figure less direct's; one request at a time is bench-load's lowest rates,
			// where each request wakes an idle process.
			if end, ok := procusage.CPU(); ok {
				b.ReportMetric(float64(end-cpu)/float64(b.N), "cpu-ns/op")
			}
			if end, ok := procusage.Switches(); ok {
				b.ReportMetric(float64(end-switches)/float64(b.N), "switches/op")
			}
		})
	}
}

// goroutinesCreated is how many goroutines the process has started so far.
func goroutinesCreated() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
