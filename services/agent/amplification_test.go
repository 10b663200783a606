package agent

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestOutageAmplification: 100 calls of a query tool during a total outage (every call
// times out) make at most 1.3 backend calls per call: the retry budget and the breaker
// bound what "3 retries every 5 s" multiplied twenty thousand-fold.
func TestOutageAmplification(t *testing.T) {
	t.Parallel()
	h := newHarness(t, query("flaky"))
	h.script("flaky", fail(failUnknown, "timeout"))
	const calls = 100
	unavailable := 0
	for i := range calls {
		_, err := h.call(t, CallRequest{Name: "flaky", Arguments: `{"i":` + itoa(i) + `}`})
		if errors.As(err, new(*UnavailableError)) {
			unavailable++
		}
		h.clock.Advance(time.Second) // one call a second
	}
	got := float64(h.backends["flaky"].count()) / calls
	if got > 1.3 {
		t.Errorf("%d backend calls for %d calls: %.2f per call, want at most 1.3", h.backends["flaky"].count(), calls, got)
	}
	if unavailable != calls {
		t.Errorf("%d of %d calls unavailable, want all (nothing stale to serve)", unavailable, calls)
	}
	t.Logf("%.2f backend calls per call", got)
}

// TestReloadKeepsUnchangedTools: a reload keeps the breaker of a tool whose configuration
// did not change, rebuilds a changed one, and drops a removed one's stale results.
func TestReloadKeepsUnchangedTools(t *testing.T) {
	t.Parallel()
	h := newHarness(t, query("a"), query("b"), query("c"))
	before := h.tools.reg.Load()
	for range 5 {
		p, _ := before.tools["a"].breaker.Allow()
		p.Done(true, 0)
	}
	h.tools.stale.put(staleKey{"acme", "c", "x"}, "{}", h.clock.Now())
	cfg := DefaultConfig()
	b := query("b")
	b.Description = "changed"
	cfg.Tools = []ToolConfig{query("a"), b}
	if err := h.tools.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	after := h.tools.reg.Load()
	if after.tools["a"] != before.tools["a"] || after.tools["a"].breaker.Snapshot().State.String() != "open" {
		t.Error("the unchanged tool lost its (open) breaker")
	}
	if after.tools["b"] == before.tools["b"] {
		t.Error("the changed tool was kept")
	}
	if _, ok := after.tools["c"]; ok || h.tools.stale.count("c") != 0 {
		t.Error("the removed tool or its stale results are still there")
	}
	if after.revision == before.revision {
		t.Error("the revision did not change")
	}
	bad := cfg
	bad.Tools = append(bad.Tools, ToolConfig{Name: "x"})
	if err := h.tools.Reload(bad); err == nil || h.tools.reg.Load() != after {
		t.Errorf("an invalid reload = %v; the registry must stay", err)
	}
	if _, err := h.tools.Call(context.Background(), CallRequest{Tenant: "acme", Name: "c"}); !errors.Is(err, ErrUnknownTool) {
		t.Errorf("call of the removed tool = %v, want ErrUnknownTool", err)
	}
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{byte('0' + i%10)}, b...)
	}
	return string(b)
}
