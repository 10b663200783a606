package agent

import (
	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	"github.com/mantle-mesh/mantle/pkg/events"
	"github.com/mantle-mesh/mantle/pkg/resilience"
	"github.com/mantle-mesh/mantle/services/agent/internal/session"
)

// This file is what the agent publishes on NATS, beside its logs and metrics: tool
// breaker transitions (mantle.events.tool.breaker) and the session changes operators
// watch (mantle.events.session), with the publisher every module shares.

// toolBreakerEvent is a tool breaker's transition as mantle.events.tool.breaker carries it.
func toolBreakerEvent(tool, kind string, tr resilience.Transition) *eventsv1.ToolBreakerEvent {
	return &eventsv1.ToolBreakerEvent{
		At: timestamppb.New(tr.At), Tool: tool, Kind: toolKindToProto(kind),
		From: events.BreakerState(tr.From), To: events.BreakerState(tr.To), Reason: tr.Reason,
		ErrorRate: tr.FailureRate, SlowCallRate: tr.SlowRate,
	}
}

// sessionEvent is a session change as mantle.events.session carries it.
func sessionEvent(ev session.Event) *eventsv1.SessionEvent {
	kind := eventsv1.SessionEventKind_SESSION_EVENT_KIND_UNSPECIFIED
	switch ev.Kind {
	case session.EventDegraded:
		kind = eventsv1.SessionEventKind_SESSION_EVENT_KIND_DEGRADED
	case session.EventPendingConfirmation:
		kind = eventsv1.SessionEventKind_SESSION_EVENT_KIND_PENDING_CONFIRMATION
	case session.EventEnded:
		kind = eventsv1.SessionEventKind_SESSION_EVENT_KIND_ENDED
	}
	return &eventsv1.SessionEvent{
		At: timestamppb.New(ev.At), Tenant: ev.Tenant, SessionId: ev.SessionID, Kind: kind,
		StepId: ev.StepID, Target: ev.Target, State: stateToProto(ev.State), Reason: ev.Reason,
		Degradations: int32(min(ev.Degradations, 1<<30)), // bounded by the steps a session records
	}
}
