package router

import (
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
)

// metrics are the router's Prometheus series, on the process registry. Every label is
// bounded: route and model come from configuration, class and level are enums, reason is
// an enum plus a few fixed words (degradationCause), scenario is a configured route's
// scenario or "_other" (scenarioLabel), and tenant is an authenticated tenant of
// auth.tenants ("default" when authentication is off), so a client cannot mint series.
type metrics struct {
	requests           *prometheus.CounterVec
	duration           *prometheus.HistogramVec
	attempts           *prometheus.CounterVec
	providerLatency    *prometheus.HistogramVec
	breakerTransitions *prometheus.CounterVec
	degradations       *prometheus.CounterVec
	budgetDenied       prometheus.Counter
	hedgeBudgetDenied  prometheus.Counter
	sideScouts         *prometheus.CounterVec
	lateTimeouts       *prometheus.CounterVec
	hedges             prometheus.Counter
	replays            prometheus.Counter
	sessionReplays     prometheus.Counter
	// cachedRefused counts cache hits the request's rules (or checks) refused to serve.
	cachedRefused prometheus.Counter
	// storesShed counts answers not stored because the stores after the answers were
	// backed up (storeWorkers).
	storesShed prometheus.Counter
	// ttft is the time to the first token of streamed attempts that produced one.
	ttft *prometheus.HistogramVec
	// retries counts attempts after a request's first (same model again, or failover), by
	// the model tried and the class of the failure that caused it.
	retries *prometheus.CounterVec
	// idempotencyUnavailable counts requests served without replay protection.
	idempotencyUnavailable prometheus.Counter
	// breakerState is the state of every breaker that has left closed at least once:
	// 1 closed, 2 open, 3 half-open (the BreakerState enum values).
	breakerState *prometheus.GaugeVec
	tokens       *prometheus.CounterVec
	cost         *prometheus.CounterVec
	// shed counts requests the overload shedder refused, by priority.
	shed *prometheus.CounterVec
	// overhead is each request's time in mantle apart from its provider calls.
	overhead *prometheus.HistogramVec

	// The children every request counts in, by their label values (see children).
	requestChildren  children[requestLabels, requestChild]
	attemptChildren  children[modelClass, prometheus.Counter]
	latencyChildren  children[modelClass, prometheus.Observer]
	overheadChildren children[string, prometheus.Observer]
	usageChildren    children[tenantModel, usageChild]
}

type requestLabels struct{ route, scenario, outcome, level string }

type requestChild struct {
	requests prometheus.Counter
	duration prometheus.Observer
}

type modelClass struct{ model, class string }

type tenantModel struct{ tenant, model string }

type usageChild struct{ input, output, cost prometheus.Counter }

// request is the requests and duration series of one route, scenario, outcome and level.
func (m *metrics) request(route, scenario, outcome, level string) requestChild {
	return m.requestChildren.get(requestLabels{route, scenario, outcome, level}, func() requestChild {
		return requestChild{m.requests.WithLabelValues(route, scenario, outcome, level), m.duration.WithLabelValues(route, scenario, level)}
	})
}

// attempt is the attempts series of one model and error class.
func (m *metrics) attempt(model, class string) prometheus.Counter {
	return m.attemptChildren.get(modelClass{model, class}, func() prometheus.Counter { return m.attempts.WithLabelValues(model, class) })
}

// latency is the provider latency series of one model and error class.
func (m *metrics) latency(model, class string) prometheus.Observer {
	return m.latencyChildren.get(modelClass{model, class}, func() prometheus.Observer { return m.providerLatency.WithLabelValues(model, class) })
}

// overheadOf is the overhead series of one route.
func (m *metrics) overheadOf(route string) prometheus.Observer {
	return m.overheadChildren.get(route, func() prometheus.Observer { return m.overhead.WithLabelValues(route) })
}

// usage is the token and cost series of one tenant and model.
func (m *metrics) usage(tenant, model string) usageChild {
	return m.usageChildren.get(tenantModel{tenant, model}, func() usageChild {
		return usageChild{m.tokens.WithLabelValues(tenant, model, "input"), m.tokens.WithLabelValues(tenant, model, "output"), m.cost.WithLabelValues(tenant, model)}
	})
}

// children holds a vector's children by their label values. A vector's own lookup checks
// every value is UTF-8 and hashes it under the vector's lock on every use, a cost each
// request paid several times over; here one map read answers. It holds no more than the
// vector does (the labels are bounded, see metrics), and the router never deletes a child.
type children[K comparable, M any] struct {
	mu sync.RWMutex
	m  map[K]M
}

