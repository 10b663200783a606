package quota

import (
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mantle-mesh/mantle/services/quota/internal/admission"
)

// Values of the result label of mantle_quota_decisions_total.
const (
	decisionGranted     = "granted"
	decisionExhausted   = "exhausted"
	decisionTooLarge    = "too_large"
	decisionQueueFull   = "queue_full"
	decisionShed        = "shed"
	decisionDeadline    = "deadline"
	decisionUnavailable = "unavailable"
	decisionPrice       = "price_unknown"
)

// maxTenantLabels bounds the tenant label of mantle_quota_decisions_total. Tenants named in
// quota's configuration (tenants, model_limits, budgets, queue weights) always get their
// own series; callers are authenticated tenants of auth.tenants, which quota does not see,
// so other names get one until this many exist and then share "_other". A client cannot
// mint series: the router sends the authenticated tenant, never one the request names.
const maxTenantLabels = 100

// otherTenant labels tenants past maxTenantLabels.
const otherTenant = "_other"

type metrics struct {
	// decisions is by result, priority class and tenant (see maxTenantLabels).
	decisions           *prometheus.CounterVec
	decisionSeconds     *prometheus.HistogramVec
	reservedTokens      prometheus.Counter
	settledTokens       prometheus.Counter
	refundedTokens      prometheus.Counter
	extraTokens         prometheus.Counter
	expiredReservations prometheus.Counter
	queueLength         *prometheus.GaugeVec
	queueWait           *prometheus.HistogramVec
	queueShed           *prometheus.CounterVec
	shadowRefusals      *prometheus.CounterVec
	nearLimit           *prometheus.CounterVec
	observations        *prometheus.CounterVec
	retries             *prometheus.CounterVec
	correction          *prometheus.GaugeVec
	backendFallback     prometheus.Gauge
	backendFallbacks    prometheus.Counter

	// grantedSeconds is decisionSeconds of granted decisions, looked up once: every
	// grant observes it.
	grantedSeconds prometheus.Observer

	tenantsMu sync.Mutex
	tenants   map[string]bool // tenant label values in use
	// granted holds the granted decisions counters by tenant label value and class, so
	// that a grant costs one map lookup instead of hashing three label values.
	granted map[string]*[admission.NumClasses]prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, configuredTenants []string) (*metrics, error) {
	classes := []string{"priority"}
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_quota_decisions_total",
			Help: "Reserve decisions by result (granted, exhausted, too_large, queue_full, shed, deadline, unavailable, price_unknown), priority class and tenant (configured tenants; at most 100 others, then _other).",
		}, []string{"result", "priority", "tenant"}),
		decisionSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "mantle_quota_decision_seconds",
			Help:    "Time to decide a Reserve, waiting in the queue included, by result.",
			Buckets: []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1, 5, 30},
		}, []string{"result"}),
		reservedTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mantle_quota_reserved_tokens_total",
			Help: "Tokens charged by granted reservations (input estimate plus max output).",
		}),
		settledTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mantle_quota_settled_tokens_total",
			Help: "Tokens actually used, as settled; compare with reserved to see how good estimates are.",
		}),
		refundedTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mantle_quota_refunded_tokens_total",
			Help: "Tokens returned by Settle because the request used less than it reserved.",
		}),
		extraTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mantle_quota_extra_tokens_total",
			Help: "Tokens charged by Settle beyond the reservation.",
		}),
		expiredReservations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mantle_quota_expired_reservations_total",
			Help: "Reservations never settled before reservation_ttl; their charge stands (memory backend; Redis expires them itself).",
		}),
		queueLength: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "mantle_quota_queue_length",
			Help: "Requests waiting for quota in this replica, by priority class.",
		}, classes),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "mantle_quota_queue_wait_seconds",
			Help:    "How long requests admitted from the queue waited, by priority class.",
			Buckets: []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
		}, classes),
		queueShed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_quota_queue_shed_total",
			Help: "Waiting requests displaced by a higher priority when the queue was full, by the displaced class.",
		}, classes),
		shadowRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_quota_shadow_refusals_total",
			Help: "Requests a rule in shadow mode would have refused (they were admitted), by bucket kind.",
		}, []string{"kind"}),
		nearLimit: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_quota_near_limit_total",
			Help: "Near-limit signals published, by bucket kind.",
		}, []string{"kind"}),
		observations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_quota_upstream_observations_total",
			Help: "ObserveUpstream calls, by whether the key has buckets (applied: true, false) or a reset was implausible and ignored (implausible).",
		}, []string{"applied"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_quota_retry_decisions_total",
			Help: "AcquireRetry answers, by result (granted, denied, denied_tenant_share).",
		}, []string{"result"}),
		correction: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "mantle_quota_token_correction",
			Help: "Correction factor learned for token estimates, by tokenizer family.",
		}, []string{"family"}),
		backendFallback: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mantle_quota_backend_fallback",
			Help: "1 while Redis is unreachable and this replica enforces limit/replicas locally; money budgets then fail closed.",
		}),
		backendFallbacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mantle_quota_backend_fallbacks_total",
			Help: "Times this replica fell back from Redis to its local limiter.",
		}),
		tenants: map[string]bool{},
		granted: map[string]*[admission.NumClasses]prometheus.Counter{},
	}
	for _, t := range configuredTenants {
		m.tenants[t] = true
	}
	for _, c := range []prometheus.Collector{
		m.decisions, m.decisionSeconds, m.reservedTokens, m.settledTokens, m.refundedTokens, m.extraTokens,
		m.expiredReservations, m.queueLength, m.queueWait, m.queueShed, m.shadowRefusals, m.nearLimit,
		m.observations, m.retries, m.correction, m.backendFallback, m.backendFallbacks,
	} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register quota metrics: %w", err)
		}
	}
	// Export every series from the start, so rate() sees a zero before the first event. The
	// tenant is "default", the one every caller is when authentication is off: one tenant
	// is enough for sums by result to start at zero.
	for c := range admission.NumClasses {
		class := admission.ClassName(c)
		for _, result := range []string{decisionGranted, decisionExhausted, decisionTooLarge, decisionQueueFull, decisionShed, decisionDeadline, decisionUnavailable, decisionPrice} {
			m.decisions.WithLabelValues(result, class, "default")
		}
		m.queueLength.WithLabelValues(class)
		m.queueShed.WithLabelValues(class)
	}
	for _, result := range []string{"granted", "denied"} {
		m.retries.WithLabelValues(result)
	}
	m.grantedSeconds = m.decisionSeconds.WithLabelValues(decisionGranted)
	return m, nil
}

