package router

import (
	"testing"
	"time"
)

func TestLocalLimiter(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		rpm     int
		burst   int           // requests at now
		after   time.Duration // then one more request this much later
		allowed int           // how many of the burst pass
		later   bool          // whether the later one passes
	}{
		{"unbounded", 0, 1000, 0, 1000, true},
		{"burst up to the limit", 60, 100, 0, 60, false},
		{"refills at rpm/60 per second", 60, 60, time.Second, 60, true},
		{"not before the refill", 60, 60, 500 * time.Millisecond, 60, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLocalLimiter(tc.rpm)
			got := 0
			for i := 0; i < tc.burst; i++ {
				if l.allow("acme", now) {
					got++
				}
			}
			if got != tc.allowed {
				t.Errorf("allowed %d of %d, want %d", got, tc.burst, tc.allowed)
			}
			if later := l.allow("acme", now.Add(tc.after)); later != tc.later {
				t.Errorf("request %s later allowed = %v, want %v", tc.after, later, tc.later)
			}
			if tc.rpm > 0 && !l.allow("other-tenant", now) {
				t.Error("tenants share a limiter")
			}
		})
	}
}
