package quota

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"

	"github.com/mantle-mesh/mantle/services/quota/internal/ledger"
)

// decodeStrict decodes the quota block the way the lead's loader does: defaults first,
// then the file, unknown keys rejected.
func decodeStrict(t *testing.T, doc string) (Config, error) {
	t.Helper()
	cfg := DefaultConfig()
	dec := yaml.NewDecoder(strings.NewReader(doc))
	dec.KnownFields(true)
	err := dec.Decode(&cfg)
	return cfg, err
}

func TestConfigYAML(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		doc     string
		want    func(*Config)
		wantErr string
	}{
		{
			name: "every key",
			doc: `
default_limits: {rpm: 100, tpm: 50000}
tenants:
  acme: {rpm: 1000, tpm: 1000000}
default_max_output_tokens: 512
reservation_ttl: 90s
sweep_interval: 1m
`,
			want: func(c *Config) {
				c.DefaultLimits = RateLimits{RPM: 100, TPM: 50000}
				c.Tenants = map[string]RateLimits{"acme": {RPM: 1000, TPM: 1_000_000}}
				c.DefaultMaxOutputTokens = 512
				c.ReservationTTL = 90 * time.Second
				c.SweepInterval = time.Minute
			},
		},
		{
			name: "the new blocks",
			doc: `
tenants: {trial: {rpm: 10, shadow: true}}
model_limits: {"*": {gpt-4o: {tpm: 100000}}}
budgets:
  tenants: {acme: {daily_usd: 50}}
  prices: {gpt-4o: {input_per_million: 2.5, output_per_million: 10}}
  default_price: {input_per_million: 1, output_per_million: 4}
  day_offset: 8h
upstream_keys: {openai-1: {rpm: 5000, tpm: 800000}}
queue: {size: 500, max_wait: 5s, deadline_margin: 20ms, weights: {acme: 3}}
near_limit_ratio: 0.9
retry_budget: {ratio: 0.1, floor: 5, window: 30s, format_only_above: 0.2, flush_interval: 2s, tenant_share: 0.25}
upstream_max_reset: 10m
tokens: {exact_max_bytes: 1000, learn_correction: false, correction_min_samples: 9}
backend: redis
redis: {address: "redis:6379", password_env: REDIS_PASSWORD, db: 2, key_prefix: "q:", pool_size: 20, dial_timeout: 2s, timeout: 50ms, replicas: 3, probe_interval: 5s, over_limit_cache: 500ms, auto_pipeline: true}
`,
			want: func(c *Config) {
				c.Tenants = map[string]RateLimits{"trial": {RPM: 10, Shadow: true}}
				c.ModelLimits = map[string]map[string]RateLimits{"*": {"gpt-4o": {TPM: 100000}}}
				c.Budgets = BudgetsConfig{
					Tenants:      map[string]Budget{"acme": {DailyUSD: 50}},
					Prices:       map[string]Price{"gpt-4o": {InputPerMillion: 2.5, OutputPerMillion: 10}},
					DefaultPrice: &Price{InputPerMillion: 1, OutputPerMillion: 4},
					DayOffset:    8 * time.Hour,
				}
				c.UpstreamKeys = map[string]RateLimits{"openai-1": {RPM: 5000, TPM: 800000}}
				c.Queue = QueueConfig{Size: 500, MaxWait: 5 * time.Second, DeadlineMargin: 20 * time.Millisecond, Weights: map[string]float64{"acme": 3}}
				c.NearLimitRatio = 0.9
				c.RetryBudget = RetryBudgetConfig{Ratio: 0.1, Floor: 5, Window: 30 * time.Second, FormatOnlyAbove: 0.2, FlushInterval: 2 * time.Second, TenantShare: 0.25}
				c.UpstreamMaxReset = 10 * time.Minute
				c.Tokens = TokensConfig{ExactMaxBytes: 1000, LearnCorrection: false, CorrectionMinSamples: 9}
				c.Backend = "redis"
				c.Redis = RedisConfig{Address: "redis:6379", PasswordEnv: "REDIS_PASSWORD", DB: 2, KeyPrefix: "q:", PoolSize: 20,
					DialTimeout: 2 * time.Second, Timeout: 50 * time.Millisecond, Replicas: 3, ProbeInterval: 5 * time.Second, OverLimitCache: 500 * time.Millisecond, AutoPipeline: true}
			},
		},
		{
			name: "omitted keys keep their defaults",
			doc:  "reservation_ttl: 5m\n",
			want: func(c *Config) { c.ReservationTTL = 5 * time.Minute },
		},
		{
			name: "a partial override leaves the other limit to inherit",
			doc:  "tenants: {acme: {tpm: 500000}}\n",
			want: func(c *Config) { c.Tenants = map[string]RateLimits{"acme": {TPM: 500_000}} },
		},
		{name: "unknown keys are errors", doc: "default_limit: {rpm: 1}\n", wantErr: "field default_limit not found"},
		{name: "durations need a unit", doc: "reservation_ttl: 120\n", wantErr: "cannot unmarshal !!int `120` into time.Duration"},
		{name: "durations must parse", doc: "reservation_ttl: soon\n", wantErr: "cannot unmarshal !!str `soon` into time.Duration"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := decodeStrict(t, tt.doc)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := DefaultConfig()
			tt.want(&want)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("config mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestConfigYAMLRoundTrip(t *testing.T) {
	t.Parallel()
	out, err := yaml.Marshal(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	// -print.config must show durations the way people write them.
	for _, want := range []string{"reservation_ttl: 2m0s", "sweep_interval: 30s", "rpm: 600", "tpm: 200000", "default_max_output_tokens: 1024",
		"backend: memory", "size: 10000", "near_limit_ratio: 0.8", "key_prefix: 'mantle:quota:'", "replicas: 1"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("marshalled config lacks %q:\n%s", want, out)
		}
	}
	back, err := decodeStrict(t, string(out))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(DefaultConfig(), back); diff != "" {
		t.Errorf("round trip changed the config (-want +got):\n%s", diff)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		modify func(*Config)
		want   string // the whole message; empty for valid
	}{
		{"defaults are valid", func(*Config) {}, ""},
		{"zero-valued override inherits", func(c *Config) { c.Tenants = map[string]RateLimits{"acme": {}} }, ""},
		{"rpm", func(c *Config) { c.DefaultLimits.RPM = -1 }, "default_limits.rpm: must be positive, got -1"},
		{"tpm", func(c *Config) { c.DefaultLimits.TPM = 0 }, "default_limits.tpm: must be positive, got 0"},
		{"tenant override", func(c *Config) { c.Tenants = map[string]RateLimits{"acme": {TPM: -5}} },
			"tenants.acme.tpm: must not be negative (omit it to inherit default_limits.tpm), got -5"},
		{"empty tenant id", func(c *Config) { c.Tenants = map[string]RateLimits{"": {}} }, "tenants: tenant id must not be empty"},
		{"max output", func(c *Config) { c.DefaultMaxOutputTokens = 0 }, "default_max_output_tokens: must be positive, got 0"},
		{"ttl", func(c *Config) { c.ReservationTTL = 0 }, "reservation_ttl: must be positive, got 0s"},
		{"sweep", func(c *Config) { c.SweepInterval = -time.Second }, "sweep_interval: must be positive, got -1s"},
		{"redis needs an address", func(c *Config) { c.Backend = "redis" }, "redis.address: is required when backend is redis"},
		{"unknown backend", func(c *Config) { c.Backend = "etcd" }, `backend: must be "memory" or "redis", got "etcd"`},
		{"redis checked only when used", func(c *Config) { c.Redis.Replicas = 0 }, ""},
		{"replicas", func(c *Config) { c.Backend, c.Redis.Address, c.Redis.Replicas = "redis", "r:6379", 0 }, "redis.replicas: must be at least 1, got 0"},
		{"hash tag in the prefix", func(c *Config) { c.Backend, c.Redis.Address, c.Redis.KeyPrefix = "redis", "r:6379", "{x}" },
			`redis.key_prefix: must not contain { or }, which Redis reads as a hash tag, got "{x}"`},
		{"model limits need a limit", func(c *Config) { c.ModelLimits = map[string]map[string]RateLimits{"*": {"m": {}}} }, "model_limits.*.m: set rpm, tpm or both"},
		{"upstream keys need a limit", func(c *Config) { c.UpstreamKeys = map[string]RateLimits{"k": {}} }, "upstream_keys.k: set rpm, tpm or both"},
		{"budgets are positive", func(c *Config) { c.Budgets.Tenants = map[string]Budget{"a": {DailyUSD: 0}} }, "budgets.tenants.a.daily_usd: must be in (0, 1000000], got 0"},
		{"prices are bounded", func(c *Config) { c.Budgets.Prices = map[string]Price{"m": {InputPerMillion: -1}} },
			"budgets.prices.m.input_per_million: must be in [0, 10000], got -1"},
		{"day offset", func(c *Config) { c.Budgets.DayOffset = 25 * time.Hour }, "budgets.day_offset: must be whole seconds within (-24h, 24h), got 25h0m0s"},
		{"queue", func(c *Config) { c.Queue.Size, c.Queue.Weights = -1, map[string]float64{"a": 0} },
			"queue.size: must not be negative (0 turns waiting off), got -1\nqueue.weights.a: must be positive, got 0"},
		{"near limit", func(c *Config) { c.NearLimitRatio = 1.5 }, "near_limit_ratio: must be in (0, 1], got 1.5"},
		{"retry window", func(c *Config) { c.RetryBudget.Window = 1500 * time.Millisecond }, "retry_budget.window: must be whole seconds, at least 1s, got 1.5s"},
		{"all problems, in a stable order", func(c *Config) {
			c.DefaultLimits.RPM = 0
			c.Tenants = map[string]RateLimits{"b": {RPM: -1}, "a": {RPM: -1}}
		}, "default_limits.rpm: must be positive, got 0\n" +
			"tenants.a.rpm: must not be negative (omit it to inherit default_limits.rpm), got -1\n" +
			"tenants.b.rpm: must not be negative (omit it to inherit default_limits.rpm), got -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := DefaultConfig()
			tt.modify(&cfg)
			err := cfg.Validate()
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Errorf("Validate() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestModelLimitsAndPrices(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.ModelLimits = map[string]map[string]RateLimits{"*": {"gpt-4o": {TPM: 1}}, "acme": {"GPT-4o": {TPM: 2}}}
	for _, tt := range []struct {
		tenant, model string
		want          int64
		ok            bool
	}{{"acme", "gpt-4o", 2, true}, {"beta", "GPT-4O", 1, true}, {"beta", "qwen", 0, false}} {
		got, ok := cfg.modelLimits(tt.tenant, tt.model)
		if got.TPM != tt.want || ok != tt.ok {
			t.Errorf("modelLimits(%s, %s) = %v, %v; want tpm %d, %v", tt.tenant, tt.model, got, ok, tt.want, tt.ok)
		}
	}
	b := BudgetsConfig{Prices: map[string]Price{"GPT-4o": {InputPerMillion: 2.5}}}
	if p, ok := b.price("gpt-4o"); !ok || p.InputPerMillion != 2.5 {
		t.Errorf("price ignoring case = %v, %v", p, ok)
	}
	if _, ok := b.price("other"); ok {
		t.Error("a model without price and no default has a price")
	}
	b.DefaultPrice = &Price{OutputPerMillion: 1}
	if p, ok := b.price("other"); !ok || p.OutputPerMillion != 1 {
		t.Errorf("default price = %v, %v", p, ok)
	}
	if got := nanoPriceOf(Price{InputPerMillion: 2.5, OutputPerMillion: 0.0375}); got != (ledger.NanoPrice{Input: 2500, Output: 38}) {
		t.Errorf("nano prices = %+v, want 2500 and 38 (rounded up)", got)
	}
}

func TestLimitsFor(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.Tenants = map[string]RateLimits{"acme": {TPM: 1_000_000}, "tiny": {RPM: 5, TPM: 100}}
	tests := []struct {
		tenant string
		want   RateLimits
	}{
		{"acme", RateLimits{RPM: 600, TPM: 1_000_000}},
		{"tiny", RateLimits{RPM: 5, TPM: 100}},
		{"anyone-else", RateLimits{RPM: 600, TPM: 200_000}},
	}
	for _, tt := range tests {
		if got := cfg.limitsFor(tt.tenant); got != tt.want {
			t.Errorf("limitsFor(%q) = %+v, want %+v", tt.tenant, got, tt.want)
		}
	}
}
