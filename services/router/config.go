package router

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// Provider types.
const (
	ProviderOpenAI    = "openai"
	ProviderAnthropic = "anthropic"
	// ProviderSim runs the built-in simulated provider in this process and reaches it
	// through the OpenAI adapter over loopback HTTP, so the real HTTP path is exercised.
	ProviderSim = "sim"
)

// Config is the router block of mantle.yaml.
type Config struct {
	// Addresses of the services the router calls when they do not run in this process.
	CacheAddress    string `yaml:"cache_address"`
	QuotaAddress    string `yaml:"quota_address"`
	VerifierAddress string `yaml:"verifier_address"`

	// DefaultBudget is the whole-request deadline when neither the caller nor the route
	// sets one.
	DefaultBudget time.Duration `yaml:"default_budget"`
	// HopReserve is kept back from every hop's timeout so the router can still answer
	// (fail over, settle, respond) when a hop uses its whole share.
	HopReserve time.Duration `yaml:"hop_reserve"`
	// MaxPromptBytes bounds the total size of a request's messages.
	MaxPromptBytes int `yaml:"max_prompt_bytes"`
	// MaxOutputTokens bounds max_tokens; 0 means no bound.
	MaxOutputTokens int `yaml:"max_output_tokens"`
	// QuotaFailOpen admits requests when the quota service cannot be reached. Availability
	// wins by default; set false where overspending is worse than refusing.
	QuotaFailOpen bool `yaml:"quota_fail_open"`

	Providers []ProviderConfig `yaml:"providers"`
	Models    []ModelConfig    `yaml:"models"`
	Routes    []RouteConfig    `yaml:"routes"`
}

// ProviderConfig is one upstream API.
type ProviderConfig struct {
	Name string `yaml:"name"`
	// Type is openai (any OpenAI-compatible API), anthropic, or sim.
	Type    string `yaml:"type"`
	BaseURL string `yaml:"base_url,omitempty"`
	// Keys are the API keys to use; their values come from environment variables only.
	Keys []KeyConfig `yaml:"keys,omitempty"`
	// Timeout is the per-try timeout of one call.
	Timeout time.Duration `yaml:"timeout"`
	// SimProfile names the built-in sim profile for type sim (per model overrides in
	// models[].sim_profile).
	SimProfile string `yaml:"sim_profile,omitempty"`
	// SimSeed makes a sim provider reproducible.
	SimSeed int64 `yaml:"sim_seed,omitempty"`
}

// KeyConfig is one API key.
type KeyConfig struct {
	// ID names the key in logs, metrics and QualityContexts.
	ID string `yaml:"id"`
	// Env is the environment variable holding the key.
	Env string `yaml:"env"`
}

// ModelConfig is one model callers can name and routes can use.
type ModelConfig struct {
	// Name is what callers and routes use.
	Name     string `yaml:"name"`
	Provider string `yaml:"provider"`
	// Upstream is the provider's model name; defaults to Name.
	Upstream string `yaml:"upstream,omitempty"`
	// ContextWindow in tokens, 0 when unknown.
	ContextWindow int `yaml:"context_window,omitempty"`
	// Prices in US dollars per million tokens.
	InputPricePerMillion  float64 `yaml:"input_price_per_million,omitempty"`
	OutputPricePerMillion float64 `yaml:"output_price_per_million,omitempty"`
	// SimProfile overrides the provider's sim profile for this model.
	SimProfile string `yaml:"sim_profile,omitempty"`
}

// RouteConfig is a name callers use for an ordered list of candidate models.
type RouteConfig struct {
	Name     string `yaml:"name"`
	Scenario string `yaml:"scenario,omitempty"`
	// Candidates are model names, first choice first.
	Candidates []string `yaml:"candidates"`
	// Budget overrides default_budget.
	Budget time.Duration `yaml:"budget,omitempty"`
}

// DefaultConfig returns the router defaults: no providers (the composition root adds the
// sim models for development).
func DefaultConfig() Config {
	return Config{
		DefaultBudget:  30 * time.Second,
		HopReserve:     200 * time.Millisecond,
		MaxPromptBytes: 1 << 20,
		QuotaFailOpen:  true,
	}
}

// Validate checks the block; messages name the key.
func (c Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.DefaultBudget <= 0 {
		add("default_budget: must be positive, got %s", c.DefaultBudget)
	}
	if c.HopReserve < 0 || c.HopReserve >= c.DefaultBudget {
		add("hop_reserve: must be between 0 and default_budget, got %s", c.HopReserve)
	}
	if c.MaxPromptBytes <= 0 {
		add("max_prompt_bytes: must be positive, got %d", c.MaxPromptBytes)
	}
	if c.MaxOutputTokens < 0 {
		add("max_output_tokens: must not be negative, got %d", c.MaxOutputTokens)
	}
	providers := map[string]bool{}
	for i, p := range c.Providers {
		key := fmt.Sprintf("providers[%d]", i)
		switch {
		case p.Name == "":
			add("%s.name: required", key)
		case providers[p.Name]:
			add("%s.name: duplicate provider %q", key, p.Name)
		}
		providers[p.Name] = true
		if !slices.Contains([]string{ProviderOpenAI, ProviderAnthropic, ProviderSim}, p.Type) {
			add("%s.type: want openai, anthropic or sim, got %q", key, p.Type)
		}
		if p.Type != ProviderSim && len(p.Keys) == 0 {
			add("%s.keys: at least one key is required for type %s", key, p.Type)
		}
		for j, k := range p.Keys {
			if k.ID == "" {
				add("%s.keys[%d].id: required", key, j)
			}
			if k.Env == "" {
				add("%s.keys[%d].env: required (keys come from environment variables only)", key, j)
			}
		}
		if p.Timeout <= 0 {
			add("%s.timeout: must be positive, got %s", key, p.Timeout)
		}
	}
	models := map[string]bool{}
	for i, m := range c.Models {
		key := fmt.Sprintf("models[%d]", i)
		switch {
		case m.Name == "":
			add("%s.name: required", key)
		case models[m.Name]:
			add("%s.name: duplicate model %q", key, m.Name)
		}
		models[m.Name] = true
		if !providers[m.Provider] {
			add("%s.provider: unknown provider %q", key, m.Provider)
		}
		if m.InputPricePerMillion < 0 || m.OutputPricePerMillion < 0 {
			add("%s: prices must not be negative", key)
		}
	}
	routes := map[string]bool{}
	for i, r := range c.Routes {
		key := fmt.Sprintf("routes[%d]", i)
		switch {
		case r.Name == "":
			add("%s.name: required", key)
		case models[r.Name]:
			add("%s.name: %q is already a model name", key, r.Name)
		case routes[r.Name]:
			add("%s.name: duplicate route %q", key, r.Name)
		}
		routes[r.Name] = true
		if len(r.Candidates) == 0 {
			add("%s.candidates: at least one model is required", key)
		}
		for j, m := range r.Candidates {
			if !models[m] {
				add("%s.candidates[%d]: unknown model %q", key, j, m)
			}
		}
		if r.Budget < 0 {
			add("%s.budget: must not be negative", key)
		}
		if r.Budget > 0 && r.Budget <= c.HopReserve {
			add("%s.budget: must be more than hop_reserve (%s), got %s", key, c.HopReserve, r.Budget)
		}
	}
	if len(c.Models) == 0 {
		add("models: at least one model is required")
	}
	return errors.Join(errs...)
}
