package session

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// eventLog collects a manager's events.
type eventLog struct {
	mu  sync.Mutex
	got []Event
}

func (l *eventLog) add(_ context.Context, ev Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ev.At = time.Time{} // the fake clock's; not what the cases compare
	l.got = append(l.got, ev)
}

func (l *eventLog) take() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	got := l.got
	l.got = nil
	return got
}

// TestEvents: each change operators watch is reported once, by the change that made it,
// on every store: degradation (not again while the session stays degraded), a step
// pending confirmation (from EndStep and from a cancel that catches an action in flight),
// and the end, however it came (complete, cancel, deadline, a budget).
func TestEvents(t *testing.T) {
	t.Parallel()
	ev := func(kind EventKind, step, target string, state State, reason string, degradations int) Event {
		return Event{Kind: kind, Tenant: "acme", SessionID: "s1", StepID: step, Target: target, State: state, Reason: reason, Degradations: degradations}
	}
	stale := func(step string) EndRequest {
		return EndRequest{Tenant: "acme", SessionID: "s1", StepID: step, Status: StatusStale, Result: []byte(`{}`), Reason: "weather failed: served stale"}
	}
	runManagerCases(t, []managerCase{
		{name: "degraded once, then completed", run: func(t *testing.T, f fixture) {
			var log eventLog
			f.m.OnEvent(log.add)
			f.run(t, model("m1"))
			f.end(t, done("m1", "a"))
			if got := log.take(); len(got) != 0 {
				t.Fatalf("a done step reported %+v", got)
			}
			f.run(t, tool("t1", "weather", ToolQuery))
			f.end(t, stale("t1"))
			want := []Event{ev(EventDegraded, "t1", "weather", StateActive, "weather failed: served stale", 1)}
			if diff := cmp.Diff(want, log.take()); diff != "" {
				t.Fatalf("after the stale step (-want +got):\n%s", diff)
			}
			// Still degraded (sticky): the next degraded step is no news.
			f.run(t, tool("t2", "weather", ToolQuery))
			f.end(t, stale("t2"))
			if got := log.take(); len(got) != 0 {
				t.Fatalf("a session already degraded reported %+v", got)
			}
			if _, err := f.m.Complete(t.Context(), "acme", "s1"); err != nil {
				t.Fatal(err)
			}
			want = []Event{ev(EventEnded, "", "", StateCompleted, EndCompleted, 1)}
			if diff := cmp.Diff(want, log.take()); diff != "" {
				t.Fatalf("after Complete (-want +got):\n%s", diff)
			}
			// Completing again changes nothing and reports nothing.
			if _, err := f.m.Complete(t.Context(), "acme", "s1"); err != nil {
				t.Fatal(err)
			}
			if got := log.take(); len(got) != 0 {
				t.Fatalf("a second Complete reported %+v", got)
			}
		}},
		{name: "pending confirmation, then cancelled with an action in flight", run: func(t *testing.T, f fixture) {
			var log eventLog
			f.m.OnEvent(log.add)
			f.run(t, tool("a1", "order", ToolAction))
			f.end(t, EndRequest{Tenant: "acme", SessionID: "s1", StepID: "a1", Status: StatusPendingConfirmation, Reason: "timeout"})
			want := []Event{ev(EventPendingConfirmation, "a1", "order", StateActive, "timeout", 0)}
			if diff := cmp.Diff(want, log.take()); diff != "" {
				t.Fatalf("after the pending step (-want +got):\n%s", diff)
			}
			f.run(t, tool("a2", "order", ToolAction))
			if _, err := f.m.Cancel(t.Context(), "acme", "s1", "user left"); err != nil {
				t.Fatal(err)
			}
			got := log.take()
			if len(got) != 2 || got[0].Kind != EventPendingConfirmation || got[0].StepID != "a2" ||
				got[1].Kind != EventEnded || got[1].State != StateCancelled || got[1].Reason != EndCancelled {
				t.Fatalf("after Cancel: %+v, want a2 pending confirmation, then the end (cancelled)", got)
			}
		}},
		{name: "ended by the step budget", cfg: func(c *Config) { c.DefaultBudget.MaxSteps = 1 }, run: func(t *testing.T, f fixture) {
			var log eventLog
			f.m.OnEvent(log.add)
			f.run(t, model("m1"))
			f.end(t, done("m1", "a"))
			if _, err := f.m.Begin(t.Context(), model("m2")); err == nil {
				t.Fatal("a step past the step budget began")
			}
			got := log.take()
			if len(got) != 1 || got[0].Kind != EventEnded || got[0].State != StateEndedPartial || got[0].Reason != EndSteps {
				t.Fatalf("events %+v, want the end (ended_partial, steps)", got)
			}
		}},
		{name: "ended by the deadline", run: func(t *testing.T, f fixture) {
			var log eventLog
			f.m.OnEvent(log.add)
			f.run(t, model("m1"))
			f.end(t, done("m1", "a"))
			f.clock.Advance(2 * time.Hour)
			f.get(t)
			got := log.take()
			if len(got) != 1 || got[0].Kind != EventEnded || got[0].State != StateEndedPartial || got[0].Reason != EndDeadline {
				t.Fatalf("events %+v, want the end (ended_partial, deadline)", got)
			}
		}},
	})
}
