package resilience

import (
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// The cached order is rebuilt after a 32nd of its values has been observed anew, or when
// its oldest value ages out: a quantile lags the newest few calls, never more.
func TestLatencyCachedOrder(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	tests := []struct {
		name    string
		size    int
		maxAge  time.Duration
		then    []int // milliseconds observed after the first Quantile
		advance time.Duration
		want    time.Duration // max after then and advance
	}{
		{"up to size/32 new values are not seen yet", 256, 0, []int{900, 900, 900, 900, 900, 900, 900, 900}, 0, ms(256)},
		{"one more and the order is rebuilt", 256, 0, []int{900, 900, 900, 900, 900, 900, 900, 900, 900}, 0, ms(900)},
		{"small windows are always exact", 16, 0, []int{900}, 0, ms(900)},
		{"an empty order is rebuilt at the first value", 0, 0, []int{900}, 0, ms(900)},
		{"aged out values drop the cache", 256, time.Minute, []int{5}, 2 * time.Minute, ms(5)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := clockwork.NewFakeClock()
			l := NewLatency(tt.size, tt.maxAge, clock)
			for i := 1; i <= tt.size; i++ {
				l.Observe(ms(i))
			}
			if got := l.Quantile(1); got != ms(tt.size) {
				t.Fatalf("max before = %s, want %s", got, ms(tt.size))
			}
			clock.Advance(tt.advance)
			for _, v := range tt.then {
				l.Observe(ms(v))
			}
			if got := l.Quantile(1); got != tt.want {
				t.Errorf("max after = %s, want %s", got, tt.want)
			}
			var got [2]time.Duration
			if l.Quantiles(got[:], 0, 1); got[1] != tt.want {
				t.Errorf("Quantiles max = %s, want %s like Quantile", got[1], tt.want)
			}
		})
	}
}
