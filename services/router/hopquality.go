package router

import (
	"slices"

	"google.golang.org/protobuf/types/known/timestamppb"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// hopQuality is the QualityContext to send to another service: a copy of qc without the
// audit trail, the attempts and the timings. The first two grow with every step and
// retry, none of the other services reads them, and each hop would otherwise marshal them
// twice (request and response): on loopback that was about a third of the full mesh's
// overhead. The services append their own audit steps to the copy and return it, so
// every step the returned copy holds is theirs: take them back with adoptAudit(qc,
// returned). The timings (overhead, upstream latency, waited) are the router's to keep:
// they are complete only once the request is answered.
//
// Sub-messages are cloned, so the copy can be marshalled while hedges go on changing qc,
// and handed over with its request (rpc.HandOverRequest): the router keeps nothing of it.
// The fields are copied by hand (a reflective copy cost 2.5% of the mesh's CPU), the
// sub-messages with vtprotobuf's generated CloneVT;
// TestHopQualityDropsOnlyTheRouterOwnFields sets every field of the message, so a field
// added to QualityContext and not copied here fails it.
//
// The deadline and usage, which every request's QualityContext has, are copied into
// messages made in the same allocation as the copy (qualityBlock): four to five hops a
// request each spared two allocations.
func hopQuality(qc *mantlev1.QualityContext) *mantlev1.QualityContext {
	if qc == nil {
		return &mantlev1.QualityContext{}
	}
	h := &qualityBlock{qc: mantlev1.QualityContext{
		RequestId:          qc.RequestId,
		IdempotencyKey:     qc.IdempotencyKey,
		TraceId:            qc.TraceId,
		Tenant:             qc.Tenant,
		Scenario:           qc.Scenario,
		Priority:           qc.Priority,
		RetryCount:         qc.RetryCount,
		CurrentModel:       qc.CurrentModel,
		CurrentProvider:    qc.CurrentProvider,
		FallbackLevel:      qc.FallbackLevel,
		DegradationReason:  qc.DegradationReason,
		UserNotice:         qc.UserNotice,
		CacheHit:           qc.CacheHit,
		CacheSimilarity:    qc.CacheSimilarity,
		CacheStale:         qc.CacheStale,
		Verification:       qc.Verification.CloneVT(), // nil stays nil
		QualityGrade:       qc.QualityGrade,
		RiskScore:          qc.RiskScore,
		CostUsd:            qc.CostUsd,
		Route:              qc.Route,
		SkippedSteps:       slices.Clone(qc.SkippedSteps),
		SessionId:          qc.SessionId,
		StepId:             qc.StepId,
		SessionReplayed:    qc.SessionReplayed,
		SessionDegraded:    qc.SessionDegraded,
		SimplifiedPrompt:   qc.SimplifiedPrompt,
		ContextCompression: qc.ContextCompression.CloneVT(),
	}}
	// Field by field, not proto.Merge, whose reflection cost as much as the rest of the
	// copy; TestHopQualityDropsOnlyTheRouterOwnFields sets every field of both.
	if d := qc.Deadline; d != nil {
		h.deadline.Seconds, h.deadline.Nanos = d.Seconds, d.Nanos
		h.qc.Deadline = &h.deadline
	}
	if u := qc.Usage; u != nil {
		h.usage.InputTokens, h.usage.OutputTokens, h.usage.TotalTokens = u.InputTokens, u.OutputTokens, u.TotalTokens
		h.qc.Usage = &h.usage
	}
	return &h.qc
}

// qualityBlock is a QualityContext with room for the deadline and usage every request's
// has, made in one allocation.
type qualityBlock struct {
	qc       mantlev1.QualityContext
	deadline timestamppb.Timestamp
	usage    mantlev1.Usage
}
