package drill

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestToolStorm runs the tool-storm scenario on both sides at a strong time scale and
// checks its invariants, never its timings: mantle performs no action twice, asks the
// flaky query tool at most 1.3 times per query step, and every session ends (done,
// partial or pending confirmation); the naive agent's blind retries perform actions twice.
func TestToolStorm(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent sessions through an in-process mesh (about 45 s)")
	}
	s, err := Builtin("tool-storm")
	if err != nil {
		t.Fatal(err)
	}
	// Three minutes healthy and four of the incident, at 0.05: 21 s of wall time per side.
	// At 0.05 the 2 s tool timeout is 100 ms of wall time, which leaves the mesh's own time
	// under the race detector on a loaded machine out of the verdict (at 0.02 it did not).
	var csv bytes.Buffer
	rep, err := Run(context.Background(), Options{Scenario: s, TimeScale: 0.05, Rate: 0.5, Duration: 7 * time.Minute, Requests: &csv})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if rep.Tools == nil || len(rep.Tools.Sides) != 2 {
		t.Fatalf("report has no tool figures for both sides: %+v", rep.Tools)
	}
	const sessions = 210 // 0.5 a second for 7 minutes
	m, n := rep.Tools.side(SideMantle), rep.Tools.side(SideNaive)
	if m == nil || n == nil {
		t.Fatalf("sides %+v", rep.Tools.Sides)
	}
	for _, sd := range []*ToolSide{m, n} {
		if sd.Sessions != sessions {
			t.Errorf("%s: %d sessions, want %d", sd.Name, sd.Sessions, sessions)
		}
		if got := sd.Done + sd.Stale + sd.Partial + sd.Pending + sd.Hung; got != sd.Sessions {
			t.Errorf("%s: outcomes add up to %d, want %d", sd.Name, got, sd.Sessions)
		}
		if sd.LogicalQueries == 0 || sd.Actions == 0 {
			t.Errorf("%s: %d query steps, %d actions: the sessions did not run", sd.Name, sd.LogicalQueries, sd.Actions)
		}
	}
	if m.ActionsTwice != 0 || m.DuplicateExecutions != 0 {
		t.Errorf("mantle performed %d actions twice (%d extra executions); idempotency keys and no blind retry must prevent it", m.ActionsTwice, m.DuplicateExecutions)
	}
	if m.QueryAmplification > 1.3 {
		t.Errorf("mantle made %.3f query calls per query step (%d for %d), want at most 1.3", m.QueryAmplification, m.QueryCalls, m.LogicalQueries)
	}
	if m.Hung != 0 {
		t.Errorf("%d of mantle's sessions never ended", m.Hung)
	}
	if m.Stale == 0 {
		t.Error("no mantle session answered a query from its last good result during the incident")
	}
	if m.Pending == 0 {
		t.Error("no mantle session has an action pending confirmation, though some actions' answers were lost")
	}
	if n.ActionsTwice == 0 {
		t.Error("the naive agent's blind retries never performed an action twice")
	}
	if n.QueryAmplification <= m.QueryAmplification {
		t.Errorf("naive amplification %.3f is not above mantle's %.3f", n.QueryAmplification, m.QueryAmplification)
	}
	// What the agent published on NATS agrees with what the agents saw.
	if got := m.SessionEvents["ended"]; got != m.Sessions-m.Hung {
		t.Errorf("%d session-ended events, want one per session that ended (%d)", got, m.Sessions-m.Hung)
	}
	if got := m.SessionEvents["pending_confirmation"]; got != m.Pending {
		t.Errorf("%d pending-confirmation events, want one per session with a pending action (%d)", got, m.Pending)
	}
	if m.SessionEvents["degraded"] == 0 || m.SessionEvents["malformed"] != 0 {
		t.Errorf("session events %v: want degradations and nothing malformed", m.SessionEvents)
	}
	opened := false
	for _, tr := range m.ToolBreakers {
		opened = opened || (tr.Tool == toolQuery && tr.To == "open")
	}
	if !opened {
		t.Errorf("the query tool's breaker never opened during its outage: %+v", m.ToolBreakers)
	}
	if n.SessionEvents != nil || n.ToolBreakers != nil {
		t.Error("the naive side has events")
	}
	if len(rep.Checks) != 3 {
		t.Errorf("checks %+v, want the 3 targets", rep.Checks)
	}

	var text, html, js bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"actions executed twice or more", "query calls per logical query", "pending confirmation", "targets (mantle)"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}
	if err := rep.WriteHTML(&html); err != nil || !strings.Contains(html.String(), "query calls per logical query") {
		t.Errorf("HTML report: %v", err)
	}
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || back.Tools == nil || back.Tools.Sides[0].Actions != m.Actions {
		t.Errorf("JSON report does not round-trip the tool figures: %v", err)
	}
	// One line per session of each side, after the header.
	lines := strings.Split(strings.TrimSpace(csv.String()), "\n")
	if len(lines) != 1+2*sessions || lines[0]+"\n" != requestsCSVHeader {
		t.Fatalf("requests CSV has %d lines (want %d) starting %q", len(lines), 1+2*sessions, lines[0])
	}
	pending := 0
	for _, l := range lines[1 : 1+sessions] {
		if strings.Contains(l, ",pending,") {
			pending++
		}
	}
	if pending != m.Pending {
		t.Errorf("requests CSV has %d pending sessions of mantle's, the report %d", pending, m.Pending)
	}
	t.Log("\n" + text.String())
}
