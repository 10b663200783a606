package router

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/agent/v1"
	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// fakeSessions keeps one session's model steps in memory, as the agent's SessionService
// does for the router: a step ended with a result replays it.
type fakeSessions struct {
	agentv1.SessionServiceClient
	beginErr error
	degraded bool
	left     time.Duration
	// ended is closed when the session ends; watching receives when a watch starts.
	ended    chan struct{}
	watching chan struct{}

	mu       sync.Mutex
	begins   []*agentv1.BeginStepRequest
	ends     []*agentv1.EndStepRequest
	recorded map[string][]byte
}

func newFakeSessions() *fakeSessions {
	return &fakeSessions{left: time.Hour, ended: make(chan struct{}), watching: make(chan struct{}, 8), recorded: map[string][]byte{}}
}

func (f *fakeSessions) BeginStep(_ context.Context, in *agentv1.BeginStepRequest, _ ...grpc.CallOption) (*agentv1.BeginStepResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.begins = append(f.begins, proto.CloneOf(in))
	if f.beginErr != nil {
		return nil, f.beginErr
	}
	if r, ok := f.recorded[in.StepId]; ok {
		return &agentv1.BeginStepResponse{Decision: agentv1.BeginStepResponse_DECISION_REPLAY, Step: &agentv1.Step{StepId: in.StepId, Result: r}}, nil
	}
	return &agentv1.BeginStepResponse{Decision: agentv1.BeginStepResponse_DECISION_RUN, Left: &agentv1.BudgetLeft{Time: durationpb.New(f.left)}, Degraded: f.degraded}, nil
}

func (f *fakeSessions) EndStep(_ context.Context, in *agentv1.EndStepRequest, _ ...grpc.CallOption) (*agentv1.EndStepResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ends = append(f.ends, proto.CloneOf(in))
	if len(in.Result) > 0 && (in.Status == agentv1.StepStatus_STEP_STATUS_DONE || in.Status == agentv1.StepStatus_STEP_STATUS_DEGRADED) {
		f.recorded[in.StepId] = in.Result
	}
	return &agentv1.EndStepResponse{Recorded: len(in.Result) > 0}, nil
}

func (f *fakeSessions) WatchSession(ctx context.Context, _ *agentv1.WatchSessionRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[agentv1.WatchSessionResponse], error) {
	f.watching <- struct{}{}
	return &fakeWatch{ctx: ctx, ended: f.ended}, nil
}

// fakeWatch is a WatchSession stream: one message once the session ended.
type fakeWatch struct {
	grpc.ClientStream
	ctx   context.Context
	ended chan struct{}
}

func (w *fakeWatch) Recv() (*agentv1.WatchSessionResponse, error) {
	select {
	case <-w.ended:
		return &agentv1.WatchSessionResponse{State: agentv1.SessionState_SESSION_STATE_CANCELLED, EndReason: "cancelled"}, nil
	case <-w.ctx.Done():
		return nil, w.ctx.Err()
	}
}

func (f *fakeSessions) endings() []*agentv1.EndStepRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*agentv1.EndStepRequest(nil), f.ends...)
}

func stepOf(model, session, step string) *routerv1.Request {
	req := ask(model)
	req.SessionId, req.StepId = session, step
	return req
}

func TestSessionStepRecordedThenReplayed(t *testing.T) {
	t.Parallel()
	s := newFakeSessions()
	h := newHarness(t, testConfig(), &harness{sessions: s})
	first, err := h.router.Complete(t.Context(), stepOf("chat", "s1", "plan"))
	if err != nil {
		t.Fatal(err)
	}
	if q := first.GetQuality(); q.SessionId != "s1" || q.StepId != "plan" || q.SessionReplayed {
		t.Fatalf("first answer's quality: session %q step %q replayed %v; want s1, plan, false", q.SessionId, q.StepId, q.SessionReplayed)
	}
	ends := s.endings()
	if len(ends) != 1 || ends[0].Status != agentv1.StepStatus_STEP_STATUS_DONE || ends[0].AnsweredBy != "a" || ends[0].Tokens != 2 || len(ends[0].Result) == 0 {
		t.Fatalf("EndStep = %+v, want one done step answered by a, 2 tokens, with its result", ends)
	}
	replayed, err := h.router.Complete(t.Context(), stepOf("chat", "s1", "plan"))
	if err != nil {
		t.Fatal(err)
	}
	if h.calls("a") != 1 {
		t.Fatalf("model a called %d times, want once: the replay must not call it", h.calls("a"))
	}
	if !replayed.GetQuality().GetSessionReplayed() || replayed.GetMessage().GetContent() != first.GetMessage().GetContent() || replayed.Id != first.Id {
		t.Fatalf("replay = %v, want the first answer marked replayed", replayed)
	}
	if n := len(s.endings()); n != 1 {
		t.Fatalf("%d EndStep calls, want 1: a replay records nothing", n)
	}
	if got := counterValue(t, h.router.deps.Metrics.sessionReplays); got != 1 {
		t.Fatalf("session replays counted %v, want 1", got)
	}
	if b := s.begins[0]; b.Target != "chat" || b.Fingerprint == "" || b.Required || b.Kind != agentv1.StepKind_STEP_KIND_MODEL {
		t.Fatalf("BeginStep = %+v, want target chat with a fingerprint", b)
	}
}

