package sim

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestBuiltins(t *testing.T) {
	t.Parallel()
	required := []string{"healthy", "fast", "flaky", "seed-incident", "outage", "rate-limit-storm",
		"slow-no-errors", "garbage-200", "stream-faults", "down"}
	names := ProfileNames()
	if !slices.IsSorted(names) {
		t.Errorf("ProfileNames() = %v, not sorted", names)
	}
	for _, name := range required {
		if !slices.Contains(names, name) {
			t.Errorf("ProfileNames() = %v, missing %q", names, name)
		}
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := mustBuiltin(t, name)
			if p.Name != name {
				t.Errorf("Name = %q, want %q", p.Name, name)
			}
			if err := p.Validate(); err != nil {
				t.Errorf("Validate() = %v", err)
			}
		})
	}
	if _, ok := Builtin("no-such-profile"); ok {
		t.Error(`Builtin("no-such-profile") found a profile`)
	}
}

func TestBuiltinReturnsFreshValues(t *testing.T) {
	t.Parallel()
	p := mustBuiltin(t, "outage")
	p.Phases[1].Errors.Overloaded = 0
	p.Phases[0].Name = "changed"
	again := mustBuiltin(t, "outage")
	if again.Phases[1].Errors.Overloaded != 1 || again.Phases[0].Name != "healthy" {
		t.Errorf("changing a returned profile changed the built-in: %+v", again.Phases)
	}
}

