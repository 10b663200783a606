package router

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/events"
	"github.com/mantle-mesh/mantle/pkg/resilience"
)

// acquire picks a key of u that may be called now: not cooling down after a 429, not
// avoided in this request, and admitted by its breaker for the scenario. Keys are tried in
// round-robin order so load spreads over them. When none may be called, skip says why.
func (r *Router) acquire(u *upstream, scenario string, avoid map[*upstreamKey]bool) (*upstreamKey, resilience.Permit, mantlev1.ErrorClass) {
	skip := mantlev1.ErrorClass_ERROR_CLASS_BREAKER_OPEN
	start := int(u.next.Add(1) - 1)
	for i := range u.keys {
		key := u.keys[(start+i)%len(u.keys)]
		if avoid[key] {
			continue
		}
		if key.cooldown.Active() {
			skip = mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED
			continue
		}
		if permit, ok := r.breaker(u, key, scenario).Allow(); ok {
			return key, permit, mantlev1.ErrorClass_ERROR_CLASS_NONE
		}
	}
	return nil, resilience.Permit{}, skip
}

// hasUsableKey reports whether u has a key that is neither avoided nor cooling down.
func (r *Router) hasUsableKey(u *upstream, avoid map[*upstreamKey]bool) bool {
	for _, key := range u.keys {
		if !avoid[key] && !key.cooldown.Active() {
			return true
		}
	}
	return false
}

// breakerScenario is the scenario whose breakers a request on rt consults: its own when it
// is a configured route's scenario, else the route's. The scenario is caller-chosen, and a
// breaker per distinct value would grow without bound.
func (r *Router) breakerScenario(rt *route, scenario string) string {
	if r.table().scenarios[scenario] {
		return scenario
	}
	return rt.scenario
}

// breaker returns the breaker of (provider, model, key, scenario), creating it on first use.
func (r *Router) breaker(u *upstream, key *upstreamKey, scenario string) *resilience.Breaker {
	key.mu.Lock()
	defer key.mu.Unlock()
	b, ok := key.breakers[scenario]
	if !ok {
		b = resilience.NewBreaker(r.conf().Breaker, r.deps.Clock, r.deps.Rand, func(t resilience.Transition) {
			r.breakerTransition(u, key, scenario, t)
		})
		key.breakers[scenario] = b
	}
	return b
}

// breakerTransition publishes every state change: operators see it on NATS, in the logs,
// in metrics and in DescribeRoutes.
func (r *Router) breakerTransition(u *upstream, key *upstreamKey, scenario string, t resilience.Transition) {
	r.deps.Log.Warn("circuit breaker transition", "provider", u.provider, "model", u.model.Name, "key", key.id,
		"scenario", scenario, "from", t.From.String(), "to", t.To.String(), "reason", t.Reason)
	r.deps.Metrics.breakerTransitions.WithLabelValues(u.model.Name, key.id, t.To.String()).Inc()
	r.deps.Metrics.breakerState.WithLabelValues(u.provider, u.model.Name, key.id, scenario).Set(float64(events.BreakerState(t.To)))
	r.deps.Events.Publish(context.Background(), events.SubjectBreaker, &eventsv1.BreakerTransitionEvent{
		At:           timestamppb.New(t.At),
		Provider:     u.provider,
		Model:        u.model.Name,
		KeyId:        key.id,
		Scenario:     scenario,
		From:         events.BreakerState(t.From),
		To:           events.BreakerState(t.To),
		Reason:       t.Reason,
		ErrorRate:    t.FailureRate,
		SlowCallRate: t.SlowRate,
	})
}

// keyHealth summarises a key's breakers for DescribeRoutes: the worst state over its
// scenarios, with that breaker's reason and, when open, when it will next let a call
// through: its next scout if one is due before the open period ends, else the period's end.
func (r *Router) keyHealth(key *upstreamKey) (mantlev1.BreakerState, string, time.Time) {
	key.mu.Lock()
	defer key.mu.Unlock()
	state, reason, until := mantlev1.BreakerState_BREAKER_STATE_CLOSED, "closed", time.Time{}
	rank := map[mantlev1.BreakerState]int{mantlev1.BreakerState_BREAKER_STATE_CLOSED: 0, mantlev1.BreakerState_BREAKER_STATE_HALF_OPEN: 1, mantlev1.BreakerState_BREAKER_STATE_OPEN: 2}
	for scenario, b := range key.breakers {
		snap := b.Snapshot()
		if s := events.BreakerState(snap.State); rank[s] > rank[state] {
			state, reason, until = s, fmt.Sprintf("%s (scenario %s)", snap.Reason, scenario), snap.OpenUntil
			if !snap.NextScout.IsZero() {
				until = snap.NextScout
			}
		}
	}
	return state, reason, until
}
