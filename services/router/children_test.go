package router

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestMetricsChildren: a series reached through the router's cache of children is the
// vector's own series for those label values, one per distinct set of values.
func TestMetricsChildren(t *testing.T) {
	t.Parallel()
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		inc    func()
		series prometheus.Counter
		want   float64
	}{
		{"requests", func() { m.request("chat", "s", "ok", "primary").requests.Inc() }, m.requests.WithLabelValues("chat", "s", "ok", "primary"), 2},
		{"requests of another outcome", func() { m.request("chat", "s", "Unavailable", "primary").requests.Inc() }, m.requests.WithLabelValues("chat", "s", "Unavailable", "primary"), 2},
		{"attempts", func() { m.attempt("gpt", "none").Inc() }, m.attempts.WithLabelValues("gpt", "none"), 2},
		{"attempts of another class", func() { m.attempt("gpt", "timeout").Inc() }, m.attempts.WithLabelValues("gpt", "timeout"), 2},
		{"input tokens", func() { m.usage("t", "gpt").input.Add(3) }, m.tokens.WithLabelValues("t", "gpt", "input"), 6},
		{"output tokens", func() { m.usage("t", "gpt").output.Add(5) }, m.tokens.WithLabelValues("t", "gpt", "output"), 10},
		{"cost", func() { m.usage("t", "gpt").cost.Add(0.5) }, m.cost.WithLabelValues("t", "gpt"), 1},
		{"another tenant's cost", func() { m.usage("u", "gpt").cost.Add(2) }, m.cost.WithLabelValues("u", "gpt"), 4},
	} {
		tc.inc()
		tc.inc()
		if got := counterValue(t, tc.series); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	for _, o := range []struct {
		name   string
		obs    func()
		series prometheus.Observer
	}{
		{"duration", func() { m.request("chat", "s", "ok", "primary").duration.Observe(1) }, m.duration.WithLabelValues("chat", "s", "primary")},
		{"provider latency", func() { m.latency("gpt", "none").Observe(1) }, m.providerLatency.WithLabelValues("gpt", "none")},
		{"overhead", func() { m.overheadOf("chat").Observe(1) }, m.overhead.WithLabelValues("chat")},
	} {
		o.obs()
		var d dto.Metric
		if err := o.series.(prometheus.Metric).Write(&d); err != nil {
			t.Fatal(err)
		}
		if got := d.GetHistogram().GetSampleCount(); got != 1 {
			t.Errorf("%s: %d observations, want 1", o.name, got)
		}
	}
}