func TestBuiltinBehaviour(t *testing.T) {
	t.Parallel()
	sum := func(m ErrorMix) float64 {
		var s float64
		for _, w := range m.weights() {
			s += w.p
		}
		return s
	}
	tests := []struct {
		name    string
		elapsed time.Duration
		check   func(t *testing.T, s settings)
	}{
		{"healthy", 0, func(t *testing.T, s settings) {
			if sum(s.errors) != 0 || s.latency != defaultLatency {
				t.Errorf("settings = %+v, want default latency and no errors", s)
			}
		}},
		{"fast", 0, func(t *testing.T, s settings) {
			if s.latency.max() > 50*time.Millisecond || sum(s.errors) != 0 {
				t.Errorf("settings = %+v, want a few ms and no errors", s)
			}
		}},
		{"flaky", 0, func(t *testing.T, s settings) {
			if got := sum(s.errors); got < 0.04 || got > 0.06 {
				t.Errorf("error probability %v, want about 5%%", got)
			}
		}},
		{"seed-incident", 5 * time.Minute, func(t *testing.T, s settings) {
			if s.phase != "incident" {
				t.Fatalf("phase at 5m = %q, want incident", s.phase)
			}
			if q := s.latency.Quantile(0.70); !near(q, 8*time.Second, 50*time.Millisecond) {
				t.Errorf("incident P70 = %v, want 8s (30%% of calls over 8 s)", q)
			}
		}},
		{"outage", 2 * time.Minute, func(t *testing.T, s settings) {
			if s.errors.Overloaded != 1 {
				t.Errorf("outage errors = %+v, want every call 503", s.errors)
			}
		}},
		{"rate-limit-storm", 2 * time.Minute, func(t *testing.T, s settings) {
			if s.errors.RateLimited == 0 || s.errors.RateLimitedNoHint == 0 {
				t.Errorf("storm errors = %+v, want hinted and unhinted 429s", s.errors)
			}
		}},
		{"slow-no-errors", 0, func(t *testing.T, s settings) {
			if s.latency.P99 != 40*time.Second || sum(s.errors) != 0 {
				t.Errorf("settings = %+v, want P99 40s and no errors", s)
			}
		}},
		{"down", 0, func(t *testing.T, s settings) {
			if s.errors.Overloaded != 1 {
				t.Errorf("errors = %+v, want every call 503", s.errors)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.check(t, mustBuiltin(t, tt.name).settingsAt(tt.elapsed))
		})
	}
}

func TestLoadProfile(t *testing.T) {
	t.Parallel()
	const doc = `
name: drill
latency: {min: 100ms, p50: 1s, p95: 4s, p99: 9s, max: 12s}
errors:
  rate_limited: 0.1
  hang: 0.05
  context_length_exceeded: 0.01
script: [server_error, ok, stream_no_done]
time_scale: 0.1
seed: 99
phases:
  - name: healthy
    start: 0s
    duration: 1m
  - name: incident
    start: 1m
    duration: 2m
    errors: {overloaded: 0.5}
    token_delay: 200ms
  - name: recovery
    start: 3m
`
	p, err := LoadProfile(strings.NewReader(doc))
	if err != nil {
		t.Fatalf("LoadProfile: %v", err)
	}
	if p.Name != "drill" || p.Latency.P99 != 9*time.Second || p.Errors.RateLimited != 0.1 ||
		p.Errors.Hang != 0.05 || p.Errors.ContextLengthExceeded != 0.01 || p.TimeScale != 0.1 || p.Seed != 99 || len(p.Phases) != 3 ||
		!slices.Equal(p.Script, []Outcome{OutcomeServerError, OutcomeOK, OutcomeStreamNoDone}) {
		t.Errorf("LoadProfile = %+v", p)
	}
	if p.TTFT != defaultTTFT || p.TokenDelay != defaultTokenDelay || p.RateLimit != defaultRateLimit {
		t.Errorf("omitted keys: ttft %+v, token_delay %v, rate_limit %+v; want the healthy defaults",
			p.TTFT, p.TokenDelay, p.RateLimit)
	}
	if ph := p.Phases[1]; ph.Errors == nil || ph.Errors.Overloaded != 0.5 || ph.TokenDelay == nil ||
		*ph.TokenDelay != 200*time.Millisecond || ph.Latency != nil {
		t.Errorf("phases[1] = %+v", ph)
	}
}

func TestLoadProfileRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		doc     string
		wantErr string
	}{
		{"unknown key", "name: x\nlatncy: {p50: 1s}\n", "latncy"},
		{"unknown nested key", "name: x\nlatency: {p90: 1s}\n", "p90"},
		{"unknown error class", "name: x\nerrors: {timeout: 0.1}\n", "timeout"},
		{"unknown phase key", "name: x\nphases: [{name: a, start: 0s, speed: 2}]\n", "speed"},
		{"duration without unit", "name: x\nlatency: {p50: 5}\n", "line 2"},
		{"probabilities above 1", "name: x\nerrors: {server_error: 0.6, overloaded: 0.5}\n", "errors: probabilities sum to 1.1"},
		{"probability out of range", "name: x\nerrors: {hang: 1.5}\n", "errors.hang"},
		{"negative latency", "name: x\nlatency: {p50: -1s}\n", "latency.p50: negative"},
		{"decreasing percentiles", "name: x\nlatency: {min: 0s, p50: 2s, p95: 1s, p99: 3s, max: 4s}\n", "latency.p95"},
		{"max below p99", "name: x\nlatency: {min: 0s, p50: 1s, p95: 2s, p99: 3s, max: 2s}\n", "latency.max"},
		{"negative ttft", "name: x\nttft: {p50: -2s}\n", "ttft.p50"},
		{"negative token delay", "name: x\ntoken_delay: -1ms\n", "token_delay"},
		{"negative time scale", "name: x\ntime_scale: -1\n", "time_scale"},
		{"phase errors", "name: x\nphases:\n- {name: a, start: 0s}\n- {name: b, start: 1m, errors: {hang: 0.7, reset: 0.7}}\n", "phases[1].errors: probabilities sum"},
		{"phase without name", "name: x\nphases: [{start: 0s}]\n", "phases[0].name: required"},
		{"unsorted phases", "name: x\nphases:\n- {name: a, start: 2m}\n- {name: b, start: 1m}\n", "phases[1].start"},
		{"overlapping phases", "name: x\nphases:\n- {name: a, start: 0s, duration: 2m}\n- {name: b, start: 1m}\n", "inside phases[0]"},
		{"empty", "", "empty"},
		{"two documents", "name: a\n---\nname: b\n", "more than one"},
		{"unknown scripted outcome", "name: x\nscript: [server_error, teapot]\n", `script[1]: unknown outcome "teapot"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := LoadProfile(strings.NewReader(tt.doc))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("LoadProfile error = %v, want one mentioning %q", err, tt.wantErr)
			}
		})
	}
}

func TestPhaseAt(t *testing.T) {
	t.Parallel()
	p := Profile{Phases: []Phase{
		{Name: "healthy", Start: 0, Duration: time.Minute},
		{Name: "incident", Start: 2 * time.Minute, Duration: 3 * time.Minute},
		{Name: "recovery", Start: 5 * time.Minute},
	}}
	scaled := p
	scaled.TimeScale = 0.1
	tests := []struct {
		p       Profile
		elapsed time.Duration
		want    string
	}{
		{p, 0, "healthy"},
		{p, time.Minute - 1, "healthy"},
		{p, time.Minute, ""}, // the gap between a bounded phase and the next
		{p, 2 * time.Minute, "incident"},
		{p, 5*time.Minute - 1, "incident"},
		{p, 5 * time.Minute, "recovery"},
		{p, 100 * time.Hour, "recovery"},
		{scaled, 5 * time.Second, "healthy"},
		{scaled, 12 * time.Second, "incident"},
		{scaled, 30 * time.Second, "recovery"},
		{Profile{}, time.Hour, ""},
	}
	for _, tt := range tests {
		if got := tt.p.PhaseAt(tt.elapsed); got != tt.want {
			t.Errorf("PhaseAt(%v) with time_scale %v = %q, want %q", tt.elapsed, tt.p.TimeScale, got, tt.want)
		}
	}
}

func TestErrorMixPick(t *testing.T) {
	t.Parallel()
	m := ErrorMix{RateLimited: 0.1, Hang: 0.2, StreamStall: 0.3}
	tests := []struct {
		u    float64
		want Outcome
	}{
		{0, OutcomeRateLimited},
		{0.0999, OutcomeRateLimited},
		{0.1, OutcomeHang},
		{0.2999, OutcomeHang},
		{0.3001, OutcomeStreamStall},
		{0.5999, OutcomeStreamStall},
		{0.6001, OutcomeOK},
		{0.9999, OutcomeOK},
	}
	for _, tt := range tests {
		if got := m.pick(tt.u); got != tt.want {
			t.Errorf("pick(%v) = %q, want %q", tt.u, got, tt.want)
		}
	}
}
