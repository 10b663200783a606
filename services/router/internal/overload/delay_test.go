package overload

import (
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestQuantileSince(t *testing.T) {
	// Boundaries as runtime/metrics gives them: len(counts)+1, the last one +Inf.
	buckets := []float64{0, 0.001, 0.01, 0.1, math.Inf(1)}
	tests := []struct {
		name   string
		counts []uint64
		prev   []uint64
		q      float64
		want   time.Duration
	}{
		{name: "no waits at all, no previous read", counts: []uint64{0, 0, 0, 0}, q: 0.99, want: 0},
		{name: "no waits since the previous read", counts: []uint64{7, 3, 2, 1}, prev: []uint64{7, 3, 2, 1}, q: 0.99, want: 0},
		{name: "no waits since an empty previous read", counts: []uint64{0, 0, 0, 0}, prev: []uint64{}, q: 1, want: 0},

		// Without a previous read the whole histogram counts.
		{name: "median in the first bucket answers its upper boundary", counts: []uint64{50, 49, 1, 0}, q: 0.5, want: time.Millisecond},
		{name: "p99 in the second bucket", counts: []uint64{50, 49, 1, 0}, q: 0.99, want: 10 * time.Millisecond},
		{name: "q=1 is the bucket of the longest wait", counts: []uint64{50, 49, 1, 0}, q: 1, want: 100 * time.Millisecond},
		{name: "rank exactly at a bucket's end stays in that bucket", counts: []uint64{50, 50, 0, 0}, q: 0.5, want: time.Millisecond},
		{name: "rank one past a bucket's end moves to the next", counts: []uint64{49, 51, 0, 0}, q: 0.5, want: 10 * time.Millisecond},
		{name: "p99 of ten waits is the longest of them", counts: []uint64{9, 1, 0, 0}, q: 0.99, want: 10 * time.Millisecond},
		{name: "empty previous read is no previous read", counts: []uint64{50, 49, 1, 0}, prev: []uint64{}, q: 0.99, want: 10 * time.Millisecond},

		// The last bucket's upper boundary is +Inf: it answers its lower boundary.
		{name: "all waits in the +Inf bucket", counts: []uint64{0, 0, 0, 5}, q: 0.5, want: 100 * time.Millisecond},
		{name: "q=1 reaching the +Inf bucket", counts: []uint64{98, 1, 0, 1}, q: 1, want: 100 * time.Millisecond},
		{name: "p99 below the one wait in the +Inf bucket", counts: []uint64{98, 1, 0, 1}, q: 0.99, want: 10 * time.Millisecond},

		// With a previous read only the difference ({0, 6, 2, 2}) counts: the same counts
		// without prev would answer 1 ms for the median (rank 30 of 60, first bucket).
		{name: "same counts without the previous read", counts: []uint64{40, 16, 2, 2}, q: 0.5, want: time.Millisecond},
		{name: "previous read subtracted, median", counts: []uint64{40, 16, 2, 2}, prev: []uint64{40, 10, 0, 0}, q: 0.5, want: 10 * time.Millisecond},
		{name: "previous read subtracted, p99", counts: []uint64{40, 16, 2, 2}, prev: []uint64{40, 10, 0, 0}, q: 0.99, want: 100 * time.Millisecond},
		{name: "previous read subtracted, q=1", counts: []uint64{40, 16, 2, 2}, prev: []uint64{40, 10, 0, 0}, q: 1, want: 100 * time.Millisecond},
		{name: "previous read subtracted, only the first bucket grew", counts: []uint64{45, 10, 5, 5}, prev: []uint64{40, 10, 5, 5}, q: 1, want: time.Millisecond},

		// A shorter previous read counts as zeros past its end.
		{name: "shorter previous read, median", counts: []uint64{40, 3, 1, 0}, prev: []uint64{40}, q: 0.5, want: 10 * time.Millisecond},
		{name: "shorter previous read, p99", counts: []uint64{40, 3, 1, 0}, prev: []uint64{40}, q: 0.99, want: 100 * time.Millisecond},
		{name: "shorter previous read, q=1", counts: []uint64{40, 3, 1, 0}, prev: []uint64{40}, q: 1, want: 100 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := quantileSince(tt.counts, tt.prev, buckets, tt.q); got != tt.want {
				t.Errorf("quantileSince(%v, %v, q=%g) = %v, want %v", tt.counts, tt.prev, tt.q, got, tt.want)
			}
		})
	}
}

// The runtime's own histogram starts with an underflow bucket (-Inf, 0): waits land at
// or above 0, and their answers are upper boundaries, never -Inf or a negative value.
func TestQuantileSinceRuntimeShapedBuckets(t *testing.T) {
	buckets := []float64{math.Inf(-1), 0, 1e-6, 0.25, math.Inf(1)}
	tests := []struct {
		name   string
		counts []uint64
		q      float64
		want   time.Duration
	}{
		{name: "waits in [0, 1µs)", counts: []uint64{0, 4, 0, 0}, q: 0.99, want: time.Microsecond},
		{name: "waits in [1µs, 250ms)", counts: []uint64{0, 4, 6, 0}, q: 0.5, want: 250 * time.Millisecond},
		{name: "waits past the last finite boundary", counts: []uint64{0, 4, 6, 1}, q: 1, want: 250 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := quantileSince(tt.counts, nil, buckets, tt.q); got != tt.want {
				t.Errorf("quantileSince(%v, q=%g) = %v, want %v", tt.counts, tt.q, got, tt.want)
			}
		})
	}
}

// TestSchedulingDelayReadAfterContention reads the real runtime's histogram after more
// busy goroutines than GOMAXPROCS have shared a bounded amount of work. The runtime
// records a runnable goroutine's wait on one in gTrackingPeriod (8) of its transitions
// out of running, so every worker yields to the others now and then (staying runnable,
// queued behind them): each worker yields hundreds of times, so waits are certainly
// recorded between the two reads, whatever the machine's speed. Only the sign is
// asserted: how long the waits were depends on the machine.
func TestSchedulingDelayReadAfterContention(t *testing.T) {
	sd := NewSchedulingDelay(0.99)

	workers := 4 * runtime.GOMAXPROCS(0)
	const target = 1 << 18 // increments shared by all workers: work, not time
	var counter atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := 0; counter.Add(1) < target; i++ {
				if i%64 == 0 {
					runtime.Gosched()
				}
			}
		})
	}
	wg.Wait()
	if got := counter.Load(); got < target {
		t.Fatalf("workers stopped at %d increments, want %d", got, target)
	}

	busy := sd.Read()
	if busy <= 0 {
		t.Errorf("Read after %d busy goroutines on GOMAXPROCS=%d = %v, want > 0", workers, runtime.GOMAXPROCS(0), busy)
	}
	idle := sd.Read()
	if idle < 0 {
		t.Errorf("Read right after, idle = %v, want >= 0", idle)
	}
	t.Logf("p99 wait for a CPU: %v under contention, %v right after", busy, idle)
}
