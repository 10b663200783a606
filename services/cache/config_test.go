package cache

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// decodeStrict decodes doc onto the defaults the way the app loads its file: unknown keys
// are errors, and keys the file leaves out keep their defaults.
func decodeStrict(doc string) (Config, error) {
	cfg := DefaultConfig()
	dec := yaml.NewDecoder(strings.NewReader(doc))
	dec.KnownFields(true)
	err := dec.Decode(&cfg)
	return cfg, err
}

func TestDefaultConfig(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("DefaultConfig().Validate() = %v, want nil", err)
	}
	if cfg.MaxEntries != 100_000 || !cfg.DefaultPolicy.Cacheable || cfg.DefaultPolicy.TTL != time.Hour || cfg.DefaultPolicy.MaxTemperature != 0.3 {
		t.Errorf("DefaultConfig() = %+v, want max_entries 100000, cacheable, ttl 1h, max_temperature 0.3", cfg)
	}
	if cfg.Backend != BackendEmbedded || cfg.Embedder.Kind != EmbedderLexical || cfg.DefaultPolicy.MaxStaleness != 24*time.Hour ||
		cfg.Coalesce.MaxWait != 10*time.Second || cfg.Coalesce.LeaseTTL != 30*time.Second || cfg.Qdrant.Timeout != 250*time.Millisecond {
		t.Errorf("DefaultConfig() = %+v, want the embedded backend, the lexical embedder, 24h staleness, coalescing 10s/30s, qdrant timeout 250ms", cfg)
	}
	for _, marker := range []string{"today", "now", "current", "latest", "今天", "现在", "实时", "库存"} {
		if !strings.Contains(strings.Join(cfg.DefaultPolicy.VolatileMarkers, "|"), marker) {
			t.Errorf("default volatile markers lack %q", marker)
		}
	}
	// 订单 and "my order" are left to detect_volatile, which tells "where is my order" from
	// "how do I cancel my order".
	if !cfg.DefaultPolicy.DetectVolatile || !cfg.DefaultPolicy.DetectPersonal {
		t.Errorf("DefaultConfig() detection volatile %v personal %v, want both on", cfg.DefaultPolicy.DetectVolatile, cfg.DefaultPolicy.DetectPersonal)
	}
}

