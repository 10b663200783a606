package resilience

import (
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

func TestBudgetConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*BudgetConfig)
		wantKey string
	}{
		{"defaults", func(*BudgetConfig) {}, ""},
		{"no retries at all", func(c *BudgetConfig) { c.Ratio, c.Floor = 0, 0 }, ""},
		{"ratio", func(c *BudgetConfig) { c.Ratio = -0.1 }, "ratio:"},
		{"floor", func(c *BudgetConfig) { c.Floor = -1 }, "floor:"},
		{"window", func(c *BudgetConfig) { c.Window = -time.Second }, "window:"},
		{"buckets", func(c *BudgetConfig) { c.Buckets = -1 }, "buckets:"},
		{"format_only_above", func(c *BudgetConfig) { c.FormatOnlyAbove = -1 }, "format_only_above:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultBudgetConfig()
			tt.mutate(&cfg)
			err := cfg.Validate()
			switch {
			case tt.wantKey == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tt.wantKey != "" && (err == nil || !strings.HasPrefix(err.Error(), tt.wantKey)):
				t.Fatalf("Validate() = %v, want an error starting with %q", err, tt.wantKey)
			}
		})
	}
}

// budgetStep is one action: r requests, or one retry attempt (format or not) expecting ok,
// or a clock advance.
type budgetStep struct {
	requests int
	retry    string // "", "retry" or "format"
	want     bool
	advance  time.Duration
}

func requests(n int) budgetStep  { return budgetStep{requests: n} }
func retry(want bool) budgetStep { return budgetStep{retry: "retry", want: want} }
func formatRetry(want bool) budgetStep {
	return budgetStep{retry: "format", want: want}
}
func wait(d time.Duration) budgetStep { return budgetStep{advance: d} }

