package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/agent/v1"
	"github.com/mantle-mesh/mantle/pkg/app"
	"github.com/mantle-mesh/mantle/pkg/events"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/agent/internal/session"
)

// SessionService's ErrorInfo reasons (session.proto), in the domain every status of this
// service has.
const (
	sessionDomain              = "agent.mantle"
	ReasonSessionNotFound      = "SESSION_NOT_FOUND"
	ReasonSessionEnded         = "SESSION_ENDED"
	ReasonStepConflict         = "STEP_CONFLICT"
	ReasonStepInProgress       = "STEP_IN_PROGRESS"
	ReasonStepNotFound         = "STEP_NOT_FOUND"
	ReasonTooManySessions      = "TOO_MANY_SESSIONS"
	ReasonSessionsUnavailable  = "UNAVAILABLE"
	defaultSessionTenant       = "default"
	sessionSweepInterval       = time.Minute
	maxSessionEndWaitPerStream = 24 * time.Hour
)

// sessionServer adapts the session manager to mantle.agent.v1.SessionService.
type sessionServer struct {
	agentv1.UnimplementedSessionServiceServer
	m   *session.Manager
	log *slog.Logger
}

// newSessions builds the session store the configuration names and the server over it;
// the Runnable sweeps a memory store's expired keys (nil for JetStream, whose server
// expires them).
func newSessions(ctx context.Context, cfg session.Config, env app.Env) (*sessionServer, app.Runnable, error) {
	clock := env.Clock
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	log := env.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var store session.Store
	var run app.Runnable
	switch cfg.Backend {
	case session.BackendJetStream:
		if env.NATS == nil {
			return nil, nil, errors.New("sessions.backend jetstream needs NATS: set events.nats_url or events.embedded, or use the memory backend")
		}
		js, err := jetstream.New(env.NATS)
		if err != nil {
			return nil, nil, fmt.Errorf("sessions: %w", err)
		}
		if store, err = session.NewJetStream(ctx, js, cfg.Bucket, cfg.MaxBucketBytes); err != nil {
			return nil, nil, fmt.Errorf("sessions: %w", err)
		}
	default:
		mem := session.NewMemory(cfg.MaxMemoryKeys, clock)
		store = mem
		run = app.RunFunc(func(ctx context.Context) error {
			t := clock.NewTicker(sessionSweepInterval)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return nil
				case <-t.Chan():
					mem.Sweep()
				}
			}
		})
	}
	m := session.NewManager(cfg, store, clock)
	if env.Events != nil {
		pub := env.Events
		m.OnEvent(func(ctx context.Context, ev session.Event) {
			pub.Publish(context.WithoutCancel(ctx), events.SubjectSession, sessionEvent(ev))
		})
	}
	return &sessionServer{m: m, log: log}, run, nil
}

var _ agentv1.SessionServiceServer = (*sessionServer)(nil)

// sessionTenant is the tenant a session call acts for: the caller's (a tenant key, or a
// service acting for one), or, for an operator, the one the request names. A tenant that
// names another tenant is refused.
func sessionTenant(ctx context.Context, named string) (string, error) {
	c := rpc.CallerOf(ctx)
	switch c.Kind {
	case rpc.CallerOperator:
		if named == "" {
			return "", rpc.Invalid("tenant", "an operator names the tenant whose session it is")
		}
		return named, nil
	case rpc.CallerNone:
		// Authentication is off: every caller is the one default tenant, as on the router.
		if named != "" && named != defaultSessionTenant {
			return "", rpc.Invalid("tenant", "without authentication every session is the %q tenant's", defaultSessionTenant)
		}
		return defaultSessionTenant, nil
	}
	tenant := c.Tenant
	if tenant == "" {
		// A service acting for no tenant (a drill, a health probe) has sessions of its own.
		tenant = defaultSessionTenant
	}
	if named != "" && named != tenant {
		return "", rpc.Status(codes.PermissionDenied, sessionDomain, rpc.ReasonPermissionDenied, "a tenant reaches only its own sessions")
	}
	return tenant, nil
}

// sessionStatus maps the session manager's errors to gRPC statuses.
func (s *sessionServer) sessionStatus(ctx context.Context, err error) error {
	return sessionStatus(ctx, s.log, err)
}

