package drill

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
)

// smallRun is the scale a scenario runs at in tests: a strong time scale, a low rate and,
// where the scenario allows, a shortened duration, so each side takes a second or a few.
// Tests check the report's invariants, never its timings.
type smallRun struct {
	scale    float64
	rate     float64
	duration time.Duration
}

var smallRuns = map[string]smallRun{
	// Two minutes healthy, then four of the incident: enough for the naive client to fail.
	// At 0.05 the 3 s budget is 150 ms of wall time, which leaves the mesh's own time under
	// the race detector on a loaded machine out of the verdict (at 0.02 it did not).
	"seed-incident":    {0.05, 2, 6 * time.Minute},
	"all-down":         {0.01, 1, 2 * time.Minute},
	"garbage-200":      {0.01, 1, 3 * time.Minute},
	"provider-outage":  {0.01, 1, 3 * time.Minute},
	"rate-limit-storm": {0.01, 1, 3 * time.Minute},
	"recovery-herd":    {0.01, 1, 6 * time.Minute},
	"slow-no-errors":   {0.01, 1, 3 * time.Minute},
	"stream-faults":    {0.01, 1, 3 * time.Minute},
}

func TestScenarioInvariants(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every scenario on both sides (about 40 s)")
	}
	for _, name := range Names() {
		if name == "tool-storm" {
			continue // TestToolStorm
		}
		small, ok := smallRuns[name]
		if !ok {
			t.Fatalf("no small-scale run for scenario %s", name)
		}
		t.Run(name, func(t *testing.T) {
			s, err := Builtin(name)
			if err != nil {
				t.Fatal(err)
			}
			rep, err := Run(context.Background(), Options{Scenario: s, TimeScale: small.scale, Rate: small.rate, Duration: small.duration, Buckets: 20})
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			wantRequests := int(math.Round(small.rate * small.duration.Seconds()))
			if rep.Requests != wantRequests || len(rep.Sides) != 2 || rep.Sides[0].Name != SideMantle || rep.Sides[1].Name != SideNaive {
				t.Fatalf("report has %d requests and sides %v, want %d and [mantle naive]", rep.Requests, sideNames(rep), wantRequests)
			}
			for _, sd := range rep.Sides {
				checkSide(t, rep, &sd)
			}
			m, n := rep.Side(SideMantle), rep.Side(SideNaive)
			if m.DuplicateBilled != 0 {
				t.Errorf("mantle billed %d calls twice; idempotency keys must prevent every duplicate bill", m.DuplicateBilled)
			}
			if len(rep.Checks) == 0 {
				t.Error("no target was checked")
			}
			switch name {
			case "seed-incident":
				if n.SuccessRate >= m.SuccessRate {
					t.Errorf("naive success rate %.4f is not below mantle's %.4f on the seed's incident", n.SuccessRate, m.SuccessRate)
				}
				if n.DuplicateBilled == 0 {
					t.Error("the naive client's timed-out retries were never billed twice")
				}
			case "all-down":
				// No model can answer: mantle's answers all come from the ladder, marked;
				// the naive client answers nothing.
				if m.Answered != m.Degraded || m.Marked != m.Degraded {
					t.Errorf("mantle answered %d, %d from the ladder, %d marked; want all from the ladder and marked", m.Answered, m.Degraded, m.Marked)
				}
				if n.Answered != 0 {
					t.Errorf("naive answered %d requests with every model down", n.Answered)
				}
			}
		})
	}
}

