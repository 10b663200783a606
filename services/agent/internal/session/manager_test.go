package session

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jonboulle/clockwork"
)

// fixture is a manager over a fresh store, on a fake clock.
type fixture struct {
	m     *Manager
	clock *clockwork.FakeClock
}

func testConfig() Config {
	c := DefaultConfig()
	c.Backend = BackendMemory
	c.DefaultBudget = BudgetConfig{Deadline: time.Hour, MaxTokens: 1000, MaxCostUSD: 1, MaxSteps: 10}
	c.MaxModelResultBytes, c.MaxToolResultBytes, c.MaxSessionResultBytes = 100, 50, 200
	c.MaxStepLease = time.Minute
	c.Degradation = DegradationConfig{StickyFor: 5 * time.Minute, RecoveryInterval: time.Minute, ConfirmActionsAfter: 2}
	c.Scheduler = SchedulerConfig{ParallelCap: 2, TimeoutRate: 0.5, MinCalls: 2, Window: time.Minute}
	return c
}

// managerCase is one behaviour every store must give the manager.
type managerCase struct {
	name string
	// cfg adjusts the test configuration.
	cfg func(*Config)
	run func(t *testing.T, f fixture)
}

func runManagerCases(t *testing.T, cases []managerCase) {
	t.Helper()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					cfg := testConfig()
					if tc.cfg != nil {
						tc.cfg(&cfg)
					}
					if err := cfg.Validate(); err != nil {
						t.Fatalf("test configuration: %v", err)
					}
					clock := clockwork.NewFakeClockAt(epoch)
					tc.run(t, fixture{m: NewManager(cfg, b.newStore(t, clock), clock), clock: clock})
				})
			}
		})
	}
}

func model(step string) BeginRequest {
	return BeginRequest{Tenant: "acme", SessionID: "s1", StepID: step, Kind: KindModel, Target: "chat"}
}

func tool(step, name, kind string) BeginRequest {
	return BeginRequest{Tenant: "acme", SessionID: "s1", StepID: step, Kind: KindTool, Target: name, ToolKind: kind}
}

func done(step string, result string) EndRequest {
	return EndRequest{Tenant: "acme", SessionID: "s1", StepID: step, Status: StatusDone, Result: []byte(result)}
}

func (f fixture) begin(t *testing.T, req BeginRequest) BeginResult {
	t.Helper()
	res, err := f.m.Begin(t.Context(), req)
	if err != nil {
		t.Fatalf("Begin(%s): %v", req.StepID, err)
	}
	return res
}

func (f fixture) run(t *testing.T, req BeginRequest) BeginResult {
	t.Helper()
	res := f.begin(t, req)
	if res.Replay {
		t.Fatalf("Begin(%s) replayed, want it to run", req.StepID)
	}
	return res
}

func (f fixture) end(t *testing.T, req EndRequest) EndResult {
	t.Helper()
	res, err := f.m.End(t.Context(), req)
	if err != nil {
		t.Fatalf("End(%s): %v", req.StepID, err)
	}
	return res
}

func (f fixture) get(t *testing.T) *Session {
	t.Helper()
	s, err := f.m.Get(t.Context(), "acme", "s1", true)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	return s
}

func (f fixture) statuses(t *testing.T) map[string]StepStatus {
	t.Helper()
	out := map[string]StepStatus{}
	for _, st := range f.get(t).Steps {
		out[st.ID] = st.Status
	}
	return out
}

func wantEnded(t *testing.T, err error, state State, reason string) {
	t.Helper()
	var e *EndedError
	if !errors.As(err, &e) || !errors.Is(err, ErrEnded) {
		t.Fatalf("err = %v, want the session ended (%s, %s)", err, state, reason)
	}
	if e.State != state || e.Reason != reason {
		t.Fatalf("ended %s (%s), want %s (%s)", e.State, e.Reason, state, reason)
	}
}

