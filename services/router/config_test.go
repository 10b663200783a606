package router

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/pkg/sim"
	"github.com/mantle-mesh/mantle/services/router/internal/overload"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mutate func(*Config)
		want   []string // each must start a line of the error; none means valid
	}{
		{"valid", func(*Config) {}, nil},
		{"defaults have no models", func(c *Config) { *c = DefaultConfig() }, []string{"models: at least one model is required"}},
		{"budget", func(c *Config) { c.DefaultBudget = 0 }, []string{"default_budget: must be positive", "hop_reserve: must be between 0 and default_budget"}},
		{"hop reserve too large", func(c *Config) { c.HopReserve = c.DefaultBudget }, []string{"hop_reserve: must be between 0 and default_budget"}},
		{"hedge budget ratio above 1", func(c *Config) { c.HedgeBudget.Ratio = 1.5 }, []string{"hedge_budget.ratio: want 0 to 1, got 1.5"}},
		{"negative hedge budget ratio", func(c *Config) { c.HedgeBudget.Ratio = -0.1 }, []string{"hedge_budget.ratio: want 0 to 1, got -0.1"}},
		{"negative hedge budget floor", func(c *Config) { c.HedgeBudget.Floor = -1 }, []string{"hedge_budget.floor: must not be negative, got -1"}},
		{"negative hedge budget window", func(c *Config) { c.HedgeBudget.Window = -time.Second }, []string{"hedge_budget.window: must be positive, got -1s"}},
		{"no hedges at all", func(c *Config) { c.HedgeBudget = HedgeBudgetConfig{} }, nil},
		{"negative hop reserve", func(c *Config) { c.HopReserve = -1 }, []string{"hop_reserve"}},
		{"prompt bytes", func(c *Config) { c.MaxPromptBytes = 0 }, []string{"max_prompt_bytes: must be positive"}},
		{"services off", func(c *Config) { c.QuotaAddress, c.CacheAddress, c.VerifierAddress = Off, Off, Off }, nil},
		{"off in capitals", func(c *Config) { c.CacheAddress, c.VerifierAddress = "OFF", "Off" }, []string{
			`cache_address: write "off" to run without the service, got "OFF"`, `verifier_address: write "off" to run without the service, got "Off"`}},
		{"cache-only mode without a cache", func(c *Config) {
			c.CacheAddress = Off
			c.Routes[0].Ladder = LadderConfig{Cache: true, ForceLevel: ForceCache}
		}, []string{"routes[0].ladder.force_level: cache needs the cache service, and cache_address is off"}},
		{"overload off", func(c *Config) { c.Overload.MaxSchedulingDelay = 0 }, nil},
		{"overload", func(c *Config) { c.Overload = overload.Config{MaxSchedulingDelay: -1, MinInFlight: -1, MaxShare: 1} }, []string{
			"overload.max_scheduling_delay: want 0 (off) or at least 1ms, got -1ns", "overload.min_in_flight: must not be negative", "overload.max_share: want a share in (0, 1), got 1"}},
		{"output tokens", func(c *Config) { c.MaxOutputTokens = -1 }, []string{"max_output_tokens: must not be negative"}},
		{"async cache stores none", func(c *Config) { c.MaxAsyncCacheStores = 0 }, []string{"max_async_cache_stores: want 1 to 65536"}},
		{"async cache stores unbounded", func(c *Config) { c.MaxAsyncCacheStores = 1 << 20 }, []string{"max_async_cache_stores: want 1 to 65536"}},
		{"provider name", func(c *Config) { c.Providers[0].Name = "" }, []string{"providers[0].name: required", `models[0].provider: unknown provider "p"`}},
		{"duplicate provider", func(c *Config) { c.Providers = append(c.Providers, c.Providers[0]) }, []string{`providers[1].name: duplicate provider "p"`}},
		{"provider type", func(c *Config) { c.Providers[0].Type = "azure" }, []string{`providers[0].type: want openai, anthropic or sim, got "azure"`}},
		{"real provider without keys", func(c *Config) { c.Providers[0].Type = ProviderOpenAI }, []string{"providers[0].keys: at least one key is required for type openai"}},
		{"key without env", func(c *Config) {
			c.Providers[0].Type = ProviderAnthropic
			c.Providers[0].Keys = []KeyConfig{{ID: "k1", Env: "K1"}, {ID: "k2"}, {Env: "K3"}}
		}, []string{"providers[0].keys[1].env: required", "providers[0].keys[2].id: required"}},
		{"provider timeout", func(c *Config) { c.Providers[0].Timeout = 0 }, []string{"providers[0].timeout: must be positive"}},
		{"model name", func(c *Config) { c.Models[1].Name = "" }, []string{"models[1].name: required"}},
		{"duplicate model", func(c *Config) { c.Models[2].Name = "a" }, []string{`models[2].name: duplicate model "a"`}},
		{"unknown provider", func(c *Config) { c.Models[0].Provider = "q" }, []string{`models[0].provider: unknown provider "q"`}},
		{"negative price", func(c *Config) { c.Models[0].OutputPricePerMillion = -1 }, []string{"models[0]: prices must not be negative"}},
		{"embeddings model on anthropic", func(c *Config) {
			c.Providers[0].Type = ProviderAnthropic
			c.Providers[0].Keys = []KeyConfig{{ID: "k1", Env: "K1"}}
			c.Models[0].Capabilities = &Capabilities{Embeddings: true}
		}, []string{`models[0].capabilities.embeddings: provider "p" is of type anthropic, whose API has no embeddings`}},
		{"route of embeddings and chat models", func(c *Config) {
			c.Models[0].Capabilities = &Capabilities{Embeddings: true}
			c.Routes[0].Candidates = []string{"a", "b"}
		}, []string{`routes[0].candidates: "a" is an embeddings model and "b" a chat model; a route has one kind`}},
		{"negative embeddings cache", func(c *Config) { c.EmbeddingsCache.MaxBytes = -1 }, []string{"embeddings_cache: max_bytes and ttl must not be negative"}},
		{"route name", func(c *Config) { c.Routes[0].Name = "" }, []string{"routes[0].name: required"}},
		{"route named like a model", func(c *Config) { c.Routes[0].Name = "b" }, []string{`routes[0].name: "b" is already a model name`}},
		{"duplicate route", func(c *Config) { c.Routes = append(c.Routes, RouteConfig{Name: "chat", Candidates: []string{"c"}}) },
			[]string{`routes[1].name: duplicate route "chat"`}},
		{"route without candidates", func(c *Config) { c.Routes[0].Candidates = nil }, []string{"routes[0].candidates: at least one model is required"}},
		{"unknown candidate", func(c *Config) { c.Routes[0].Candidates = []string{"a", "gpt-9"} }, []string{`routes[0].candidates[1]: unknown model "gpt-9"`}},
		{"fast answer of an unknown model", func(c *Config) {
			c.Routes[0].Ladder.FastAnswer = FastAnswerConfig{Model: "gpt-9", Prompt: "Be brief."}
		}, []string{`routes[0].ladder.fast_answer.model: unknown model "gpt-9"`}},
		{"fast answer without a prompt", func(c *Config) { c.Routes[0].Ladder.FastAnswer = FastAnswerConfig{Model: "b"} },
			[]string{`routes[0].ladder.fast_answer.prompt: required with a model`}},
		{"context compression settings without a model", func(c *Config) { c.Routes[0].ContextCompression.KeepRecent = 4 },
			[]string{`routes[0].context_compression.model: unknown model ""`}},
		{"context compression with a negative bound", func(c *Config) {
			c.Routes[0].ContextCompression = ContextCompressionConfig{Model: "b", MaxSummaryTokens: -1}
		}, []string{`routes[0].context_compression: keep_recent and max_summary_tokens must not be negative`}},
		{"route candidates cannot be routes", func(c *Config) {
			c.Routes = append(c.Routes, RouteConfig{Name: "alias", Candidates: []string{"chat"}})
		}, []string{`routes[1].candidates[0]: unknown model "chat"`}},
		{"negative route budget", func(c *Config) { c.Routes[0].Budget = -time.Second }, []string{"routes[0].budget: must not be negative"}},
		{"route budget within the hop reserve", func(c *Config) { c.Routes[0].Budget = c.HopReserve }, []string{"routes[0].budget: must be more than hop_reserve"}},
		{"route budget above the hop reserve", func(c *Config) { c.Routes[0].Budget = c.HopReserve + time.Millisecond }, nil},
		{"custom sim profile", func(c *Config) {
			c.SimProfiles = map[string]sim.Profile{"drill": {Errors: sim.ErrorMix{Overloaded: 1}, Script: []sim.Outcome{sim.OutcomeOK}}}
		}, nil},
		{"invalid sim profile", func(c *Config) {
			c.SimProfiles = map[string]sim.Profile{"drill": {Errors: sim.ErrorMix{Overloaded: 0.7, Hang: 0.7}}}
		}, []string{`sim_profiles.drill: sim: profile "unnamed": errors: probabilities sum to 1.4`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := testConfig()
			tt.mutate(&c)
			err := c.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate = nil, want %q", tt.want)
			}
			msg := "\n" + err.Error()
			for _, want := range tt.want {
				if !strings.Contains(msg, "\n"+want) {
					t.Errorf("Validate error has no line starting with %q:%s", want, msg)
				}
			}
		})
	}
}