func checkSide(t *testing.T, rep *Report, sd *Side) {
	t.Helper()
	if sd.Requests != rep.Requests {
		t.Errorf("%s: %d requests, want %d", sd.Name, sd.Requests, rep.Requests)
	}
	if sd.Answered+sd.Failed != sd.Requests {
		t.Errorf("%s: answered %d + failed %d != requests %d", sd.Name, sd.Answered, sd.Failed, sd.Requests)
	}
	if sd.Correct+sd.Wrong+sd.Degraded != sd.Answered {
		t.Errorf("%s: correct %d + wrong %d + degraded %d != answered %d", sd.Name, sd.Correct, sd.Wrong, sd.Degraded, sd.Answered)
	}
	failures := 0
	for _, n := range sd.Failures {
		failures += n
	}
	if failures != sd.Failed {
		t.Errorf("%s: failure reasons add up to %d, want %d", sd.Name, failures, sd.Failed)
	}
	levels, shares := 0, 0.0
	for l := range sd.Levels {
		levels += sd.Levels[l]
		shares += sd.LevelShares[l]
	}
	if levels != sd.Answered {
		t.Errorf("%s: answers per level add up to %d, want %d", sd.Name, levels, sd.Answered)
	}
	if sd.Answered > 0 && math.Abs(shares-1) > 1e-9 {
		t.Errorf("%s: level shares add up to %v, want 1", sd.Name, shares)
	}
	if sd.Name == SideNaive && sd.Levels[0] != sd.Answered {
		t.Errorf("naive: answers below L0 %v; the naive client has no ladder", sd.Levels)
	}
	var calls, billed, dup int64
	for _, mc := range sd.Models {
		calls += mc.Calls
		billed += mc.Billed
		dup += mc.DuplicateBilled
		var outcomes int64
		for _, n := range mc.Outcomes {
			outcomes += n
		}
		if outcomes != mc.Calls {
			t.Errorf("%s: outcomes add up to %d, want %d calls", sd.Name, outcomes, mc.Calls)
		}
	}
	if calls != sd.UpstreamCalls || billed != sd.Billed || dup != sd.DuplicateBilled || dup > billed || billed > calls {
		t.Errorf("%s: per model calls %d billed %d duplicate %d; totals %d, %d, %d", sd.Name, calls, billed, dup, sd.UpstreamCalls, sd.Billed, sd.DuplicateBilled)
	}
	if want := float64(sd.UpstreamCalls) / float64(sd.Requests); math.Abs(sd.Amplification-want) > 1e-9 {
		t.Errorf("%s: amplification %v, want %v", sd.Name, sd.Amplification, want)
	}
	if sd.Name == SideNaive {
		// At most 1 + retries calls per request.
		if max := float64(1 + 3); sd.Amplification > max {
			t.Errorf("naive: %v calls per request, more than its %v tries", sd.Amplification, max)
		}
	}
	bucketRequests, bucketCalls := 0, 0
	for _, b := range sd.Timeline {
		bucketRequests += b.Requests
		bucketCalls += b.UpstreamCalls
		if b.Answered > b.Requests || b.Correct > b.Answered {
			t.Errorf("%s: bucket at %.0f s has %d requests, %d answered, %d correct", sd.Name, b.StartS, b.Requests, b.Answered, b.Correct)
		}
	}
	if bucketRequests != sd.Requests || int64(bucketCalls) > sd.UpstreamCalls {
		t.Errorf("%s: timeline holds %d requests and %d calls, want %d and at most %d", sd.Name, bucketRequests, bucketCalls, sd.Requests, sd.UpstreamCalls)
	}
	if sd.Latency.P50 > sd.Latency.P95 || sd.Latency.P95 > sd.Latency.P99 || sd.Latency.P99 > sd.Latency.Max {
		t.Errorf("%s: percentiles out of order: %+v", sd.Name, sd.Latency)
	}
	if sd.Name == SideMantle {
		if sd.Verified == nil || *sd.Verified > sd.Answered {
			t.Errorf("mantle: verified %v of %d answers", sd.Verified, sd.Answered)
		}
		for _, mb := range sd.Breakers {
			if mb.Trips > len(mb.Transitions) {
				t.Errorf("mantle: breaker %s: %d trips in %d transitions", mb.Model, mb.Trips, len(mb.Transitions))
			}
		}
		// Every answer says what mantle spent on it; its own time (wall clock) is part of
		// what the user waited, and so is what mantle held it on purpose (scenario time).
		// A request's scenario latency counts mantle's own time as it was, unstretched by
		// the scale (scenarioLatency), so the slowest request waited at least the longest
		// own time, however long a loaded machine made that.
		switch o, w := sd.Overhead, sd.Waited; {
		case sd.Answered > 0 && (o == nil || w == nil):
			t.Errorf("mantle: %d answers and no overhead (%v) or waits (%v) reported", sd.Answered, o, w)
		case o != nil && (o.P50 <= 0 || o.P50 > o.P95 || o.P95 > o.P99 || o.P99 > o.Max || o.Max > sd.Latency.Max*(1+1e-9)):
			t.Errorf("mantle: own time %+v out of order or over the latency max %v ms", *o, sd.Latency.Max)
		case w != nil && (w.P50 < 0 || w.P50 > w.P95 || w.P95 > w.P99 || w.P99 > w.Max || w.Max > sd.Latency.Max):
			t.Errorf("mantle: waits %+v out of order or over the latency max %v ms", *w, sd.Latency.Max)
		}
	} else if sd.Overhead != nil || sd.Waited != nil {
		t.Errorf("%s: overhead %v, waited %v from a client without mantle", sd.Name, sd.Overhead, sd.Waited)
	}
}

