package drill

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mantle-mesh/mantle/pkg/sim"
)

func TestBuiltinScenarios(t *testing.T) {
	t.Parallel()
	want := []string{"seed-incident", "all-down", "garbage-200", "provider-outage", "rate-limit-storm", "recovery-herd", "slow-no-errors", "stream-faults", "tool-storm"}
	if got := Names(); !slices.Equal(got, want) {
		t.Fatalf("Names() = %v, want %v", got, want)
	}
	for _, name := range want {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s, err := Builtin(name)
			if err != nil {
				t.Fatalf("Builtin: %v", err)
			}
			if s.Name != name {
				t.Errorf("name = %q, want the file's name %q", s.Name, name)
			}
			if s.Description == "" || s.Incident == nil {
				t.Errorf("description %q, incident %v: every built-in says what it does and when", s.Description, s.Incident)
			}
			if s.Tools != nil {
				if s.Targets.DuplicateActions == nil || *s.Targets.DuplicateActions != 0 {
					t.Error("a tool storm checks that mantle performs no action twice")
				}
				for _, scale := range []float64{s.TimeScale, 0.01} {
					p, err := newPlan(Options{Scenario: s, TimeScale: scale})
					if err != nil {
						t.Fatal(err)
					}
					if err := p.toolMeshConfig("http://127.0.0.1:1/v1", "http://127.0.0.1:2").Validate(); err != nil {
						t.Errorf("tool mesh configuration at scale %g does not validate:\n%v", scale, err)
					}
				}
			} else if s.Targets.DuplicateBilled == nil || *s.Targets.DuplicateBilled != 0 {
				t.Error("every built-in checks that mantle bills no call twice")
			}
			// The mesh configuration the drill runs must be one mantle accepts, at the
			// scenario's scale and at the strong scales tests use.
			for _, scale := range []float64{s.TimeScale, 0.01} {
				if err := s.MeshConfig("http://127.0.0.1:1/v1", scale).Validate(); err != nil {
					t.Errorf("MeshConfig at scale %g does not validate:\n%v", scale, err)
				}
			}
		})
	}
}

func TestBuiltinUnknown(t *testing.T) {
	t.Parallel()
	_, err := Builtin("no-such-drill")
	if err == nil || !strings.Contains(err.Error(), "seed-incident") {
		t.Errorf("Builtin(unknown) error = %v, want one listing the scenarios", err)
	}
}

