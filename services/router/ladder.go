package router

import (
	"context"
	"errors"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	cachev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/cache/v1"
	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/events"
)

// Ladder levels below the route's models. L0 (the route's candidates) and L1 (its smaller
// models) are attempts; L2 and L3 answer without a provider.
const (
	ForceCache    = "cache"
	ForceTemplate = "template"
)

// templateModel names the answerer of an L3 template answer.
const templateModel = "mantle/template"

// ladderBudget bounds the L2 and L3 steps, which run after the attempt loop has used the
// request's budget: they must still answer quickly, and the reserve is there for them.
const ladderBudget = 500 * time.Millisecond

// descend answers from the ladder when the route's models could not: L2 the closest
// verified cached answer, marked as related; L3 the route's template with a notice, and a
// review request so a person follows up. It returns nil when the route has no level left.
func (r *Router) descend(ctx context.Context, req *routerv1.Request, rt *route, qc *mantlev1.QualityContext, reason string) *routerv1.CompleteResponse {
	if errors.Is(ctx.Err(), context.Canceled) {
		return nil // the caller left; nobody reads a degraded answer
	}
	// The request's deadline may be spent; the ladder has its own small budget.
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ladderBudget)
	defer cancel()
	if rt.ladder.Cache && rt.ladder.ForceLevel != ForceTemplate {
		if resp := r.approximate(lctx, req, rt, qc, reason); resp != nil {
			return resp
		}
	}
	if rt.ladder.Template != "" {
		return r.template(lctx, rt, qc, reason)
	}
	return nil
}

// approximate looks the prompt up in the cache as an L2 answer.
func (r *Router) approximate(ctx context.Context, req *routerv1.Request, rt *route, qc *mantlev1.QualityContext, reason string) *routerv1.CompleteResponse {
	if r.deps.Cache == nil {
		r.audit(qc, "ladder", "L2 cache: off", 0)
		return nil
	}
	start := r.deps.Clock.Now()
	res, err := r.deps.Cache.Lookup(ctx, &cachev1.LookupRequest{Quality: hopQuality(qc), Prompt: cachePrompt(req, rt, qc),
		Mode: cachev1.LookupMode_LOOKUP_MODE_APPROXIMATE})
	if err != nil || !res.Hit || res.Entry == nil {
		r.audit(qc, "ladder", "L2 cache: no related answer", r.deps.Clock.Since(start))
		return nil
	}
	if len(res.Entry.ToolCalls) > 0 && !exactMatch(res.Match) {
		// Tool calls made for a related question would act with its arguments.
		r.audit(qc, "ladder", "L2 cache: the related answer calls tools; not served", r.deps.Clock.Since(start))
		return nil
	}
	// The request's rules judge the related answer too; one they refuse leaves the template.
	v, content, ok := r.ruleCached(ctx, req, qc, res, mantlev1.FallbackLevel_FALLBACK_LEVEL_CACHED_APPROXIMATE)
	if !ok {
		return nil
	}
	r.degrade(qc, mantlev1.FallbackLevel_FALLBACK_LEVEL_CACHED_APPROXIMATE, reason, rt.ladder.Notice)
	detail := "L2 cache: related answer " + res.Entry.Id
	if res.Stale {
		detail += " (stale)"
	}
	r.audit(qc, "ladder", detail, r.deps.Clock.Since(start))
	return r.serveCached(qc, res, v, content)
}

// template answers with the route's fixed text and opens a review so a person follows up.
func (r *Router) template(ctx context.Context, rt *route, qc *mantlev1.QualityContext, reason string) *routerv1.CompleteResponse {
	r.degrade(qc, mantlev1.FallbackLevel_FALLBACK_LEVEL_TEMPLATE, reason, rt.ladder.Notice)
	qc.CurrentModel, qc.CurrentProvider = templateModel, "mantle"
	qc.QualityGrade = mantlev1.QualityGrade_QUALITY_GRADE_LOW
	r.audit(qc, "ladder", "L3 template", 0)
	r.deps.Events.Publish(ctx, events.SubjectReview, &eventsv1.ReviewRequestEvent{
		At:            timestamppb.New(r.deps.Clock.Now()),
		RequestId:     qc.RequestId,
		Tenant:        qc.Tenant,
		Scenario:      qc.Scenario,
		Reason:        "answered with a template: " + reason,
		Content:       rt.ladder.Template,
		DefaultAction: "follow_up",
		Quality:       qc,
	})
	return &routerv1.CompleteResponse{
		Id:           qc.RequestId,
		Model:        templateModel,
		Message:      &mantlev1.ChatMessage{Role: "assistant", Content: rt.ladder.Template},
		FinishReason: "stop",
		Usage:        &mantlev1.Usage{},
		Quality:      qc,
	}
}

func (r *Router) degrade(qc *mantlev1.QualityContext, level mantlev1.FallbackLevel, reason, notice string) {
	qc.FallbackLevel = level
	qc.DegradationReason = reason
	qc.UserNotice = notice
	if notice == "" {
		qc.UserNotice = defaultNotice(level)
	}
}

func defaultNotice(level mantlev1.FallbackLevel) string {
	switch level {
	case mantlev1.FallbackLevel_FALLBACK_LEVEL_CACHED_APPROXIMATE:
		return "This is a related answer from earlier; the assistant is busy right now."
	case mantlev1.FallbackLevel_FALLBACK_LEVEL_TEMPLATE:
		return "The assistant is unavailable right now; we have noted your question and will follow up."
	}
	return ""
}