func sideNames(r *Report) []string {
	var out []string
	for _, s := range r.Sides {
		out = append(out, s.Name)
	}
	return out
}

// A report renders as text, JSON that reads back the same, and one HTML page that loads
// nothing from anywhere.
func TestReportRenders(t *testing.T) {
	t.Parallel()
	s, err := Builtin("all-down")
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Run(context.Background(), Options{Scenario: s, TimeScale: 0.01, Rate: 1, Duration: time.Minute, Buckets: 10})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}

	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"all-down:", "mantle", "naive", "upstream calls per request", "answers at L3 template", "targets (mantle)"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}

	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatalf("JSON does not read back: %v", err)
	}
	if back.Requests != rep.Requests || len(back.Sides) != 2 || back.Sides[0].Answered != rep.Sides[0].Answered {
		t.Errorf("JSON read back as %d requests, %d sides", back.Requests, len(back.Sides))
	}

	var page bytes.Buffer
	if err := rep.WriteHTML(&page); err != nil {
		t.Fatal(err)
	}
	html := page.String()
	if got := strings.Count(html, "<svg"); got != 4 {
		t.Errorf("HTML has %d charts, want 4", got)
	}
	if external := regexp.MustCompile(`(?i)(src|href)\s*=|@import|url\(`).FindString(html); external != "" {
		t.Errorf("HTML refers to something outside the page (%q); it must be self-contained", external)
	}
}

func TestRunRejectsBadOptions(t *testing.T) {
	t.Parallel()
	s, err := Builtin("all-down")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		opts Options
		want string
	}{
		{"no scenario", Options{}, "no scenario"},
		{"time scale", Options{Scenario: s, TimeScale: 11}, "time scale must be in"},
		{"side", Options{Scenario: s, Sides: []string{"mantle", "clever"}}, `unknown side "clever"`},
		{"too fast", Options{Scenario: s, TimeScale: 0.0001, Rate: 100}, "rate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Run(context.Background(), tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Run error = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// A drill can drive a mesh that is already running, configured to reach the drill's
// simulator at a fixed address, and read its breaker events from the mesh's NATS.
func TestRunAgainstRunningMesh(t *testing.T) {
	t.Parallel()
	s, err := Builtin("provider-outage")
	if err != nil {
		t.Fatal(err)
	}
	// 0.05 replays the two minutes in six seconds: at 0.01 a loaded CI machine's scheduling
	// hiccups were as long as the outage's first calls, and the trip could be missed.
	const scale = 0.05
	simAddr := freeAddr(t)
	m := meshtest.StartWith(t, s.MeshConfig("http://"+simAddr+"/v1", scale), meshtest.All, mesh.Options{Getenv: simKeyEnv})
	rep, err := Run(context.Background(), Options{
		Scenario: s, TimeScale: scale, Rate: 2, Duration: 2 * time.Minute, Sides: []string{SideMantle},
		MeshURL: "http://" + m.HTTPAddr, NATSURL: m.NATSURL, SimAddr: simAddr,
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !strings.HasPrefix(rep.Target, "mesh at http://") || len(rep.Sides) != 1 {
		t.Fatalf("target %q with %d sides", rep.Target, len(rep.Sides))
	}
	sd := rep.Sides[0]
	checkSide(t, rep, &sd)
	if sd.UpstreamCalls == 0 || sd.Answered == 0 {
		t.Errorf("%d upstream calls, %d answered: the running mesh did not reach the drill's simulator", sd.UpstreamCalls, sd.Answered)
	}
	// The outage starts a minute in: the primary's breaker opens, and the drill saw it.
	if mb := sd.breaker("primary"); mb == nil || mb.Trips == 0 {
		t.Errorf("breakers %+v: no trip of the primary was read from the mesh's events", sd.Breakers)
	}
}

// freeAddr returns a loopback address nothing listens on right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