func (c *children[K, M]) get(k K, child func() M) M {
	c.mu.RLock()
	v, ok := c.m[k]
	c.mu.RUnlock()
	if ok {
		return v
	}
	v = child()
	c.mu.Lock()
	if c.m == nil {
		c.m = map[K]M{}
	}
	c.m[k] = v
	c.mu.Unlock()
	return v
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_router_requests_total", Help: "Requests by route, scenario, outcome (gRPC code) and ladder level.",
		}, []string{"route", "scenario", "outcome", "level"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "mantle_router_request_duration_seconds", Help: "End-to-end request latency (from the front door's handler or the gRPC method) by route, scenario and the ladder level that answered.",
			Buckets: []float64{.05, .1, .25, .5, .75, 1, 1.5, 2, 3, 5, 8, 12, 20, 30},
		}, []string{"route", "scenario", "level"}),
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
			Name: "mantle_router_degradations_total", Help: "Answers below the primary by route, ladder level and reason (an error class, forced, retry_budget, rule or skipped).",
		}, []string{"route", "level", "reason"}),
		budgetDenied: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mantle_router_retry_budget_rejections_total", Help: "Retries and failovers refused by the retry budget.",
		}),
		sideScouts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_router_side_scouts_total", Help: "Scouts of an open breaker sent beside the request that drew them, by model (router.side_scouts).",
		}, []string{"model"}),
		lateTimeouts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_router_late_timeouts_total", Help: "Provider calls that timed out while this process was short of CPU (the deadline noticed, or the P90 wait for a CPU, over a tenth of the limit), by model; the breaker gets no verdict from them.",
		}, []string{"model"}),
		hedgeBudgetDenied: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mantle_router_hedge_budget_rejections_total", Help: "Hedges not sent because the hedge budget was spent.",
		}),
		hedges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mantle_router_hedges_total", Help: "Hedged requests sent.",
		}),
		sessionReplays: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mantle_router_session_replays_total", Help: "Model steps of agent sessions answered from the session's record: no model was called.",
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
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "mantle_router_provider_ttft_seconds", Help: "Time to the first token of streamed provider attempts, by model.",
			Buckets: []float64{.1, .25, .5, .75, 1, 1.5, 2, 3, 4, 6, 8, 10, 15, 20, 30},
		}, []string{"model"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_router_retries_total", Help: "Attempts after a request's first (a retry of the same model or a failover), by the model tried and the error class that caused it.",
		}, []string{"model", "class"}),
		overhead: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "mantle_router_overhead_seconds", Help: "Time requests spent in mantle's own work, not waiting on providers nor held on purpose (QualityContext.overhead), by route.",
			Buckets: []float64{.0001, .00025, .0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"route"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_router_shed_total", Help: "Requests refused with OVERLOADED while the process was short of CPU, by priority.",
		}, []string{"priority"}),
		cachedRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mantle_router_cached_answers_refused_total", Help: "Cache hits not served because the verification of the request's scenario refused them (a rule blocked or degraded them, or L1 failed); the models were asked instead.",
		}),
		storesShed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mantle_router_cache_stores_shed_total", Help: "Cacheable answers not offered to the cache because router.max_async_cache_stores stores were already in flight after their answers (router.async_cache_store); their coalescing leases were released.",
		}),
		idempotencyUnavailable: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mantle_router_idempotency_unavailable_total", Help: "Requests served without replay protection because the idempotency store failed.",
		}),
	}
	for v := range mantlev1.Priority_name { // from zero, so that rate() sees the first refusals
		if p := mantlev1.Priority(v); p != mantlev1.Priority_PRIORITY_UNSPECIFIED {
			m.shed.WithLabelValues(priorityLabel(p))
		}
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.attempts, m.providerLatency, m.breakerTransitions, m.degradations, m.budgetDenied, m.hedgeBudgetDenied, m.sideScouts, m.lateTimeouts, m.hedges, m.replays, m.sessionReplays, m.cachedRefused, m.storesShed, m.idempotencyUnavailable, m.breakerState, m.tokens, m.cost, m.ttft, m.retries, m.shed, m.overhead} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register router metrics: %w", err)
		}
	}
	return m, nil
}

// Values of the reason label of mantle_router_degradations_total besides the error classes.
const (
	causeForced      = "forced"       // an operator forced the route's ladder level
	causeRetryBudget = "retry_budget" // the retry budget refused the next attempt
	causeRule        = "rule"         // a business rule asked to degrade the answer
	causeSkipped     = "skipped"      // no attempt failed: every better candidate was skipped
)

// reasonRuleDegrade is the degradation reason when a verifier rule asks for it.
const reasonRuleDegrade = "a business rule asked to degrade the answer"

// degradationCause is the bounded label for why a request degraded; err is the error that
// ended the attempt loop (nil when a lower candidate answered). The free-text reason goes
// to the event and the caller, never to a label.
func degradationCause(qc *mantlev1.QualityContext, err error) string {
	if qc.GetDegradationReason() == reasonRuleDegrade {
		return causeRule
	}
	var ex *exhaustedError
	if errors.As(err, &ex) {
		switch {
		case ex.forced != "":
			return causeForced
		case ex.retryDenied:
			return causeRetryBudget
		}
		return shortClass(ex.class)
	}
	if err != nil {
		return shortClass(provider.ClassOf(err))
	}
	for i := len(qc.GetAttempts()) - 1; i >= 0; i-- {
		if c := qc.Attempts[i].ErrorClass; c != mantlev1.ErrorClass_ERROR_CLASS_NONE && c != mantlev1.ErrorClass_ERROR_CLASS_CANCELED {
			return shortClass(c)
		}
	}
	return causeSkipped
}

// otherScenario labels scenarios no route is configured with: a request may name any
// scenario, and a series per invented name would grow without bound.
const otherScenario = "_other"

// scenarioLabel is the scenario label value for a request's scenario.
func (r *Router) scenarioLabel(scenario string) string {
	if r.table().scenarios[scenario] {
		return scenario
	}
	return otherScenario
}