func TestManagerSteps(t *testing.T) {
	runManagerCases(t, []managerCase{
		{name: "a first step opens the session with the default budget", run: func(t *testing.T, f fixture) {
			res := f.run(t, model("m1"))
			want := Left{Time: time.Hour, Tokens: 1000, CostUSD: 1, Steps: 9}
			if diff := cmp.Diff(want, res.Left); diff != "" {
				t.Fatalf("left (-want +got):\n%s", diff)
			}
			if res.ParallelCap != 2 || res.Degraded || res.ActionsNeedConfirmation {
				t.Fatalf("begin = %+v, want cap 2, not degraded", res)
			}
			s := f.get(t)
			if s.State != StateActive || s.Tenant != "acme" || len(s.Steps) != 1 || s.Steps[0].Status != StatusRunning {
				t.Fatalf("session = %+v, want active with one running step", s)
			}
		}},
		{name: "a requested budget replaces the defaults it sets", run: func(t *testing.T, f fixture) {
			req := model("m1")
			req.Budget = Budget{Deadline: time.Minute, Steps: 3}
			res := f.run(t, req)
			want := Left{Time: time.Minute, Tokens: 1000, CostUSD: 1, Steps: 2}
			if diff := cmp.Diff(want, res.Left); diff != "" {
				t.Fatalf("left (-want +got):\n%s", diff)
			}
		}},
		{name: "a completed step replays its result, uncharged", run: func(t *testing.T, f fixture) {
			f.run(t, model("m1"))
			end := done("m1", "answer")
			end.Tokens, end.CostUSD = 100, 0.25
			if got := f.end(t, end); !got.Recorded || got.Left.Tokens != 900 {
				t.Fatalf("End = %+v, want recorded with 900 tokens left", got)
			}
			res := f.begin(t, model("m1"))
			if !res.Replay || string(res.Step.Result) != "answer" || res.Step.Status != StatusDone {
				t.Fatalf("Begin again = %+v, want a replay of the answer", res)
			}
			s := f.get(t)
			if s.StepsBegun != 1 || s.Tokens != 100 || s.CostUSD != 0.25 {
				t.Fatalf("session usage = %d steps, %d tokens, $%v; want 1, 100, $0.25", s.StepsBegun, s.Tokens, s.CostUSD)
			}
			if string(s.Steps[0].Result) != "answer" {
				t.Fatalf("Get with results: %q, want the answer", s.Steps[0].Result)
			}
		}},
		{name: "a second end of a step changes nothing", run: func(t *testing.T, f fixture) {
			f.run(t, model("m1"))
			f.end(t, done("m1", "first"))
			again := done("m1", "second")
			again.Tokens = 500
			if got := f.end(t, again); got.Recorded || got.Left.Tokens != 1000 {
				t.Fatalf("second End = %+v, want nothing recorded or charged", got)
			}
			if res := f.begin(t, model("m1")); string(res.Step.Result) != "first" {
				t.Fatalf("replay = %q, want the first result", res.Step.Result)
			}
		}},
		{name: "a step id reused for another request is refused", run: func(t *testing.T, f fixture) {
			req := model("m1")
			req.Fingerprint = "aaa"
			f.run(t, req)
			f.end(t, done("m1", "x"))
			req.Fingerprint = "bbb"
			if _, err := f.m.Begin(t.Context(), req); !errors.Is(err, ErrStepConflict) {
				t.Fatalf("Begin with another fingerprint = %v, want ErrStepConflict", err)
			}
			if _, err := f.m.Begin(t.Context(), tool("m1", "search", ToolQuery)); !errors.Is(err, ErrStepConflict) {
				t.Fatalf("Begin as a tool step = %v, want ErrStepConflict", err)
			}
		}},
		{name: "a running step is in progress until its lease runs out", run: func(t *testing.T, f fixture) {
			req := model("m1")
			req.Deadline = epoch.Add(20 * time.Second) // the runner's own deadline, within max_step_lease
			f.run(t, req)
			if _, err := f.m.Begin(t.Context(), model("m1")); !errors.Is(err, ErrStepInProgress) {
				t.Fatalf("Begin while it runs = %v, want ErrStepInProgress", err)
			}
			f.clock.Advance(20 * time.Second)
			f.run(t, model("m1")) // the runner is presumed gone
			s := f.get(t)
			if s.Steps[0].Attempts != 2 || s.StepsBegun != 2 {
				t.Fatalf("attempts %d, steps begun %d; want 2 and 2", s.Steps[0].Attempts, s.StepsBegun)
			}
		}},
		{name: "a lease is at most max_step_lease", run: func(t *testing.T, f fixture) {
			f.run(t, model("m1"))
			f.clock.Advance(time.Minute)
			f.run(t, model("m1"))
		}},
		{name: "failed and cancelled steps run again", run: func(t *testing.T, f fixture) {
			f.run(t, model("m1"))
			f.end(t, EndRequest{Tenant: "acme", SessionID: "s1", StepID: "m1", Status: StatusFailed, Reason: "upstream down"})
			f.run(t, model("m1"))
			f.end(t, EndRequest{Tenant: "acme", SessionID: "s1", StepID: "m1", Status: StatusCancelled})
			f.run(t, model("m1"))
		}},
		{name: "a result over the step bound is not recorded and runs again", run: func(t *testing.T, f fixture) {
			f.run(t, tool("t1", "search", ToolQuery))
			if got := f.end(t, done("t1", string(bytes.Repeat([]byte("x"), 51)))); got.Recorded {
				t.Fatal("a 51-byte tool result was recorded over the 50-byte bound")
			}
			s := f.get(t)
			if !s.Steps[0].RecordTooLarge || s.Steps[0].Status != StatusDone || s.ResultBytes != 0 {
				t.Fatalf("step = %+v, want done and record_too_large", s.Steps[0])
			}
			f.run(t, tool("t1", "search", ToolQuery))
		}},
		{name: "the session's results are bounded in total", run: func(t *testing.T, f fixture) {
			for i := range 3 {
				id := fmt.Sprintf("m%d", i)
				f.run(t, model(id))
				got := f.end(t, done(id, string(bytes.Repeat([]byte("x"), 90))))
				if want := i < 2; got.Recorded != want {
					t.Fatalf("step %d recorded %v, want %v (200 bytes per session)", i, got.Recorded, want)
				}
			}
			if s := f.get(t); s.ResultBytes != 180 {
				t.Fatalf("result bytes %d, want 180", s.ResultBytes)
			}
		}},
		{name: "end of a step never begun", run: func(t *testing.T, f fixture) {
			f.run(t, model("m1"))
			if _, err := f.m.End(t.Context(), done("m2", "")); !errors.Is(err, ErrStepNotFound) {
				t.Fatalf("End = %v, want ErrStepNotFound", err)
			}
			if _, err := f.m.End(t.Context(), EndRequest{Tenant: "acme", SessionID: "nope", StepID: "m1", Status: StatusDone}); !errors.Is(err, ErrSessionNotFound) {
				t.Fatalf("End = %v, want ErrSessionNotFound", err)
			}
		}},
		{name: "concurrent steps are all recorded", run: func(t *testing.T, f fixture) {
			const n = 8
			var wg sync.WaitGroup
			errs := make(chan error, 2*n)
			for i := range n {
				wg.Go(func() {
					id := fmt.Sprintf("m%d", i)
					if _, err := f.m.Begin(context.Background(), model(id)); err != nil {
						errs <- err
						return
					}
					end := done(id, "r")
					end.Tokens = 10
					if _, err := f.m.End(context.Background(), end); err != nil {
						errs <- err
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			s := f.get(t)
			if len(s.Steps) != n || s.StepsBegun != n || s.Tokens != 10*n {
				t.Fatalf("%d steps, %d begun, %d tokens; want %d, %d, %d", len(s.Steps), s.StepsBegun, s.Tokens, n, n, 10*n)
			}
			for _, st := range s.Steps {
				if st.Status != StatusDone || string(st.Result) != "r" {
					t.Fatalf("step %s = %s %q, want done r", st.ID, st.Status, st.Result)
				}
			}
		}},
	})
}

func TestManagerValidation(t *testing.T) {
	f := fixture{m: NewManager(testConfig(), NewMemory(10, nil), nil)}
	long := string(bytes.Repeat([]byte("a"), maxIDLen+1))
	tests := []struct {
		name  string
		req   BeginRequest
		field string
	}{
		{"no session", BeginRequest{StepID: "a", Kind: KindModel, Target: "m"}, "session_id"},
		{"long session", BeginRequest{SessionID: long, StepID: "a", Kind: KindModel, Target: "m"}, "session_id"},
		{"space in step", BeginRequest{SessionID: "s", StepID: "a b", Kind: KindModel, Target: "m"}, "step_id"},
		{"no kind", BeginRequest{SessionID: "s", StepID: "a", Target: "m"}, "kind"},
		{"no target", BeginRequest{SessionID: "s", StepID: "a", Kind: KindModel}, "target"},
		{"tool without a tool kind", BeginRequest{SessionID: "s", StepID: "a", Kind: KindTool, Target: "t"}, "tool_kind"},
		{"model with a tool kind", BeginRequest{SessionID: "s", StepID: "a", Kind: KindModel, Target: "m", ToolKind: ToolQuery}, "tool_kind"},
		{"negative budget", BeginRequest{SessionID: "s", StepID: "a", Kind: KindModel, Target: "m", Budget: Budget{Tokens: -1}}, "budget"},
		{"budget over the max", BeginRequest{SessionID: "s", StepID: "a", Kind: KindModel, Target: "m", Budget: Budget{Steps: 501}}, "budget.max_steps"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := f.m.Begin(context.Background(), tt.req)
			var inv *InvalidError
			if !errors.As(err, &inv) || inv.Field != tt.field {
				t.Fatalf("Begin = %v, want an invalid %s", err, tt.field)
			}
		})
	}
	if _, err := f.m.End(context.Background(), EndRequest{SessionID: "s", StepID: "a", Status: StatusRunning}); err == nil {
		t.Fatal("End with status running was accepted")
	}
	if _, err := f.m.End(context.Background(), EndRequest{SessionID: "s", StepID: "a", Status: StatusDone, Tokens: -1}); err == nil {
		t.Fatal("End with negative tokens was accepted")
	}
}

func TestManagerBudgets(t *testing.T) {
	runManagerCases(t, []managerCase{
		{name: "the deadline ends the session at the next step, partial", run: func(t *testing.T, f fixture) {
			f.run(t, model("m1"))
			f.end(t, done("m1", "kept"))
			f.clock.Advance(time.Hour)
			_, err := f.m.Begin(t.Context(), model("m2"))
			wantEnded(t, err, StateEndedPartial, EndDeadline)
			s := f.get(t)
			if diff := cmp.Diff(map[string]StepStatus{"m1": StatusDone, "m2": StatusSkipped}, f.statuses(t)); diff != "" {
				t.Fatalf("steps (-want +got):\n%s", diff)
			}
			if string(s.Steps[0].Result) != "kept" {
				t.Fatalf("the partial result lost its step: %q", s.Steps[0].Result)
			}
		}},
		{name: "tokens run out at the end of the step that spent them", run: func(t *testing.T, f fixture) {
			f.run(t, model("m1"))
			end := done("m1", "a")
			end.Tokens = 1000
			if got := f.end(t, end); got.State != StateEndedPartial || got.EndReason != EndTokens || !got.Recorded {
				t.Fatalf("End = %+v, want the session ended (tokens) with the step recorded", got)
			}
			_, err := f.m.Begin(t.Context(), model("m2"))
			wantEnded(t, err, StateEndedPartial, EndTokens)
			if res := f.begin(t, model("m1")); !res.Replay || string(res.Step.Result) != "a" {
				t.Fatalf("Begin of a recorded step of an ended session = %+v, want its replay", res)
			}
		}},
		{name: "cost runs out", run: func(t *testing.T, f fixture) {
			f.run(t, model("m1"))
			end := done("m1", "a")
			end.CostUSD = 1.5
			if got := f.end(t, end); got.EndReason != EndCost {
				t.Fatalf("End = %+v, want the session ended (cost)", got)
			}
		}},
		{name: "steps run out at the step past the budget", cfg: func(c *Config) { c.DefaultBudget.MaxSteps = 2 }, run: func(t *testing.T, f fixture) {
			for _, id := range []string{"m1", "m2"} {
				f.run(t, model(id))
				f.end(t, done(id, "x"))
			}
			if res := f.begin(t, model("m1")); !res.Replay {
				t.Fatal("a replay was refused at the step budget; replays are not counted")
			}
			_, err := f.m.Begin(t.Context(), model("m3"))
			wantEnded(t, err, StateEndedPartial, EndSteps)
		}},
		{name: "each step gets what is left of the time", run: func(t *testing.T, f fixture) {
			f.run(t, model("m1"))
			f.clock.Advance(40 * time.Minute)
			if res := f.run(t, model("m2")); res.Left.Time != 20*time.Minute || res.Left.Steps != 8 {
				t.Fatalf("left = %+v, want 20m and 8 steps", res.Left)
			}
		}},
		{name: "a required step's failure ends the session; an optional one's does not", run: func(t *testing.T, f fixture) {
			f.run(t, model("m1"))
			if got := f.end(t, EndRequest{Tenant: "acme", SessionID: "s1", StepID: "m1", Status: StatusFailed}); got.State != StateActive {
				t.Fatalf("an optional step's failure ended the session: %+v", got)
			}
			req := model("m2")
			req.Required = true
			f.run(t, req)
			got := f.end(t, EndRequest{Tenant: "acme", SessionID: "s1", StepID: "m2", Status: StatusFailed, Reason: "no model answered"})
			if got.State != StateEndedPartial || got.EndReason != EndRequiredStepFailed {
				t.Fatalf("End = %+v, want ended (required_step_failed)", got)
			}
		}},
		{name: "Get ends an active session past its deadline", run: func(t *testing.T, f fixture) {
			f.run(t, model("m1"))
			f.clock.Advance(2 * time.Hour)
			s := f.get(t)
			if s.State != StateEndedPartial || s.EndReason != EndDeadline || s.Steps[0].Status != StatusCancelled {
				t.Fatalf("session = %s (%s), step %s; want ended (deadline), step cancelled", s.State, s.EndReason, s.Steps[0].Status)
			}
		}},
	})
}

func TestManagerEndings(t *testing.T) {
	runManagerCases(t, []managerCase{
		{name: "cancel cancels running steps and marks running actions for confirmation", run: func(t *testing.T, f fixture) {
			f.run(t, model("m1"))
			f.end(t, done("m1", "x"))
			f.run(t, model("m2"))
			f.run(t, tool("q1", "search", ToolQuery))
			f.run(t, tool("a1", "order", ToolAction))
			s, err := f.m.Cancel(t.Context(), "acme", "s1", "the user pressed stop")
			if err != nil {
				t.Fatal(err)
			}
			if s.State != StateCancelled || s.EndReason != EndCancelled {
				t.Fatalf("session = %s (%s), want cancelled", s.State, s.EndReason)
			}
			want := map[string]StepStatus{"m1": StatusDone, "m2": StatusCancelled, "q1": StatusCancelled, "a1": StatusPendingConfirmation}
			if diff := cmp.Diff(want, f.statuses(t)); diff != "" {
				t.Fatalf("steps (-want +got):\n%s", diff)
			}
			_, err = f.m.Begin(t.Context(), model("m3"))
			wantEnded(t, err, StateCancelled, EndCancelled)
		}},
		{name: "cancel and complete are idempotent and exclusive", run: func(t *testing.T, f fixture) {
			f.run(t, model("m1"))
			if _, err := f.m.Cancel(t.Context(), "acme", "s1", ""); err != nil {
				t.Fatal(err)
			}
			if _, err := f.m.Cancel(t.Context(), "acme", "s1", ""); err != nil {
				t.Fatalf("a second Cancel = %v, want the session", err)
			}
			_, err := f.m.Complete(t.Context(), "acme", "s1")
			wantEnded(t, err, StateCancelled, EndCancelled)
		}},
		{name: "complete ends the session", run: func(t *testing.T, f fixture) {
			f.run(t, model("m1"))
			f.end(t, done("m1", "x"))
			s, err := f.m.Complete(t.Context(), "acme", "s1")
			if err != nil || s.State != StateCompleted {
				t.Fatalf("Complete = (%v, %v), want completed", s, err)
			}
			if _, err := f.m.Complete(t.Context(), "acme", "s1"); err != nil {
				t.Fatalf("a second Complete = %v", err)
			}
			_, err = f.m.Cancel(t.Context(), "acme", "s1", "")
			wantEnded(t, err, StateCompleted, EndCompleted)
		}},
		{name: "a step that finishes after the cancel keeps its outcome", run: func(t *testing.T, f fixture) {
			f.run(t, tool("a1", "order", ToolAction))
			if _, err := f.m.Cancel(t.Context(), "acme", "s1", ""); err != nil {
				t.Fatal(err)
			}
			end := done("a1", `{"order":42}`)
			end.IdempotencyKey = "acme-s1-a1"
			if got := f.end(t, end); got.State != StateCancelled || !got.Recorded {
				t.Fatalf("late End = %+v, want recorded in the cancelled session", got)
			}
			s := f.get(t)
			if st := s.Steps[0]; st.Status != StatusDone || string(st.Result) != `{"order":42}` || st.IdempotencyKey != "acme-s1-a1" {
				t.Fatalf("step = %+v, want done with its result", st)
			}
		}},
		{name: "cancel wakes whoever awaits the end", run: func(t *testing.T, f fixture) {
			f.run(t, model("m1"))
			got := make(chan error, 1)
			go func() {
				s, err := f.m.AwaitEnd(context.Background(), "acme", "s1")
				if err == nil && s.State != StateCancelled {
					err = fmt.Errorf("AwaitEnd returned state %s", s.State)
				}
				got <- err
			}()
			if _, err := f.m.Cancel(t.Context(), "acme", "s1", ""); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-got:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(waitBound):
				t.Fatal("AwaitEnd did not return after the cancel")
			}
		}},
		{name: "AwaitEnd waits while the session is active", run: func(t *testing.T, f fixture) {
			f.run(t, model("m1"))
			ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
			defer cancel()
			if _, err := f.m.AwaitEnd(ctx, "acme", "s1"); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("AwaitEnd = %v, want to wait until its context ends", err)
			}
		}},
		{name: "AwaitEnd returns at the deadline", run: func(t *testing.T, f fixture) {
			f.run(t, model("m1"))
			got := make(chan *Session, 1)
			go func() {
				s, _ := f.m.AwaitEnd(context.Background(), "acme", "s1")
				got <- s
			}()
			if err := f.clock.BlockUntilContext(t.Context(), 1); err != nil {
				t.Fatal(err)
			}
			f.clock.Advance(time.Hour)
			select {
			case s := <-got:
				if s == nil || s.EndReason != EndDeadline {
					t.Fatalf("AwaitEnd = %+v, want ended at the deadline", s)
				}
			case <-time.After(waitBound):
				t.Fatal("AwaitEnd did not return at the deadline")
			}
		}},
	})
}

func TestManagerTenants(t *testing.T) {
	runManagerCases(t, []managerCase{
		{name: "a tenant sees and changes only its own sessions", run: func(t *testing.T, f fixture) {
			f.run(t, model("m1"))
			f.end(t, done("m1", "secret"))
			ctx := t.Context()
			if _, err := f.m.Get(ctx, "mallory", "s1", true); !errors.Is(err, ErrSessionNotFound) {
				t.Fatalf("another tenant's Get = %v, want ErrSessionNotFound", err)
			}
			if _, err := f.m.Cancel(ctx, "mallory", "s1", ""); !errors.Is(err, ErrSessionNotFound) {
				t.Fatalf("another tenant's Cancel = %v, want ErrSessionNotFound", err)
			}
			if _, err := f.m.Complete(ctx, "mallory", "s1"); !errors.Is(err, ErrSessionNotFound) {
				t.Fatalf("another tenant's Complete = %v, want ErrSessionNotFound", err)
			}
			if _, err := f.m.End(ctx, EndRequest{Tenant: "mallory", SessionID: "s1", StepID: "m1", Status: StatusDone, Tokens: 999}); !errors.Is(err, ErrSessionNotFound) {
				t.Fatalf("another tenant's End = %v, want ErrSessionNotFound", err)
			}
			// The same id is another session for another tenant: no replay of acme's step.
			req := model("m1")
			req.Tenant = "mallory"
			if res := f.begin(t, req); res.Replay {
				t.Fatal("another tenant replayed acme's step")
			}
			if s := f.get(t); s.State != StateActive || s.Tokens != 0 || string(s.Steps[0].Result) != "secret" {
				t.Fatalf("acme's session changed: %+v", s)
			}
		}},
		{name: "a tenant opens at most new_sessions_per_minute sessions", cfg: func(c *Config) { c.NewSessionsPerMinute = 2 }, run: func(t *testing.T, f fixture) {
			for i := range 2 {
				req := model("m1")
				req.SessionID = fmt.Sprintf("s%d", i)
				f.run(t, req)
			}
			req := model("m1")
			req.SessionID = "s9"
			if _, err := f.m.Begin(t.Context(), req); !errors.Is(err, ErrTooManySessions) {
				t.Fatalf("a third session = %v, want ErrTooManySessions", err)
			}
			req.Tenant = "other"
			f.run(t, req) // another tenant is not affected
			f.run(t, model("m2"))
			f.clock.Advance(30 * time.Second)
			req.Tenant = "acme"
			f.run(t, req)
		}},
	})
}

func TestManagerDegradation(t *testing.T) {
	degraded := func(step string) EndRequest {
		return EndRequest{Tenant: "acme", SessionID: "s1", StepID: step, Status: StatusDegraded, AnsweredBy: "small"}
	}
	runManagerCases(t, []managerCase{
		{name: "a degraded step makes the session degraded for sticky_for", run: func(t *testing.T, f fixture) {
			f.run(t, model("m1"))
			f.end(t, degraded("m1"))
			if res := f.run(t, model("m2")); !res.Degraded {
				t.Fatal("the step after a degradation is not degraded")
			}
			f.end(t, done("m2", "x")) // a degraded step that answered changes nothing
			f.clock.Advance(4 * time.Minute)
			if res := f.run(t, model("m3")); !res.Degraded {
				t.Fatal("the session recovered before sticky_for")
			}
		}},
		{name: "after sticky_for one step tries the full form and recovers", run: func(t *testing.T, f fixture) {
			f.run(t, model("m1"))
			f.end(t, degraded("m1"))
			f.clock.Advance(5 * time.Minute)
			if res := f.run(t, model("probe")); res.Degraded {
				t.Fatal("the probe step is degraded")
			}
			if res := f.run(t, model("other")); !res.Degraded {
				t.Fatal("a step beside the probe is not degraded")
			}
			f.end(t, done("probe", "x"))
			if res := f.run(t, model("m4")); res.Degraded {
				t.Fatal("the session is still degraded after its probe answered")
			}
			if s := f.get(t); s.Degraded || s.Degradations != 1 {
				t.Fatalf("session degraded %v, degradations %d; want recovered after 1", s.Degraded, s.Degradations)
			}
		}},
		{name: "a probe that degrades again waits recovery_interval", run: func(t *testing.T, f fixture) {
			f.run(t, model("m1"))
			f.end(t, degraded("m1"))
			f.clock.Advance(5 * time.Minute)
			f.run(t, model("probe"))
			f.end(t, EndRequest{Tenant: "acme", SessionID: "s1", StepID: "probe", Status: StatusStale})
			if res := f.run(t, model("m3")); !res.Degraded {
				t.Fatal("not degraded after the probe degraded")
			}
			f.clock.Advance(time.Minute)
			if res := f.run(t, model("probe2")); res.Degraded {
				t.Fatal("no probe after recovery_interval")
			}
		}},
		{name: "a probe whose runner is gone is replaced", run: func(t *testing.T, f fixture) {
			f.run(t, model("m1"))
			f.end(t, degraded("m1"))
			f.clock.Advance(5 * time.Minute)
			f.run(t, model("probe"))
			f.clock.Advance(time.Minute) // its lease ran out
			if res := f.run(t, model("probe2")); res.Degraded {
				t.Fatal("the next step did not take over the dead probe")
			}
		}},
		{name: "repeated degradation makes actions need confirmation", run: func(t *testing.T, f fixture) {
			f.run(t, model("m1"))
			f.end(t, degraded("m1"))
			if res := f.run(t, tool("a1", "order", ToolAction)); res.ActionsNeedConfirmation {
				t.Fatal("actions need confirmation after one degradation; want after two")
			}
			f.end(t, done("a1", "ok"))
			f.clock.Advance(5 * time.Minute)
			f.run(t, model("probe"))
			f.end(t, degraded("probe"))
			if res := f.run(t, tool("a2", "order", ToolAction)); !res.ActionsNeedConfirmation {
				t.Fatal("actions do not need confirmation after two degradations")
			}
			if s := f.get(t); s.Degradations != 2 || !s.ActionsNeedConfirmation {
				t.Fatalf("session = %d degradations, confirm %v; want 2, true", s.Degradations, s.ActionsNeedConfirmation)
			}
		}},
	})
}

func TestManagerScheduler(t *testing.T) {
	runManagerCases(t, []managerCase{
		{name: "tool steps wait at the cap until one ends", run: func(t *testing.T, f fixture) {
			f.run(t, tool("t1", "search", ToolQuery))
			f.run(t, tool("t2", "search", ToolQuery))
			f.run(t, model("m1")) // model steps are not capped
			ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
			defer cancel()
			if _, err := f.m.Begin(ctx, tool("t3", "search", ToolQuery)); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("a third tool step at cap 2 = %v, want it to wait", err)
			}
			got := make(chan error, 1)
			go func() {
				_, err := f.m.Begin(context.Background(), tool("t3", "search", ToolQuery))
				got <- err
			}()
			f.end(t, done("t1", "r"))
			select {
			case err := <-got:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(waitBound):
				t.Fatal("the waiting step did not begin after another ended")
			}
		}},
		{name: "a step waiting at the cap begins when a lease runs out", run: func(t *testing.T, f fixture) {
			f.run(t, tool("t1", "search", ToolQuery))
			f.run(t, tool("t2", "search", ToolQuery))
			got := make(chan error, 1)
			go func() {
				_, err := f.m.Begin(context.Background(), tool("t3", "search", ToolQuery))
				got <- err
			}()
			if err := f.clock.BlockUntilContext(t.Context(), 1); err != nil {
				t.Fatal(err)
			}
			f.clock.Advance(time.Minute)
			select {
			case err := <-got:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(waitBound):
				t.Fatal("the waiting step did not begin when the leases ran out")
			}
		}},
		{name: "timeouts lower the cap to serial and quiet windows restore it", cfg: func(c *Config) {
			c.Scheduler.ParallelCap = 4
			c.DefaultBudget.MaxSteps = 100
		}, run: func(t *testing.T, f fixture) {
			step := 0
			call := func(timedOut bool) BeginResult {
				step++
				id := fmt.Sprintf("t%d", step)
				res := f.run(t, tool(id, "flaky", ToolExternal))
				end := EndRequest{Tenant: "acme", SessionID: "s1", StepID: id, Status: StatusDone, TimedOut: timedOut}
				if timedOut {
					end.Status = StatusFailed
				}
				f.end(t, end)
				return res
			}
			if res := call(true); res.ParallelCap != 4 {
				t.Fatalf("cap %d, want 4 at first", res.ParallelCap)
			}
			call(true)
			if res := call(false); res.ParallelCap != 2 {
				t.Fatalf("cap %d after timeouts, want 2", res.ParallelCap)
			}
			f.clock.Advance(time.Minute)
			call(true)
			call(true)
			if res := call(false); res.ParallelCap != 1 {
				t.Fatalf("cap %d after another window of timeouts, want 1 (serial)", res.ParallelCap)
			}
			f.clock.Advance(time.Minute) // a window with one good call: quiet
			if res := call(false); res.ParallelCap != 1 {
				t.Fatalf("cap %d, want 1 until the quiet window ends", res.ParallelCap)
			}
			f.clock.Advance(time.Minute)
			if res := call(false); res.ParallelCap != 2 {
				t.Fatalf("cap %d after a quiet window, want 2", res.ParallelCap)
			}
			f.clock.Advance(time.Minute)
			if res := call(false); res.ParallelCap != 4 {
				t.Fatalf("cap %d after two quiet windows, want 4", res.ParallelCap)
			}
		}},
	})
}
