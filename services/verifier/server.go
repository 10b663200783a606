package verifier

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/pkg/formatcheck"
	"github.com/mantle-mesh/mantle/pkg/pbtime"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/verifier/internal/review"
	"github.com/mantle-mesh/mantle/services/verifier/internal/rules"
)

// errorDomain is the ErrorInfo domain of every status this service returns.
const errorDomain = "verifier.mantle"

// ErrorInfo reasons of this service, beyond the shared ones in pkg/rpc.
const (
	ReasonNotFound       = "NOT_FOUND"
	ReasonReviewConflict = "REVIEW_CONFLICT"
	ReasonRulesRejected  = "RULES_REJECTED"
	ReasonUnavailable    = "UNAVAILABLE"
)

// errTenantMismatch: the request claims a tenant other than the one that authenticated.
var errTenantMismatch = rpc.ErrTenantMismatch

// errNoReviews: the review RPCs were called on a server built without a review service.
var errNoReviews = errors.New("human review is not configured on this server")

// Server adapts a Verifier and its review service to mantle.verifier.v1.VerifierService.
type Server struct {
	verifierv1.UnimplementedVerifierServiceServer
	verifier *Verifier
	reviews  *review.Service // nil: review RPCs are unavailable
	log      *slog.Logger
}

// NewServer returns the gRPC adapter for v and its review service (which may be nil).
func NewServer(v *Verifier, reviews *review.Service, log *slog.Logger) *Server {
	return &Server{verifier: v, reviews: reviews, log: log}
}

// HandsOverResponse implements app.ResponseHandOver for Verify: its answer is made for the
// call (the request's QualityContext extended, the findings, actions and risk signals
// converted or copied), while the verdict the L3 worker keeps and a review opened for the
// answer share none of it.
func (s *Server) HandsOverResponse(method string) bool {
	return method == verifierv1.VerifierService_Verify_FullMethodName
}

// TakesOverRequest implements app.RequestTakeOver for Verify: it writes nothing of its
// request but the QualityContext, which it extends with the verdict and answers with;
// the L3 worker and a review keep copies of that, and only read the rest of what they
// keep (the messages' text, tools, references).
func (s *Server) TakesOverRequest(method string) bool {
	return method == verifierv1.VerifierService_Verify_FullMethodName
}

// Verify checks one answer and returns the verdict with the updated QualityContext.
func (s *Server) Verify(ctx context.Context, req *verifierv1.VerifyRequest) (*verifierv1.VerifyResponse, error) {
	tenant, err := callTenant(ctx, req.GetQuality().GetTenant())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	answer, err := answerFromProto(req, tenant)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	verdict, err := s.verifier.Verify(ctx, answer)
	if err != nil {
		return nil, s.toStatus(ctx, fmt.Errorf("request %q: %w", req.GetQuality().GetRequestId(), err))
	}
	if !verdict.Passed && s.log.Enabled(ctx, slog.LevelDebug) {
		s.log.DebugContext(ctx, "answer failed verification",
			"request_id", req.GetQuality().GetRequestId(), "tenant", tenant, "model", req.GetModel(),
			"layer", verdict.FailedLayer, "failure_class", verdict.FailureClass, "codes", verdict.FailedCodes())
	}
	return &verifierv1.VerifyResponse{
		Passed:       verdict.Passed,
		FailedLayer:  verdict.FailedLayer,
		FailureClass: classToProto(verdict.FailureClass),
		Findings:     findingsToProto(verdict.Findings),
		Content:      verdict.Content,
		Grade:        gradeToProto(verdict.Grade),
		RiskScore:    verdict.RiskScore,
		Quality:      qualityWithVerdict(req.GetQuality(), tenant, req.GetModel(), verdict),
		Actions:      actionsToProto(verdict.Actions),
		L3Pending:    verdict.L3Pending,
		ReviewId:     verdict.ReviewID,
		Risk: &verifierv1.RiskBreakdown{
			Input: verdict.Risk.Input, Output: verdict.Risk.Output, Context: verdict.Risk.Context,
			Signals: slices.Clone(verdict.Risk.Signals), Threshold: verdict.Risk.Threshold,
		},
		Degrade:    verdict.Degrade,
		UserNotice: verdict.UserNotice,
	}, nil
}

