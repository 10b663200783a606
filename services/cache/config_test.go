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
	for _, marker := range []string{"today", "now", "current", "latest", "今天", "现在", "实时", "库存", "订单"} {
		if !strings.Contains(strings.Join(cfg.DefaultPolicy.VolatileMarkers, "|"), marker) {
			t.Errorf("default volatile markers lack %q", marker)
		}
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
		{"ttl zero", func(c *Config) { c.DefaultPolicy.TTL = 0 }, []string{"default_policy.ttl: must be positive, got 0s"}},
		{"negative max_temperature", func(c *Config) { c.DefaultPolicy.MaxTemperature = -1 }, []string{"default_policy.max_temperature: must be a non-negative number, got -1"}},
		{"marker without a word", func(c *Config) { c.DefaultPolicy.VolatileMarkers = []string{"today", " ？"} }, []string{`default_policy.volatile_markers[1]: must contain a word, got " ？"`}},
		{"scenario override", func(c *Config) {
			c.Scenarios = map[string]ScenarioPolicy{"support": {TTL: new(-time.Minute)}}
		}, []string{"scenarios.support.ttl: must be positive, got -1m0s"}},
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
