package quota

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Values of the result label of mantle_quota_decisions_total.
const (
	decisionGranted   = "granted"
	decisionExhausted = "exhausted"
	decisionTooLarge  = "too_large"
)

type metrics struct {
	decisions           *prometheus.CounterVec
	reservedTokens      prometheus.Counter
	settledTokens       prometheus.Counter
	expiredReservations prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_quota_decisions_total",
			Help: "Reserve decisions by result: granted, exhausted (retry later) or too_large (never fits).",
		}, []string{"result"}),
		reservedTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mantle_quota_reserved_tokens_total",
			Help: "Tokens charged by granted reservations (input estimate plus max output).",
		}),
		settledTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mantle_quota_settled_tokens_total",
			Help: "Tokens actually used, as settled; compare with reserved to see how good estimates are.",
		}),
		expiredReservations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mantle_quota_expired_reservations_total",
			Help: "Reservations never settled before reservation_ttl; their charge stands.",
		}),
	}
	for _, c := range []prometheus.Collector{m.decisions, m.reservedTokens, m.settledTokens, m.expiredReservations} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register quota metrics: %w", err)
		}
	}
	// Export every result from the start, so rate() sees a zero before the first refusal.
	for _, result := range []string{decisionGranted, decisionExhausted, decisionTooLarge} {
		m.decisions.WithLabelValues(result)
	}
	return m, nil
}
