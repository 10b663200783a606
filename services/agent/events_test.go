package agent

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/agent/v1"
	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/app"
	"github.com/mantle-mesh/mantle/pkg/events"
	"github.com/mantle-mesh/mantle/pkg/natsembed"
	"github.com/mantle-mesh/mantle/services/agent/internal/session"
)

// natsEvents is a publisher and a subscriber on an embedded NATS server.
type natsEvents struct {
	pub  *events.Publisher
	msgs chan *nats.Msg
}

func newNATSEvents(t *testing.T, subjects ...string) natsEvents {
	t.Helper()
	srv, err := natsembed.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	pub, err := events.Connect(context.Background(), srv.URL(), slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	sub, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sub.Close)
	n := natsEvents{pub: pub, msgs: make(chan *nats.Msg, 64)}
	for _, s := range subjects {
		if _, err := sub.ChanSubscribe(s, n.msgs); err != nil {
			t.Fatal(err)
		}
	}
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	return n
}

// next returns the next message decoded into msg, and its subject.
func (n natsEvents) next(t *testing.T, msg proto.Message) string {
	t.Helper()
	select {
	case m := <-n.msgs:
		if err := proto.Unmarshal(m.Data, msg); err != nil {
			t.Fatalf("%s: %v", m.Subject, err)
		}
		return m.Subject
	case <-time.After(10 * time.Second): // a failure timeout, not a wait
		t.Fatal("no event")
		return ""
	}
}

// TestSessionEventsOnNATS: the agent publishes a session's degradation, a step pending
// confirmation and the session's end on mantle.events.session.
func TestSessionEventsOnNATS(t *testing.T) {
	t.Parallel()
	n := newNATSEvents(t, events.SubjectSession)
	clock := clockwork.NewFakeClockAt(time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC))
	cfg := session.DefaultConfig()
	srv, _, err := newSessions(t.Context(), cfg, app.Env{Events: n.pub, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	m := srv.m
	ctx := t.Context()
	for _, step := range []struct {
		id, tool, kind string
		status         session.StepStatus
		reason         string
	}{
		{"t1", "weather", session.ToolQuery, session.StatusStale, "served stale"},
		{"a1", "order", session.ToolAction, session.StatusPendingConfirmation, "timeout"},
	} {
		if _, err := m.Begin(ctx, session.BeginRequest{Tenant: "acme", SessionID: "s1", StepID: step.id, Kind: session.KindTool, Target: step.tool, ToolKind: step.kind}); err != nil {
			t.Fatal(err)
		}
		if _, err := m.End(ctx, session.EndRequest{Tenant: "acme", SessionID: "s1", StepID: step.id, Status: step.status, Reason: step.reason}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.Complete(ctx, "acme", "s1"); err != nil {
		t.Fatal(err)
	}
	want := []*eventsv1.SessionEvent{
		{Tenant: "acme", SessionId: "s1", Kind: eventsv1.SessionEventKind_SESSION_EVENT_KIND_DEGRADED, StepId: "t1", Target: "weather",
			State: agentv1.SessionState_SESSION_STATE_ACTIVE, Reason: "served stale", Degradations: 1},
		{Tenant: "acme", SessionId: "s1", Kind: eventsv1.SessionEventKind_SESSION_EVENT_KIND_PENDING_CONFIRMATION, StepId: "a1", Target: "order",
			State: agentv1.SessionState_SESSION_STATE_ACTIVE, Reason: "timeout", Degradations: 1},
		{Tenant: "acme", SessionId: "s1", Kind: eventsv1.SessionEventKind_SESSION_EVENT_KIND_ENDED,
			State: agentv1.SessionState_SESSION_STATE_COMPLETED, Reason: session.EndCompleted, Degradations: 1},
	}
	for i, w := range want {
		got := &eventsv1.SessionEvent{}
		if subject := n.next(t, got); subject != events.SubjectSession {
			t.Fatalf("event %d on %s", i, subject)
		}
		if !got.GetAt().AsTime().Equal(clock.Now()) {
			t.Errorf("event %d at %v, want the clock's %v", i, got.GetAt().AsTime(), clock.Now())
		}
		got.At = nil
		if !proto.Equal(got, w) {
			t.Errorf("event %d = %v, want %v", i, got, w)
		}
	}
}

// TestToolBreakerEventsOnNATS: a tool's breaker that opens is published on
// mantle.events.tool.breaker with the tool, its kind and why.
func TestToolBreakerEventsOnNATS(t *testing.T) {
	t.Parallel()
	n := newNATSEvents(t, events.SubjectToolBreaker, events.SubjectBreaker)
	clock := clockwork.NewFakeClockAt(time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC))
	tc := validTool("order")
	tc.Kind = KindAction
	cfg := DefaultConfig()
	cfg.Idempotency.Backend = IdempotencyMemory
	cfg.Tools = []ToolConfig{tc}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	sb := &scripted{steps: []step{fail(failRefused, "unavailable")}}
	tools, err := NewTools(cfg, ToolsDeps{
		Clock: clock, Rand: func() float64 { return 0 }, Events: n.pub,
		NewBackend: func(ToolConfig, int) (backend, error) { return sb, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tools.Close)
	// The default breaker opens after 5 failures in a row; each call has its own key, and
	// a refused call is known not to have happened.
	for i := range 5 {
		_, _ = tools.Call(t.Context(), CallRequest{Tenant: "acme", Name: "order", Arguments: "{}", IdempotencyKey: "k" + string(rune('0'+i))})
	}
	got := &eventsv1.ToolBreakerEvent{}
	if subject := n.next(t, got); subject != events.SubjectToolBreaker {
		t.Fatalf("event on %s, want %s (the router's subject is for provider breakers)", subject, events.SubjectToolBreaker)
	}
	if got.GetTool() != "order" || got.GetKind() != agentv1.ToolKind_TOOL_KIND_ACTION ||
		got.GetFrom() != mantlev1.BreakerState_BREAKER_STATE_CLOSED || got.GetTo() != mantlev1.BreakerState_BREAKER_STATE_OPEN ||
		got.GetReason() == "" || !got.GetAt().AsTime().Equal(clock.Now()) {
		t.Errorf("event %v, want order (action) closed -> open, with a reason, at the clock's time", got)
	}
	if sb.count() != 5 {
		t.Errorf("backend called %d times, want 5", sb.count())
	}
}
