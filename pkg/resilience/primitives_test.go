package resilience

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"pgregory.net/rapid"
)

func TestBackoff(t *testing.T) {
	const ms = time.Millisecond
	tests := []struct {
		name      string
		retry     int
		base, cap time.Duration
		r         float64
		want      time.Duration
	}{
		{"first retry, middle draw", 0, 200 * ms, 1500 * ms, 0.5, 100 * ms},
		{"second retry doubles the ceiling", 1, 200 * ms, 1500 * ms, 0.5, 200 * ms},
		{"third retry", 2, 200 * ms, 1500 * ms, 0.5, 400 * ms},
		{"ceiling capped", 3, 200 * ms, 1500 * ms, 0.5, 750 * ms},
		{"far retry capped, no overflow", 200, 200 * ms, 1500 * ms, 0.5, 750 * ms},
		{"lowest draw is zero", 2, 200 * ms, 1500 * ms, 0, 0},
		{"highest draw stays below the ceiling", 3, 200 * ms, 1500 * ms, 0.9999999999999999, 1500*ms - 1},
		{"no cap", 10, time.Second, 0, 0.5, 512 * time.Second},
		{"zero base", 3, 0, time.Second, 0.5, 0},
		{"negative retry is the first", -1, 200 * ms, 1500 * ms, 0.5, 100 * ms},
		{"base above cap", 0, 2 * time.Second, time.Second, 0.5, 500 * ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Backoff(tt.retry, tt.base, tt.cap, func() float64 { return tt.r }); got != tt.want {
				t.Fatalf("Backoff = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestBackoffWithoutCapDoesNotOverflow(t *testing.T) {
	prev := time.Duration(0)
	for retry := range 200 {
		d := Backoff(retry, time.Second, 0, func() float64 { return 0.5 })
		if d < prev {
			t.Fatalf("retry %d: Backoff = %s, below the previous %s (overflow?)", retry, d, prev)
		}
		prev = d
	}
	if prev < time.Duration(1<<62) {
		t.Fatalf("Backoff at retry 199 = %s, want it saturated near the largest duration", prev)
	}
}

func TestBackoffBoundsProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		retry := rapid.IntRange(0, 100).Draw(t, "retry")
		base := time.Duration(rapid.Int64Range(1, int64(10*time.Second)).Draw(t, "base"))
		cap := time.Duration(rapid.Int64Range(1, int64(time.Hour)).Draw(t, "cap"))
		r := rapid.Float64Range(0, 0.9999999999999999).Draw(t, "r")
		ceiling := min(cap, base)
		for range retry {
			if ceiling >= cap {
				break
			}
			ceiling = min(cap, 2*ceiling)
		}
		got := Backoff(retry, base, cap, func() float64 { return r })
		if got < 0 || got >= ceiling || got > cap {
			t.Fatalf("Backoff(%d, %s, %s, %v) = %s, want in [0, %s)", retry, base, cap, r, got, ceiling)
		}
	})
}

func TestBackoffDefaultRandomness(t *testing.T) {
	for range 1000 {
		if d := Backoff(3, 100*time.Millisecond, time.Second, nil); d < 0 || d >= 800*time.Millisecond {
			t.Fatalf("Backoff with nil rnd = %s, want in [0, 800ms)", d)
		}
	}
}

func TestBulkhead(t *testing.T) {
	b := NewBulkhead(2)
	r1, ok1 := b.TryAcquire()
	_, ok2 := b.TryAcquire()
	r3, ok3 := b.TryAcquire()
	if !ok1 || !ok2 || ok3 {
		t.Fatalf("TryAcquire x3 = %v %v %v, want true true false", ok1, ok2, ok3)
	}
	r3() // the refusal's release is harmless
	if b.InFlight() != 2 || b.Max() != 2 {
		t.Fatalf("InFlight %d Max %d, want 2 2", b.InFlight(), b.Max())
	}
	r1()
	r1() // idempotent
	if got := b.InFlight(); got != 1 {
		t.Fatalf("InFlight after a double release = %d, want 1", got)
	}
	if _, ok := b.TryAcquire(); !ok {
		t.Fatal("TryAcquire after a release = false")
	}
}

func TestBulkheadUnlimited(t *testing.T) {
	for _, max := range []int{0, -1} {
		b := NewBulkhead(max)
		for i := range 1000 {
			if _, ok := b.TryAcquire(); !ok {
				t.Fatalf("max %d: acquire %d refused", max, i)
			}
		}
		if b.InFlight() != 1000 || b.Max() != 0 {
			t.Fatalf("max %d: InFlight %d Max %d, want 1000 0", max, b.InFlight(), b.Max())
		}
	}
}

// TestBulkheadConcurrency: many goroutines never hold more than max places at once
// (run with -race).
func TestBulkheadConcurrency(t *testing.T) {
	const limit = 4
	b := NewBulkhead(limit)
	var holders, peak, admitted atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for range 500 {
				release, ok := b.TryAcquire()
				if !ok {
					continue
				}
				admitted.Add(1)
				n := holders.Add(1)
				for {
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}
				holders.Add(-1)
				release()
				release()
			}
		})
	}
	wg.Wait()
	if p := peak.Load(); p > limit {
		t.Fatalf("peak holders %d, want at most %d", p, limit)
	}
	if admitted.Load() == 0 || b.InFlight() != 0 {
		t.Fatalf("admitted %d, InFlight %d at the end; want some and 0", admitted.Load(), b.InFlight())
	}
}

