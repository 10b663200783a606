package quota

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	quotav1 "github.com/mantle-mesh/mantle/pkg/api/mantle/quota/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/pbtime"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/quota/internal/ledger"
	"github.com/mantle-mesh/mantle/services/quota/internal/tokencount"
)

// errorDomain is the ErrorInfo domain of every error this service returns.
const errorDomain = "quota.mantle"

// server adapts Service to quotav1.QuotaServiceServer: it converts messages, resolves
// the tenant, appends the audit step, and maps errors in toStatus. It holds no logic.
type server struct {
	quotav1.UnimplementedQuotaServiceServer
	svc *service
	log *slog.Logger
}

func newServer(svc *service) *server {
	return &server{svc: svc, log: svc.log}
}

// HandsOverResponse implements app.ResponseHandOver for Reserve and Settle: their answers
// are made for the call from the ledger's figures (limits, buckets and budget converted,
// not shared) around the call's own copy of the request's QualityContext, and nothing of
// them is kept.
func (s *server) HandsOverResponse(method string) bool {
	return method == quotav1.QuotaService_Reserve_FullMethodName || method == quotav1.QuotaService_Settle_FullMethodName
}

// TakesOverRequest implements app.RequestTakeOver for Reserve and Settle: they write
// nothing of their request but its QualityContext, which Reserve extends and answers
// with, and keep nothing of it once they return.
func (s *server) TakesOverRequest(method string) bool {
	return method == quotav1.QuotaService_Reserve_FullMethodName || method == quotav1.QuotaService_Settle_FullMethodName
}

func (s *server) Reserve(ctx context.Context, req *quotav1.ReserveRequest) (*quotav1.ReserveResponse, error) {
	start := s.svc.clock.Now()
	tenant, err := rpc.CallTenant(ctx, req.GetQuality().GetTenant())
	if err != nil {
		return nil, s.toStatus(err)
	}
	got, err := s.svc.Reserve(ctx, reserveRequest{
		Tenant:          tenant,
		RequestID:       req.GetQuality().GetRequestId(),
		Priority:        req.GetQuality().GetPriority(),
		Model:           req.GetModel(),
		InputTokens:     req.GetInputTokens(),
		MaxOutputTokens: req.GetMaxOutputTokens(),
		Messages:        messagesFromProto(req.GetMessages()),
		Tools:           req.GetTools(),
		UpstreamKey:     req.GetUpstreamKeyId(),
		KeyOnly:         req.GetScope() == quotav1.ReserveScope_RESERVE_SCOPE_UPSTREAM_KEY,
	})
	if err != nil {
		return nil, s.toStatus(err)
	}

	// The request was decoded for this call alone, so its QualityContext can be extended
	// in place and handed back.
	quality := req.GetQuality()
	if quality == nil {
		quality = &mantlev1.QualityContext{}
	}
	if quality.GetTenant() == "" {
		quality.Tenant = tenant
	}
	detail := reserveDetail(got, req.GetModel())
	// The answer, its times and its audit step in one allocation (reserveMessage).
	m := &reserveMessage{
		step: mantlev1.AuditStep{Service: "quota", Step: "reserve", Detail: detail},
		resp: quotav1.ReserveResponse{
			ReservationId:  got.ReservationID,
			ReservedTokens: got.ReservedTokens,
			Limits:         limitsToProto(got.Levels),
			Quality:        quality,
			Buckets:        bucketsToProto(got.Buckets),
			InputTokens:    got.InputTokens,
		},
	}
	pbtime.SetTimestamp(&m.stepAt, start)
	pbtime.SetDuration(&m.stepTook, s.svc.clock.Since(start))
	m.step.At, m.step.Duration = &m.stepAt, &m.stepTook
	quality.Audit = append(quality.Audit, &m.step)
	pbtime.SetTimestamp(&m.expiresAt, got.ExpiresAt)
	pbtime.SetDuration(&m.waited, got.Waited)
	resp := &m.resp
	resp.ExpiresAt, resp.Waited = &m.expiresAt, &m.waited
	if b := got.Budget; b != nil {
		resp.Budget = &quotav1.Budget{LimitUsd: nanoToDollars(b.Limit), SpentUsd: nanoToDollars(b.Spent), ResetAfter: durationpb.New(b.Reset), Shadow: b.Shadow}
	}
	return resp, nil
}

