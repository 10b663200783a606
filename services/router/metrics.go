package router

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	requests           *prometheus.CounterVec
	duration           *prometheus.HistogramVec
	attempts           *prometheus.CounterVec
	providerLatency    *prometheus.HistogramVec
	breakerTransitions *prometheus.CounterVec
	degradations       *prometheus.CounterVec
	budgetDenied       prometheus.Counter
	hedges             prometheus.Counter
	replays            prometheus.Counter
	// idempotencyUnavailable counts requests served without replay protection.
	idempotencyUnavailable prometheus.Counter
	// breakerState is the state of every breaker that has left closed at least once:
	// 1 closed, 2 open, 3 half-open (the BreakerState enum values).
	breakerState *prometheus.GaugeVec
	tokens       *prometheus.CounterVec
	cost         *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_router_requests_total", Help: "Requests by route, outcome (gRPC code) and ladder level.",
		}, []string{"route", "outcome", "level"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "mantle_router_request_duration_seconds", Help: "End-to-end request latency by route.",
			Buckets: []float64{.05, .1, .25, .5, .75, 1, 1.5, 2, 3, 5, 8, 12, 20, 30},
		}, []string{"route"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_router_attempts_total", Help: "Provider attempts by model and error class.",
		}, []string{"model", "class"}),
		providerLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "mantle_router_provider_attempt_duration_seconds", Help: "Provider attempt latency by model and error class.",
			Buckets: []float64{.05, .1, .25, .5, .75, 1, 1.5, 2, 3, 5, 8, 12, 20, 30, 60},
		}, []string{"model", "class"}),
		breakerTransitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_router_breaker_transitions_total", Help: "Circuit breaker transitions by model, key and new state.",
		}, []string{"model", "key", "state"}),
		degradations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_router_degradations_total", Help: "Answers below the primary by route and ladder level.",
		}, []string{"route", "level"}),
		budgetDenied: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mantle_router_retry_budget_rejections_total", Help: "Retries, failovers and hedges refused by the retry budget.",
		}),
		hedges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mantle_router_hedges_total", Help: "Hedged requests sent.",
		}),
		replays: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mantle_router_idempotent_replays_total", Help: "Requests answered from an idempotency record.",
		}),
		breakerState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "mantle_router_breaker_state", Help: "Circuit breaker state: 1 closed, 2 open, 3 half-open.",
		}, []string{"provider", "model", "key", "scenario"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_router_tokens_total", Help: "Provider tokens by tenant, model and direction (input, output), failed attempts included.",
		}, []string{"tenant", "model", "direction"}),
		cost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_router_cost_usd_total", Help: "Estimated provider cost in US dollars by tenant and model.",
		}, []string{"tenant", "model"}),
		idempotencyUnavailable: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mantle_router_idempotency_unavailable_total", Help: "Requests served without replay protection because the idempotency store failed.",
		}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.attempts, m.providerLatency, m.breakerTransitions, m.degradations, m.budgetDenied, m.hedges, m.replays, m.idempotencyUnavailable, m.breakerState, m.tokens, m.cost} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register router metrics: %w", err)
		}
	}
	return m, nil
}
