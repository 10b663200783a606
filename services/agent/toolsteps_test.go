package agent

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/agent/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/agent/internal/session"
)

// stepHarness is a tool server whose calls that name a session are tool steps of sessions
// kept in memory, over scripted backends, on one fake clock.
type stepHarness struct {
	*harness
	server   *toolServer
	sessions *session.Manager
	// started receives when a backend call starts.
	started chan struct{}
}

// announcing is a scripted backend that says when a call starts.
type announcing struct {
	*scripted
	started chan struct{}
}

func (a announcing) call(ctx context.Context, c backendCall) (backendResult, error) {
	a.started <- struct{}{}
	return a.scripted.call(ctx, c)
}

func newStepHarness(t *testing.T, change func(*session.Config), tools ...ToolConfig) *stepHarness {
	t.Helper()
	h := &stepHarness{harness: newHarness(t, tools...), started: make(chan struct{}, 64)}
	// The same tools, each backend announcing its calls on started.
	cfg := DefaultConfig()
	cfg.Tools = tools
	var err error
	h.tools, err = NewTools(cfg, ToolsDeps{
		Clock: h.clock, Rand: func() float64 { return 1 },
		NewBackend: func(tc ToolConfig, _ int) (backend, error) {
			return announcing{scripted: h.backends[tc.Name], started: h.started}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	scfg := session.DefaultConfig()
	scfg.Degradation.ConfirmActionsAfter = 2
	if change != nil {
		change(&scfg)
	}
	h.sessions = session.NewManager(scfg, session.NewMemory(1000, h.clock), h.clock)
	h.server = &toolServer{tools: h.tools, log: slog.New(slog.DiscardHandler), sessions: h.sessions}
	return h
}

// step calls tool as step of session s1 of tenant acme.
func (h *stepHarness) step(t *testing.T, ctx context.Context, tool, step, args string) (*agentv1.CallToolResponse, error) {
	t.Helper()
	return h.server.CallTool(ctx, &agentv1.CallToolRequest{
		Name: tool, Arguments: args, SessionId: "s1", StepId: step, Quality: &mantlev1.QualityContext{Tenant: "acme"},
	})
}

func (h *stepHarness) stepStatus(t *testing.T, id string) *session.Step {
	t.Helper()
	s, err := h.sessions.Get(context.Background(), "acme", "s1", true)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range s.Steps {
		if st.ID == id {
			return st
		}
	}
	t.Fatalf("no step %s in %+v", id, s.Steps)
	return nil
}

func TestToolStepRecordedAndReplayed(t *testing.T) {
	t.Parallel()
	h := newStepHarness(t, nil, query("weather"))
	h.script("weather", answer(`{"temp":21}`))
	first, err := h.step(t, t.Context(), "weather", "w1", `{"city":"Paris"}`)
	if err != nil {
		t.Fatal(err)
	}
	if first.Status != agentv1.ToolCallStatus_TOOL_CALL_STATUS_OK || first.Result != `{"temp":21}` {
		t.Fatalf("first call = %v, want OK with the result", first)
	}
	again, err := h.step(t, t.Context(), "weather", "w1", `{"city":"Paris"}`)
	if err != nil {
		t.Fatal(err)
	}
	if again.Status != agentv1.ToolCallStatus_TOOL_CALL_STATUS_REPLAYED || again.Result != `{"temp":21}` || len(again.Attempts) != 0 {
		t.Fatalf("the step again = %v, want its recorded result, replayed, no attempts", again)
	}
	if n := h.backends["weather"].count(); n != 1 {
		t.Fatalf("the backend ran %d times, want once", n)
	}
	if st := h.stepStatus(t, "w1"); st.Status != session.StatusDone || st.Kind != session.KindTool || st.ToolKind != KindQuery {
		t.Fatalf("step = %+v, want a done query tool step", st)
	}
	_, err = h.step(t, t.Context(), "weather", "w1", `{"city":"Rome"}`)
	if status.Code(err) != codes.FailedPrecondition || rpc.ErrorInfo(err).GetReason() != ReasonStepConflict {
		t.Fatalf("the step id with other arguments = %v, want FAILED_PRECONDITION %s", err, ReasonStepConflict)
	}
}

func TestToolStepStatuses(t *testing.T) {
	t.Parallel()
	backup := query("weather-backup")
	primary := query("weather")
	primary.Backup = backup.Name
	primary.Retry = RetryConfig{MaxRetries: 0, Base: time.Second, Multiplier: 1, MaxDelay: time.Second}
	tests := []struct {
		name     string
		tool     string
		script   map[string][]step
		want     session.StepStatus
		degraded bool
	}{
		{name: "a backup's answer degrades the step and the session", tool: "weather",
			script: map[string][]step{"weather": {fail(failRefused, "unavailable")}, "weather-backup": {answer(`{"temp":20}`)}},
			want:   session.StatusDegraded, degraded: true},
		{name: "a tool that answers that the call failed fails the step", tool: "weather",
			script: map[string][]step{"weather": {{result: `{"error":"no such city"}`, isError: true}}},
			want:   session.StatusFailed},
		{name: "an order whose outcome is unknown awaits confirmation", tool: "order",
			script: map[string][]step{"order": {fail(failUnknown, "timeout")}},
			want:   session.StatusPendingConfirmation},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newStepHarness(t, nil, primary, backup, action("order"))
			for name, steps := range tt.script {
				h.script(name, steps...)
			}
			resp, err := h.step(t, t.Context(), tt.tool, "x1", `{}`)
			if err != nil {
				t.Fatal(err)
			}
			if st := h.stepStatus(t, "x1"); st.Status != tt.want {
				t.Fatalf("step %s (%s), want %s; response %v", st.Status, st.Reason, tt.want, resp)
			}
			s, _ := h.sessions.Get(t.Context(), "acme", "s1", false)
			if s.Degraded != tt.degraded {
				t.Fatalf("session degraded %v, want %v", s.Degraded, tt.degraded)
			}
		})
	}
}

func TestToolStepPendingActionIsNotRunAgain(t *testing.T) {
	t.Parallel()
	h := newStepHarness(t, nil, action("order"))
	h.script("order", fail(failUnknown, "timeout"))
	first, err := h.step(t, t.Context(), "order", "buy", `{"sku":"a"}`)
	if err != nil {
		t.Fatal(err)
	}
	if first.Status != agentv1.ToolCallStatus_TOOL_CALL_STATUS_PENDING_CONFIRMATION {
		t.Fatalf("first = %v, want pending confirmation", first)
	}
	h.script("order", answer(`{"order":1}`))
	again, err := h.step(t, t.Context(), "order", "buy", `{"sku":"a"}`)
	if err != nil {
		t.Fatal(err)
	}
	if again.Status != agentv1.ToolCallStatus_TOOL_CALL_STATUS_PENDING_CONFIRMATION || h.backends["order"].count() != 1 {
		t.Fatalf("the step again = %v after %d backend calls, want pending and one call", again, h.backends["order"].count())
	}
}

func TestToolStepActionsNeedConfirmationAfterDegradations(t *testing.T) {
	t.Parallel()
	h := newStepHarness(t, func(c *session.Config) { c.Degradation.StickyFor = time.Minute }, action("order"))
	ctx := t.Context()
	degrade := func(step string) {
		if _, err := h.sessions.Begin(ctx, session.BeginRequest{Tenant: "acme", SessionID: "s1", StepID: step, Kind: session.KindModel, Target: "chat"}); err != nil {
			t.Fatal(err)
		}
		if _, err := h.sessions.End(ctx, session.EndRequest{Tenant: "acme", SessionID: "s1", StepID: step, Status: session.StatusDegraded}); err != nil {
			t.Fatal(err)
		}
	}
	degrade("m1")
	h.clock.Advance(time.Minute)
	degrade("m2") // the recovery try degraded again: the second degradation
	resp, err := h.step(t, ctx, "order", "buy", `{}`)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != agentv1.ToolCallStatus_TOOL_CALL_STATUS_PENDING_CONFIRMATION || h.backends["order"].count() != 0 {
		t.Fatalf("action = %v after %d backend calls, want pending confirmation and no call", resp, h.backends["order"].count())
	}
	if st := h.stepStatus(t, "buy"); st.Status != session.StatusPendingConfirmation {
		t.Fatalf("step %s, want pending_confirmation", st.Status)
	}
}

func TestToolStepCancelInterruptsCall(t *testing.T) {
	t.Parallel()
	h := newStepHarness(t, nil, query("slow"))
	h.script("slow", step{block: true})
	got := make(chan error, 1)
	go func() {
		_, err := h.step(t, context.Background(), "slow", "s-1", `{}`)
		got <- err
	}()
	select {
	case <-h.started:
	case err := <-got:
		t.Fatalf("the call returned before it reached the backend: %v", err)
	}
	if _, err := h.sessions.Cancel(t.Context(), "acme", "s1", "stop"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if status.Code(err) != codes.FailedPrecondition || rpc.ErrorInfo(err).GetReason() != ReasonSessionEnded {
			t.Fatalf("the interrupted call = %v, want FAILED_PRECONDITION %s", err, ReasonSessionEnded)
		}
	case <-time.After(waitBound):
		t.Fatal("the cancel did not interrupt the call")
	}
	if st := h.stepStatus(t, "s-1"); st.Status != session.StatusCancelled {
		t.Fatalf("step %s, want cancelled", st.Status)
	}
	_, err := h.step(t, t.Context(), "slow", "s-2", `{}`)
	if status.Code(err) != codes.FailedPrecondition || h.backends["slow"].count() != 1 {
		t.Fatalf("a step of the cancelled session = %v after %d calls, want refused and no call", err, h.backends["slow"].count())
	}
}

// waitBound bounds the waits on another goroutine; it matters only when the code is broken.
const waitBound = 10 * time.Second
