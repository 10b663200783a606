package resilience

import (
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// The router calls Allow+Done once per attempt and TryRetry once per retry; these must stay
// far below a network round trip.

func BenchmarkBreakerAllowDone(b *testing.B) {
	br := NewBreaker(DefaultBreakerConfig(), clockwork.NewRealClock(), nil, nil)
	b.ReportAllocs()
	for b.Loop() {
		p, ok := br.Allow()
		if !ok {
			b.Fatal("refused")
		}
		p.Done(false, time.Second)
	}
}

func BenchmarkBreakerAllowDoneParallel(b *testing.B) {
	br := NewBreaker(DefaultBreakerConfig(), clockwork.NewRealClock(), nil, nil)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p, ok := br.Allow()
			if !ok {
				b.Error("refused")
				return
			}
			p.Done(false, time.Second)
		}
	})
}

func BenchmarkBreakerSnapshot(b *testing.B) {
	br := NewBreaker(DefaultBreakerConfig(), clockwork.NewRealClock(), nil, nil)
	b.ReportAllocs()
	for b.Loop() {
		br.Snapshot()
	}
}

func BenchmarkBudgetTryRetry(b *testing.B) {
	cfg := DefaultBudgetConfig()
	cfg.Ratio = 1e9 // keep admitting, so every iteration takes the counting path
	bu := NewBudget(cfg, clockwork.NewRealClock())
	bu.Request()
	b.ReportAllocs()
	for b.Loop() {
		bu.TryRetry(true)
	}
}

func BenchmarkBudgetTryRetryParallel(b *testing.B) {
	cfg := DefaultBudgetConfig()
	cfg.Ratio = 1e9
	bu := NewBudget(cfg, clockwork.NewRealClock())
	bu.Request()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			bu.TryRetry(true)
		}
	})
}

func BenchmarkBulkheadAcquireRelease(b *testing.B) {
	bh := NewBulkhead(200)
	b.ReportAllocs()
	for b.Loop() {
		release, _ := bh.TryAcquire()
		release()
	}
}

func BenchmarkLatencyObserve(b *testing.B) {
	l := NewLatency(256, time.Minute, clockwork.NewRealClock())
	b.ReportAllocs()
	for b.Loop() {
		l.Observe(time.Second)
	}
}

func BenchmarkLatencyQuantile256(b *testing.B) {
	l := NewLatency(256, time.Minute, clockwork.NewRealClock())
	for i := range 256 {
		l.Observe(time.Duration(i*7919%1000) * time.Millisecond)
	}
	b.ReportAllocs()
	for b.Loop() {
		l.Quantile(0.95)
	}
}

// BenchmarkLatencyAttempt is the router's pattern per attempt: one quantile before the
// call, one observation after it.
func BenchmarkLatencyAttempt(b *testing.B) {
	l := NewLatency(256, time.Minute, clockwork.NewRealClock())
	for i := range 256 {
		l.Observe(time.Duration(i*7919%1000) * time.Millisecond)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		l.Quantile(0.5)
		l.Observe(time.Duration(i*7919%1000) * time.Millisecond)
		i++
	}
}