func (s *server) Settle(ctx context.Context, req *quotav1.SettleRequest) (*quotav1.SettleResponse, error) {
	tenant, err := rpc.CallTenant(ctx, req.GetQuality().GetTenant())
	if err != nil {
		return nil, s.toStatus(err)
	}
	var usage *tokenUsage
	if u := req.GetUsage(); u != nil {
		usage = &tokenUsage{InputTokens: u.GetInputTokens(), OutputTokens: u.GetOutputTokens(), TotalTokens: u.GetTotalTokens()}
	}
	settled, err := s.svc.Settle(ctx, settleRequest{
		Tenant:        tenant,
		RequestID:     req.GetQuality().GetRequestId(),
		ReservationID: req.GetReservationId(),
		Usage:         usage,
	})
	if err != nil {
		return nil, s.toStatus(err)
	}
	return &quotav1.SettleResponse{
		RefundedTokens: settled.Refunded,
		Limits:         limitsToProto(settled.Levels),
		ReservedTokens: settled.Reserved,
		Buckets:        bucketsToProto(settled.Buckets),
		CostUsd:        settled.CostUSD,
	}, nil
}

func (s *server) CountTokens(ctx context.Context, req *quotav1.CountTokensRequest) (*quotav1.CountTokensResponse, error) {
	count, err := s.svc.CountTokens(ctx, req.GetModel(), messagesFromProto(req.GetMessages()), req.GetTools(), req.GetText())
	if err != nil {
		return nil, s.toStatus(err)
	}
	return &quotav1.CountTokensResponse{Tokens: count.Tokens, Tokenizer: count.Tokenizer, Exact: count.Exact, Correction: count.Correction}, nil
}

func (s *server) ObserveUpstream(ctx context.Context, req *quotav1.ObserveUpstreamRequest) (*quotav1.ObserveUpstreamResponse, error) {
	applied, levels, err := s.svc.ObserveUpstream(ctx, upstreamObservation{
		Key:               req.GetUpstreamKeyId(),
		RemainingRequests: req.GetRemainingRequests(),
		RemainingTokens:   req.GetRemainingTokens(),
		ResetRequests:     req.GetResetRequests().AsDuration(),
		ResetTokens:       req.GetResetTokens().AsDuration(),
	})
	if err != nil {
		return nil, s.toStatus(err)
	}
	resp := &quotav1.ObserveUpstreamResponse{Applied: applied}
	if applied {
		resp.Limits = limitsToProto(levels)
	}
	return resp, nil
}

func (s *server) AcquireRetry(ctx context.Context, req *quotav1.AcquireRetryRequest) (*quotav1.AcquireRetryResponse, error) {
	d, err := s.svc.AcquireRetry(ctx, req.GetUpstreamKeyId(), req.GetFormatRetry())
	if err != nil {
		return nil, s.toStatus(err)
	}
	resp := &quotav1.AcquireRetryResponse{Granted: d.Granted, Requests: d.Requests, Retries: d.Retries}
	if !d.Granted {
		resp.Budget = d.Budget
	}
	return resp, nil
}

// DescribeUsage scopes an authenticated caller to its own tenant: one tenant's traffic is
// not another's business.
func (s *server) DescribeUsage(ctx context.Context, req *quotav1.DescribeUsageRequest) (*quotav1.DescribeUsageResponse, error) {
	tenants := req.GetTenants()
	if own := rpc.Tenant(ctx); own != "" {
		for _, t := range tenants {
			if _, err := rpc.CallTenant(ctx, t); err != nil {
				return nil, s.toStatus(err)
			}
		}
		tenants = []string{own}
	}
	usage, err := s.svc.Usage(ctx, tenants)
	if err != nil {
		return nil, s.toStatus(err)
	}
	resp := &quotav1.DescribeUsageResponse{}
	for _, u := range usage {
		b := bucketsToProto([]ledger.BucketLevel{u.Levels.Requests, u.Levels.Tokens})
		resp.Tenants = append(resp.Tenants, &quotav1.TenantUsage{Tenant: u.Tenant, Requests: b[0], Tokens: b[1]})
	}
	return resp, nil
}