func TestSessionStepEndedSession(t *testing.T) {
	t.Parallel()
	s := newFakeSessions()
	s.beginErr = rpc.Status(codes.FailedPrecondition, "agent.mantle", ReasonSessionEnded, "session ended (cancelled)")
	h := newHarness(t, testConfig(), &harness{sessions: s})
	_, err := h.router.Complete(t.Context(), stepOf("chat", "s1", "plan"))
	if status.Code(err) != codes.FailedPrecondition || rpc.ErrorInfo(toStatus(err)).GetReason() != ReasonSessionEnded {
		t.Fatalf("Complete = %v, want FAILED_PRECONDITION %s", err, ReasonSessionEnded)
	}
	if h.calls("a") != 0 {
		t.Fatal("a model was asked for a step of an ended session")
	}
	w := httptest.NewRecorder()
	writeError(w, toStatus(err))
	var body errorBody
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if w.Code != http.StatusBadRequest || body.Error.Code != "session_ended" {
		t.Fatalf("HTTP %d code %q, want 400 session_ended", w.Code, body.Error.Code)
	}
}

func TestSessionCancelInterruptsRunningStep(t *testing.T) {
	t.Parallel()
	s := newFakeSessions()
	cfg := testConfig()
	h := newHarness(t, cfg, &harness{sessions: s})
	h.providers["a"].results = []result{hang()}
	ch := h.start(t.Context(), stepOf("chat", "s1", "slow"))
	<-h.providers["a"].started
	<-s.watching
	close(s.ended) // the agent's user cancelled the session
	d := await(t, ch)
	if status.Code(d.err) != codes.FailedPrecondition || rpc.ErrorInfo(toStatus(d.err)).GetReason() != ReasonSessionEnded {
		t.Fatalf("Complete = %v, want FAILED_PRECONDITION %s", d.err, ReasonSessionEnded)
	}
	if h.calls("b") != 0 {
		t.Fatal("the interrupted step failed over to b; it must stop")
	}
	ends := s.endings()
	if len(ends) != 1 || ends[0].Status != agentv1.StepStatus_STEP_STATUS_CANCELLED || len(ends[0].Result) != 0 {
		t.Fatalf("EndStep = %+v, want the step cancelled without a result", ends)
	}
}

func TestSessionStickyDegradation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		degraded  bool
		models    []string // routes' candidates
		wantModel string
		wantEnd   agentv1.StepStatus
	}{
		{"a healthy session asks the first choice", false, []string{"a", "b"}, "a", agentv1.StepStatus_STEP_STATUS_DONE},
		{"a degraded session skips the first choice", true, []string{"a", "b"}, "b", agentv1.StepStatus_STEP_STATUS_DEGRADED},
		{"a route with one candidate still asks it", true, []string{"a"}, "a", agentv1.StepStatus_STEP_STATUS_DONE},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newFakeSessions()
			s.degraded = tt.degraded
			cfg := testConfig()
			cfg.Routes[0].Candidates = tt.models
			h := newHarness(t, cfg, &harness{sessions: s})
			resp, err := h.router.Complete(t.Context(), stepOf("chat", "s1", "m1"))
			if err != nil {
				t.Fatal(err)
			}
			if resp.Model != tt.wantModel || resp.GetQuality().GetSessionDegraded() != tt.degraded {
				t.Fatalf("answered by %s (session_degraded %v), want %s (%v)", resp.Model, resp.GetQuality().GetSessionDegraded(), tt.wantModel, tt.degraded)
			}
			if ends := s.endings(); len(ends) != 1 || ends[0].Status != tt.wantEnd {
				t.Fatalf("EndStep = %+v, want status %s", ends, tt.wantEnd)
			}
		})
	}
}

