package mesh_test

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
)

// sample sums the series of name in reg whose labels include want: a counter's or gauge's
// value, a histogram's sample count. found is false when no series matched.
func sample(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) (sum float64, found bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue series
				}
			}
			found = true
			switch mf.GetType() {
			case dto.MetricType_HISTOGRAM:
				sum += float64(m.GetHistogram().GetSampleCount())
			case dto.MetricType_GAUGE:
				sum += m.GetGauge().GetValue()
			default:
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum, found
}

// dump lists a metric's series, for failure messages.
func dump(t *testing.T, reg *prometheus.Registry, name string) string {
	t.Helper()
	mfs, _ := reg.Gather()
	var out []string
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				out = append(out, m.String())
			}
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// TestMetricsMove sends requests through the four services, each in its own process with
// its own registry, and checks that the issue 8 series moved by exactly what happened:
// the first choice is down, so two requests fail over (retries after overloaded) until its
// breaker opens, the next ones skip it; one answer streams (TTFT); a repeated prompt is a
// cache hit (the model's own route, scenario default).
func TestMetricsMove(t *testing.T) {
	cfg := testConfig()
	cfg.Router.Breaker.ConsecutiveFailures = 2
	cfg.Router.Breaker.OpenDuration = time.Hour // stays open for the whole test
	cfg.Router.Breaker.MaxOpenDuration = time.Hour
	cfg.Router.Breaker.OpenJitter = 0
	m := meshtest.Start(t, cfg, meshtest.Split)
	client := routerv1.NewRouterServiceClient(meshtest.Dial(t, m.GRPCAddr))
	ctx := authed(acmeKey)

	for i, q := range []string{"Where is parcel 1?", "Where is parcel 2?", "Where is parcel 3?"} {
		if _, err := client.Complete(ctx, &routerv1.CompleteRequest{Request: ask("chat", q)}); err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
	}
	s, err := client.StreamComplete(ctx, &routerv1.StreamCompleteRequest{Request: ask("chat", "Where is parcel 4?")})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := s.Recv(); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("stream: %v", err)
		}
	}
	// A primary-level answer is stored (degraded ones are not), so asking again hits.
	repeat := ask("backup", "What is the refund policy for orders placed online?")
	repeat.Temperature = proto.Float64(0) // sampled answers are not cached
	for i := range 2 {
		if _, err := client.Complete(ctx, &routerv1.CompleteRequest{Request: repeat}); err != nil {
			t.Fatalf("backup request %d: %v", i+1, err)
		}
	}

	reg := func(svc string) *prometheus.Registry {
		p := m.Processes[svc]
		if p == nil || p.Metrics == nil {
			t.Fatalf("no registry for %s", svc)
		}
		return p.Metrics
	}
	router, quota, cache, verifier := reg("router"), reg("quota"), reg("cache"), reg("verifier")
	l := func(kv ...string) map[string]string {
		out := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	tests := []struct {
		reg    *prometheus.Registry
		name   string
		labels map[string]string
		want   float64
	}{
		// End to end, by scenario and ladder level: chat's four answers came from its backup
		// (level backup_model); the backup route answered at its primary level.
		{router, "mantle_router_requests_total", l("route", "chat", "scenario", "chat", "outcome", "ok", "level", "backup_model"), 4},
		{router, "mantle_router_request_duration_seconds", l("route", "chat", "scenario", "chat", "level", "backup_model"), 4},
		{router, "mantle_router_requests_total", l("scenario", "chat"), 4},
		{router, "mantle_router_requests_total", l("route", "backup", "scenario", "default", "outcome", "ok", "level", "primary"), 2},
		{router, "mantle_router_request_duration_seconds", l("route", "backup", "scenario", "default", "level", "primary"), 2},
		// Provider attempts, retries and breakers.
		{router, "mantle_router_attempts_total", l("model", "broken", "class", "overloaded"), 2},
		{router, "mantle_router_attempts_total", l("model", "broken", "class", "breaker_open"), 2},
		{router, "mantle_router_provider_attempt_duration_seconds", l("model", "broken", "class", "overloaded"), 2},
		{router, "mantle_router_retries_total", l("model", "backup", "class", "overloaded"), 2},
		{router, "mantle_router_retries_total", l(), 2},
		{router, "mantle_router_provider_ttft_seconds", l("model", "backup"), 1},
		{router, "mantle_router_breaker_transitions_total", l("model", "broken", "key", "sim", "state", "open"), 1},
		{router, "mantle_router_breaker_state", l("provider", "sim", "model", "broken", "key", "sim", "scenario", "chat"), 2},
		// Degradations by level and bounded reason.
		{router, "mantle_router_degradations_total", l("route", "chat", "level", "backup_model", "reason", "overloaded"), 2},
		{router, "mantle_router_degradations_total", l("route", "chat", "level", "backup_model", "reason", "skipped"), 2},
		// Tokens and cost per tenant and model.
		{router, "mantle_router_cost_usd_total", l("tenant", "acme", "model", "broken"), 0},
		// Events the router published (one per degradation, one breaker transition).
		{router, "mantle_events_published_total", l("subject", "mantle.events.degradation"), 4},
		{router, "mantle_events_published_total", l("subject", "mantle.events.breaker"), 1},
		{router, "mantle_events_dropped_total", l(), 0},
		// Quota: one granted reservation per request, by tenant.
		{quota, "mantle_quota_decisions_total", l("result", "granted", "tenant", "acme"), 6},
		{quota, "mantle_quota_decision_seconds", l("result", "granted"), 6},
		{quota, "mantle_quota_queue_length", l(), 0},
		// Cache: the repeated prompt hit its own entry: found stored (exact), or, when it
		// came before the first answer's store landed (router.async_cache_store), given
		// that answer on the first request's lease (coalesced); never a similar one.
		{cache, "mantle_cache_lookups_total", l("scenario", "default", "result", "hit"), 1},
		{cache, "mantle_cache_lookups_total", l("scenario", "default", "result", "hit", "match", "semantic"), 0},
		{cache, "mantle_cache_lookups_total", l("scenario", "default", "result", "miss"), 1},
		{cache, "mantle_cache_lookups_total", l("scenario", "chat", "result", "miss"), 4},
		{cache, "mantle_cache_stores_total", l("outcome", "stored"), 1},
		// Verifier: every answer a model gave, and the cache hit (ruled for its request),
		// was checked and passed.
		{verifier, "mantle_verifier_verdicts_total", l("result", "passed"), 6},
		{verifier, "mantle_verifier_findings_total", l("blocking", "true"), 0},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s%v", tt.name, tt.labels), func(t *testing.T) {
			got, found := sample(t, tt.reg, tt.name, tt.labels)
			if tt.want != 0 && !found {
				t.Fatalf("no series of %s with %v; series:\n%s", tt.name, tt.labels, dump(t, tt.reg, tt.name))
			}
			if got != tt.want {
				t.Errorf("%s%v = %v, want %v; series:\n%s", tt.name, tt.labels, got, tt.want, dump(t, tt.reg, tt.name))
			}
		})
	}
	// Tokens are counted per tenant and model, both directions.
	for _, dir := range []string{"input", "output"} {
		if got, _ := sample(t, router, "mantle_router_tokens_total", l("tenant", "acme", "model", "backup", "direction", dir)); got <= 0 {
			t.Errorf("mantle_router_tokens_total{tenant=acme,model=backup,direction=%s} = %v, want > 0", dir, got)
		}
	}
}
