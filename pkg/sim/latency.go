package sim

import (
	"fmt"
	"math"
	"time"
)

// Latency is a latency distribution described by its percentiles, the way the seed articles
// and provider dashboards describe it. A value is drawn by taking a uniform number u in
// [0, 1) and interpolating between the percentile points (0, Min), (0.50, P50), (0.95, P95),
// (0.99, P99) and (1, Max) on a log scale. Log-linear interpolation keeps the long tail long:
// halfway between P95 3.2 s and P99 8.5 s lies 5.2 s, not 5.85 s, which matches how latency
// tails look in practice, and it reproduces the configured percentiles exactly.
//
// The zero Latency is always zero, which tests use for instant answers.
type Latency struct {
	// Min is the fastest possible answer. Zero makes the bottom half of the distribution
	// linear from zero to P50 (a log scale cannot start at zero).
	Min time.Duration `yaml:"min,omitempty"`
	P50 time.Duration `yaml:"p50"`
	P95 time.Duration `yaml:"p95"`
	P99 time.Duration `yaml:"p99"`
	// Max caps the tail. Zero means P99: the slowest 1% all take P99.
	Max time.Duration `yaml:"max,omitempty"`
}

// Quantile returns the latency at quantile q (clamped to [0, 1]). It is the inverse of the
// distribution's CDF, so Quantile(u) with u uniform in [0, 1) is a sample; it is exported
// because drills and tests reason about percentiles directly ("what fraction of calls take
// over 8 s").
func (l Latency) Quantile(q float64) time.Duration {
	points := [...]struct {
		q float64
		d time.Duration
	}{
		{0, l.Min},
		{0.50, l.P50},
		{0.95, l.P95},
		{0.99, l.P99},
		{1, l.max()},
	}
	q = math.Max(0, math.Min(1, q))
	for i := 1; i < len(points); i++ {
		if q <= points[i].q {
			lo, hi := points[i-1], points[i]
			return interpolate(lo.d, hi.d, (q-lo.q)/(hi.q-lo.q))
		}
	}
	return points[len(points)-1].d
}

func (l Latency) max() time.Duration {
	if l.Max == 0 {
		return l.P99
	}
	return l.Max
}

// interpolate returns the point at fraction f between lo and hi, geometrically when it can
// (both ends positive) and linearly otherwise.
func interpolate(lo, hi time.Duration, f float64) time.Duration {
	if lo <= 0 || hi <= 0 {
		return lo + time.Duration(f*float64(hi-lo))
	}
	return time.Duration(float64(lo) * math.Pow(float64(hi)/float64(lo), f))
}

// validate reports problems with l, naming each by its YAML key under path.
func (l Latency) validate(path string) []string {
	var problems []string
	fields := []struct {
		key string
		d   time.Duration
	}{{"min", l.Min}, {"p50", l.P50}, {"p95", l.P95}, {"p99", l.P99}, {"max", l.Max}}
	for _, f := range fields {
		if f.d < 0 {
			problems = append(problems, fmt.Sprintf("%s.%s: negative duration %s", path, f.key, f.d))
		}
	}
	if len(problems) > 0 {
		return problems
	}
	order := []struct {
		key string
		d   time.Duration
	}{{"min", l.Min}, {"p50", l.P50}, {"p95", l.P95}, {"p99", l.P99}, {"max", l.max()}}
	for i := 1; i < len(order); i++ {
		prev, cur := order[i-1], order[i]
		if cur.d < prev.d {
			problems = append(problems, fmt.Sprintf("%s.%s: %s is below %s.%s %s (percentiles must not decrease)",
				path, cur.key, cur.d, path, prev.key, prev.d))
		}
	}
	return problems
}
