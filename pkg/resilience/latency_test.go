package resilience

import (
	"slices"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"pgregory.net/rapid"
)

// Latency's quantiles are always those of the window it holds, however observations and
// ageing interleave: checked against sorting the window anew (the reference) after every
// step. Equal values, a full ring, values that age out between observations and a window
// that empties are all drawn.
func TestPropertyLatencyQuantilesAreExact(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		size := rapid.IntRange(1, 40).Draw(rt, "size")
		maxAge := time.Duration(rapid.IntRange(0, 20).Draw(rt, "max age s")) * time.Second
		clock := clockwork.NewFakeClock()
		l := NewLatency(size, maxAge, clock)
		var held []sample // the reference: every observation, oldest first
		steps := rapid.IntRange(1, 200).Draw(rt, "steps")
		for range steps {
			if rapid.Bool().Draw(rt, "observe") {
				d := time.Duration(rapid.IntRange(0, 30).Draw(rt, "ms")) * time.Millisecond
				l.Observe(d)
				held = append(held, sample{at: clock.Now(), d: d})
			} else {
				clock.Advance(time.Duration(rapid.IntRange(0, 5000).Draw(rt, "advance ms")) * time.Millisecond)
			}
			var window []time.Duration
			for _, s := range held[max(0, len(held)-size):] {
				if maxAge <= 0 || clock.Since(s.at) <= maxAge {
					window = append(window, s.d)
				}
			}
			slices.Sort(window)
			q := float64(rapid.IntRange(0, 100).Draw(rt, "q%")) / 100
			if got, want := l.Quantile(q), nearestRank(window, q); got != want {
				rt.Fatalf("Quantile(%v) = %s, want %s of %v", q, got, want, window)
			}
			var both [2]time.Duration
			if l.Quantiles(both[:], 0, 1); len(window) > 0 && (both[0] != window[0] || both[1] != window[len(window)-1]) {
				rt.Fatalf("Quantiles(0, 1) = %v, want %s and %s", both, window[0], window[len(window)-1])
			}
			if got := l.Count(); got != len(window) {
				rt.Fatalf("Count = %d, want %d", got, len(window))
			}
		}
	})
}
