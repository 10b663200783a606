package sim

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestQuantileHitsConfiguredPoints(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		l    Latency
	}{
		{"default", defaultLatency},
		{"ttft", defaultTTFT},
		{"incident", incidentLatency},
		{"min zero", Latency{P50: time.Second, P95: 2 * time.Second, P99: 4 * time.Second, Max: 8 * time.Second}},
		{"max zero caps at p99", Latency{Min: time.Millisecond, P50: time.Second, P95: 2 * time.Second, P99: 4 * time.Second}},
		{"constant", Latency{Min: time.Second, P50: time.Second, P95: time.Second, P99: time.Second, Max: time.Second}},
		{"zero", Latency{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			points := []struct {
				q    float64
				want time.Duration
			}{
				{0, tt.l.Min}, {0.5, tt.l.P50}, {0.95, tt.l.P95}, {0.99, tt.l.P99}, {1, tt.l.max()},
				{-1, tt.l.Min}, {2, tt.l.max()},
			}
			for _, p := range points {
				if got := tt.l.Quantile(p.q); !near(got, p.want, time.Microsecond) {
					t.Errorf("Quantile(%v) = %v, want %v", p.q, got, p.want)
				}
			}
			prev := time.Duration(-1)
			for i := 0; i <= 1000; i++ {
				got := tt.l.Quantile(float64(i) / 1000)
				if got < prev {
					t.Fatalf("Quantile(%v) = %v, below Quantile at the previous step %v: not monotone", float64(i)/1000, got, prev)
				}
				prev = got
			}
		})
	}
}

func TestQuantileInterpolatesOnALogScale(t *testing.T) {
	t.Parallel()
	// Halfway between P95 3.2 s and P99 8.5 s is their geometric mean, not their average.
	got := defaultLatency.Quantile(0.97)
	want := time.Duration(math.Sqrt(3.2 * 8.5 * float64(time.Second) * float64(time.Second)))
	if !near(got, want, time.Millisecond) {
		t.Errorf("Quantile(0.97) = %v, want %v", got, want)
	}
}

// TestSampledPercentiles checks the sampler as a whole: 100k draws from a seeded generator
// have the configured percentiles.
func TestSampledPercentiles(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		l    Latency
	}{
		{"seeds' default", defaultLatency},
		{"incident", incidentLatency},
		{"slow-no-errors", mustBuiltin(t, "slow-no-errors").Latency},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(7, 11))
			draws := make([]time.Duration, 100_000)
			for i := range draws {
				draws[i] = tt.l.Quantile(rng.Float64())
			}
			slices.Sort(draws)
			for _, p := range []struct {
				q    float64
				want time.Duration
			}{{0.50, tt.l.P50}, {0.95, tt.l.P95}, {0.99, tt.l.P99}} {
				got := draws[int(p.q*float64(len(draws)))]
				if rel := math.Abs(float64(got-p.want)) / float64(p.want); rel > 0.03 {
					t.Errorf("empirical P%v = %v, want %v within 3%% (off by %.1f%%)", p.q*100, got, p.want, rel*100)
				}
			}
			if draws[0] < tt.l.Min || draws[len(draws)-1] > tt.l.Max {
				t.Errorf("draws span [%v, %v], outside [min %v, max %v]", draws[0], draws[len(draws)-1], tt.l.Min, tt.l.Max)
			}
		})
	}
}

// TestIncidentTail pins the seed's incident: about 30% of calls take over 8 s.
func TestIncidentTail(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 100_000
	slow := 0
	for range n {
		if incidentLatency.Quantile(rng.Float64()) > 8*time.Second {
			slow++
		}
	}
	if frac := float64(slow) / n; math.Abs(frac-0.30) > 0.01 {
		t.Errorf("fraction of incident calls over 8s = %.3f, want 0.30 ± 0.01", frac)
	}
}

func near(got, want, tolerance time.Duration) bool {
	d := got - want
	return d <= tolerance && d >= -tolerance
}

func mustBuiltin(t *testing.T, name string) Profile {
	t.Helper()
	p, ok := Builtin(name)
	if !ok {
		t.Fatalf("Builtin(%q) not found", name)
	}
	return p
}
