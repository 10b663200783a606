package mesh

import (
	"slices"
	"testing"
	"time"

	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/quota"
	"github.com/mantle-mesh/mantle/services/router"
)

func TestDiffConfig(t *testing.T) {
	t.Parallel()
	base := func() Config {
		c := Default()
		c.Router.Routes = []router.RouteConfig{
			{Name: "chat", Scenario: "chat", Candidates: []string{"a", "b"}},
			{Name: "support", Scenario: "support", Candidates: []string{"b"}},
		}
		c.Quota.Tenants = map[string]quota.RateLimits{"acme": {RPM: 10, TPM: 1000}}
		c.Auth.Tenants = []rpc.TenantKey{{ID: "acme", KeySHA256: rpc.HashKey("old-key")}}
		return c
	}
	tests := []struct {
		name   string
		change func(*Config)
		want   []string // path: old -> new
	}{
		{"nothing", func(*Config) {}, nil},
		{"a route's hedging", func(c *Config) { c.Router.Routes[0].Hedge.Enabled = true },
			[]string{"router.routes.chat.hedge.enabled: false -> true"}},
		{"a tenant's limit", func(c *Config) { c.Quota.Tenants["acme"] = quota.RateLimits{RPM: 10, TPM: 2000} },
			[]string{"quota.tenants.acme.tpm: 1000 -> 2000"}},
		{"a tenant added", func(c *Config) { c.Quota.Tenants["globex"] = quota.RateLimits{RPM: 5} },
			[]string{"quota.tenants.globex: (none) -> {...}"}},
		{"routes reordered are not changed", func(c *Config) { slices.Reverse(c.Router.Routes) }, nil},
		{"a route removed", func(c *Config) { c.Router.Routes = c.Router.Routes[:1] },
			[]string{"router.routes.support: {...} -> (none)"}},
		{"a candidate list", func(c *Config) { c.Router.Routes[0].Candidates = []string{"b", "a"} },
			[]string{"router.routes.chat.candidates: [a b] -> [b a]"}},
		{"durations read as durations", func(c *Config) { c.Router.DefaultBudget = 3 * time.Second },
			[]string{"router.default_budget: " + Default().Router.DefaultBudget.String() + " -> 3s"}},
		{"key hashes are redacted", func(c *Config) { c.Auth.Tenants[0].KeySHA256 = rpc.HashKey("new-key") },
			[]string{"auth.tenants.acme.key_sha256: [REDACTED] -> [REDACTED]"}},
		{"log switches", func(c *Config) { c.Log.DebugBodies = true },
			[]string{"log.debug_bodies: false -> true"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			old, new := base(), base()
			tt.change(&new)
			var got []string
			for _, c := range diffConfig(old, new) {
				got = append(got, c.String())
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("diff =\n %q\nwant\n %q", got, tt.want)
			}
		})
	}
}

func TestSecretPath(t *testing.T) {
	t.Parallel()
	for path, want := range map[string]bool{
		"auth.tenants.acme.key_sha256":          true,
		"router.providers.openai.keys.a.env":    false,
		"cache.embedder.api_key_env":            false,
		"router.routes.chat.max_tokens":         false,
		"verifier.l3.judge.token":               true,
		"cache.qdrant.api_key":                  true,
		"router.providers.openai.keys.a.id":     false,
		"quota.upstream_keys.k1.rpm":            false,
		"router.providers.openai.client_secret": true,
	} {
		if got := secretPath(path); got != want {
			t.Errorf("secretPath(%q) = %t, want %t", path, got, want)
		}
	}
}

func TestRestartPaths(t *testing.T) {
	t.Parallel()
	got := restartPaths([]configChange{
		{Path: "log.level"}, {Path: "router.default_budget"}, {Path: "server.grpc_listen_address"}, {Path: "target"},
		{Path: "router.hedge_budget.ratio"}, {Path: "router.retry_budget_extra"}, {Path: "router.routes[0].hedge.max_delay"},
		{Path: "quota.default_limits.tpm"}, {Path: "router.breaker.open_duration"}, {Path: "router.quota_address"},
		{Path: "router.overload.max_share"}, {Path: "runtime.gc_percent"},
	})
	want := []string{"log.level", "server.grpc_listen_address", "target", "router.hedge_budget.ratio",
		"quota.default_limits.tpm", "router.breaker.open_duration", "router.quota_address",
		"router.overload.max_share", "runtime.gc_percent"}
	if !slices.Equal(got, want) {
		t.Errorf("restartPaths = %q, want %q", got, want)
	}
}
