package router

import (
	"context"
	"encoding/hex"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/agent/v1"
	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// This file runs a request that names an agent session (session_id and step_id, or the
// x-mantle-session and x-mantle-step headers) as a model step of that session, kept by the
// agent's SessionService: BeginStep before the model is asked, EndStep after.

// stepBegin opens a model step.
type stepBegin struct {
	SessionID, StepID string
	// Target is the route the step asks; Fingerprint a digest of the request, so that a
	// step id reused for another request is refused.
	Target, Fingerprint string
	Required            bool
}

// stepGrant is how a step goes on.
type stepGrant struct {
	// Replay: the step was recorded before; Result is its CompleteResponse (protobuf).
	Replay bool
	Result []byte
	// Left is the time left of the session's budget: the step runs under it.
	Left time.Duration
	// Degraded: the session is degraded (sticky): the step skips the route's first choice.
	Degraded bool
}

// Step outcomes (stepEnd.Status), as the SessionService names them.
const (
	stepDone      = "done"
	stepDegraded  = "degraded"
	stepFailed    = "failed"
	stepCancelled = "cancelled"
)

// stepEnd records a step's outcome.
type stepEnd struct {
	SessionID, StepID string
	Status            string
	// Result is the answer (a CompleteResponse in protobuf), for a step that answered.
	Result             []byte
	AnsweredBy, Reason string
	Tokens             int64
	CostUSD            float64
}

// ReasonSessionEnded is the ErrorInfo reason of a step of a session that has ended
// (FAILED_PRECONDITION; HTTP 400 session_ended). The agent answers it for a step begun
// after the end; the router for a step the session's end interrupted.
const ReasonSessionEnded = "SESSION_ENDED"

// Reasons of session requests the router cannot serve.
const (
	// ReasonSessionsOff: the request names a session and this router has no agent to keep
	// it (agent_address off).
	ReasonSessionsOff = "SESSIONS_UNAVAILABLE"
)

// errSessionEnded is the cause of a step's context cancelled because its session ended.
var errSessionEnded = errors.New("the session ended while the step ran")

// maxSessionIDBytes bounds session and step ids, as the SessionService does.
const maxSessionIDBytes = 128

// validateSession adds the problems of req's session fields to v.
func validateSession(req *routerv1.Request, v *rpc.ValidationError) {
	if req.SessionId == "" && req.StepId == "" {
		if req.StepRequired {
			v.Add("request.step_required", "only with session_id and step_id")
		}
		return
	}
	for _, f := range []struct{ name, value string }{{"request.session_id", req.SessionId}, {"request.step_id", req.StepId}} {
		if !validSessionID(f.value) {
			v.Add(f.name, "required with a session: 1 to %d printable ASCII characters without spaces", maxSessionIDBytes)
		}
	}
}

func validSessionID(s string) bool {
	if s == "" || len(s) > maxSessionIDBytes {
		return false
	}
	for i := range len(s) {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// inSession runs run as the model step req names, or as it is when req names none.
func (r *Router) inSession(ctx context.Context, req *routerv1.Request, rt *route, qc *mantlev1.QualityContext, sink Sink,
	run func(ctx context.Context) (*routerv1.CompleteResponse, error),
) (*routerv1.CompleteResponse, error) {
	if req.SessionId == "" {
		return run(ctx)
	}
	if r.deps.Sessions == nil {
		// Answering without the session would break what the caller relies on: a resumed
		// agent would call the model again and the session's budget would not count it.
		return nil, rpc.Status(codes.FailedPrecondition, errorDomain, ReasonSessionsOff,
			"this request names an agent session, and this router has no agent module to keep it (router.agent_address is off)")
	}
	sessions := sessionClient{c: r.deps.Sessions}
	qc.SessionId, qc.StepId = req.SessionId, req.StepId
	fp := requestFingerprint(req)
	began := r.deps.Clock.Now()
	grant, err := sessions.Begin(ctx, stepBegin{
		SessionID: req.SessionId, StepID: req.StepId, Target: rt.name,
		Fingerprint: hex.EncodeToString(fp[:min(len(fp), 16)]), Required: req.StepRequired,
	})
	if err != nil {
		return nil, err
	}
	if grant.Replay {
		return r.replayStep(grant.Result, qc, sink)
	}
	qc.Audit = append(qc.Audit, r.step("session", "step "+req.StepId+" of session "+req.SessionId+" begun", r.deps.Clock.Since(began)))
	qc.SessionDegraded = grant.Degraded
	// The step runs under what is left of its session's time.
	if until := r.deps.Clock.Now().Add(grant.Left); until.Before(qc.Deadline.AsTime()) {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, until)
		defer cancel()
		qc.Deadline = timestamppb.New(until)
	}
	// A session that ends while the step runs (the agent's user cancelled it) interrupts
	// the step: the provider call is cancelled with the request's context.
	ctx, stop := r.watchSession(ctx, sessions, req.SessionId)
	resp, err := run(ctx)
	interrupted := stop()

	end := stepEnd{SessionID: req.SessionId, StepID: req.StepId, Tokens: qc.GetUsage().GetTotalTokens(), CostUSD: qc.GetCostUsd()}
	switch {
	case err == nil:
		end.Status, end.AnsweredBy = stepDone, resp.GetModel()
		if qc.FallbackLevel != mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY {
			end.Status, end.Reason = stepDegraded, qc.DegradationReason
		}
		if end.Result, err = proto.Marshal(resp); err != nil {
			end.Result = nil // not recorded: a resumed session runs the step again
			err = nil
		}
	case interrupted:
		end.Status, end.Reason = stepCancelled, errSessionEnded.Error()
		err = rpc.Status(codes.FailedPrecondition, errorDomain, ReasonSessionEnded, "the session ended while this step ran; the step was cancelled")
	case errors.Is(err, context.Canceled):
		end.Status, end.Reason = stepCancelled, "the caller went away"
	default:
		end.Status, end.Reason = stepFailed, err.Error()
	}
	// Recorded even when the caller has gone: the work is done and billed.
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sessionEndTimeout)
	defer cancel()
	if eerr := sessions.End(ectx, end); eerr != nil {
		// The answer is still good; only a resumed session will not find it recorded.
		r.deps.Log.WarnContext(ctx, "session step not recorded", "session", req.SessionId, "step", req.StepId, "err", eerr)
		qc.SkippedSteps = append(qc.SkippedSteps, "session_record")
	}
	return resp, err
}

// sessionEndTimeout bounds EndStep after the request's own deadline may have passed.
const sessionEndTimeout = 5 * time.Second

// watchSession returns a context that is cancelled when the session ends, and stop, which
// ends the watch and reports whether the session's end cancelled the context. The watch
// is the goroutine's; stop waits for it.
func (r *Router) watchSession(ctx context.Context, sessions sessionClient, sessionID string) (context.Context, func() bool) {
	stepCtx, cancelStep := context.WithCancelCause(ctx)
	watchCtx, cancelWatch := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := sessions.AwaitEnd(watchCtx, sessionID); err == nil {
			cancelStep(errSessionEnded)
		}
	}()
	return stepCtx, func() bool {
		cancelWatch()
		<-done
		interrupted := errors.Is(context.Cause(stepCtx), errSessionEnded)
		cancelStep(nil)
		return interrupted
	}
}

