package quota

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"
)

// Config is the quota block of mantle's YAML file. Durations are strings such as "2m"
// or "30s": yaml v3 parses them into time.Duration and prints them back the same way.
type Config struct {
	// DefaultLimits apply to every tenant without an entry in Tenants.
	DefaultLimits RateLimits `yaml:"default_limits"`
	// Tenants overrides limits per tenant id. A field left out (or 0) inherits the
	// default, so `acme: {tpm: 500000}` raises only acme's token limit.
	Tenants map[string]RateLimits `yaml:"tenants"`
	// DefaultMaxOutputTokens is reserved for the answer when a request leaves
	// max_output_tokens at 0.
	DefaultMaxOutputTokens int64 `yaml:"default_max_output_tokens"`
	// ReservationTTL is how long a reservation can be settled. After it, the reservation
	// is gone and its charge stands (see the package documentation).
	ReservationTTL time.Duration `yaml:"reservation_ttl"`
	// SweepInterval is how often expired reservation records are deleted.
	SweepInterval time.Duration `yaml:"sweep_interval"`
}

// RateLimits are the per-minute limits of one tenant. Each is both the bucket's
// capacity and how much it refills per minute.
type RateLimits struct {
	RPM int64 `yaml:"rpm"`
	TPM int64 `yaml:"tpm"`
}

// DefaultConfig returns the defaults; the file and flags override them.
func DefaultConfig() Config {
	return Config{
		DefaultLimits:          RateLimits{RPM: 600, TPM: 200_000},
		Tenants:                map[string]RateLimits{}, // printed as {} so the key is discoverable
		DefaultMaxOutputTokens: 1024,
		ReservationTTL:         2 * time.Minute,
		SweepInterval:          30 * time.Second,
	}
}

// Validate reports every invalid key, named relative to the quota block.
func (c Config) Validate() error {
	var errs []error
	if c.DefaultLimits.RPM <= 0 {
		errs = append(errs, fmt.Errorf("default_limits.rpm: must be positive, got %d", c.DefaultLimits.RPM))
	}
	if c.DefaultLimits.TPM <= 0 {
		errs = append(errs, fmt.Errorf("default_limits.tpm: must be positive, got %d", c.DefaultLimits.TPM))
	}
	// Sorted so the same file always produces the same message.
	for _, tenant := range slices.Sorted(maps.Keys(c.Tenants)) {
		limits := c.Tenants[tenant]
		if tenant == "" {
			errs = append(errs, errors.New("tenants: tenant id must not be empty"))
		}
		if limits.RPM < 0 {
			errs = append(errs, fmt.Errorf("tenants.%s.rpm: must not be negative (omit it to inherit default_limits.rpm), got %d", tenant, limits.RPM))
		}
		if limits.TPM < 0 {
			errs = append(errs, fmt.Errorf("tenants.%s.tpm: must not be negative (omit it to inherit default_limits.tpm), got %d", tenant, limits.TPM))
		}
	}
	if c.DefaultMaxOutputTokens <= 0 {
		errs = append(errs, fmt.Errorf("default_max_output_tokens: must be positive, got %d", c.DefaultMaxOutputTokens))
	}
	if c.ReservationTTL <= 0 {
		errs = append(errs, fmt.Errorf("reservation_ttl: must be positive, got %s", c.ReservationTTL))
	}
	if c.SweepInterval <= 0 {
		errs = append(errs, fmt.Errorf("sweep_interval: must be positive, got %s", c.SweepInterval))
	}
	return errors.Join(errs...)
}

// limitsFor returns the tenant's limits: its override where set, the default elsewhere.
func (c Config) limitsFor(tenant string) RateLimits {
	limits := c.DefaultLimits
	override := c.Tenants[tenant]
	if override.RPM > 0 {
		limits.RPM = override.RPM
	}
	if override.TPM > 0 {
		limits.TPM = override.TPM
	}
	return limits
}