func TestProviderDialTimeout(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		p       ProviderConfig
		want    time.Duration
		wantErr string
	}{
		{"default", ProviderConfig{Timeout: 30 * time.Second}, 3 * time.Second, ""},
		{"set", ProviderConfig{Timeout: 30 * time.Second, DialTimeout: time.Second}, time.Second, ""},
		{"short timeout: half of it", ProviderConfig{Timeout: 2 * time.Second}, time.Second, ""},
		{"not below the timeout", ProviderConfig{Timeout: 2 * time.Second, DialTimeout: 2 * time.Second}, 2 * time.Second,
			"providers[0].dial_timeout: must be positive and below timeout (2s), got 2s"},
		{"negative", ProviderConfig{Timeout: 2 * time.Second, DialTimeout: -time.Second}, -time.Second,
			"providers[0].dial_timeout: must be positive and below timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := tt.p.dialTimeout(); got != tt.want && tt.p.DialTimeout >= 0 {
				t.Errorf("dialTimeout() = %s, want %s", got, tt.want)
			}
			cfg := testConfig()
			tt.p.Name, tt.p.Type = "p", ProviderSim
			cfg.Providers[0] = tt.p
			err := cfg.Validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("Validate: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("Validate = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// TestProviderHTTPClientUsesTheDialTimeout checks the wiring: a provider's client connects
// with its own dial timeout. (Making a real connection attempt hang would need an address
// that drops SYNs, which a test may not send traffic to; the timeout itself is the
// standard library's.)
func TestProviderHTTPClientUsesTheDialTimeout(t *testing.T) {
	t.Parallel()
	c := providerHTTPClient(ProviderConfig{Timeout: 30 * time.Second, DialTimeout: 1500 * time.Millisecond})
	tr, ok := c.Transport.(*http.Transport)
	if !ok {
		t.Fatalf("transport %T, want *http.Transport", c.Transport)
	}
	if tr.TLSHandshakeTimeout != 1500*time.Millisecond || tr.DialContext == nil {
		t.Errorf("TLS handshake timeout %s, dialer set %t; want 1.5s and a dialer with the dial timeout", tr.TLSHandshakeTimeout, tr.DialContext != nil)
	}
}

// TestMissingProviderKeys: a provider key whose variable is unset or empty refuses the start
// by name, unless allow_missing_keys, which starts with a warning and a key whose calls fail
// at once with an auth error.
func TestMissingProviderKeys(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Providers = append(cfg.Providers, ProviderConfig{Name: "openai", Type: ProviderOpenAI, Timeout: 5 * time.Second,
		Keys: []KeyConfig{{ID: "main", Env: "OPENAI_KEY_SET"}, {ID: "spare", Env: "OPENAI_KEY_UNSET"}}})
	getenv := func(k string) string {
		if k == "OPENAI_KEY_SET" {
			return "sk-set"
		}
		return ""
	}
	_, err := missingKeys(cfg, getenv)
	if err == nil || !strings.Contains(err.Error(), "providers[1].keys[1].env: environment variable OPENAI_KEY_UNSET (key spare of provider openai) is unset or empty") {
		t.Errorf("missingKeys = %v, want the unset key named", err)
	}
	cfg.AllowMissingKeys = true
	missing, err := missingKeys(cfg, getenv)
	if err != nil || len(missing) != 1 || missing[0] != (missingKey{provider: "openai", id: "spare", env: "OPENAI_KEY_UNSET"}) {
		t.Errorf("with allow_missing_keys: %v, %v; want the spare key listed and no error", missing, err)
	}
	_, err = missingKeyProvider{env: "OPENAI_KEY_UNSET"}.Complete(context.Background(), provider.Request{})
	if provider.ClassOf(err) != mantlev1.ErrorClass_ERROR_CLASS_AUTH || !strings.Contains(err.Error(), "OPENAI_KEY_UNSET") {
		t.Errorf("a call on the missing key: %v, want an auth error naming the variable", err)
	}
}