func repeat(n int, s budgetStep) []budgetStep {
	out := make([]budgetStep, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func steps(parts ...any) []budgetStep {
	var out []budgetStep
	for _, p := range parts {
		switch p := p.(type) {
		case budgetStep:
			out = append(out, p)
		case []budgetStep:
			out = append(out, p...)
		}
	}
	return out
}

func TestBudget(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*BudgetConfig)
		steps  []budgetStep
		// What Snapshot reports at the end.
		wantRequests, wantRetries int
	}{
		{
			name:         "floor allows retries with no requests",
			steps:        steps(repeat(10, retry(true)), retry(false)),
			wantRetries:  10,
			wantRequests: 0,
		},
		{
			name:         "floor zero and ratio zero allow nothing",
			mutate:       func(c *BudgetConfig) { c.Ratio, c.Floor = 0, 0 },
			steps:        steps(requests(100), retry(false), formatRetry(false)),
			wantRequests: 100,
		},
		{
			// 100 requests: the ratio allows 20; format-only mode (rate > 15%) is off for
			// format retries, so format retries take the ratio all the way.
			name:         "ratio caps format retries",
			steps:        steps(requests(100), repeat(20, formatRetry(true)), formatRetry(false)),
			wantRequests: 100, wantRetries: 20,
		},
		{
			// Beyond the floor, ordinary retries stop once the rate passes 15%: at 15 of
			// 100 (15%) one more is allowed, at 16 of 100 not.
			name:         "format-only mode above 15%",
			steps:        steps(requests(100), repeat(16, retry(true)), retry(false), formatRetry(true), retry(false)),
			wantRequests: 100, wantRetries: 17,
		},
		{
			name:         "floor holds off format-only mode at low traffic",
			steps:        steps(requests(5), repeat(10, retry(true)), retry(false), formatRetry(false)),
			wantRequests: 5, wantRetries: 10,
		},
		{
			name:   "format-only mode ends as requests dilute the rate",
			mutate: func(c *BudgetConfig) { c.Ratio = 1 },
			steps: steps(requests(50), repeat(10, retry(true)), retry(false), // 20% > 15%
				requests(30), retry(true), // 10/80 = 12.5%
			),
			wantRequests: 80, wantRetries: 11,
		},
		{
			name: "window slides: old retries age out",
			steps: steps(requests(100), repeat(16, retry(true)), retry(false), // 16% > 15%
				wait(30*time.Second), requests(100), // 16 of 200 = 8%
				repeat(15, retry(true)), retry(false), // 31 of 200 = 15.5%: format only
				wait(30*time.Second),      // the first 100 requests and 16 retries slide out
				retry(true), retry(false), // 15 of 100 is not above 15%, 16 of 100 is
			),
			wantRequests: 100, wantRetries: 16,
		},
		{
			name:         "requests aging out leave retries over budget",
			steps:        steps(requests(100), wait(30*time.Second), repeat(20, formatRetry(true)), wait(30*time.Second), formatRetry(false)),
			wantRequests: 0, wantRetries: 20,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultBudgetConfig()
			if tt.mutate != nil {
				tt.mutate(&cfg)
			}
			clock := clockwork.NewFakeClock()
			b := NewBudget(cfg, clock)
			for i, s := range tt.steps {
				for range s.requests {
					b.Request()
				}
				clock.Advance(s.advance)
				if s.retry == "" {
					continue
				}
				format := s.retry == "format"
				if allowed := b.Allowed(format); allowed != s.want {
					t.Fatalf("step %d: Allowed(%v) = %v, want %v", i, format, allowed, s.want)
				}
				if got := b.TryRetry(format); got != s.want {
					req, ret, rate := b.Snapshot()
					t.Fatalf("step %d: TryRetry(%v) = %v, want %v (requests %d retries %d rate %.3f)", i, format, got, s.want, req, ret, rate)
				}
			}
			req, ret, rate := b.Snapshot()
			if req != tt.wantRequests || ret != tt.wantRetries {
				t.Fatalf("Snapshot = %d requests %d retries, want %d %d", req, ret, tt.wantRequests, tt.wantRetries)
			}
			if want := float64(ret) / float64(max(req, 1)); !near(rate, want) {
				t.Fatalf("Snapshot rate = %v, want %v", rate, want)
			}
		})
	}
}

func TestBudgetFormatOnly(t *testing.T) {
	b := NewBudget(DefaultBudgetConfig(), clockwork.NewFakeClock())
	for range 100 {
		b.Request()
	}
	for i := range 16 {
		if b.FormatOnly() {
			t.Fatalf("FormatOnly after %d retries of 100, want false", i)
		}
		b.TryRetry(false)
	}
	if !b.FormatOnly() {
		t.Fatal("FormatOnly after 16 retries of 100 = false, want true")
	}
}

func TestNewBudgetZeroConfigTakesDefaults(t *testing.T) {
	b := NewBudget(BudgetConfig{}, clockwork.NewFakeClock())
	if b.cfg != DefaultBudgetConfig() {
		t.Fatalf("config %+v, want defaults", b.cfg)
	}
}

func TestZeroWindowAndBucketsMeanTheDefaults(t *testing.T) {
	c := BudgetConfig{Ratio: 0.5, Floor: 1, FormatOnlyAbove: 0.9}
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate() = %v, want nil: zero window and buckets take the defaults", err)
	}
	if f := c.filled(); f.Window != DefaultBudgetConfig().Window || f.Buckets != DefaultBudgetConfig().Buckets {
		t.Errorf("filled() = %v/%d, want the defaults", f.Window, f.Buckets)
	}
	b := BreakerConfig{MinCalls: 1, FailureRate: 0.5, OpenDuration: time.Second, MaxOpenDuration: time.Second, HalfOpenProbes: 1}
	if f := b.filled(); f.Window != DefaultBreakerConfig().Window || f.Buckets != DefaultBreakerConfig().Buckets {
		t.Errorf("breaker filled() = %v/%d, want the defaults", f.Window, f.Buckets)
	}
}