// replayStep answers from a step's record: no model is called, nothing is charged.
func (r *Router) replayStep(result []byte, qc *mantlev1.QualityContext, sink Sink) (*routerv1.CompleteResponse, error) {
	var resp routerv1.CompleteResponse
	if err := proto.Unmarshal(result, &resp); err != nil || resp.Quality == nil {
		return nil, rpc.Status(codes.Internal, errorDomain, "SESSION_RECORD_UNREADABLE", "the step's recorded answer cannot be read")
	}
	r.deps.Metrics.sessionReplays.Inc()
	resp.Quality.SessionReplayed = true
	resp.Quality.Audit = append(resp.Quality.Audit, r.step("session_replay",
		"step "+qc.StepId+" of session "+qc.SessionId+" answered from its record (request "+resp.Quality.RequestId+") for "+qc.RequestId, 0))
	return &resp, sendWhole(sink, &resp)
}

// stickyDegradation keeps the model steps of a degraded session off the route's first
// choice while the session stays degraded, so that an agent does not switch between a
// model and its fallback from one step to the next. A route with nothing after its first
// choice (but the fast-answer rung, which drops the request's instructions) still asks it.
func stickyDegradation(p *plan, qc *mantlev1.QualityContext) {
	full := 0
	for _, c := range p.cands {
		if !c.fast {
			full++
		}
	}
	if !qc.GetSessionDegraded() || full < 2 {
		return
	}
	p.cands[0].exhausted = true
}

// sessionClient is the router's side of the agent's SessionService: it opens and ends the
// model steps of agent sessions, and tells when a session ends.
type sessionClient struct {
	c agentv1.SessionServiceClient
}

// Begin opens a model step: a recorded step comes back as a replay (no model is asked), a
// new one with what is left of its session's budget. An ended session is the agent's
// FAILED_PRECONDITION status (SESSION_ENDED).
func (s sessionClient) Begin(ctx context.Context, b stepBegin) (stepGrant, error) {
	resp, err := s.c.BeginStep(ctx, &agentv1.BeginStepRequest{
		SessionId: b.SessionID, StepId: b.StepID, Kind: agentv1.StepKind_STEP_KIND_MODEL,
		Target: b.Target, Required: b.Required, Fingerprint: b.Fingerprint,
	})
	if err != nil {
		return stepGrant{}, err
	}
	if resp.GetDecision() == agentv1.BeginStepResponse_DECISION_REPLAY {
		return stepGrant{Replay: true, Result: resp.GetStep().GetResult()}, nil
	}
	return stepGrant{Left: resp.GetLeft().GetTime().AsDuration(), Degraded: resp.GetDegraded()}, nil
}

// End records a step's outcome.
func (s sessionClient) End(ctx context.Context, e stepEnd) error {
	st := agentv1.StepStatus_STEP_STATUS_FAILED
	switch e.Status {
	case stepDone:
		st = agentv1.StepStatus_STEP_STATUS_DONE
	case stepDegraded:
		st = agentv1.StepStatus_STEP_STATUS_DEGRADED
	case stepCancelled:
		st = agentv1.StepStatus_STEP_STATUS_CANCELLED
	}
	_, err := s.c.EndStep(ctx, &agentv1.EndStepRequest{
		SessionId: e.SessionID, StepId: e.StepID, Status: st, Result: e.Result, AnsweredBy: e.AnsweredBy,
		Reason: e.Reason, Tokens: e.Tokens, CostUsd: e.CostUSD,
	})
	return err
}

// AwaitEnd returns nil when the session ends (cancelled, completed, out of budget), or an
// error when ctx is done or the agent cannot tell.
func (s sessionClient) AwaitEnd(ctx context.Context, sessionID string) error {
	stream, err := s.c.WatchSession(ctx, &agentv1.WatchSessionRequest{SessionId: sessionID})
	if err != nil {
		return err
	}
	_, err = stream.Recv()
	return err
}
