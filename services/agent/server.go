package agent

import (
	"context"
	"errors"
	"log/slog"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/agent/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/events"
	"github.com/mantle-mesh/mantle/pkg/formatcheck"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/agent/internal/session"
)

// errorDomain is the ErrorInfo domain of every status this service returns.
const errorDomain = "agent.mantle"

// ErrorInfo reasons of this service, beyond the shared ones in pkg/rpc (see tool.proto).
const (
	ReasonUnknownTool          = "UNKNOWN_TOOL"
	ReasonInvalidArguments     = "INVALID_ARGUMENTS"
	ReasonToolUnavailable      = "TOOL_UNAVAILABLE"
	ReasonRateLimited          = "RATE_LIMITED"
	ReasonIdempotencyKeyReused = "IDEMPOTENCY_KEY_REUSED"
	ReasonActionInProgress     = "ACTION_IN_PROGRESS"
	ReasonActionsUnavailable   = "ACTIONS_UNAVAILABLE"
)

// errTenantMismatch: the request claims a tenant other than the one that authenticated.
var errTenantMismatch = rpc.ErrTenantMismatch

// toolServer adapts Tools to mantle.agent.v1.ToolService.
type toolServer struct {
	agentv1.UnimplementedToolServiceServer
	tools *Tools
	log   *slog.Logger
	// sessions keeps the tool steps of calls that name a session (toolsteps.go); nil
	// runs every call on its own.
	sessions *session.Manager
}

