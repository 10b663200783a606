package verifier

import (
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	// verdicts counts verdicts by result (passed, failed) and the code that decided a
	// failure ("none" when passed). Codes are a fixed set, so the cardinality is bounded.
	verdicts *prometheus.CounterVec
	// findings counts every finding, warnings included, by code and whether it blocked.
	findings *prometheus.CounterVec
	// duration is how long L1 took; the seed's budget is 1 ms.
	duration prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		verdicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "mantle", Subsystem: "verifier", Name: "verdicts_total",
			Help: "Verdicts by result (passed, failed) and the code of the first blocking finding (none when passed).",
		}, []string{"result", "code"}),
		findings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "mantle", Subsystem: "verifier", Name: "findings_total",
			Help: "Findings by layer, code and whether they failed the answer.",
		}, []string{"layer", "code", "blocking"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "mantle", Subsystem: "verifier", Name: "l1_duration_seconds",
			Help:    "Time spent on L1 checks per answer.",
			Buckets: prometheus.ExponentialBuckets(10e-6, 4, 8), // 10µs .. 164ms
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.verdicts, m.findings, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register verifier metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) observe(v Verdict) {
	result, code := "passed", "none"
	if !v.Passed {
		result = "failed"
		for _, f := range v.Findings {
			if f.Blocking {
				code = f.Code
				break
			}
		}
	}
	m.verdicts.WithLabelValues(result, code).Inc()
	for _, f := range v.Findings {
		m.findings.WithLabelValues(f.Layer, f.Code, strconv.FormatBool(f.Blocking)).Inc()
	}
	m.duration.Observe(v.Duration.Seconds())
}
