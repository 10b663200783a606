package resilience

import (
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// Hedges may use only a share of the budget: with ratio 0.2, floor 10 and format-only
// above 15%, a half share allows a hedge while retries stay under 5 (half the floor), then
// while the retry rate is at most 7.5% and one more fits in 10% of the requests.
func TestBudgetAllowedShare(t *testing.T) {
	cfg := BudgetConfig{Ratio: 0.2, Floor: 10, Window: time.Minute, Buckets: 6, FormatOnlyAbove: 0.15}
	tests := []struct {
		name              string
		requests, retries int
		share             float64
		want              bool
	}{
		{"under half the floor", 0, 4, 0.5, true},
		{"half the floor spent, no requests", 0, 5, 0.5, false},
		{"7 of 100 (7%): one more fits in 10%", 100, 7, 0.5, true},
		{"8 of 100: rate 8% over 7.5%", 100, 8, 0.5, false},
		{"the whole budget is still open to failovers at 8 of 100", 100, 8, 1, true},
		{"9 of 100 with the full share: one more fits in 20%", 100, 9, 1, true},
		{"share 0 allows nothing once anything was retried", 100, 1, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := NewBudget(cfg, clockwork.NewFakeClock())
			for range tt.requests {
				b.Request()
			}
			for range tt.retries {
				b.window.AddAt(b.clock.Now(), fieldRetries, 1) // as TryRetry counts, without its rules
			}
			if got := b.AllowedShare(tt.share); got != tt.want {
				t.Errorf("AllowedShare(%v) with %d requests and %d retries = %t, want %t", tt.share, tt.requests, tt.retries, got, tt.want)
			}
			if tt.share == 1 && b.AllowedShare(1) != b.Allowed(false) {
				t.Errorf("AllowedShare(1) = %t disagrees with Allowed = %t", b.AllowedShare(1), b.Allowed(false))
			}
		})
	}
}