func TestSessionStepRunsUnderWhatIsLeft(t *testing.T) {
	t.Parallel()
	s := newFakeSessions()
	s.left = 2 * time.Second
	h := newHarness(t, testConfig(), &harness{sessions: s})
	resp, err := h.router.Complete(t.Context(), stepOf("chat", "s1", "m1"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := resp.GetQuality().GetDeadline().AsTime(), h.clock.Now().Add(2*time.Second); !got.Equal(want) {
		t.Fatalf("deadline %s, want the session's %s", got, want)
	}
}

func TestSessionStepRefusals(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		sessions bool
		req      *routerv1.Request
		code     codes.Code
		field    string
		reason   string
	}{
		{name: "a session without a step", sessions: true, req: stepOf("chat", "s1", ""), code: codes.InvalidArgument, field: "request.step_id"},
		{name: "a step without a session", sessions: true, req: stepOf("chat", "", "m1"), code: codes.InvalidArgument, field: "request.session_id"},
		{name: "an id with a space", sessions: true, req: stepOf("chat", "s 1", "m1"), code: codes.InvalidArgument, field: "request.session_id"},
		{name: "a long id", sessions: true, req: stepOf("chat", strings.Repeat("s", 129), "m1"), code: codes.InvalidArgument, field: "request.session_id"},
		{name: "required without a session", sessions: true, req: func() *routerv1.Request { r := ask("chat"); r.StepRequired = true; return r }(), code: codes.InvalidArgument, field: "request.step_required"},
		{name: "no agent to keep sessions", sessions: false, req: stepOf("chat", "s1", "m1"), code: codes.FailedPrecondition, reason: ReasonSessionsOff},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			hh := &harness{}
			if tt.sessions {
				hh.sessions = newFakeSessions()
			}
			h := newHarness(t, testConfig(), hh)
			_, err := h.router.Complete(t.Context(), tt.req)
			st := toStatus(err)
			if status.Code(st) != tt.code {
				t.Fatalf("Complete = %v, want %s", err, tt.code)
			}
			if tt.field != "" {
				if fields := rpc.BadRequestFields(st); len(fields) == 0 || fields[0] != tt.field {
					t.Fatalf("bad request fields %v, want %s", fields, tt.field)
				}
			}
			if tt.reason != "" && rpc.ErrorInfo(st).GetReason() != tt.reason {
				t.Fatalf("reason %q, want %s", rpc.ErrorInfo(st).GetReason(), tt.reason)
			}
			if h.calls("a") != 0 {
				t.Fatal("a model was asked")
			}
		})
	}
}

func TestSessionHeaders(t *testing.T) {
	t.Parallel()
	s := newFakeSessions()
	h := newHarness(t, testConfig(), &harness{sessions: s})
	f := &frontDoor{router: h.router}
	post := func(headers map[string]string, stream bool) *httptest.ResponseRecorder {
		body := `{"model":"chat","messages":[{"role":"user","content":"hi"}]`
		if stream {
			body += `,"stream":true`
		}
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body+"}"))
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		f.chatCompletions(w, req)
		return w
	}
	step := map[string]string{HeaderSession: "s1", HeaderStep: "m1", HeaderStepRequired: "true"}
	if w := post(step, false); w.Code != http.StatusOK || w.Header().Get(HeaderReplayed) != "" {
		t.Fatalf("first step: HTTP %d, replayed %q; want 200 and no replay header", w.Code, w.Header().Get(HeaderReplayed))
	}
	if b := s.begins[0]; b.SessionId != "s1" || b.StepId != "m1" || !b.Required {
		t.Fatalf("BeginStep = %+v, want s1/m1 required", b)
	}
	for _, stream := range []bool{false, true} {
		w := post(step, stream)
		if w.Code != http.StatusOK || w.Header().Get(HeaderReplayed) != "true" {
			t.Fatalf("replayed step (stream %v): HTTP %d, %s %q; want 200 and true", stream, w.Code, HeaderReplayed, w.Header().Get(HeaderReplayed))
		}
	}
	if h.calls("a") != 1 {
		t.Fatalf("model a called %d times, want once", h.calls("a"))
	}
	w := post(map[string]string{HeaderSession: "s1", HeaderStep: "m2", HeaderStepRequired: "yes"}, false)
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), HeaderStepRequired) {
		t.Fatalf("a bad %s: HTTP %d %s; want 400 naming it", HeaderStepRequired, w.Code, w.Body.String())
	}
}

func (f *fakeSessions) session(id string) *agentv1.Session {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := &agentv1.Session{SessionId: id, State: agentv1.SessionState_SESSION_STATE_ACTIVE, Budget: &agentv1.SessionBudget{Deadline: durationpb.New(time.Minute), MaxSteps: 10}}
	for step, r := range f.recorded {
		s.Steps = append(s.Steps, &agentv1.Step{StepId: step, Kind: agentv1.StepKind_STEP_KIND_MODEL, Status: agentv1.StepStatus_STEP_STATUS_DONE, Result: r})
	}
	return s
}

func (f *fakeSessions) GetSession(_ context.Context, in *agentv1.GetSessionRequest, _ ...grpc.CallOption) (*agentv1.GetSessionResponse, error) {
	if in.SessionId != "s1" {
		return nil, rpc.Status(codes.NotFound, "agent.mantle", "SESSION_NOT_FOUND", "no such session")
	}
	return &agentv1.GetSessionResponse{Session: f.session(in.SessionId)}, nil
}

