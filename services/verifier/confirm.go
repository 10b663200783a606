package verifier

import (
	"context"
	"strings"

	"google.golang.org/protobuf/types/known/timestamppb"

	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/verifier/internal/review"
)

// The "confirm outcome" RPCs. Opening and reading are the agent's (service plane, acting
// for the tenant whose call it was), listing and deciding the operators' (operator
// plane); Audiences gates them, and tenantKey below refuses a tenant key again should the
// table ever say otherwise.

// tenantKey reports whether the call was made with a tenant key.
func tenantKey(ctx context.Context) bool { return rpc.CallerOf(ctx).Kind == rpc.CallerTenant }

// OpenConfirmation opens the confirmation of an action whose outcome is unknown.
func (s *Server) OpenConfirmation(ctx context.Context, req *verifierv1.OpenConfirmationRequest) (*verifierv1.OpenConfirmationResponse, error) {
	if s.reviews == nil {
		return nil, s.toStatus(ctx, errNoReviews)
	}
	tenant, err := s.confirmTenant(ctx, req.GetTenant())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	c, created, err := s.reviews.OpenConfirmation(ctx, review.Confirmation{
		Tenant: tenant, Tool: req.GetTool(), IdempotencyKey: req.GetIdempotencyKey(),
		SessionID: req.GetSessionId(), StepID: req.GetStepId(), RequestID: req.GetRequestId(),
		Arguments: req.GetArguments(), Reason: req.GetReason(), Attempt: req.GetAttempt(),
	})
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &verifierv1.OpenConfirmationResponse{Confirmation: confirmationToProto(c), Created: created}, nil
}

// GetConfirmation reads one confirmation of a tenant.
func (s *Server) GetConfirmation(ctx context.Context, req *verifierv1.GetConfirmationRequest) (*verifierv1.GetConfirmationResponse, error) {
	if s.reviews == nil {
		return nil, s.toStatus(ctx, errNoReviews)
	}
	if req.GetConfirmationId() == "" {
		return nil, s.toStatus(ctx, rpc.Invalid("confirmation_id", "is required"))
	}
	tenant, err := s.confirmTenant(ctx, req.GetTenant())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	c, err := s.reviews.GetConfirmation(ctx, tenant, req.GetConfirmationId())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &verifierv1.GetConfirmationResponse{Confirmation: confirmationToProto(c)}, nil
}

// ListConfirmations lists confirmations for operators.
func (s *Server) ListConfirmations(ctx context.Context, req *verifierv1.ListConfirmationsRequest) (*verifierv1.ListConfirmationsResponse, error) {
	if s.reviews == nil {
		return nil, s.toStatus(ctx, errNoReviews)
	}
	if tenantKey(ctx) {
		return nil, s.toStatus(ctx, errTenantMismatch)
	}
	list, next, err := s.reviews.ListConfirmations(ctx,
		review.ConfirmFilter{Tenant: req.GetTenant(), State: confirmStateFromProto(req.GetState())},
		review.Page{Size: int(req.GetPageSize()), Token: req.GetPageToken()})
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp := &verifierv1.ListConfirmationsResponse{NextPageToken: next}
	for _, c := range list {
		resp.Confirmations = append(resp.Confirmations, confirmationToProto(c))
	}
	return resp, nil
}

// DecideConfirmation records an operator's decision.
func (s *Server) DecideConfirmation(ctx context.Context, req *verifierv1.DecideConfirmationRequest) (*verifierv1.DecideConfirmationResponse, error) {
	if s.reviews == nil {
		return nil, s.toStatus(ctx, errNoReviews)
	}
	if tenantKey(ctx) {
		return nil, s.toStatus(ctx, errTenantMismatch)
	}
	if req.GetConfirmationId() == "" {
		return nil, s.toStatus(ctx, rpc.Invalid("confirmation_id", "is required"))
	}
	c, err := s.reviews.DecideConfirmation(ctx, review.ConfirmDecision{
		ID: req.GetConfirmationId(), Reviewer: req.GetReviewer(), State: confirmStateFromProto(req.GetDecision()),
		Result: req.GetResult(), Note: req.GetNote(),
	})
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &verifierv1.DecideConfirmationResponse{Confirmation: confirmationToProto(c)}, nil
}

// confirmTenant is the tenant a confirmation call is for: the request's, which must be
// the tenant the calling service acts for when it names one. A tenant key is refused.
func (s *Server) confirmTenant(ctx context.Context, claimed string) (string, error) {
	if tenantKey(ctx) {
		return "", errTenantMismatch
	}
	if claimed == "" {
		return "", rpc.Invalid("tenant", "is required")
	}
	if acting := rpc.Tenant(ctx); acting != "" && acting != claimed {
		return "", errTenantMismatch
	}
	return claimed, nil
}

func confirmStateFromProto(s verifierv1.ConfirmationState) review.ConfirmState {
	if s == verifierv1.ConfirmationState_CONFIRMATION_STATE_UNSPECIFIED {
		return ""
	}
	return review.ConfirmState(enumName(s.String(), "CONFIRMATION_STATE_"))
}

func confirmationToProto(c review.Confirmation) *verifierv1.Confirmation {
	out := &verifierv1.Confirmation{
		Id: c.ID, Tenant: c.Tenant, Tool: c.Tool, IdempotencyKey: c.IdempotencyKey, SessionId: c.SessionID,
		StepId: c.StepID, RequestId: c.RequestID, Arguments: c.Arguments, Reason: c.Reason,
		State:  verifierv1.ConfirmationState(toEnum(verifierv1.ConfirmationState_value, "CONFIRMATION_STATE_", strings.ToLower(string(c.State)))),
		Result: c.Result, DecidedBy: c.DecidedBy, Note: c.Note, CreatedAt: timestamppb.New(c.CreatedAt), Attempt: c.Attempt,
	}
	if !c.DecidedAt.IsZero() {
		out.DecidedAt = timestamppb.New(c.DecidedAt)
	}
	return out
}
