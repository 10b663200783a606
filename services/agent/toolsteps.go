package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/protobuf/proto"

	agentv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/agent/v1"
	"github.com/mantle-mesh/mantle/services/agent/internal/session"
)

// This file runs a tool call that names a session (session_id and step_id) as a tool step
// of that session: begun before the tool is called (a recorded step replays, the step
// waits for a place under the session's parallel cap, an ended session refuses it) and
// ended after, with the call's outcome and its result recorded.

// errSessionEndedDuringCall is the cause of a call's context cancelled because its session
// ended.
var errSessionEndedDuringCall = errors.New("the session ended while the tool ran")

// sessionStepEndTimeout bounds EndStep after the call's own deadline may have passed.
const sessionStepEndTimeout = 5 * time.Second

// callStep runs call, as a step of the session req names when it names one. It returns
// the response (without its QualityContext) and the result the audit step describes.
func (s *toolServer) callStep(ctx context.Context, tenant string, req *agentv1.CallToolRequest,
	call func(ctx context.Context) (CallResult, error),
) (*agentv1.CallToolResponse, CallResult, error) {
	m := s.sessions
	tl, known := s.tools.reg.Load().tools[req.GetName()]
	if m == nil || req.GetSessionId() == "" || !known {
		// Without a session, or for a tool the registry does not have (the call fails
		// with UNKNOWN_TOOL before any step would begin).
		res, err := call(ctx)
		if err != nil {
			return nil, res, err
		}
		return ResultToProto(res), res, nil
	}
	if req.GetStepId() == "" {
		return nil, CallResult{}, &session.InvalidError{Field: "step_id", Reason: "required with session_id"}
	}
	kind := tl.cfg.Kind
	sum := sha256.Sum256([]byte(req.GetName() + "\x00" + argsText(req.GetArguments())))
	begin := session.BeginRequest{
		Tenant: tenant, SessionID: req.GetSessionId(), StepID: req.GetStepId(), Kind: session.KindTool,
		Target: req.GetName(), Fingerprint: hex.EncodeToString(sum[:16]), ToolKind: kind,
	}
	if d, ok := ctx.Deadline(); ok {
		begin.Deadline = d
	}
	grant, err := m.Begin(ctx, begin)
	if err != nil {
		return nil, CallResult{}, err
	}
	if grant.Replay {
		return replayedStep(&grant.Step, kind)
	}
	end := session.EndRequest{Tenant: tenant, SessionID: req.GetSessionId(), StepID: req.GetStepId()}
	if kind == KindAction && grant.ActionsNeedConfirmation {
		// The session degraded again and again: its actions wait for a person instead of
		// running on their own.
		res := CallResult{Status: StatusPendingConfirmation, Kind: kind, Notice: "this session degraded repeatedly: its actions need a person's confirmation before they run; nothing was done"}
		end.Status, end.Reason = session.StatusPendingConfirmation, res.Notice
		s.endStep(ctx, end)
		return ResultToProto(res), res, nil
	}

	callCtx, stop := watchToolSession(ctx, m, tenant, req.GetSessionId())
	res, err := call(callCtx)
	interrupted := stop()
	resp := ResultToProto(res)
	end.TimedOut = timedOut(res.Attempts, req.GetName()) || timedOutErr(err, req.GetName())
	switch {
	case err == nil:
		end.Status, end.AnsweredBy, end.IdempotencyKey, end.ConfirmationID = stepStatusOfResult(res), res.AnsweredBy, res.IdempotencyKey, res.ConfirmationID
		end.StaleAge, end.Reason = res.StaleAge, res.Notice
		if res.IsError {
			end.Reason = "the tool answered that the call failed"
		}
		if end.Status == session.StatusDone || end.Status == session.StatusDegraded || end.Status == session.StatusStale {
			if b, merr := proto.Marshal(resp); merr == nil {
				end.Result = b
			}
		}
	case interrupted:
		end.Status, end.Reason = session.StatusCancelled, errSessionEndedDuringCall.Error()
		if kind == KindAction {
			end.Status = session.StatusPendingConfirmation
		}
		err = &session.EndedError{State: session.StateCancelled, Reason: "the session ended while the tool ran"}
	case errors.Is(err, context.Canceled):
		end.Status, end.Reason = session.StatusCancelled, "the caller went away"
	default:
		end.Status, end.Reason = session.StatusFailed, err.Error()
	}
	s.endStep(ctx, end)
	if err != nil {
		return nil, res, err
	}
	return resp, res, nil
}