func TestConfigYAML(t *testing.T) {
	t.Parallel()
	cfg, err := decodeStrict(`
max_entries: 500
default_policy:
  ttl: 30m
scenarios:
  support:
    ttl: 10m
  orders:
    cacheable: false
    volatile_markers: []
  extraction:
    max_temperature: 0
    volatile_markers: [price]
`)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	base := DefaultConfig().DefaultPolicy
	base.TTL = 30 * time.Minute
	if !reflect.DeepEqual(cfg.DefaultPolicy, base) {
		t.Errorf("default_policy = %+v, want the defaults with ttl 30m", cfg.DefaultPolicy)
	}
	tests := []struct {
		scenario string
		want     func(p *Policy)
	}{
		{"support", func(p *Policy) { p.TTL = 10 * time.Minute }},
		{"orders", func(p *Policy) { p.Cacheable, p.VolatileMarkers = false, []string{} }},
		{"extraction", func(p *Policy) { p.MaxTemperature, p.VolatileMarkers = 0, []string{"price"} }},
	}
	for _, tt := range tests {
		t.Run(tt.scenario, func(t *testing.T) {
			t.Parallel()
			want := base
			tt.want(&want)
			if got := cfg.DefaultPolicy.with(cfg.Scenarios[tt.scenario]); !reflect.DeepEqual(got, want) {
				t.Errorf("effective policy\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestConfigYAMLBackendsAndEmbedders(t *testing.T) {
	t.Parallel()
	cfg, err := decodeStrict(`
backend: qdrant
qdrant:
  address: qdrant:6334
  api_key_env: QDRANT_API_KEY
  timeout: 150ms
embedder:
  kind: openai
  base_url: http://ollama:11434/v1
  model: nomic-embed-text
  timeout: 300ms
coalesce: {max_wait: 5s}
default_policy:
  threshold: 0.93
scenarios:
  faq: {approximate_threshold: 0.88, max_staleness: 0s}
`)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if cfg.Qdrant.Address != "qdrant:6334" || cfg.Qdrant.Timeout != 150*time.Millisecond || cfg.Qdrant.CollectionPrefix != "mantle_cache_" ||
		cfg.Embedder.Model != "nomic-embed-text" || cfg.Coalesce.MaxWait != 5*time.Second || cfg.Coalesce.LeaseTTL != 30*time.Second {
		t.Errorf("decoded %+v", cfg)
	}
	faq := cfg.DefaultPolicy.with(cfg.Scenarios["faq"])
	if got := faq.thresholds(defaultThresholds(cfg.Embedder.Kind)); got != (thresholds{normal: 0.93, stale: 0.96, approximate: 0.88}) {
		t.Errorf("faq thresholds = %+v, want 0.93, 0.96 (the default distance), 0.88", got)
	}
	if faq.MaxStaleness != 0 {
		t.Errorf("faq max_staleness = %s, want 0 (never stale)", faq.MaxStaleness)
	}
}

func TestThresholdDefaults(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		kind   string
		policy Policy
		want   thresholds
	}{
		{"dense defaults", EmbedderOpenAI, Policy{}, thresholds{0.92, 0.95, 0.85}},
		{"lexical defaults are stricter", EmbedderLexical, Policy{}, thresholds{0.94, 0.97, 0.90}},
		{"a threshold keeps the distances", EmbedderOpenAI, Policy{Threshold: 0.90}, thresholds{0.90, 0.93, 0.85}},
		{"the approximate floor holds", EmbedderOpenAI, Policy{Threshold: 0.86}, thresholds{0.86, 0.89, 0.85}},
		{"stale is capped at 1", EmbedderLexical, Policy{Threshold: 0.99}, thresholds{0.99, 1, 0.95}},
		{"explicit values win", EmbedderLexical, Policy{Threshold: 0.95, StaleThreshold: 0.99, ApproximateThreshold: 0.87}, thresholds{0.95, 0.99, 0.87}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := tt.policy.thresholds(defaultThresholds(tt.kind))
			for _, pair := range [][2]float64{{got.normal, tt.want.normal}, {got.stale, tt.want.stale}, {got.approximate, tt.want.approximate}} {
				if diff := pair[0] - pair[1]; diff > 1e-9 || diff < -1e-9 {
					t.Fatalf("thresholds = %+v, want %+v", got, tt.want)
				}
			}
		})
	}
}

func TestConfigYAMLRoundTrip(t *testing.T) {
	t.Parallel()
	want := DefaultConfig()
	want.Scenarios = map[string]ScenarioPolicy{"support": {TTL: new(90 * time.Second)}}
	out, err := yaml.Marshal(want)
	if err != nil {
		t.Fatalf("Marshal: %v", err)
	}
	for _, line := range []string{"ttl: 1h0m0s", "ttl: 1m30s"} {
		if !bytes.Contains(out, []byte(line)) {
			t.Errorf("marshalled config lacks %q:\n%s", line, out)
		}
	}
	got, err := decodeStrict(string(out))
	if err != nil {
		t.Fatalf("decode marshalled config: %v", err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("round trip\n got %+v\nwant %+v", got, want)
	}
}

func TestConfigYAMLErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, doc, wantErr string
	}{
		{"unknown key", "max_entrys: 5\n", "max_entrys"},
		{"unknown policy key", "default_policy:\n  tll: 1h\n", "tll"},
		{"duration without unit", "default_policy:\n  ttl: 3600\n", "into time.Duration"},
		{"duration in words", "default_policy:\n  ttl: one hour\n", "into time.Duration"},
		{"duration as a list", "default_policy:\n  ttl: [1h]\n", "into time.Duration"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := decodeStrict(tt.doc)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("decode error = %v, want one mentioning %q", err, tt.wantErr)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		change  func(c *Config)
		wantErr []string
	}{
		{"max_entries zero", func(c *Config) { c.MaxEntries = 0 }, []string{"max_entries: must be positive, got 0"}},
		{"max_bytes under 1 MiB", func(c *Config) { c.MaxBytes = 1 << 19 }, []string{"max_bytes: must be at least 1 MiB, got 524288"}},
		{"ttl zero", func(c *Config) { c.DefaultPolicy.TTL = 0 }, []string{"default_policy.ttl: must be positive, got 0s"}},
		{"negative max_temperature", func(c *Config) { c.DefaultPolicy.MaxTemperature = -1 }, []string{"default_policy.max_temperature: must be a non-negative number, got -1"}},
		{"marker without a word", func(c *Config) { c.DefaultPolicy.VolatileMarkers = []string{"today", " ？"} }, []string{`default_policy.volatile_markers[1]: must contain a word, got " ？"`}},
		{"scenario override", func(c *Config) {
			c.Scenarios = map[string]ScenarioPolicy{"support": {TTL: new(-time.Minute)}}
		}, []string{"scenarios.support.ttl: must be positive, got -1m0s"}},
		{"unknown backend", func(c *Config) { c.Backend = "redis" }, []string{`backend: must be embedded or qdrant, got "redis"`}},
		{"qdrant without an address", func(c *Config) { c.Backend = BackendQdrant }, []string{`qdrant.address: must be host:port, got ""`}},
		{"qdrant with a bad port", func(c *Config) { c.Backend, c.Qdrant.Address = BackendQdrant, "qdrant:grpc" }, []string{`qdrant.address: port must be a number, got "grpc"`}},
		{"qdrant needs vectors", func(c *Config) {
			c.Backend, c.Qdrant.Address, c.Embedder.Kind = BackendQdrant, "qdrant:6334", EmbedderNone
		}, []string{"embedder.kind: none needs backend embedded; Qdrant stores vectors"}},
		{"unknown embedder", func(c *Config) { c.Embedder.Kind = "bert" }, []string{`embedder.kind: must be lexical, openai or none, got "bert"`}},
		{"openai without endpoint", func(c *Config) { c.Embedder.Kind = EmbedderOpenAI }, []string{
			"embedder.base_url: required for kind openai", "embedder.model: required for kind openai",
		}},
		{"threshold below the floor", func(c *Config) { c.DefaultPolicy.Threshold = 0.8 }, []string{
			"default_policy.threshold: must be 0 (the embedder's default) or within [0.85, 1], got 0.8",
		}},
		{"thresholds out of order", func(c *Config) { c.DefaultPolicy.StaleThreshold = 0.9 }, []string{
			"default_policy: thresholds must satisfy approximate_threshold (0.9) <= threshold (0.94) <= stale_threshold (0.9)",
		}},
		{"bad personal pattern", func(c *Config) { c.DefaultPolicy.PersonalPatterns = []string{"(unclosed"} }, []string{
			"default_policy.personal_patterns[0]: error parsing regexp: missing closing ): `(unclosed`",
		}},
		{"snapshot without an interval", func(c *Config) { c.Embedded.SnapshotPath, c.Embedded.SnapshotInterval = "/tmp/x", 0 }, []string{
			"embedded.snapshot_interval: must be positive with a snapshot_path, got 0s",
		}},
		{"snapshot limit too small", func(c *Config) { c.Embedded.SnapshotPath, c.Embedded.SnapshotMaxBytes = "/tmp/x", 1000 }, []string{
			"embedded.snapshot_max_bytes: must be at least 1 MiB with a snapshot_path, got 1000",
		}},
		{"lease ttl zero", func(c *Config) { c.Coalesce.LeaseTTL = 0 }, []string{"coalesce.lease_ttl: must be positive, got 0s"}},
		{"every problem is reported", func(c *Config) { c.MaxEntries, c.DefaultPolicy.TTL = -1, 0 }, []string{
			"max_entries: must be positive, got -1", "default_policy.ttl: must be positive, got 0s",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := DefaultConfig()
			tt.change(&cfg)
			err := cfg.Validate()
			if err == nil {
				t.Fatalf("Validate() = nil, want %v", tt.wantErr)
			}
			if got := strings.Split(err.Error(), "\n"); !reflect.DeepEqual(got, tt.wantErr) {
				t.Errorf("Validate() = %q, want %q", got, tt.wantErr)
			}
		})
	}
}