// toStatus is the one place domain errors become gRPC statuses. Every status carries
// ErrorInfo{Domain: "quota.mantle", Reason}; clients branch on codes and details.
func (s *server) toStatus(err error) error {
	if v, ok := errors.AsType[*rpc.ValidationError](err); ok {
		return rpc.InvalidArgument(errorDomain, v)
	}
	if e, ok := errors.AsType[*ledger.ExhaustedError](err); ok {
		return exhaustedStatus(e)
	}
	if e, ok := errors.AsType[*tooLargeError](err); ok {
		return rpc.Status(codes.FailedPrecondition, errorDomain, reasonRequestTooLarge, e.Error(),
			&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
				Subject: e.Bucket, Description: e.Error(),
			}}},
			&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{
				Field:       e.Field,
				Description: fmt.Sprintf("the request needs %d but %s holds at most %d; reduce it or raise the limit", e.Cost, e.Bucket, e.Limit),
			}}},
		)
	}
	if e, ok := errors.AsType[*priceUnknownError](err); ok {
		return rpc.Status(codes.FailedPrecondition, errorDomain, reasonPriceUnknown, e.Error())
	}
	switch {
	case errors.Is(err, ledger.ErrReservationNotFound):
		return rpc.Status(codes.NotFound, errorDomain, reasonReservationNotFound, err.Error())
	case errors.Is(err, rpc.ErrTenantMismatch):
		return rpc.Status(codes.PermissionDenied, errorDomain, rpc.ReasonPermissionDenied, err.Error())
	case errors.Is(err, errBudgetUnavailable):
		return rpc.Status(codes.Unavailable, errorDomain, reasonBudgetUnavailable, errBudgetUnavailable.Error())
	case errors.Is(err, errStoreUnavailable), errors.Is(err, errShuttingDown):
		return rpc.Status(codes.Unavailable, errorDomain, reasonUnavailable, err.Error())
	case rpc.ContextStatus(err) != nil:
		return rpc.ContextStatus(err)
	default:
		// The caller gets a generic message; the detail goes to the log, once, here.
		s.log.Error("quota: internal error", "err", err)
		return rpc.Status(codes.Internal, errorDomain, rpc.ReasonInternal, "internal error")
	}
}

// exhaustedStatus is RESOURCE_EXHAUSTED with RetryInfo, QuotaFailure, and the cause in
// the ErrorInfo metadata. The reason stays QUOTA_EXHAUSTED whatever the cause, so
// clients need one branch to retry after the delay.
func exhaustedStatus(e *ledger.ExhaustedError) error {
	meta := map[string]string{"cause": e.EffectiveCause()}
	if e.Waited > 0 {
		meta["waited_ms"] = strconv.FormatInt(e.Waited.Milliseconds(), 10)
	}
	return status.ErrorProto(&spb.Status{
		Code:    int32(codes.ResourceExhausted),
		Message: e.Error(),
		Details: mustAny(
			&errdetails.ErrorInfo{Reason: rpc.ReasonQuotaExhausted, Domain: errorDomain, Metadata: meta},
			&errdetails.RetryInfo{RetryDelay: durationpb.New(e.RetryAfter)},
			&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{Subject: e.Bucket, Description: e.Error()}}},
		),
	})
}

func mustAny(msgs ...proto.Message) []*anypb.Any {
	out := make([]*anypb.Any, 0, len(msgs))
	for _, m := range msgs {
		a, err := anypb.New(m)
		if err != nil {
			continue // our own well-formed messages; cannot happen
		}
		out = append(out, a)
	}
	return out
}