func TestCooldown(t *testing.T) {
	tests := []struct {
		name          string
		sets          []time.Duration // each at the time after the previous advance
		advances      []time.Duration
		wantRemaining time.Duration
	}{
		{"never set", nil, nil, 0},
		{"set", []time.Duration{10 * time.Second}, []time.Duration{0}, 10 * time.Second},
		{"shorter hint does not shorten", []time.Duration{10 * time.Second, 5 * time.Second}, []time.Duration{0, 0}, 10 * time.Second},
		{"longer hint extends", []time.Duration{10 * time.Second, 20 * time.Second}, []time.Duration{0, 0}, 20 * time.Second},
		{"later hint that ends later extends", []time.Duration{10 * time.Second, 5 * time.Second}, []time.Duration{6 * time.Second, 0}, 5 * time.Second},
		{"zero and negative do nothing", []time.Duration{0, -time.Second}, []time.Duration{0, 0}, 0},
		{"expires", []time.Duration{10 * time.Second}, []time.Duration{10 * time.Second}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := clockwork.NewFakeClock()
			c := NewCooldown(clock)
			for i, d := range tt.sets {
				c.Set(d)
				clock.Advance(tt.advances[i])
			}
			if got := c.Remaining(); got != tt.wantRemaining {
				t.Fatalf("Remaining = %s, want %s", got, tt.wantRemaining)
			}
			if got := c.Active(); got != (tt.wantRemaining > 0) {
				t.Fatalf("Active = %v, want %v", got, tt.wantRemaining > 0)
			}
			if tt.wantRemaining > 0 && !c.Until().Equal(clock.Now().Add(tt.wantRemaining)) {
				t.Fatalf("Until = %s, want now+%s", c.Until(), tt.wantRemaining)
			}
		})
	}
}

func TestLatency(t *testing.T) {
	tests := []struct {
		name      string
		size      int
		maxAge    time.Duration
		observe   []int         // milliseconds, observed 1 s apart
		after     time.Duration // advance after the last observation
		q         float64
		want      time.Duration
		wantCount int
	}{
		{"empty", 10, 0, nil, 0, 0.5, 0, 0},
		{"median of 1..100", 100, 0, seq(1, 100), 0, 0.5, 50 * time.Millisecond, 100},
		{"p95 of 1..100", 100, 0, seq(1, 100), 0, 0.95, 95 * time.Millisecond, 100},
		{"p99 of 1..100", 100, 0, seq(1, 100), 0, 0.99, 99 * time.Millisecond, 100},
		{"max", 100, 0, seq(1, 100), 0, 1, 100 * time.Millisecond, 100},
		{"min", 100, 0, seq(1, 100), 0, 0, 1 * time.Millisecond, 100},
		{"ring keeps the last size", 10, 0, seq(1, 100), 0, 0, 91 * time.Millisecond, 10},
		{"old samples ignored", 100, 30 * time.Second, seq(1, 100), 0, 0, 70 * time.Millisecond, 31},
		{"all too old", 100, 30 * time.Second, seq(1, 10), time.Minute, 0.5, 0, 0},
		{"size below one is one", 0, 0, seq(1, 5), 0, 0.5, 5 * time.Millisecond, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := clockwork.NewFakeClock()
			l := NewLatency(tt.size, tt.maxAge, clock)
			for i, ms := range tt.observe {
				if i > 0 {
					clock.Advance(time.Second)
				}
				l.Observe(time.Duration(ms) * time.Millisecond)
			}
			clock.Advance(tt.after)
			if got := l.Quantile(tt.q); got != tt.want {
				t.Errorf("Quantile(%v) = %s, want %s", tt.q, got, tt.want)
			}
			if got := l.Count(); got != tt.wantCount {
				t.Errorf("Count = %d, want %d", got, tt.wantCount)
			}
		})
	}
}

func TestLatencyOrderDoesNotMatter(t *testing.T) {
	l := NewLatency(1000, 0, clockwork.NewFakeClock())
	vals := seq(1, 1000)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(vals), func(i, j int) { vals[i], vals[j] = vals[j], vals[i] })
	for _, v := range vals {
		l.Observe(time.Duration(v) * time.Millisecond)
	}
	if got := l.Quantile(0.95); got != 950*time.Millisecond {
		t.Fatalf("p95 = %s, want 950ms", got)
	}
}

func seq(from, to int) []int {
	out := make([]int, 0, to-from+1)
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}