// endStep records a step's outcome even when the caller has gone: the call was made.
func (s *toolServer) endStep(ctx context.Context, end session.EndRequest) {
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sessionStepEndTimeout)
	defer cancel()
	if _, err := s.sessions.End(ectx, end); err != nil {
		s.log.WarnContext(ctx, "tool step not recorded", "session", end.SessionID, "step", end.StepID, "err", err)
	}
}

// watchToolSession returns a context cancelled when the session ends, and stop, which ends
// the watch and reports whether the session's end cancelled the context.
func watchToolSession(ctx context.Context, m *session.Manager, tenant, sessionID string) (context.Context, func() bool) {
	callCtx, cancelCall := context.WithCancelCause(ctx)
	watchCtx, cancelWatch := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := m.AwaitEnd(watchCtx, tenant, sessionID); err == nil {
			cancelCall(errSessionEndedDuringCall)
		}
	}()
	return callCtx, func() bool {
		cancelWatch()
		<-done
		interrupted := errors.Is(context.Cause(callCtx), errSessionEndedDuringCall)
		cancelCall(nil)
		return interrupted
	}
}

// replayedStep answers a tool step from its record: the tool is not called.
func replayedStep(st *session.Step, kind string) (*agentv1.CallToolResponse, CallResult, error) {
	res := CallResult{Status: StatusReplayed, Kind: kind, AnsweredBy: st.AnsweredBy, ConfirmationID: st.ConfirmationID, IdempotencyKey: st.IdempotencyKey}
	if st.Status == session.StatusPendingConfirmation {
		res.Status = StatusPendingConfirmation
		res.Notice = "this step's action awaits a person's confirmation; it was not run again"
		return ResultToProto(res), res, nil
	}
	var resp agentv1.CallToolResponse
	if err := proto.Unmarshal(st.Result, &resp); err != nil {
		return nil, res, fmt.Errorf("tool step %s: recorded result: %w", st.ID, err)
	}
	resp.Status = agentv1.ToolCallStatus_TOOL_CALL_STATUS_REPLAYED
	resp.Attempts = nil // none were made now
	if resp.Notice == "" {
		resp.Notice = "replayed from the session's record; the tool was not called again"
	}
	return &resp, res, nil
}

// stepStatusOfResult is the session step status of a call's result.
func stepStatusOfResult(res CallResult) session.StepStatus {
	switch {
	case res.IsError:
		return session.StatusFailed
	case res.Status == StatusBackup:
		return session.StatusDegraded
	case res.Status == StatusStale:
		return session.StatusStale
	case res.Status == StatusPendingConfirmation:
		return session.StatusPendingConfirmation
	}
	return session.StatusDone
}

// timedOut reports whether a call of tool timed out (feeds the session scheduler's cap).
func timedOut(attempts []Attempt, tool string) bool {
	for _, a := range attempts {
		if a.Tool == tool && a.Outcome == "timeout" {
			return true
		}
	}
	return false
}

func timedOutErr(err error, tool string) bool {
	var u *UnavailableError
	return errors.As(err, &u) && timedOut(u.Attempts, tool)
}

// sessionErrorStatus maps the errors of the session package (an ended session, a step
// conflict...) to gRPC statuses; ok is false for any other error.
func sessionErrorStatus(ctx context.Context, log *slog.Logger, err error) (error, bool) {
	var (
		invalid *session.InvalidError
		ended   *session.EndedError
	)
	if !errors.As(err, &invalid) && !errors.As(err, &ended) && !errors.Is(err, session.ErrSessionNotFound) &&
		!errors.Is(err, session.ErrStepNotFound) && !errors.Is(err, session.ErrStepConflict) &&
		!errors.Is(err, session.ErrStepInProgress) && !errors.Is(err, session.ErrTooManySessions) &&
		!errors.Is(err, session.ErrUnavailable) {
		return nil, false
	}
	return sessionStatus(ctx, log, err), true
}
