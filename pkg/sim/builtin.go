package sim

import (
	"slices"
	"time"
)

// The seed articles' typical model latency: P50 0.7 s, P95 3.2 s, P99 8.5 s.
// Min and Max bound what the articles leave open: nothing answers faster than a network
// round trip plus a little generation, and client timeouts cut the tail well before 20 s.
var defaultLatency = Latency{
	Min: 150 * time.Millisecond,
	P50: 700 * time.Millisecond,
	P95: 3200 * time.Millisecond,
	P99: 8500 * time.Millisecond,
	Max: 20 * time.Second,
}

// First-token delay for streams: a separate and shorter distribution (P50 300 ms).
var defaultTTFT = Latency{
	Min: 80 * time.Millisecond,
	P50: 300 * time.Millisecond,
	P95: 1200 * time.Millisecond,
	P99: 3 * time.Second,
	Max: 8 * time.Second,
}

const defaultTokenDelay = 20 * time.Millisecond

// incidentLatency is the reference incident: "about 30% of requests took over 8 s" against a
// 3 s design target. With P50 5 s and P95 14.4 s, log-linear interpolation puts 8 s at the
// 70th percentile, so exactly 30% of calls take longer.
var incidentLatency = Latency{
	Min: 300 * time.Millisecond,
	P50: 5 * time.Second,
	P95: 14400 * time.Millisecond,
	P99: 25 * time.Second,
	Max: 30 * time.Second,
}

// defaultRateLimit gives every built-in a realistic key to report in x-ratelimit-* headers
// without getting in the way of ordinary traffic.
var defaultRateLimit = RateLimit{RequestsPerMinute: 10_000, TokensPerMinute: 2_000_000}

func healthy() Profile {
	return Profile{
		Name:        "healthy",
		Description: "the seeds' typical latency (P50 0.7 s, P95 3.2 s, P99 8.5 s), no errors",
		Latency:     defaultLatency,
		TTFT:        defaultTTFT,
		TokenDelay:  defaultTokenDelay,
		RetryAfter:  2 * time.Second,
		RateLimit:   defaultRateLimit,
	}
}

func ptr[T any](v T) *T { return &v }

// builtins builds every named profile. It is a function rather than a package variable so
// that callers get fresh values (profiles hold slices and pointers) and nothing global can
// be mutated.
func builtins() map[string]Profile {
	fastLatency := Latency{Min: time.Millisecond, P50: 2 * time.Millisecond, P95: 5 * time.Millisecond,
		P99: 10 * time.Millisecond, Max: 20 * time.Millisecond}

	fast := healthy()
	fast.Name, fast.Description = "fast", "a few milliseconds per call, no errors: for tests and development"
	fast.Latency, fast.TTFT, fast.TokenDelay = fastLatency, fastLatency, time.Millisecond

	flaky := healthy()
	flaky.Name, flaky.Description = "flaky", "typical latency with about 5% mixed failures"
	flaky.Errors = ErrorMix{
		RateLimited: 0.01, ServerError: 0.01, Overloaded: 0.01, Reset: 0.005,
		ErrorIn200: 0.005, MalformedJSON: 0.005, Truncated: 0.005,
	}

	seedIncident := healthy()
	seedIncident.Name = "seed-incident"
	seedIncident.Description = "the reference incident: healthy for 2 min, then 10 min with 30% of calls over 8 s, then recovery"
	seedIncident.Phases = []Phase{
		{Name: "healthy", Start: 0, Duration: 2 * time.Minute},
		{
			Name: "incident", Start: 2 * time.Minute, Duration: 10 * time.Minute,
			Latency: ptr(incidentLatency),
			TTFT: &Latency{Min: 200 * time.Millisecond, P50: 3 * time.Second, P95: 9 * time.Second,
				P99: 15 * time.Second, Max: 20 * time.Second},
			Errors: &ErrorMix{Overloaded: 0.02, ServerError: 0.01},
		},
		{Name: "recovery", Start: 12 * time.Minute},
	}

	outage := healthy()
	outage.Name, outage.Description = "outage", "healthy for 1 min, every call 503 for 5 min, then recovery"
	outage.Phases = []Phase{
		{Name: "healthy", Start: 0, Duration: time.Minute},
		{Name: "outage", Start: time.Minute, Duration: 5 * time.Minute, Errors: &ErrorMix{Overloaded: 1}},
		{Name: "recovery", Start: 6 * time.Minute},
	}

	storm := healthy()
	storm.Name, storm.Description = "rate-limit-storm", "healthy for 1 min, then 5 min where 60% of calls get 429 (a third of them without a hint)"
	storm.Phases = []Phase{
		{Name: "healthy", Start: 0, Duration: time.Minute},
		{Name: "storm", Start: time.Minute, Duration: 5 * time.Minute,
			Errors: &ErrorMix{RateLimited: 0.4, RateLimitedNoHint: 0.2}},
		{Name: "recovery", Start: 6 * time.Minute},
	}

	// Seed 004: "a vendor at P99 40 s with 0% errors": only a slow-call breaker notices.
	slow := healthy()
	slow.Name, slow.Description = "slow-no-errors", "P99 40 s and no errors at all: only slow-call detection can catch it"
	slow.Latency = Latency{Min: 500 * time.Millisecond, P50: 5 * time.Second, P95: 20 * time.Second,
		P99: 40 * time.Second, Max: 60 * time.Second}
	slow.TTFT = Latency{Min: 300 * time.Millisecond, P50: 3 * time.Second, P95: 10 * time.Second,
		P99: 20 * time.Second, Max: 30 * time.Second}
	slow.TokenDelay = 100 * time.Millisecond

	// Seed 001: failures that come back as 200s.
	garbage := healthy()
	garbage.Name, garbage.Description = "garbage-200", "30% of answers are 200s carrying an error, broken JSON, a refusal or a truncation"
	garbage.Errors = ErrorMix{ErrorIn200: 0.1, MalformedJSON: 0.1, Refusal: 0.05, Truncated: 0.05}

	streams := healthy()
	streams.Name, streams.Description = "stream-faults", "streams that break: 10% cut without [DONE], 5% stall, 5% truncated"
	streams.Errors = ErrorMix{StreamCut: 0.1, StreamStall: 0.05, Truncated: 0.05}

	down := healthy()
	down.Name, down.Description = "down", "every call fails with 503"
	down.Errors = ErrorMix{Overloaded: 1}

	all := []Profile{healthy(), fast, flaky, seedIncident, outage, storm, slow, garbage, streams, down}
	m := make(map[string]Profile, len(all))
	for _, p := range all {
		m[p.Name] = p
	}
	return m
}

// Builtin returns the named built-in profile. Each call returns a fresh value the caller may
// modify (for example to set TimeScale for a fast drill).
func Builtin(name string) (Profile, bool) {
	p, ok := builtins()[name]
	return p, ok
}

// ProfileNames returns the names of the built-in profiles, sorted.
func ProfileNames() []string {
	names := make([]string, 0, 16)
	for name := range builtins() {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}
