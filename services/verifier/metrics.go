package verifier

import (
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	// verdicts counts verdicts by result (passed, failed) and the code that decided a
	// failure ("none" when passed). Codes are a fixed set plus rule ids, so the cardinality
	// is bounded by configuration.
	verdicts *prometheus.CounterVec
	// findings counts every finding, warnings included, by layer, code and whether it blocked.
	findings *prometheus.CounterVec
	// duration is how long the synchronous layers (L1 and L2) took; the usual budgets are
	// 1 ms and 3-8 ms.
	duration prometheus.Histogram
	// ruleErrors counts rule conditions that could not be evaluated.
	ruleErrors *prometheus.CounterVec
	// reloads counts rule set compilations by outcome; rules is the size of the live set.
	reloads *prometheus.CounterVec
	rules   prometheus.Gauge
	// reviews counts review requests handed to the queue (opened) or lost (failed).
	reviews *prometheus.CounterVec
	// l3 counts L3 jobs by outcome: done, failed, shed (queue full).
	l3 *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	opts := func(name, help string) prometheus.CounterOpts {
		return prometheus.CounterOpts{Namespace: "mantle", Subsystem: "verifier", Name: name, Help: help}
	}
	m := &metrics{
		verdicts: prometheus.NewCounterVec(opts("verdicts_total",
			"Verdicts by result (passed, failed) and the code of the first blocking finding (none when passed)."),
			[]string{"result", "code"}),
		findings: prometheus.NewCounterVec(opts("findings_total",
			"Findings by layer, code and whether they failed the answer."), []string{"layer", "code", "blocking"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "mantle", Subsystem: "verifier", Name: "verify_duration_seconds",
			Help:    "Time spent on the synchronous checks (L1 and L2) per answer.",
			Buckets: prometheus.ExponentialBuckets(10e-6, 4, 8), // 10µs .. 164ms
		}),
		ruleErrors: prometheus.NewCounterVec(opts("rule_errors_total",
			"Rule conditions that could not be evaluated, by rule and kind (cost_limit, evaluation)."), []string{"rule", "kind"}),
		reloads: prometheus.NewCounterVec(opts("rule_reloads_total",
			"Rule set compilations by result (accepted, rejected)."), []string{"result"}),
		rules: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "mantle", Subsystem: "verifier", Name: "rules",
			Help: "Rules in the live L2 set."}),
		reviews: prometheus.NewCounterVec(opts("review_requests_total",
			"Review requests by result: opened (queued durably) or failed (lost)."), []string{"result"}),
		l3: prometheus.NewCounterVec(opts("l3_checks_total",
			"L3 checks by result: done, failed, shed (queue full)."), []string{"result"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.verdicts, m.findings, m.duration, m.ruleErrors, m.reloads, m.rules, m.reviews, m.l3} {
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
