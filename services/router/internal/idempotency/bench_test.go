package idempotency

import (
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// benchRecord is about the size of a short marshalled CompleteResponse.
var benchRecord = Record{Response: make([]byte, 512)}

// beginComplete is the owner's path for a new request: claim, then record.
func beginComplete(b *testing.B, s Store, key string) {
	ctx := b.Context()
	if _, owner, err := s.Begin(ctx, key); err != nil || !owner {
		b.Fatalf("Begin(%q) = (%v, %v), want to own the key", key, owner, err)
	}
	if err := s.Complete(ctx, key, benchRecord); err != nil {
		b.Fatal(err)
	}
}

func reportOpsPerSecond(b *testing.B) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

func BenchmarkMemoryBeginComplete(b *testing.B) {
	m := NewMemory(24*time.Hour, time.Minute, clockwork.NewRealClock())
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		beginComplete(b, m, "tenant/req-"+strconv.Itoa(i))
	}
}

func BenchmarkMemoryReplay(b *testing.B) {
	m := NewMemory(24*time.Hour, time.Minute, clockwork.NewRealClock())
	beginComplete(b, m, "replayed")
	b.ReportAllocs()
	for b.Loop() {
		if rec, _, err := m.Begin(b.Context(), "replayed"); err != nil || rec == nil {
			b.Fatalf("Begin = (%v, %v), want the record", rec, err)
		}
	}
}

func newBenchJetStream(b *testing.B) *JetStream {
	_, js := connect(b, startNATS(b))
	s, err := NewJetStream(b.Context(), js, newBucketName(), 24*time.Hour, time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// BenchmarkJetStreamBeginComplete is one caller doing new requests back to back: two KV
// round trips each (create the claim, update it to the record). It also reports the
// latency percentiles of the pair.
func BenchmarkJetStreamBeginComplete(b *testing.B) {
	s := newBenchJetStream(b)
	var lat []time.Duration
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		beginComplete(b, s, "tenant/req-"+strconv.Itoa(i))
		lat = append(lat, time.Since(start))
	}
	reportOpsPerSecond(b)
	slices.Sort(lat)
	for _, q := range []struct {
		name string
		q    float64
	}{{"p50-µs", 0.50}, {"p99-µs", 0.99}} {
		b.ReportMetric(float64(lat[int(q.q*float64(len(lat)-1))].Microseconds()), q.name)
	}
}

// BenchmarkJetStreamBeginCompleteParallel is many requests in flight on one connection, as
// on a busy replica.
func BenchmarkJetStreamBeginCompleteParallel(b *testing.B) {
	s := newBenchJetStream(b)
	var seq atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			beginComplete(b, s, "tenant/req-"+strconv.FormatInt(seq.Add(1), 10))
		}
	})
	reportOpsPerSecond(b)
}

// BenchmarkJetStreamReplay is a duplicate of a finished request: a failed create and a get.
func BenchmarkJetStreamReplay(b *testing.B) {
	s := newBenchJetStream(b)
	beginComplete(b, s, "replayed")
	b.ReportAllocs()
	for b.Loop() {
		if rec, _, err := s.Begin(b.Context(), "replayed"); err != nil || rec == nil {
			b.Fatalf("Begin = (%v, %v), want the record", rec, err)
		}
	}
	reportOpsPerSecond(b)
}
