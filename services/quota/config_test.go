package quota

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"
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
	for _, want := range []string{"reservation_ttl: 2m0s", "sweep_interval: 30s", "rpm: 600", "tpm: 200000", "default_max_output_tokens: 1024"} {
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
