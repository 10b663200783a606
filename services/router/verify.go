package router

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/pkg/formatcheck"
	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// applyVerdict records the verifier's verdict on the answer going out; nil means nobody
// could check it, and an earlier candidate's verdict must not stick to it.
func applyVerdict(qc *mantlev1.QualityContext, v *verifierv1.VerifyResponse) {
	if v == nil {
		qc.Verification, qc.QualityGrade, qc.RiskScore = nil, mantlev1.QualityGrade_QUALITY_GRADE_UNSPECIFIED, 0
		if !slices.Contains(qc.SkippedSteps, "verify") {
			qc.SkippedSteps = append(qc.SkippedSteps, "verify")
		}
		return
	}
	qc.Verification = v.GetQuality().GetVerification()
	if qc.Verification == nil {
		qc.Verification = &mantlev1.Verification{L1Passed: v.Passed, FailureClass: v.FailureClass}
	}
	qc.QualityGrade, qc.RiskScore = v.Grade, v.RiskScore
	if v.Passed && v.UserNotice != "" {
		// A business rule's notice for the user (for example "this is not medical advice").
		qc.UserNotice = strings.TrimSpace(qc.UserNotice + " " + v.UserNotice)
	}
}

// answerer is who gave an answer being verified: a candidate's model, or the cache.
type answerer struct {
	model, provider string
	// level is the ladder level the answer would go out at.
	level mantlev1.FallbackLevel
	// cached: the answer comes from the cache (stale: past its time to live).
	cached, stale bool
}

func (c *candidate) answerer() answerer {
	return answerer{model: c.u.model.Name, provider: c.u.provider, level: c.level}
}

// verify asks the verifier about res. A verifier that cannot be reached does not fail the
// request: the router runs L1 itself (deps.Checker, the library the verifier serves L1
// from), so a malformed answer still fails over, and an answer that passes goes out
// unverified and says so (verdict nil): L2 rules and L3 did not run.
func (r *Router) verify(ctx context.Context, req *routerv1.Request, qc *mantlev1.QualityContext, who answerer, res *provider.Response, audit []*mantlev1.AuditStep) (*verifierv1.VerifyResponse, []*mantlev1.AuditStep, error) {
	start := r.deps.Clock.Now()
	if r.deps.Verifier == nil {
		audit, err := r.checkLocally(ctx, req, who.level, res, audit, "verifier off", start)
		return nil, audit, err
	}
	hop, cancel := r.hopContext(ctx)
	defer cancel()
	// The verifier reads the QualityContext as it is now; a clone keeps concurrent hedges
	// from racing on the request's copy.
	snapshot := hopQuality(qc)
	// The verifier judges a fallback model by that model's own thresholds: tell it the
	// level this answer would go out at, and which model gave it.
	snapshot.FallbackLevel, snapshot.CurrentModel, snapshot.CurrentProvider = who.level, who.model, who.provider
	// The verifier knows a cached answer by cache_hit (it was checked in depth when first
	// given, so L3 does not run again); its rules run all the same.
	snapshot.CacheHit, snapshot.CacheStale = who.cached, who.stale
	v, err := r.deps.Verifier.Verify(hop, &verifierv1.VerifyRequest{
		Quality:        snapshot,
		Messages:       req.Messages,
		Content:        res.Content,
		FinishReason:   res.FinishReason,
		ResponseFormat: req.ResponseFormat,
		ToolCalls:      toolCallsProto(res.ToolCalls),
		Tools:          req.Tools,
		// tool_choice none forbids calls, required and function demand one: L1 checks it.
		ToolChoice:         req.ToolChoice,
		ToolChoiceFunction: req.ToolChoiceFunction,
		Model:              who.model,
		SessionId:          req.User,
	}, rpc.HandOverRequest())
	if status.Code(err) == codes.InvalidArgument {
		// The verifier refuses to judge this answer (an oversized answer, or a schema the
		// router's own compile accepted under other limits): that is no outage, and the
		// answer must not go out unverified with rules and review skipped.
		audit = append(audit, r.step("verify", "refused by the verifier: "+status.Convert(err).Message(), r.deps.Clock.Since(start)))
		return nil, audit, &provider.Error{Class: mantlev1.ErrorClass_ERROR_CLASS_VERIFICATION_FAILED, Message: "the verifier refused the answer: " + status.Convert(err).Message()}
	}
	if err != nil {
		r.deps.Log.WarnContext(ctx, "verifier unavailable; checking L1 in the router", "err", err)
		audit, err := r.checkLocally(ctx, req, who.level, res, audit, "verifier unavailable ("+status.Code(err).String()+")", start)
		return nil, audit, err
	}
	audit = append(audit, v.GetQuality().GetAudit()...) // every step is the verifier's (adoptAudit)
	audit = append(audit, r.step("verify", "passed="+strconv.FormatBool(v.Passed)+" grade="+shortGrade(v.Grade), r.deps.Clock.Since(start)))
	if v.Degrade {
		// A business rule says this kind of answer must not come from a model now: no other
		// candidate is asked, the ladder answers.
		return v, audit, &provider.Error{Class: mantlev1.ErrorClass_ERROR_CLASS_VERIFICATION_FAILED, Message: "a business rule asks to degrade: " + findingCodes(v.Findings)}
	}
	if !v.Passed {
		return v, audit, &provider.Error{Class: v.FailureClass, Message: "verification failed: " + findingCodes(v.Findings)}
	}
	res.Content = v.Content
	return v, audit, nil
}

// checkLocally runs the L1 format checks in the router, for an answer the verifier does
// not see (why says why, for the audit). An answer that fails them is an error like a
// failed verification; without a checker it goes out unchecked.
func (r *Router) checkLocally(ctx context.Context, req *routerv1.Request, level mantlev1.FallbackLevel, res *provider.Response, audit []*mantlev1.AuditStep, why string, start time.Time) ([]*mantlev1.AuditStep, error) {
	if r.deps.Checker == nil {
		return append(audit, r.step("verify", why+"; not checked", r.deps.Clock.Since(start))), nil
	}
	format, _ := formatcheck.FormatFromProto(req.ResponseFormat) // an unknown type is checked as text
	l1 := r.deps.Checker.Check(formatcheck.Answer{
		Content: res.Content, FinishReason: res.FinishReason, Format: format,
		ToolCalls: formatcheck.ToolCallsFromProto(toolCallsProto(res.ToolCalls)), Tools: formatcheck.ToolsFromProto(req.Tools),
		ToolChoice: formatcheck.ToolChoiceOf(req.ToolChoice, req.ToolChoiceFunction),
		// As the verifier would judge it from the same QualityContext.
		Degraded: level != mantlev1.FallbackLevel_FALLBACK_LEVEL_UNSPECIFIED && level != mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY,
	})
	if !l1.Passed {
		codes := strings.Join(l1.FailedCodes(), ",")
		for _, f := range l1.Findings {
			if f.Blocking && f.Path != "" {
				codes += " (at " + f.Path + ")" // as findingCodes says it for the verifier's verdict
				break
			}
		}
		r.deps.Log.DebugContext(ctx, "local L1 check failed", "codes", codes)
		audit = append(audit, r.step("verify", fmt.Sprintf("%s; local L1 failed: %s (%s)", why, codes, shortClass(l1.Class)), r.deps.Clock.Since(start)))
		return audit, &provider.Error{Class: l1.Class, Message: "verification failed: " + codes}
	}
	res.Content = l1.Content // unwrapped from a markdown fence, as the verifier delivers it
	return append(audit, r.step("verify", why+"; local L1 passed", r.deps.Clock.Since(start))), nil
}