func messagesFromProto(msgs []*mantlev1.ChatMessage) []tokencount.Message {
	out := make([]tokencount.Message, 0, len(msgs))
	for _, m := range msgs {
		out = append(out, tokencount.Message{
			Role: m.GetRole(), Content: m.GetContent(), Name: m.GetName(), Parts: m.GetParts(),
			ToolCalls: m.GetToolCalls(), ToolCallID: m.GetToolCallId(), Refusal: m.GetRefusal(),
		})
	}
	return out
}

// Every reserve and settle answers with the limits and the bucket levels, each with its
// durations: limitsToProto and bucketsToProto make each with its durations in one
// allocation (limitsMessage, bucketMessage) instead of one per message.

type limitsMessage struct {
	limits                     quotav1.Limits
	resetRequests, resetTokens durationpb.Duration
}

func limitsToProto(l levelPair) *quotav1.Limits {
	m := &limitsMessage{limits: quotav1.Limits{
		LimitRequests:     l.Requests.Limit,
		RemainingRequests: l.Requests.Remaining,
		LimitTokens:       l.Tokens.Limit,
		RemainingTokens:   l.Tokens.Remaining,
	}}
	pbtime.SetDuration(&m.resetRequests, l.Requests.Reset)
	pbtime.SetDuration(&m.resetTokens, l.Tokens.Reset)
	m.limits.ResetRequests, m.limits.ResetTokens = &m.resetRequests, &m.resetTokens
	return &m.limits
}

type bucketMessage struct {
	level      quotav1.BucketLevel
	resetAfter durationpb.Duration
}

func bucketsToProto(levels []ledger.BucketLevel) []*quotav1.BucketLevel {
	out := make([]*quotav1.BucketLevel, len(levels))
	ms := make([]bucketMessage, len(levels))
	for i, l := range levels {
		m := &ms[i]
		m.level.Name, m.level.Limit, m.level.Remaining = l.Name, l.Limit, l.Remaining
		m.level.Shadow, m.level.ShadowRefused = l.Shadow, l.ShadowRefused
		pbtime.SetDuration(&m.resetAfter, l.Reset)
		m.level.ResetAfter = &m.resetAfter
		out[i] = &m.level
	}
	return out
}

// reserveDetail is a reserve's audit detail, "reserved 1000 tokens (900 input + 100 max
// output) for m; 9000/10000 tokens and 59/60 requests left[; waited 1.5s]", appended
// into one buffer: fmt boxed each of its numbers, every reserve.
func reserveDetail(got reserveOutcome, model string) string {
	var buf [192]byte
	b := append(buf[:0], "reserved "...)
	b = strconv.AppendInt(b, got.ReservedTokens, 10)
	b = append(b, " tokens ("...)
	b = strconv.AppendInt(b, got.InputTokens, 10)
	b = append(b, " input + "...)
	b = strconv.AppendInt(b, got.MaxOutputTokens, 10)
	b = append(b, " max output) for "...)
	b = append(b, model...)
	b = append(b, "; "...)
	b = strconv.AppendInt(b, got.Levels.Tokens.Remaining, 10)
	b = append(b, '/')
	b = strconv.AppendInt(b, got.Levels.Tokens.Limit, 10)
	b = append(b, " tokens and "...)
	b = strconv.AppendInt(b, got.Levels.Requests.Remaining, 10)
	b = append(b, '/')
	b = strconv.AppendInt(b, got.Levels.Requests.Limit, 10)
	b = append(b, " requests left"...)
	if got.Waited > 0 {
		b = append(b, "; waited "...)
		b = append(b, got.Waited.String()...)
	}
	return string(b)
}

// reserveMessage is a reserve's answer with its times and the audit step it adds.
type reserveMessage struct {
	resp      quotav1.ReserveResponse
	expiresAt timestamppb.Timestamp
	waited    durationpb.Duration
	step      mantlev1.AuditStep
	stepAt    timestamppb.Timestamp
	stepTook  durationpb.Duration
}