// sessionStatus is the one place the session manager's errors become gRPC statuses, for
// SessionService and for the tool steps of CallTool.
func sessionStatus(ctx context.Context, log *slog.Logger, err error) error {
	var (
		invalid *session.InvalidError
		ended   *session.EndedError
		verr    *rpc.ValidationError
	)
	switch {
	case err == nil:
		return nil
	case errors.As(err, &verr):
		return rpc.InvalidArgument(sessionDomain, verr)
	case errors.As(err, &invalid):
		return rpc.InvalidArgument(sessionDomain, rpc.Invalid(invalid.Field, "%s", invalid.Reason))
	case errors.As(err, &ended):
		return rpc.Status(codes.FailedPrecondition, sessionDomain, ReasonSessionEnded, ended.Error())
	case errors.Is(err, session.ErrSessionNotFound):
		return rpc.Status(codes.NotFound, sessionDomain, ReasonSessionNotFound, "no such session for this tenant (or it has expired)")
	case errors.Is(err, session.ErrStepNotFound):
		return rpc.Status(codes.NotFound, sessionDomain, ReasonStepNotFound, err.Error())
	case errors.Is(err, session.ErrStepConflict):
		return rpc.Status(codes.FailedPrecondition, sessionDomain, ReasonStepConflict, err.Error())
	case errors.Is(err, session.ErrStepInProgress):
		return rpc.Status(codes.Aborted, sessionDomain, ReasonStepInProgress, err.Error())
	case errors.Is(err, session.ErrTooManySessions):
		return rpc.ResourceExhausted(sessionDomain, "sessions", "this tenant opens sessions faster than agent.sessions.new_sessions_per_minute", time.Second)
	case errors.Is(err, context.Canceled):
		return rpc.Status(codes.Canceled, sessionDomain, "CANCELED", "request canceled")
	case errors.Is(err, context.DeadlineExceeded):
		return rpc.Status(codes.DeadlineExceeded, sessionDomain, "DEADLINE_EXCEEDED", "the deadline passed before the step could begin")
	case errors.Is(err, session.ErrUnavailable):
		log.WarnContext(ctx, "session store unavailable", "err", err)
		return rpc.Status(codes.Unavailable, sessionDomain, ReasonSessionsUnavailable, "the session store cannot be reached")
	}
	if _, ok := status.FromError(err); ok {
		return err // a status already (sessionTenant's refusals)
	}
	log.ErrorContext(ctx, "session call failed", "err", err)
	return rpc.Status(codes.Internal, sessionDomain, rpc.ReasonInternal, "internal error")
}

// BeginStep implements SessionService.
func (s *sessionServer) BeginStep(ctx context.Context, in *agentv1.BeginStepRequest) (*agentv1.BeginStepResponse, error) {
	tenant, err := sessionTenant(ctx, "")
	if err != nil {
		return nil, s.sessionStatus(ctx, err)
	}
	req := session.BeginRequest{
		Tenant: tenant, SessionID: in.GetSessionId(), StepID: in.GetStepId(), Kind: stepKindOf(in.GetKind()),
		Target: in.GetTarget(), Required: in.GetRequired(), Fingerprint: in.GetFingerprint(),
		ToolKind: toolKindOf(in.GetToolKind()),
	}
	if b := in.GetBudget(); b != nil {
		req.Budget = session.Budget{Deadline: b.GetDeadline().AsDuration(), Tokens: b.GetMaxTokens(), CostUSD: b.GetMaxCostUsd(), Steps: int(b.GetMaxSteps())}
	}
	// The caller's deadline is the step's lease: a router that dies mid-step holds the
	// step id no longer than its request could have run.
	if d, ok := ctx.Deadline(); ok {
		req.Deadline = d
	}
	res, err := s.m.Begin(ctx, req)
	if err != nil {
		return nil, s.sessionStatus(ctx, err)
	}
	out := &agentv1.BeginStepResponse{
		Decision: agentv1.BeginStepResponse_DECISION_RUN, Left: leftToProto(res.Left), Degraded: res.Degraded,
		ActionsNeedConfirmation: res.ActionsNeedConfirmation, ParallelCap: int32(res.ParallelCap),
	}
	if res.Replay {
		out.Decision = agentv1.BeginStepResponse_DECISION_REPLAY
		out.Step = stepToProto(&res.Step)
	}
	return out, nil
}

// EndStep implements SessionService.
func (s *sessionServer) EndStep(ctx context.Context, in *agentv1.EndStepRequest) (*agentv1.EndStepResponse, error) {
	tenant, err := sessionTenant(ctx, "")
	if err != nil {
		return nil, s.sessionStatus(ctx, err)
	}
	status, ok := stepStatusOf(in.GetStatus())
	if !ok {
		return nil, s.sessionStatus(ctx, rpc.Invalid("status", "want done, degraded, stale, pending_confirmation, failed or cancelled, got %s", in.GetStatus()))
	}
	res, err := s.m.End(ctx, session.EndRequest{
		Tenant: tenant, SessionID: in.GetSessionId(), StepID: in.GetStepId(), Status: status, Result: in.GetResult(),
		AnsweredBy: in.GetAnsweredBy(), Reason: in.GetReason(), Tokens: in.GetTokens(), CostUSD: in.GetCostUsd(),
		IdempotencyKey: in.GetIdempotencyKey(), ConfirmationID: in.GetConfirmationId(), StaleAge: in.GetStaleAge().AsDuration(),
		TimedOut: in.GetTimedOut(),
	})
	if err != nil {
		return nil, s.sessionStatus(ctx, err)
	}
	return &agentv1.EndStepResponse{State: stateToProto(res.State), EndReason: res.EndReason, Left: leftToProto(res.Left), Recorded: res.Recorded}, nil
}