// GetFollowUp returns (or waits for) the L3 result of a request.
func (s *Server) GetFollowUp(ctx context.Context, req *verifierv1.GetFollowUpRequest) (*verifierv1.GetFollowUpResponse, error) {
	if req.GetRequestId() == "" {
		return nil, s.toStatus(ctx, rpc.Invalid("request_id", "is required"))
	}
	if s.verifier.l3 == nil {
		return &verifierv1.GetFollowUpResponse{}, nil
	}
	ev, err := s.verifier.l3.followUp(ctx, req.GetRequestId(), req.GetWait())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	// A tenant sees only its own follow-ups; not found is all another tenant learns.
	if ev == nil || (rpc.Tenant(ctx) != "" && ev.GetTenant() != rpc.Tenant(ctx)) {
		return &verifierv1.GetFollowUpResponse{}, nil
	}
	return &verifierv1.GetFollowUpResponse{Found: true, FollowUp: ev}, nil
}

// ReportFeedback records a user's (dis)satisfaction for context risk.
func (s *Server) ReportFeedback(ctx context.Context, req *verifierv1.ReportFeedbackRequest) (*verifierv1.ReportFeedbackResponse, error) {
	tenant, err := callTenant(ctx, req.GetTenant())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	verr := &rpc.ValidationError{}
	if req.GetRequestId() == "" && req.GetSessionId() == "" {
		verr.Add("request_id", "request_id or session_id is required")
	}
	if req.GetFeedback() == verifierv1.Feedback_FEEDBACK_UNSPECIFIED {
		verr.Add("feedback", "is required")
	}
	if err := verr.OrNil(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	dissatisfied := req.GetFeedback() == verifierv1.Feedback_FEEDBACK_DISSATISFIED
	session := s.verifier.sessions.feedback(tenant, req.GetSessionId(), req.GetRequestId(), dissatisfied)
	resp := &verifierv1.ReportFeedbackResponse{SessionId: session}
	if session != "" {
		_, unhappy := s.verifier.sessions.context(tenant, session, "", false)
		if unhappy {
			resp.ContextRisk = 1
		}
	}
	return resp, nil
}

// scope is the tenant a review call is limited to: the caller's tenant, or "" (every
// tenant) for operators, services acting for no tenant, and when authentication is off.
func (s *Server) scope(ctx context.Context) string { return rpc.Tenant(ctx) }

// ListReviews lists reviews.
func (s *Server) ListReviews(ctx context.Context, req *verifierv1.ListReviewsRequest) (*verifierv1.ListReviewsResponse, error) {
	if s.reviews == nil {
		return nil, s.toStatus(ctx, errNoReviews)
	}
	reviews, next, err := s.reviews.List(ctx, review.Filter{
		Scope: s.scope(ctx), State: stateFromProto(req.GetState()), Scenario: req.GetScenario(),
	}, review.Page{Size: int(req.GetPageSize()), Token: req.GetPageToken()})
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp := &verifierv1.ListReviewsResponse{NextPageToken: next}
	for _, r := range reviews {
		resp.Reviews = append(resp.Reviews, reviewToProto(r))
	}
	return resp, nil
}

// GetReview returns one review.
func (s *Server) GetReview(ctx context.Context, req *verifierv1.GetReviewRequest) (*verifierv1.GetReviewResponse, error) {
	if s.reviews == nil {
		return nil, s.toStatus(ctx, errNoReviews)
	}
	if req.GetReviewId() == "" {
		return nil, s.toStatus(ctx, rpc.Invalid("review_id", "is required"))
	}
	r, err := s.reviews.Get(ctx, s.scope(ctx), req.GetReviewId())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &verifierv1.GetReviewResponse{Review: reviewToProto(r)}, nil
}

// ClaimReview takes a lease on a review.
func (s *Server) ClaimReview(ctx context.Context, req *verifierv1.ClaimReviewRequest) (*verifierv1.ClaimReviewResponse, error) {
	if s.reviews == nil {
		return nil, s.toStatus(ctx, errNoReviews)
	}
	r, err := s.reviews.Claim(ctx, review.ClaimRequest{
		Scope: s.scope(ctx), ID: req.GetReviewId(), Reviewer: req.GetReviewer(),
		Lease: req.GetLease().AsDuration(), Scenario: req.GetScenario(),
	})
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &verifierv1.ClaimReviewResponse{Review: reviewToProto(r)}, nil
}

// DecideReview records a decision.
func (s *Server) DecideReview(ctx context.Context, req *verifierv1.DecideReviewRequest) (*verifierv1.DecideReviewResponse, error) {
	if s.reviews == nil {
		return nil, s.toStatus(ctx, errNoReviews)
	}
	if req.GetReviewId() == "" {
		return nil, s.toStatus(ctx, rpc.Invalid("review_id", "is required"))
	}
	dr := review.DecideRequest{
		Scope: s.scope(ctx), ID: req.GetReviewId(), Reviewer: req.GetReviewer(),
		Verdict:          review.Verdict(enumName(req.GetVerdict().String(), "REVIEW_VERDICT_")),
		RootCause:        review.RootCause(enumName(req.GetRootCause().String(), "ROOT_CAUSE_")),
		CorrectiveAction: review.CorrectiveAction(enumName(req.GetCorrectiveAction().String(), "CORRECTIVE_ACTION_")),
		CorrectedContent: req.GetCorrectedContent(), Note: req.GetNote(),
	}
	if h := req.GetDraftRule(); h != nil {
		dr.Draft = &rules.Hint{QuestionTerms: h.GetQuestionTerms(), AnswerTerms: h.GetAnswerTerms(),
			Knowledge: h.GetKnowledge(), Description: h.GetDescription()}
	}
	r, draft, err := s.reviews.Decide(ctx, dr)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp := &verifierv1.DecideReviewResponse{Review: reviewToProto(r)}
	if draft != nil {
		resp.DraftRule = draftToProto(*draft)
	}
	return resp, nil
}

// ListReviewAudit lists the audit trail.
func (s *Server) ListReviewAudit(ctx context.Context, req *verifierv1.ListReviewAuditRequest) (*verifierv1.ListReviewAuditResponse, error) {
	if s.reviews == nil {
		return nil, s.toStatus(ctx, errNoReviews)
	}
	entries, next, err := s.reviews.Audit(ctx, review.AuditFilter{Scope: s.scope(ctx), ReviewID: req.GetReviewId(), Actor: req.GetActor()},
		review.Page{Size: int(req.GetPageSize()), Token: req.GetPageToken()})
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp := &verifierv1.ListReviewAuditResponse{NextPageToken: next}
	for _, e := range entries {
		resp.Entries = append(resp.Entries, &verifierv1.AuditEntry{
			At: timestamppb.New(e.At), ReviewId: e.ReviewID, Actor: e.Actor, Action: e.Action,
			Detail: e.Detail, DraftRuleId: e.DraftRuleID,
		})
	}
	return resp, nil
}

// ListDraftRules lists drafted rules.
func (s *Server) ListDraftRules(ctx context.Context, req *verifierv1.ListDraftRulesRequest) (*verifierv1.ListDraftRulesResponse, error) {
	if s.reviews == nil {
		return nil, s.toStatus(ctx, errNoReviews)
	}
	drafts, err := s.reviews.Drafts(ctx, s.scope(ctx), draftStateFromProto(req.GetState()))
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp := &verifierv1.ListDraftRulesResponse{}
	for _, d := range drafts {
		resp.Rules = append(resp.Rules, draftToProto(d))
	}
	return resp, nil
}

// DecideDraftRule approves or rejects a draft rule.
func (s *Server) DecideDraftRule(ctx context.Context, req *verifierv1.DecideDraftRuleRequest) (*verifierv1.DecideDraftRuleResponse, error) {
	if s.reviews == nil {
		return nil, s.toStatus(ctx, errNoReviews)
	}
	if req.GetDraftRuleId() == "" {
		return nil, s.toStatus(ctx, rpc.Invalid("draft_rule_id", "is required"))
	}
	// Approval changes answers for every tenant the rule covers: the method is on the
	// operator plane, and a call that acts for a tenant is refused here too.
	if s.scope(ctx) != "" {
		return nil, s.toStatus(ctx, errTenantMismatch)
	}
	d, err := s.reviews.DecideDraft(ctx, "", review.DraftDecision{
		ID: req.GetDraftRuleId(), Reviewer: req.GetReviewer(), Approve: req.GetApprove(),
		Widen: req.GetWiden(), Operator: rpc.CallerOf(ctx).Name,
	})
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &verifierv1.DecideDraftRuleResponse{Rule: draftToProto(d)}, nil
}

// ReloadRules re-reads the rules file. Only operators may (rules are process-wide): the
// method is on the operator plane, and a call that acts for a tenant is refused here too.
func (s *Server) ReloadRules(ctx context.Context, _ *verifierv1.ReloadRulesRequest) (*verifierv1.ReloadRulesResponse, error) {
	if s.scope(ctx) != "" {
		return nil, s.toStatus(ctx, errTenantMismatch)
	}
	set, err := s.verifier.rules.Reload()
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp := &verifierv1.ReloadRulesResponse{Version: set.Version, RuleCount: int32(set.Len())}
	for _, r := range set.Rules() {
		resp.RuleIds = append(resp.RuleIds, r.ID)
	}
	return resp, nil
}

// toStatus maps every error the RPCs can meet to a gRPC status. It is the only place that does.
func (s *Server) toStatus(ctx context.Context, err error) error {
	var (
		invalid  *rpc.ValidationError
		conflict *review.ConflictError
		rejected *review.RulesRejectedError
	)
	switch {
	case err == nil:
		return nil
	case errors.As(err, &invalid):
		return rpc.InvalidArgument(errorDomain, invalid)
	case errors.Is(err, errTenantMismatch):
		return rpc.Status(codes.PermissionDenied, errorDomain, rpc.ReasonPermissionDenied,
			"the claimed tenant does not match the authenticated tenant, or the call is for operators only")
	case errors.Is(err, review.ErrNotFound):
		return rpc.Status(codes.NotFound, errorDomain, ReasonNotFound, err.Error())
	case errors.As(err, &conflict):
		return rpc.Status(codes.FailedPrecondition, errorDomain, ReasonReviewConflict, conflict.Reason)
	case errors.As(err, &rejected), errors.Is(err, ErrRulesRejected):
		return rpc.Status(codes.FailedPrecondition, errorDomain, ReasonRulesRejected, err.Error())
	case errors.Is(err, review.ErrUnavailable), errors.Is(err, errNoReviews):
		s.log.WarnContext(ctx, "review store unavailable", "err", err)
		return rpc.Status(codes.Unavailable, errorDomain, ReasonUnavailable, "the review store is unavailable; retry")
	case rpc.ContextStatus(err) != nil:
		return rpc.ContextStatus(err)
	default:
		// The caller gets a generic message; the cause is for operators, logged once here.
		s.log.ErrorContext(ctx, "verifier call failed", "err", err)
		return rpc.Status(codes.Internal, errorDomain, rpc.ReasonInternal, "internal error")
	}
}

// callTenant returns the tenant the call acts for: the authenticated one when auth is on
// (a different claimed tenant is refused), the claimed one otherwise, which is then required.
func callTenant(ctx context.Context, claimed string) (string, error) {
	tenant, err := rpc.CallTenant(ctx, claimed)
	if err == nil && tenant == "" {
		return "", rpc.Invalid("quality.tenant", "is required when the call is not authenticated")
	}
	return tenant, err
}

func answerFromProto(req *verifierv1.VerifyRequest, tenant string) (Answer, error) {
	format, ok := formatcheck.FormatFromProto(req.GetResponseFormat())
	if !ok {
		return Answer{}, rpc.Invalid("response_format.type", "unknown type %d", int32(req.GetResponseFormat().GetType()))
	}
	a := Answer{
		Content:      req.GetContent(),
		FinishReason: req.GetFinishReason(),
		ToolCalls:    formatcheck.ToolCallsFromProto(req.GetToolCalls()),
		Tools:        formatcheck.ToolsFromProto(req.GetTools()),
		ToolChoice:   formatcheck.ToolChoiceOf(req.GetToolChoice(), req.GetToolChoiceFunction()),
		Format:       format,
		Model:        req.GetModel(),
		Quality:      req.GetQuality(),
		Tenant:       tenant,
		SessionID:    req.GetSessionId(),
		References:   req.GetReferences(),
	}
	if len(req.GetMessages()) > 0 {
		a.Messages = make([]Message, len(req.GetMessages()))
		for i, m := range req.GetMessages() {
			a.Messages[i] = Message{Role: m.GetRole(), Content: m.GetContent()}
		}
	}
	return a, nil
}

// qualityWithVerdict returns the request's QualityContext (a new one when the caller sent
// none) with the verdict recorded and an audit step appended. The verification is
// replaced, not merged: it describes this answer, not an earlier attempt's. The request's
// is extended in place and answered with, as app.RequestTakeOver allows: nothing the
// verifier keeps shares it (the L3 job and a review keep copies), and a copy cost as much
// as the rest of Verify's own work.
func qualityWithVerdict(in *mantlev1.QualityContext, tenant, model string, v Verdict) *mantlev1.QualityContext {
	// The verification and the audit step with its times in one allocation.
	m := &verdictParts{
		verification: mantlev1.Verification{
			L1Passed:       v.L1Passed(),
			L1Failures:     v.FailedCodes(),
			L2RulesApplied: v.RulesApplied(),
			L3Pending:      v.L3Pending,
			FailureClass:   classToProto(v.FailureClass),
		},
		step: mantlev1.AuditStep{Service: ServiceName, Step: "verify", Detail: auditDetail(model, v)},
	}
	quality := in
	if quality == nil {
		quality = &mantlev1.QualityContext{}
	}
	quality.Tenant = tenant
	quality.Verification = &m.verification
	quality.QualityGrade = gradeToProto(v.Grade)
	quality.RiskScore = v.RiskScore
	if v.UserNotice != "" && !strings.Contains(quality.UserNotice, v.UserNotice) {
		quality.UserNotice = strings.TrimSpace(quality.UserNotice + " " + v.UserNotice)
	}
	pbtime.SetTimestamp(&m.stepAt, v.StartedAt)
	pbtime.SetDuration(&m.stepTook, v.Duration)
	m.step.At, m.step.Duration = &m.stepAt, &m.stepTook
	quality.Audit = append(quality.Audit, &m.step)
	return quality
}

// verdictParts are the messages qualityWithVerdict adds.
type verdictParts struct {
	verification mantlev1.Verification
	step         mantlev1.AuditStep
	stepAt       timestamppb.Timestamp
	stepTook     durationpb.Duration
}

// auditDetail says what happened in a line an operator can read, e.g.
// "model=gpt-4o l1 failed: json_parse (malformed_output)".
func auditDetail(model string, v Verdict) string {
	// Every verified answer gets one: sized once, the common parts written directly.
	var b strings.Builder
	b.Grow(len(model) + 48)
	if model != "" {
		b.WriteString("model=")
		b.WriteString(model)
		b.WriteByte(' ')
	}
	switch {
	case !v.Passed && v.FailedLayer == LayerL1:
		fmt.Fprintf(&b, "l1 failed: %s (%s)", strings.Join(v.FailedCodes(), ","), v.FailureClass)
	case !v.Passed:
		fmt.Fprintf(&b, "%s failed: %s (%s)", v.FailedLayer, strings.Join(v.RulesApplied(), ","), v.FailureClass)
	case len(v.Findings) > 0:
		codes := make([]string, 0, len(v.Findings))
		for _, f := range v.Findings {
			codes = append(codes, f.Code)
		}
		fmt.Fprintf(&b, "passed with findings: %s", strings.Join(codes, ","))
	default:
		b.WriteString("l1 passed")
	}
	b.WriteString(" risk=")
	var risk [24]byte
	b.Write(strconv.AppendFloat(risk[:0], v.RiskScore, 'f', 2, 64))
	if v.ReviewID != "" {
		fmt.Fprintf(&b, " review=%s", v.ReviewID)
	}
	return b.String()
}

func findingsToProto(findings []Finding) []*verifierv1.Finding {
	out := make([]*verifierv1.Finding, 0, len(findings))
	for _, f := range findings {
		out = append(out, &verifierv1.Finding{
			Layer: f.Layer, Code: f.Code, Path: f.Path, Message: f.Message, Blocking: f.Blocking,
		})
	}
	return out
}

func actionsToProto(actions []Action) []*verifierv1.AppliedAction {
	out := make([]*verifierv1.AppliedAction, 0, len(actions))
	for _, a := range actions {
		out = append(out, &verifierv1.AppliedAction{RuleId: a.RuleID, Action: string(a.Action), Path: a.Path, Detail: a.Detail})
	}
	return out
}

func classToProto(c FailureClass) mantlev1.ErrorClass {
	switch c {
	case ClassNone:
		return mantlev1.ErrorClass_ERROR_CLASS_NONE
	case ClassMalformedOutput:
		return mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT
	case ClassRefusal:
		return mantlev1.ErrorClass_ERROR_CLASS_REFUSAL
	case ClassTruncated:
		return mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED
	case ClassVerificationFailed:
		return mantlev1.ErrorClass_ERROR_CLASS_VERIFICATION_FAILED
	}
	return mantlev1.ErrorClass_ERROR_CLASS_UNKNOWN
}

func gradeToProto(g Grade) mantlev1.QualityGrade {
	switch g {
	case GradeHigh:
		return mantlev1.QualityGrade_QUALITY_GRADE_HIGH
	case GradeMedium:
		return mantlev1.QualityGrade_QUALITY_GRADE_MEDIUM
	case GradeLow:
		return mantlev1.QualityGrade_QUALITY_GRADE_LOW
	}
	return mantlev1.QualityGrade_QUALITY_GRADE_UNSPECIFIED
}

// enumName turns a proto enum value name into the domain's lower-case name
// (REVIEW_VERDICT_APPROVE -> approve); the unspecified value becomes "unspecified", which
// the domain rejects with a clear message.
func enumName(s, prefix string) string { return strings.ToLower(strings.TrimPrefix(s, prefix)) }

func stateFromProto(s verifierv1.ReviewState) review.State {
	if s == verifierv1.ReviewState_REVIEW_STATE_UNSPECIFIED {
		return ""
	}
	return review.State(enumName(s.String(), "REVIEW_STATE_"))
}

func stateToProto(s review.State) verifierv1.ReviewState {
	return verifierv1.ReviewState(verifierv1.ReviewState_value["REVIEW_STATE_"+strings.ToUpper(string(s))])
}

func draftStateFromProto(s verifierv1.DraftRuleState) review.DraftState {
	if s == verifierv1.DraftRuleState_DRAFT_RULE_STATE_UNSPECIFIED {
		return ""
	}
	return review.DraftState(enumName(s.String(), "DRAFT_RULE_STATE_"))
}

func toEnum(m map[string]int32, prefix, name string) int32 { return m[prefix+strings.ToUpper(name)] }

func reviewToProto(r review.Review) *verifierv1.Review {
	out := &verifierv1.Review{
		Id: r.ID, RequestId: r.RequestID, Tenant: r.Tenant, Scenario: r.Scenario, State: stateToProto(r.State),
		RiskScore: r.RiskScore, Reason: r.Reason, Signals: r.Signals, Question: r.Question, Content: r.Content,
		Model: r.Model, SessionId: r.SessionID, CreatedAt: timestamppb.New(r.CreatedAt), DueAt: timestamppb.New(r.DueAt),
		DefaultAction: string(r.Default.Type), DefaultActionText: r.Default.Text, ClaimedBy: r.ClaimedBy,
	}
	if !r.LeaseUntil.IsZero() {
		out.LeaseExpiresAt = timestamppb.New(r.LeaseUntil)
	}
	if len(r.Quality) > 0 {
		q := &mantlev1.QualityContext{}
		if proto.Unmarshal(r.Quality, q) == nil {
			out.Quality = q
		}
	}
	if d := r.Decision; d != nil {
		out.Decision = &verifierv1.ReviewDecision{
			Reviewer:         d.Reviewer,
			Verdict:          verifierv1.ReviewVerdict(toEnum(verifierv1.ReviewVerdict_value, "REVIEW_VERDICT_", string(d.Verdict))),
			RootCause:        verifierv1.RootCause(toEnum(verifierv1.RootCause_value, "ROOT_CAUSE_", string(d.RootCause))),
			CorrectiveAction: verifierv1.CorrectiveAction(toEnum(verifierv1.CorrectiveAction_value, "CORRECTIVE_ACTION_", string(d.CorrectiveAction))),
			CorrectedContent: d.CorrectedContent, Note: d.Note, DecidedAt: timestamppb.New(d.DecidedAt), DraftRuleId: d.DraftRuleID,
		}
	}
	return out
}

func draftToProto(d review.DraftRule) *verifierv1.DraftRule {
	out := &verifierv1.DraftRule{
		Id: d.ID, ReviewId: d.ReviewID, State: verifierv1.DraftRuleState(toEnum(verifierv1.DraftRuleState_value, "DRAFT_RULE_STATE_", string(d.State))),
		CreatedBy: d.CreatedBy, CreatedAt: timestamppb.New(d.CreatedAt), DecidedBy: d.DecidedBy,
		Tenant: d.Tenant, Widened: d.Widened,
		Rule: &verifierv1.Rule{
			Id: d.Rule.ID, Description: d.Rule.Description, Scenarios: d.Rule.Scenarios, Condition: d.Rule.Condition,
			Action: &verifierv1.RuleAction{Type: string(d.Rule.Action.Type), Field: d.Rule.Action.Field,
				Pattern: d.Rule.Action.Pattern, Value: d.Rule.Action.Value, Notice: d.Rule.Action.Notice},
		},
	}
	if !d.DecidedAt.IsZero() {
		out.DecidedAt = timestamppb.New(d.DecidedAt)
	}
	return out
}
