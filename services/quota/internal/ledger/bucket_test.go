package ledger

import (
	"math"
	"testing"
	"time"
)

func TestDurationOfAndTokensIn(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		n, limit     int64
		wantDuration time.Duration
	}{
		{"whole window", 600, 600, time.Minute},
		{"one request at 600 rpm", 1, 600, 100 * time.Millisecond},
		{"rounds up to the nanosecond", 1, 7, 8_571_428_572}, // 60s/7 = 8.571428571428…s
		{"nothing", 0, 600, 0},
		{"saturates instead of overflowing", math.MaxInt64, 1, MaxDebt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := DurationOf(tt.n, tt.limit); got != tt.wantDuration {
				t.Errorf("durationOf(%d, %d) = %v, want %v", tt.n, tt.limit, got, tt.wantDuration)
			}
			// Refilling for exactly durationOf(n) must earn at least n tokens: that is
			// what makes retry-after exact.
			if tt.wantDuration < MaxDebt {
				if got := TokensIn(tt.wantDuration, tt.limit); got < tt.n {
					t.Errorf("tokensIn(%v, %d) = %d, want at least %d", tt.wantDuration, tt.limit, got, tt.n)
				}
			}
		})
	}
}
