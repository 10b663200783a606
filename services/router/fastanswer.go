package router

import (
	"fmt"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
)

// The fast-answer rung (ladder.fast_answer) sits between L1 and L2. When the route's
// models and its smaller ones have all failed, one more attempt goes to a small model with
// the route's short prompt instead of the request's system messages and a small
// max_tokens: an agent that cannot think deeply right now still answers quickly, and a
// quick answer from a model beats a related answer from the cache or a template. It is an
// ordinary candidate of the attempt loop (breakers, bulkheads, budgets and verification
// apply), the last one of the plan.

// defaultFastAnswerTokens is fast_answer.max_tokens when it is 0.
const defaultFastAnswerTokens = 256

// fastRequest is preq as the fast-answer rung sends it: the route's prompt in place of the
// system messages, max_tokens at most the rung's. Everything else the caller sent (the
// conversation, tools, response format, sampling fields) goes as given; what was replaced
// is said in the QualityContext (simplified_prompt) and the audit.
func fastRequest(preq provider.Request, fa FastAnswerConfig) provider.Request {
	msgs := make([]provider.Message, 0, len(preq.Messages)+1)
	msgs = append(msgs, provider.Message{Role: "system", Content: fa.Prompt})
	for _, m := range preq.Messages {
		if m.Role != "system" && m.Role != "developer" {
			msgs = append(msgs, m)
		}
	}
	preq.Messages = msgs
	limit := fa.limit()
	if preq.MaxTokens <= 0 || preq.MaxTokens > limit {
		preq.MaxTokens = limit
	}
	return preq
}

// limit is the rung's max_tokens.
func (fa FastAnswerConfig) limit() int {
	if fa.MaxTokens <= 0 {
		return defaultFastAnswerTokens
	}
	return fa.MaxTokens
}

// fastCandidate is the plan's candidate for rt's fast-answer rung, nil when it has none.
func fastCandidate(rt *route, order int) *candidate {
	if rt.fast == nil {
		return nil
	}
	return &candidate{u: rt.fast, level: mantlev1.FallbackLevel_FALLBACK_LEVEL_BACKUP_MODEL, order: order, fast: true}
}

// markFast records in qc that the fast-answer rung answered.
func (r *Router) markFast(qc *mantlev1.QualityContext, rt *route, model string) {
	qc.SimplifiedPrompt = true
	r.audit(qc, "ladder", fmt.Sprintf("fast answer: %s with the route's short prompt (max_tokens %d)", model, rt.ladder.FastAnswer.limit()), 0)
}
