package agent

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the agent's Prometheus series, per tool and kind.
type metrics struct {
	calls         *prometheus.CounterVec
	results       *prometheus.CounterVec
	attempts      *prometheus.CounterVec
	confirmations *prometheus.CounterVec
	breaker       *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_agent_tool_calls_total", Help: "Tool calls with valid arguments, by tool and kind.",
		}, []string{"tool", "kind"}),
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_agent_tool_results_total",
			Help: "Tool call outcomes by tool, kind and result: ok, backup, stale, cached, replayed, pending_confirmation, unavailable, invalid_arguments, error.",
		}, []string{"tool", "kind", "result"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_agent_tool_backend_calls_total",
			Help: "Backend calls (and calls refused before the backend: breaker_open, bulkhead_full, throttled by the tool's rate_limit) by tool and outcome.",
		}, []string{"tool", "outcome"}),
		confirmations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_agent_tool_confirmations_total", Help: "Actions whose outcome was unknown and went to a person to confirm, by tool.",
		}, []string{"tool"}),
		breaker: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mantle_agent_tool_breaker_transitions_total", Help: "Tool circuit breaker transitions by tool and the state entered.",
		}, []string{"tool", "state"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.calls, m.results, m.attempts, m.confirmations, m.breaker} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register agent metrics: %w", err)
		}
	}
	return m, nil
}