// GetSession implements SessionService.
func (s *sessionServer) GetSession(ctx context.Context, in *agentv1.GetSessionRequest) (*agentv1.GetSessionResponse, error) {
	tenant, err := sessionTenant(ctx, in.GetTenant())
	if err != nil {
		return nil, s.sessionStatus(ctx, err)
	}
	got, err := s.m.Get(ctx, tenant, in.GetSessionId(), true)
	if err != nil {
		return nil, s.sessionStatus(ctx, err)
	}
	return &agentv1.GetSessionResponse{Session: s.sessionToProto(got)}, nil
}

// CancelSession implements SessionService.
func (s *sessionServer) CancelSession(ctx context.Context, in *agentv1.CancelSessionRequest) (*agentv1.CancelSessionResponse, error) {
	tenant, err := sessionTenant(ctx, in.GetTenant())
	if err != nil {
		return nil, s.sessionStatus(ctx, err)
	}
	got, err := s.m.Cancel(ctx, tenant, in.GetSessionId(), in.GetReason())
	if err != nil {
		return nil, s.sessionStatus(ctx, err)
	}
	return &agentv1.CancelSessionResponse{Session: s.sessionToProto(got)}, nil
}

// CompleteSession implements SessionService.
func (s *sessionServer) CompleteSession(ctx context.Context, in *agentv1.CompleteSessionRequest) (*agentv1.CompleteSessionResponse, error) {
	tenant, err := sessionTenant(ctx, in.GetTenant())
	if err != nil {
		return nil, s.sessionStatus(ctx, err)
	}
	got, err := s.m.Complete(ctx, tenant, in.GetSessionId())
	if err != nil {
		return nil, s.sessionStatus(ctx, err)
	}
	return &agentv1.CompleteSessionResponse{Session: s.sessionToProto(got)}, nil
}

// WatchSession implements SessionService: one message when the session ends. A watch
// without a deadline ends after a day at most, so a forgotten stream is not held forever.
func (s *sessionServer) WatchSession(in *agentv1.WatchSessionRequest, stream grpc.ServerStreamingServer[agentv1.WatchSessionResponse]) error {
	ctx := stream.Context()
	tenant, err := sessionTenant(ctx, "")
	if err != nil {
		return s.sessionStatus(ctx, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, maxSessionEndWaitPerStream)
		defer cancel()
	}
	got, err := s.m.AwaitEnd(ctx, tenant, in.GetSessionId())
	if err != nil {
		return s.sessionStatus(ctx, err)
	}
	return stream.Send(&agentv1.WatchSessionResponse{State: stateToProto(got.State), EndReason: got.EndReason})
}

func stepKindOf(k agentv1.StepKind) session.Kind {
	switch k {
	case agentv1.StepKind_STEP_KIND_MODEL:
		return session.KindModel
	case agentv1.StepKind_STEP_KIND_TOOL:
		return session.KindTool
	}
	return ""
}

func stepKindToProto(k session.Kind) agentv1.StepKind {
	switch k {
	case session.KindModel:
		return agentv1.StepKind_STEP_KIND_MODEL
	case session.KindTool:
		return agentv1.StepKind_STEP_KIND_TOOL
	}
	return agentv1.StepKind_STEP_KIND_UNSPECIFIED
}

func toolKindOf(k agentv1.ToolKind) string {
	switch k {
	case agentv1.ToolKind_TOOL_KIND_QUERY:
		return session.ToolQuery
	case agentv1.ToolKind_TOOL_KIND_ACTION:
		return session.ToolAction
	case agentv1.ToolKind_TOOL_KIND_EXTERNAL:
		return session.ToolExternal
	}
	return ""
}

func toolKindToProto(k string) agentv1.ToolKind {
	switch k {
	case session.ToolQuery:
		return agentv1.ToolKind_TOOL_KIND_QUERY
	case session.ToolAction:
		return agentv1.ToolKind_TOOL_KIND_ACTION
	case session.ToolExternal:
		return agentv1.ToolKind_TOOL_KIND_EXTERNAL
	}
	return agentv1.ToolKind_TOOL_KIND_UNSPECIFIED
}

