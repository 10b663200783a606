package router

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jonboulle/clockwork"
)

func TestKeyStatsSnapshot(t *testing.T) {
	t.Parallel()
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	tests := []struct {
		name string
		// latencies of successful calls, in the order they finish
		ok       []time.Duration
		failures int
		// timeouts are failures that timed out, booked after the failures; earlyTimeouts
		// are booked before everything else
		timeouts, earlyTimeouts int
		inFlight                int
		want                    statsSnapshot
	}{
		{name: "no calls", want: statsSnapshot{}},
		{name: "one call", ok: []time.Duration{ms(7)}, want: statsSnapshot{p50: ms(7), p95: ms(7), p99: ms(7), calls: 1}},
		{
			name: "1..100 ms shuffled, with failures and calls in flight",
			ok:   shuffled(100, ms), failures: 5, inFlight: 2,
			// Nearest rank: p50 is the 50th value, p95 the 95th, p99 the 99th.
			want: statsSnapshot{p50: ms(50), p95: ms(95), p99: ms(99), calls: 105, failures: 5, inFlight: 2},
		},
		{
			name: "four values",
			ok:   []time.Duration{ms(40), ms(10), ms(30), ms(20)},
			want: statsSnapshot{p50: ms(20), p95: ms(40), p99: ms(40), calls: 4},
		},
		{
			name: "the window keeps the latest 256",
			// 300 slow calls, then 256 fast ones push every slow one out.
			ok:   append(repeat(300, ms(900)), shuffled(256, ms)...),
			want: statsSnapshot{p50: ms(128), p95: ms(244), p99: ms(254), calls: 556},
		},
		{
			name: "the timeout share is of the calls so far while they are fewer than the window",
			ok:   repeat(6, ms(10)), failures: 1, timeouts: 3,
			want: statsSnapshot{p50: ms(10), p95: ms(10), p99: ms(10), calls: 10, failures: 4, timeoutShare: 0.3},
		},
		{
			name: "the timeout share is of the latest 64 calls",
			// 10 timeouts, then 60 answers: four of the timeouts are among the latest 64.
			earlyTimeouts: 10, ok: repeat(60, ms(10)),
			want: statsSnapshot{p50: ms(10), p95: ms(10), p99: ms(10), calls: 70, failures: 10, timeoutShare: 4.0 / 64},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newKeyStats(clockwork.NewFakeClock())
			for range tt.inFlight {
				s.start()
			}
			for range tt.earlyTimeouts {
				s.start()
				s.finish(time.Hour, true, true)
			}
			for _, d := range tt.ok {
				s.start()
				s.finish(d, false, false)
			}
			for range tt.failures {
				s.start()
				s.finish(time.Hour, true, false) // failures never count as latency
			}
			for range tt.timeouts {
				s.start()
				s.finish(time.Hour, true, true)
			}
			got := s.snapshot()
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(statsSnapshot{})); diff != "" {
				t.Errorf("snapshot (-want +got):\n%s", diff)
			}
		})
	}
}

func shuffled(n int, unit func(int) time.Duration) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = unit(i + 1)
	}
	r := rand.New(rand.NewPCG(1, 2))
	r.Shuffle(n, func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

func repeat(n int, d time.Duration) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = d
	}
	return out
}

// The p50 check runs before every attempt: a snapshot must not allocate.
func BenchmarkKeyStatsSnapshot(b *testing.B) {
	s := newKeyStats(clockwork.NewRealClock())
	for i := range latencyWindow {
		s.finish(time.Duration(i)*time.Millisecond, false, false)
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = s.snapshot()
	}
}