func (f *fakeSessions) CancelSession(_ context.Context, in *agentv1.CancelSessionRequest, _ ...grpc.CallOption) (*agentv1.CancelSessionResponse, error) {
	s := f.session(in.SessionId)
	s.State, s.EndReason = agentv1.SessionState_SESSION_STATE_CANCELLED, "cancelled: "+in.Reason
	return &agentv1.CancelSessionResponse{Session: s}, nil
}

func (f *fakeSessions) CompleteSession(_ context.Context, in *agentv1.CompleteSessionRequest, _ ...grpc.CallOption) (*agentv1.CompleteSessionResponse, error) {
	s := f.session(in.SessionId)
	s.State = agentv1.SessionState_SESSION_STATE_COMPLETED
	return &agentv1.CompleteSessionResponse{Session: s}, nil
}

func TestSessionEndpoints(t *testing.T) {
	t.Parallel()
	s := newFakeSessions()
	h := newHarness(t, testConfig(), &harness{sessions: s})
	if _, err := h.router.Complete(t.Context(), stepOf("chat", "s1", "plan")); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	(&frontDoor{router: h.router}).register(mux)
	off := http.NewServeMux()
	(&frontDoor{router: newHarness(t, testConfig(), nil).router}).register(off)
	call := func(mux *http.ServeMux, method, path, body string) (*httptest.ResponseRecorder, map[string]any) {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		var out map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
			t.Fatalf("%s %s: %v in %s", method, path, err, w.Body)
		}
		return w, out
	}
	tests := []struct {
		name         string
		mux          *http.ServeMux
		method, path string
		body         string
		code         int
		check        func(t *testing.T, out map[string]any)
	}{
		{name: "get", mux: mux, method: http.MethodGet, path: "/v1/sessions/s1", code: http.StatusOK, check: func(t *testing.T, out map[string]any) {
			steps, _ := out["steps"].([]any)
			if out["state"] != "active" || out["object"] != "agent.session" || len(steps) != 1 {
				t.Fatalf("session = %v, want active with one step", out)
			}
			step := steps[0].(map[string]any)
			result, _ := step["result"].(map[string]any)
			if step["status"] != "done" || step["kind"] != "model" || result["object"] != "chat.completion" {
				t.Fatalf("step = %v, want a done model step whose result is its chat completion", step)
			}
		}},
		{name: "another session", mux: mux, method: http.MethodGet, path: "/v1/sessions/other", code: http.StatusNotFound, check: func(t *testing.T, out map[string]any) {
			if e := out["error"].(map[string]any); e["code"] != "session_not_found" {
				t.Fatalf("error = %v, want session_not_found", e)
			}
		}},
		{name: "cancel with a reason", mux: mux, method: http.MethodPost, path: "/v1/sessions/s1/cancel", body: `{"reason":"user pressed stop"}`, code: http.StatusOK, check: func(t *testing.T, out map[string]any) {
			if out["state"] != "cancelled" || out["end_reason"] != "cancelled: user pressed stop" {
				t.Fatalf("session = %v, want cancelled with the reason", out)
			}
		}},
		{name: "cancel without a body", mux: mux, method: http.MethodPost, path: "/v1/sessions/s1/cancel", code: http.StatusOK},
		{name: "cancel with an unknown field", mux: mux, method: http.MethodPost, path: "/v1/sessions/s1/cancel", body: `{"why":"x"}`, code: http.StatusBadRequest},
		{name: "cancel with a large body", mux: mux, method: http.MethodPost, path: "/v1/sessions/s1/cancel", body: `{"reason":"` + strings.Repeat("x", 5000) + `"}`, code: http.StatusRequestEntityTooLarge},
		{name: "complete", mux: mux, method: http.MethodPost, path: "/v1/sessions/s1/complete", code: http.StatusOK, check: func(t *testing.T, out map[string]any) {
			if out["state"] != "completed" {
				t.Fatalf("session = %v, want completed", out)
			}
		}},
		{name: "an id that is not printable", mux: mux, method: http.MethodGet, path: "/v1/sessions/%01", code: http.StatusBadRequest},
		{name: "no agent", mux: off, method: http.MethodGet, path: "/v1/sessions/s1", code: http.StatusNotFound, check: func(t *testing.T, out map[string]any) {
			if e := out["error"].(map[string]any); e["code"] != strings.ToLower(ReasonSessionsOff) {
				t.Fatalf("error = %v, want %s", e, strings.ToLower(ReasonSessionsOff))
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, out := call(tt.mux, tt.method, tt.path, tt.body)
			if w.Code != tt.code {
				t.Fatalf("HTTP %d %s, want %d", w.Code, w.Body, tt.code)
			}
			if tt.check != nil {
				tt.check(t, out)
			}
		})
	}
}
