package router

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	attempts *prometheus.CounterVec
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
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.attempts} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register router metrics: %w", err)
		}
	}
	return m, nil
}