// CallTool runs one tool call.
func (s *toolServer) CallTool(ctx context.Context, req *agentv1.CallToolRequest) (*agentv1.CallToolResponse, error) {
	tenant, err := callTenant(ctx, req.GetQuality().GetTenant())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	verr := &rpc.ValidationError{}
	if req.GetName() == "" {
		verr.Add("name", "is required")
	}
	if len(req.GetSessionId()) > 128 || len(req.GetStepId()) > 128 {
		verr.Add("session_id", "session_id and step_id are at most 128 bytes")
	}
	if err := verr.OrNil(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp, res, err := s.callStep(ctx, tenant, req, func(ctx context.Context) (CallResult, error) {
		return s.tools.Call(ctx, CallRequest{
			Tenant: tenant, Name: req.GetName(), Arguments: req.GetArguments(), IdempotencyKey: req.GetIdempotencyKey(),
			SessionID: req.GetSessionId(), StepID: req.GetStepId(), RequestID: req.GetQuality().GetRequestId(),
		})
	})
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp.Quality = qualityOf(req.GetQuality(), tenant, res)
	return resp, nil
}

// ResultToProto converts a call's result to its wire form.
func ResultToProto(res CallResult) *agentv1.CallToolResponse {
	resp := &agentv1.CallToolResponse{
		Result: res.Result, Status: statusToProto(res.Status), IsError: res.IsError, Notice: res.Notice,
		IdempotencyKey: res.IdempotencyKey, ConfirmationId: res.ConfirmationID, Kind: kindToProto(res.Kind),
		AnsweredBy: res.AnsweredBy,
	}
	if res.StaleAge > 0 {
		resp.StaleAge = durationpb.New(res.StaleAge)
	}
	for _, a := range res.Attempts {
		resp.Attempts = append(resp.Attempts, &agentv1.ToolAttempt{Tool: a.Tool, Outcome: a.Outcome, Latency: durationpb.New(a.Latency), HttpStatus: int32(a.HTTPStatus)})
	}
	return resp
}

// qualityOf is the caller's QualityContext with this call's audit step.
func qualityOf(q *mantlev1.QualityContext, tenant string, res CallResult) *mantlev1.QualityContext {
	out := &mantlev1.QualityContext{}
	if q != nil {
		out = proto.CloneOf(q)
	}
	out.Tenant = tenant
	detail := statusName(res.Status)
	if res.AnsweredBy != "" {
		detail += " by " + res.AnsweredBy
	}
	out.Audit = append(out.Audit, &mantlev1.AuditStep{Service: ServiceName, Step: "tool", Detail: detail})
	return out
}

// ListTools lists the registry, with each tool's health when asked.
func (s *toolServer) ListTools(_ context.Context, req *agentv1.ListToolsRequest) (*agentv1.ListToolsResponse, error) {
	reg := s.tools.reg.Load()
	resp := &agentv1.ListToolsResponse{Revision: reg.revision}
	for _, t := range reg.list() {
		info := toolInfo(t)
		if req.GetIncludeHealth() {
			info.Health = toolHealth(t)
		}
		resp.Tools = append(resp.Tools, info)
	}
	return resp, nil
}

// toolHealth is a tool's live state without its backend: what a tenant may see.
func toolHealth(t *tool) *agentv1.ToolHealth {
	snap := t.breaker.Snapshot()
	h := &agentv1.ToolHealth{
		Breaker: events.BreakerState(snap.State), Calls: t.stats.calls.Load(), Failures: t.stats.failures.Load(),
		StaleAnswers: t.stats.staleAnswers.Load(), RecentOutcomes: t.stats.recentOutcomes(),
	}
	if !snap.OpenUntil.IsZero() {
		h.BreakerUntil = timestamppb.New(snap.OpenUntil)
	}
	return h
}

func toolInfo(t *tool) *agentv1.ToolInfo {
	in := t.inputSchema
	if in == "" {
		in = `{"type":"object"}`
	}
	return &agentv1.ToolInfo{Name: t.cfg.Name, Description: t.cfg.Description, Kind: kindToProto(t.cfg.Kind), InputSchema: in, OutputSchema: t.outputSchema}
}

// DescribeTools returns the registry with each tool's live state on this replica.
func (s *toolServer) DescribeTools(_ context.Context, _ *agentv1.DescribeToolsRequest) (*agentv1.DescribeToolsResponse, error) {
	reg := s.tools.reg.Load()
	resp := &agentv1.DescribeToolsResponse{Revision: reg.revision}
	for _, t := range reg.list() {
		snap := t.breaker.Snapshot()
		requests, retries, _ := t.budget.Snapshot()
		st := &agentv1.ToolState{
			Tool: toolInfo(t), Backend: t.cfg.Backend.Type, Endpoint: endpointOf(t.cfg.Backend),
			Timeout: durationpb.New(t.cfg.Timeout), Backup: t.cfg.Backup, Breaker: events.BreakerState(snap.State),
			InFlight: int32(t.bulkhead.InFlight()), MaxInFlight: int32(t.bulkhead.Max()),
			StaleEntries: int32(s.tools.stale.count(t.cfg.Name)),
			Calls:        t.stats.calls.Load(), Failures: t.stats.failures.Load(), StaleAnswers: t.stats.staleAnswers.Load(),
			RecentOutcomes: t.stats.recentOutcomes(),
		}
		st.RetryTokens = max(0, max(float64(t.cfg.RetryBudget.Floor), t.cfg.RetryBudget.Ratio*float64(requests))-float64(retries))
		if !snap.OpenUntil.IsZero() {
			st.BreakerUntil = timestamppb.New(snap.OpenUntil)
		}
		resp.Tools = append(resp.Tools, st)
	}
	return resp, nil
}

func statusToProto(s Status) agentv1.ToolCallStatus {
	switch s {
	case StatusOK:
		return agentv1.ToolCallStatus_TOOL_CALL_STATUS_OK
	case StatusBackup:
		return agentv1.ToolCallStatus_TOOL_CALL_STATUS_BACKUP
	case StatusStale:
		return agentv1.ToolCallStatus_TOOL_CALL_STATUS_STALE
	case StatusReplayed:
		return agentv1.ToolCallStatus_TOOL_CALL_STATUS_REPLAYED
	case StatusPendingConfirmation:
		return agentv1.ToolCallStatus_TOOL_CALL_STATUS_PENDING_CONFIRMATION
	case StatusCached:
		return agentv1.ToolCallStatus_TOOL_CALL_STATUS_CACHED
	}
	return agentv1.ToolCallStatus_TOOL_CALL_STATUS_UNSPECIFIED
}

func kindToProto(k string) agentv1.ToolKind {
	switch k {
	case KindQuery:
		return agentv1.ToolKind_TOOL_KIND_QUERY
	case KindAction:
		return agentv1.ToolKind_TOOL_KIND_ACTION
	case KindExternal:
		return agentv1.ToolKind_TOOL_KIND_EXTERNAL
	}
	return agentv1.ToolKind_TOOL_KIND_UNSPECIFIED
}

// toStatus maps an error to its gRPC status, in one place.
func (s *toolServer) toStatus(ctx context.Context, err error) error {
	var (
		invalid     *rpc.ValidationError
		badArgs     *argError
		schemaErr   *formatcheck.SchemaError
		unavailable *UnavailableError
		limited     *RateLimitedError
	)
	if st, ok := sessionErrorStatus(ctx, s.log, err); ok {
		return st
	}
	switch {
	case err == nil:
		return nil
	case errors.As(err, &invalid):
		return rpc.InvalidArgument(errorDomain, invalid)
	case errors.As(err, &badArgs):
		return rpc.Status(codes.InvalidArgument, errorDomain, ReasonInvalidArguments, badArgs.Error(),
			&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "arguments" + badArgs.Path, Description: badArgs.Reason}}})
	case errors.Is(err, errTenantMismatch):
		return rpc.Status(codes.PermissionDenied, errorDomain, rpc.ReasonPermissionDenied, "the claimed tenant does not match the authenticated tenant")
	case errors.Is(err, ErrUnknownTool):
		return rpc.Status(codes.NotFound, errorDomain, ReasonUnknownTool, err.Error())
	case errors.Is(err, ErrKeyReused):
		return rpc.Status(codes.FailedPrecondition, errorDomain, ReasonIdempotencyKeyReused, err.Error())
	case errors.Is(err, ErrActionInProgress):
		return rpc.Status(codes.Aborted, errorDomain, ReasonActionInProgress, err.Error())
	case errors.Is(err, ErrActionsUnavailable):
		s.log.WarnContext(ctx, "action refused: idempotency store unavailable", "err", err)
		return rpc.Status(codes.Unavailable, errorDomain, ReasonActionsUnavailable, "actions are unavailable: their idempotency records cannot be reached; queries are still served")
	case errors.As(err, &limited):
		return rpc.Status(codes.ResourceExhausted, errorDomain, ReasonRateLimited, limited.Error(),
			&errdetails.RetryInfo{RetryDelay: durationpb.New(limited.RetryAfter)})
	case errors.As(err, &unavailable):
		return rpc.Status(codes.Unavailable, errorDomain, ReasonToolUnavailable, unavailable.Error())
	case errors.As(err, &schemaErr):
		// The registry's own schema does not compile: the configuration's fault.
		s.log.ErrorContext(ctx, "tool schema does not compile", "err", err)
		return rpc.Status(codes.Internal, errorDomain, rpc.ReasonInternal, "the tool's schema is invalid")
	case rpc.ContextStatus(err) != nil:
		return rpc.ContextStatus(err)
	default:
		s.log.ErrorContext(ctx, "tool call failed", "err", err)
		return rpc.Status(codes.Internal, errorDomain, rpc.ReasonInternal, "internal error")
	}
}

// callTenant returns the tenant the call acts for: the authenticated one when auth is on
// (a different claimed tenant is refused), the claimed one otherwise, which is then required.
func callTenant(ctx context.Context, claimed string) (string, error) {
	tenant, err := rpc.CallTenant(ctx, claimed)
	switch {
	case err != nil || tenant != "":
		return tenant, err
	case rpc.IsOperator(ctx):
		return "", rpc.Invalid("quality.tenant", "an operator calls tools for a tenant: set quality.tenant")
	default:
		return "", rpc.Invalid("quality.tenant", "is required when the call is not authenticated")
	}
}