func TestSeedIncidentProfiles(t *testing.T) {
	t.Parallel()
	s, err := Builtin("seed-incident")
	if err != nil {
		t.Fatal(err)
	}
	primary, _ := s.Model("primary")
	backup, _ := s.Model("backup")
	// The overrides change the normal latency and keep the built-in incident phase.
	if primary.Profile.Latency.P99 != 1200*time.Millisecond || backup.Profile.Latency.P99 != 1200*time.Millisecond {
		t.Errorf("normal P99 = %s and %s, want 1.2s", primary.Profile.Latency.P99, backup.Profile.Latency.P99)
	}
	inc := primary.Profile.Phases[1]
	if inc.Name != "incident" || inc.Start != 2*time.Minute || inc.Latency == nil {
		t.Fatalf("phase 1 = %+v, want the built-in incident at 2m", inc)
	}
	// The reference incident: about 30% of calls over 8 s.
	if q := inc.Latency.Quantile(0.70); q < 7900*time.Millisecond || q > 8100*time.Millisecond {
		t.Errorf("incident 70th percentile = %s, want 8s", q)
	}
	if len(backup.Profile.Phases) != 0 || backup.Profile.Errors != (sim.ErrorMix{}) {
		t.Error("the backup must be healthy throughout")
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	const valid = `
name: tiny
load: {rate: 1, duration: 1m}
models:
  - {name: a, timeout: 1s}
route: {candidates: [a]}
`
	if _, err := Parse(strings.NewReader(valid)); err != nil {
		t.Fatalf("valid scenario: %v", err)
	}
	tests := []struct {
		name, doc, want string
	}{
		{"empty", "", "empty document"},
		{"unknown key", valid + "colour: blue\n", "field colour not found"},
		{"unknown sim key", strings.Replace(valid, "timeout: 1s}", "timeout: 1s, sim: {latency: {p42: 1s}}}", 1), "field p42 not found"},
		{"unknown base profile", strings.Replace(valid, "timeout: 1s}", "timeout: 1s, sim_profile: wobbly}", 1), `unknown profile "wobbly"`},
		{"invalid override", strings.Replace(valid, "timeout: 1s}", "timeout: 1s, sim: {errors: {overloaded: 2}}}", 1), "outside [0, 1]"},
		{"unknown candidate", strings.Replace(valid, "[a]", "[a, b]", 1), `route.candidates[1]: unknown model "b"`},
		{"no rate", strings.Replace(valid, "rate: 1", "rate: 0", 1), "load.rate: must be positive"},
		{"no timeout", strings.Replace(valid, "timeout: 1s", "timeout: 0s", 1), "models[0].timeout: must be positive"},
		{"stream share", strings.Replace(valid, "duration: 1m}", "duration: 1m, stream: 2}", 1), "load.stream: must be in [0, 1]"},
		{"naive model", valid + "naive: {model: z}\n", `naive.model: unknown model "z"`},
		{"incident backwards", valid + "incident: {start: 2m, end: 1m}\n", "incident: want 0 <= start < end"},
		{"time scale", valid + "time_scale: 0\n", "time_scale: must be in (0, 10]"},
		{"route name taken", strings.Replace(strings.Replace(valid, "name: a,", "name: drill,", 1), "[a]", "[drill]", 1), "is the drill's route name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse(strings.NewReader(tt.doc))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse error = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestMeshConfigScalesTime(t *testing.T) {
	t.Parallel()
	s, err := Builtin("seed-incident")
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.MeshConfig("http://sim/v1", 0.1)
	r := cfg.Router
	if len(r.Routes) != 1 || r.Routes[0].Name != RouteName {
		t.Fatalf("routes = %+v, want one named %q", r.Routes, RouteName)
	}
	rt := r.Routes[0]
	checks := []struct {
		name      string
		got, want time.Duration
	}{
		{"route budget", rt.Budget, 300 * time.Millisecond},
		{"default budget", r.DefaultBudget, 300 * time.Millisecond},
		{"hop reserve", r.HopReserve, 10 * time.Millisecond},
		{"primary timeout", r.Providers[0].Timeout, 120 * time.Millisecond},
		{"breaker window", r.Breaker.Window, 3 * time.Second},
		{"breaker open duration", r.Breaker.OpenDuration, 1500 * time.Millisecond},
		{"slow call", r.Breaker.SlowCall, 200 * time.Millisecond},
		{"retry budget window", r.RetryBudget.Window, 3 * time.Second},
		{"hedge budget window", r.HedgeBudget.Window, 3 * time.Second},
		{"backoff base", r.Retry.BackoffBase, 10 * time.Millisecond},
		{"hedge max delay", rt.Hedge.MaxDelay, 90 * time.Millisecond},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %s, want %s", c.name, c.got, c.want)
		}
	}
	for _, p := range r.Providers {
		if p.BaseURL != "http://sim/v1" || p.Type != "openai" {
			t.Errorf("provider %s = %s at %q, want openai at the simulator", p.Name, p.Type, p.BaseURL)
		}
	}
	// Counts and rates do not scale.
	if r.Breaker.MinCalls != 20 || r.Breaker.HalfOpenProbes != 3 || r.RetryBudget.Ratio != 0.2 {
		t.Errorf("breaker %+v, budget %+v: counts and ratios must not scale", r.Breaker, r.RetryBudget)
	}
}

func TestRequestsAreReproducible(t *testing.T) {
	t.Parallel()
	s, err := Builtin("garbage-200") // half of its requests ask for JSON
	if err != nil {
		t.Fatal(err)
	}
	prompts := map[string]bool{}
	jsonCount := 0
	for i := range 1000 {
		r := requestFor(s, i)
		if again := requestFor(s, i); again != r {
			t.Fatalf("request %d differs between calls: %+v and %+v", i, r, again)
		}
		if prompts[r.prompt] {
			t.Fatalf("prompt %q repeated", r.prompt)
		}
		prompts[r.prompt] = true
		if r.json {
			jsonCount++
		}
		if r.stream {
			t.Fatalf("request %d streams; garbage-200 asks for no streams", i)
		}
	}
	if jsonCount < 400 || jsonCount > 600 {
		t.Errorf("%d of 1000 requests ask for JSON, want about half", jsonCount)
	}
}