var stepStatuses = []struct {
	pb agentv1.StepStatus
	st session.StepStatus
}{
	{agentv1.StepStatus_STEP_STATUS_RUNNING, session.StatusRunning},
	{agentv1.StepStatus_STEP_STATUS_DONE, session.StatusDone},
	{agentv1.StepStatus_STEP_STATUS_DEGRADED, session.StatusDegraded},
	{agentv1.StepStatus_STEP_STATUS_STALE, session.StatusStale},
	{agentv1.StepStatus_STEP_STATUS_SKIPPED, session.StatusSkipped},
	{agentv1.StepStatus_STEP_STATUS_PENDING_CONFIRMATION, session.StatusPendingConfirmation},
	{agentv1.StepStatus_STEP_STATUS_FAILED, session.StatusFailed},
	{agentv1.StepStatus_STEP_STATUS_CANCELLED, session.StatusCancelled},
}

// stepStatusOf maps a status EndStep may set; running and unspecified are not among them.
func stepStatusOf(s agentv1.StepStatus) (session.StepStatus, bool) {
	for _, m := range stepStatuses {
		if m.pb == s && m.st != session.StatusRunning && m.st != session.StatusSkipped {
			return m.st, true
		}
	}
	return "", false
}

func stepStatusToProto(s session.StepStatus) agentv1.StepStatus {
	for _, m := range stepStatuses {
		if m.st == s {
			return m.pb
		}
	}
	return agentv1.StepStatus_STEP_STATUS_UNSPECIFIED
}

func stateToProto(s session.State) agentv1.SessionState {
	switch s {
	case session.StateActive:
		return agentv1.SessionState_SESSION_STATE_ACTIVE
	case session.StateCompleted:
		return agentv1.SessionState_SESSION_STATE_COMPLETED
	case session.StateCancelled:
		return agentv1.SessionState_SESSION_STATE_CANCELLED
	case session.StateEndedPartial:
		return agentv1.SessionState_SESSION_STATE_ENDED_PARTIAL
	}
	return agentv1.SessionState_SESSION_STATE_UNSPECIFIED
}

func leftToProto(l session.Left) *agentv1.BudgetLeft {
	return &agentv1.BudgetLeft{Time: durationpb.New(max(l.Time, 0)), Tokens: max(l.Tokens, 0), CostUsd: max(l.CostUSD, 0), Steps: int32(max(l.Steps, 0))}
}

// timestampOrNil keeps a zero time absent.
func timestampOrNil(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func stepToProto(st *session.Step) *agentv1.Step {
	out := &agentv1.Step{
		StepId: st.ID, Kind: stepKindToProto(st.Kind), Status: stepStatusToProto(st.Status), Target: st.Target,
		AnsweredBy: st.AnsweredBy, Required: st.Required, Result: st.Result, RecordTooLarge: st.RecordTooLarge,
		Reason: st.Reason, ToolKind: toolKindToProto(st.ToolKind), IdempotencyKey: st.IdempotencyKey,
		ConfirmationId: st.ConfirmationID, Tokens: st.Tokens, CostUsd: st.CostUSD,
		StartedAt: timestampOrNil(st.StartedAt), EndedAt: timestampOrNil(st.EndedAt), Fingerprint: st.Fingerprint,
	}
	if st.StaleAge > 0 {
		out.StaleAge = durationpb.New(st.StaleAge)
	}
	return out
}

func (s *sessionServer) sessionToProto(got *session.Session) *agentv1.Session {
	now := s.m.Now()
	out := &agentv1.Session{
		SessionId: got.ID, Tenant: got.Tenant, State: stateToProto(got.State), EndReason: got.EndReason,
		Budget: &agentv1.SessionBudget{
			Deadline: durationpb.New(got.Budget.Deadline), MaxTokens: got.Budget.Tokens,
			MaxCostUsd: got.Budget.CostUSD, MaxSteps: int32(got.Budget.Steps),
		},
		Left: leftToProto(got.Left(now)), Degraded: got.Degraded, DegradedUntil: timestampOrNil(got.DegradedUntil),
		Degradations: int32(got.Degradations), ActionsNeedConfirmation: got.ActionsNeedConfirmation,
		ParallelCap: int32(s.m.ParallelCap(got, now)),
		CreatedAt:   timestampOrNil(got.CreatedAt), UpdatedAt: timestampOrNil(got.UpdatedAt),
	}
	for _, st := range got.Steps {
		out.Steps = append(out.Steps, stepToProto(st))
	}
	return out
}
