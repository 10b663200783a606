package quota

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// The tenant label stays bounded: configured tenants always keep theirs, others get one
// until maxTenantLabels exist, then share _other.
func TestTenantLabelIsBounded(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.Tenants = map[string]RateLimits{"acme": {}}
	cfg.ModelLimits = map[string]map[string]RateLimits{"*": {}, "globex": {}}
	m, err := newMetrics(prometheus.NewRegistry(), configuredTenants(cfg))
	if err != nil {
		t.Fatal(err)
	}
	for i := range maxTenantLabels { // more than fit: the configured two hold places
		m.tenant(fmt.Sprintf("t%03d", i))
	}
	tests := []struct{ tenant, want string }{
		{"acme", "acme"},
		{"globex", "globex"},
		{"*", otherTenant}, // the wildcard is not a tenant
		{"t000", "t000"},
		{fmt.Sprintf("t%03d", maxTenantLabels-3), fmt.Sprintf("t%03d", maxTenantLabels-3)},
		{fmt.Sprintf("t%03d", maxTenantLabels-2), otherTenant},
		{"newcomer", otherTenant},
	}
	for _, tt := range tests {
		if got := m.tenant(tt.tenant); got != tt.want {
			t.Errorf("tenant(%q) = %q, want %q", tt.tenant, got, tt.want)
		}
	}
}

func TestDecisionsCountTenants(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testConfig())
	f.reserve(t, "acme", 10, 1)
	f.reserve(t, "acme", 10, 1)
	f.reserve(t, "globex", 10, 1)
	for tenant, want := range map[string]float64{"acme": 2, "globex": 1} {
		if got := f.counter(t, "mantle_quota_decisions_total", "result", "granted", "tenant", tenant); got != want {
			t.Errorf("granted decisions of %s = %v, want %v", tenant, got, want)
		}
	}
}