// grantedCounter returns the granted decisions counter of a tenant (its label value,
// see tenant) and class.
func (m *metrics) grantedCounter(id string, class int) prometheus.Counter {
	m.tenantsMu.Lock()
	defer m.tenantsMu.Unlock()
	label := m.tenantLocked(id)
	byClass := m.granted[label]
	if byClass == nil {
		byClass = new([admission.NumClasses]prometheus.Counter)
		for c := range admission.NumClasses {
			byClass[c] = m.decisions.WithLabelValues(decisionGranted, admission.ClassName(c), label)
		}
		m.granted[label] = byClass
	}
	return byClass[class]
}

// tenant returns the tenant label value for a tenant id (see maxTenantLabels).
func (m *metrics) tenant(id string) string {
	m.tenantsMu.Lock()
	defer m.tenantsMu.Unlock()
	return m.tenantLocked(id)
}

func (m *metrics) tenantLocked(id string) string {
	if m.tenants[id] {
		return id
	}
	if len(m.tenants) < maxTenantLabels {
		m.tenants[id] = true
		return id
	}
	return otherTenant
}

// configuredTenants are the tenant ids quota's configuration names, "*" left out.
func configuredTenants(cfg Config) []string {
	var out []string
	for t := range cfg.Tenants {
		out = append(out, t)
	}
	for t := range cfg.ModelLimits {
		if t != "*" {
			out = append(out, t)
		}
	}
	for t := range cfg.Budgets.Tenants {
		out = append(out, t)
	}
	for t := range cfg.Queue.Weights {
		out = append(out, t)
	}
	return out
}
