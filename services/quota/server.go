package quota

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	quotav1 "github.com/mantle-mesh/mantle/pkg/api/mantle/quota/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// errorDomain is the ErrorInfo domain of every error this service returns.
const errorDomain = "quota.mantle"

// server adapts Service to quotav1.QuotaServiceServer: it converts messages, resolves
// the tenant, appends the audit step, and maps errors in toStatus. It holds no logic.
type server struct {
	quotav1.UnimplementedQuotaServiceServer
	svc *Service
	log *slog.Logger
}

func newServer(svc *Service) *server {
	return &server{svc: svc, log: svc.log}
}

func (s *server) Reserve(ctx context.Context, req *quotav1.ReserveRequest) (*quotav1.ReserveResponse, error) {
	start := s.svc.clock.Now()
	tenant, err := resolveTenant(ctx, req.GetQuality())
	if err != nil {
		return nil, s.toStatus(err)
	}
	got, err := s.svc.Reserve(ctx, ReserveRequest{
		Tenant:          tenant,
		RequestID:       req.GetQuality().GetRequestId(),
		Priority:        req.GetQuality().GetPriority(),
		Model:           req.GetModel(),
		InputTokens:     req.GetInputTokens(),
		MaxOutputTokens: req.GetMaxOutputTokens(),
		Messages:        messagesFromProto(req.GetMessages()),
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
	quality.Audit = append(quality.Audit, &mantlev1.AuditStep{
		At:      timestamppb.New(start),
		Service: "quota",
		Step:    "reserve",
		Detail: fmt.Sprintf("reserved %d tokens (%d input + %d max output) for %s; %d/%d tokens and %d/%d requests left",
			got.ReservedTokens, got.InputTokens, got.MaxOutputTokens, req.GetModel(),
			got.Levels.Tokens.Remaining, got.Levels.Tokens.Limit, got.Levels.Requests.Remaining, got.Levels.Requests.Limit),
		Duration: durationpb.New(s.svc.clock.Since(start)),
	})
	return &quotav1.ReserveResponse{
		ReservationId:  got.ReservationID,
		ReservedTokens: got.ReservedTokens,
		Limits:         limitsToProto(got.Levels),
		ExpiresAt:      timestamppb.New(got.ExpiresAt),
		Quality:        quality,
	}, nil
}

func (s *server) Settle(ctx context.Context, req *quotav1.SettleRequest) (*quotav1.SettleResponse, error) {
	tenant, err := resolveTenant(ctx, req.GetQuality())
	if err != nil {
		return nil, s.toStatus(err)
	}
	var usage *Usage
	if u := req.GetUsage(); u != nil {
		usage = &Usage{InputTokens: u.GetInputTokens(), OutputTokens: u.GetOutputTokens(), TotalTokens: u.GetTotalTokens()}
	}
	settled, err := s.svc.Settle(ctx, SettleRequest{
		Tenant:        tenant,
		RequestID:     req.GetQuality().GetRequestId(),
		ReservationID: req.GetReservationId(),
		Usage:         usage,
	})
	if err != nil {
		return nil, s.toStatus(err)
	}
	return &quotav1.SettleResponse{RefundedTokens: settled.Refunded, Limits: limitsToProto(settled.Levels)}, nil
}

func (s *server) CountTokens(ctx context.Context, req *quotav1.CountTokensRequest) (*quotav1.CountTokensResponse, error) {
	count, err := s.svc.CountTokens(ctx, req.GetModel(), messagesFromProto(req.GetMessages()), req.GetText())
	if err != nil {
		return nil, s.toStatus(err)
	}
	return &quotav1.CountTokensResponse{Tokens: count.Tokens, Tokenizer: count.Tokenizer, Exact: count.Exact}, nil
}

// resolveTenant returns the tenant a call acts for. An authenticated tenant wins, and a
// request naming a different one is refused. Without authentication (dev mode) the
// request's own tenant is used; the domain requires it to be set.
func resolveTenant(ctx context.Context, quality *mantlev1.QualityContext) (string, error) {
	authenticated, claimed := rpc.Tenant(ctx), quality.GetTenant()
	switch {
	case authenticated == "":
		return claimed, nil
	case claimed != "" && claimed != authenticated:
		return "", ErrTenantMismatch
	default:
		return authenticated, nil
	}
}

// toStatus is the one place domain errors become gRPC statuses. Every status carries
// ErrorInfo{Domain: "quota.mantle", Reason}; clients branch on codes and details.
func (s *server) toStatus(err error) error {
	if v, ok := errors.AsType[*rpc.ValidationError](err); ok {
		return rpc.InvalidArgument(errorDomain, v)
	}
	if e, ok := errors.AsType[*ExhaustedError](err); ok {
		return rpc.ResourceExhausted(errorDomain, e.Bucket, e.Error(), e.RetryAfter)
	}
	if e, ok := errors.AsType[*TooLargeError](err); ok {
		return rpc.Status(codes.FailedPrecondition, errorDomain, ReasonRequestTooLarge, e.Error(),
			&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
				Subject: e.Bucket, Description: e.Error(),
			}}},
			&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{
				Field:       e.Field,
				Description: fmt.Sprintf("the request needs %d tokens but the limit is %d per minute; reduce it or raise the limit", e.Cost, e.Limit),
			}}},
		)
	}
	switch {
	case errors.Is(err, ErrReservationNotFound):
		return rpc.Status(codes.NotFound, errorDomain, ReasonReservationNotFound, err.Error())
	case errors.Is(err, ErrTenantMismatch):
		return rpc.Status(codes.PermissionDenied, errorDomain, rpc.ReasonPermissionDenied, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	default:
		// The caller gets a generic message; the detail goes to the log, once, here.
		s.log.Error("quota: internal error", "err", err)
		return rpc.Status(codes.Internal, errorDomain, rpc.ReasonInternal, "internal error")
	}
}

func messagesFromProto(msgs []*mantlev1.ChatMessage) []Message {
	out := make([]Message, 0, len(msgs))
	for _, m := range msgs {
		out = append(out, Message{Role: m.GetRole(), Content: m.GetContent(), Name: m.GetName()})
	}
	return out
}

func limitsToProto(l Levels) *quotav1.Limits {
	return &quotav1.Limits{
		LimitRequests:     l.Requests.Limit,
		RemainingRequests: l.Requests.Remaining,
		LimitTokens:       l.Tokens.Limit,
		RemainingTokens:   l.Tokens.Remaining,
		ResetRequests:     durationpb.New(l.Requests.Reset),
		ResetTokens:       durationpb.New(l.Tokens.Reset),
	}
}
