package agent

import (
	"context"
	"fmt"
	"slices"
	"testing"

	agentv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/agent/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// TestListToolsHealth: a tool's health (breaker, counters, recent outcomes oldest first)
// is in ListTools when asked for, and never without asking; the operator's DescribeTools
// carries the same recent outcomes.
func TestListToolsHealth(t *testing.T) {
	t.Parallel()
	h := newHarness(t, query("lookup"))
	s := &toolServer{tools: h.tools}
	ctx := context.Background()

	h.script("lookup", answer(`{"ok":true}`))
	if _, err := h.call(t, CallRequest{Name: "lookup", Arguments: `{"q":"a"}`}); err != nil {
		t.Fatal(err)
	}
	h.script("lookup", step{result: `{"error":"no"}`, isError: true})
	if _, err := h.call(t, CallRequest{Name: "lookup", Arguments: `{"q":"b"}`}); err != nil {
		t.Fatal(err)
	}
	h.script("lookup", fail(failRefused, "unavailable"))
	res, err := h.call(t, CallRequest{Name: "lookup", Arguments: `{"q":"a"}`})
	if err != nil || res.Status != StatusStale {
		t.Fatalf("stale call = %+v, %v", res, err)
	}
	failed := int64(len(res.Attempts)) // each of the stale call's attempts failed

	plain, err := s.ListTools(ctx, &agentv1.ListToolsRequest{})
	if err != nil || plain.GetTools()[0].GetHealth() != nil {
		t.Errorf("ListTools without include_health = %v, %v; want no health", plain, err)
	}
	resp, err := s.ListTools(ctx, &agentv1.ListToolsRequest{IncludeHealth: true})
	if err != nil {
		t.Fatal(err)
	}
	health := resp.GetTools()[0].GetHealth()
	want := []string{"ok", "tool_error", "stale"}
	if !slices.Equal(health.GetRecentOutcomes(), want) || health.GetCalls() != 3 || health.GetFailures() != failed || health.GetStaleAnswers() != 1 ||
		health.GetBreaker() != mantlev1.BreakerState_BREAKER_STATE_CLOSED {
		t.Errorf("health = %v, want outcomes %v, 3 calls, %d failures, 1 stale answer, breaker closed", health, want, failed)
	}
	described, err := s.DescribeTools(ctx, &agentv1.DescribeToolsRequest{})
	if err != nil || !slices.Equal(described.GetTools()[0].GetRecentOutcomes(), want) {
		t.Errorf("DescribeTools recent outcomes = %v, %v; want %v", described.GetTools()[0].GetRecentOutcomes(), err, want)
	}
}

// TestRecentOutcomesRing: the ring keeps the last maxRecentOutcomes, oldest first.
func TestRecentOutcomesRing(t *testing.T) {
	t.Parallel()
	for _, n := range []int{0, 1, maxRecentOutcomes - 1, maxRecentOutcomes, maxRecentOutcomes + 1, 3*maxRecentOutcomes + 7} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			t.Parallel()
			var s toolStats
			for i := range n {
				s.record(fmt.Sprint(i))
			}
			got := s.recentOutcomes()
			want := []string{}
			for i := max(0, n-maxRecentOutcomes); i < n; i++ {
				want = append(want, fmt.Sprint(i))
			}
			if !slices.Equal(got, want) {
				t.Errorf("after %d outcomes: %v, want %v", n, got, want)
			}
		})
	}
}
