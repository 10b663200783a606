package cache

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"
)

// Config is the cache block of mantle's YAML file.
//
//	max_entries: 100000
//	default_policy:
//	  cacheable: true
//	  ttl: 1h
//	  max_temperature: 0.3
//	  volatile_markers: [today, now, 今天, 实时, ...]
//	scenarios:
//	  support: {ttl: 10m}          # inherits everything else from default_policy
//	  orders:  {cacheable: false}
type Config struct {
	// MaxEntries bounds the in-memory index; the least recently used entry is evicted
	// when a new one would exceed it.
	MaxEntries int `yaml:"max_entries"`
	// DefaultPolicy applies to every scenario without its own block, and fills in the
	// keys a scenario block leaves out.
	DefaultPolicy Policy `yaml:"default_policy"`
	// Scenarios overrides the default policy per scenario name.
	Scenarios map[string]ScenarioPolicy `yaml:"scenarios"`
}

// Policy decides which answers may be stored and for how long.
type Policy struct {
	// Cacheable false turns storing off for the scenario.
	Cacheable bool `yaml:"cacheable"`
	// TTL is how long a stored answer is served. A Store request may ask for less, never more.
	TTL time.Duration `yaml:"ttl"`
	// MaxTemperature is the highest sampling temperature whose answers are stored: above it
	// an answer is one random draw among many, not the answer to the question.
	MaxTemperature float64 `yaml:"max_temperature"`
	// VolatileMarkers are words that make a prompt time- or person-dependent (today, 库存,
	// 订单 ...). A prompt whose user turns contain one is never stored. Matching happens
	// after the same normalisation as the key; Latin-script markers match whole words only,
	// so "now" does not match "know".
	VolatileMarkers []string `yaml:"volatile_markers"`
}

// ScenarioPolicy overrides some keys of the default policy for one scenario; a key left
// out (nil) inherits the default. volatile_markers replaces the default list when
// present; write [] for none.
type ScenarioPolicy struct {
	Cacheable       *bool          `yaml:"cacheable,omitempty"`
	TTL             *time.Duration `yaml:"ttl,omitempty"`
	MaxTemperature  *float64       `yaml:"max_temperature,omitempty"`
	VolatileMarkers []string       `yaml:"volatile_markers,omitempty"`
}

// defaultVolatileMarkers are the default volatile markers: time words, live data and
// personal records, in English and Chinese. The seeds warn against caching real-time
// inventory, order status, weather and personalised content.
var defaultVolatileMarkers = []string{
	"today", "tonight", "tomorrow", "yesterday", "now", "current", "currently", "latest",
	"real-time", "realtime", "weather", "in stock", "inventory", "my order", "order status",
	"今天", "今日", "明天", "昨天", "现在", "目前", "当前", "最新", "实时", "天气", "库存", "订单", "股价",
}

// DefaultConfig returns the configuration used when the file leaves the cache block out.
func DefaultConfig() Config {
	return Config{
		MaxEntries: 100_000,
		DefaultPolicy: Policy{
			Cacheable:       true,
			TTL:             time.Hour,
			MaxTemperature:  0.3,
			VolatileMarkers: slices.Clone(defaultVolatileMarkers),
		},
	}
}

// Validate reports every invalid key, named relative to the cache block.
func (c Config) Validate() error {
	var errs []error
	if c.MaxEntries <= 0 {
		errs = append(errs, fmt.Errorf("max_entries: must be positive, got %d", c.MaxEntries))
	}
	errs = append(errs, c.DefaultPolicy.validate("default_policy")...)
	for _, name := range slices.Sorted(maps.Keys(c.Scenarios)) {
		resolved := c.DefaultPolicy.with(c.Scenarios[name])
		errs = append(errs, resolved.validate("scenarios."+name)...)
	}
	return errors.Join(errs...)
}

func (p Policy) validate(prefix string) []error {
	var errs []error
	if p.TTL <= 0 {
		errs = append(errs, fmt.Errorf("%s.ttl: must be positive, got %s", prefix, p.TTL))
	}
	if p.MaxTemperature < 0 || math.IsNaN(p.MaxTemperature) || math.IsInf(p.MaxTemperature, 0) {
		errs = append(errs, fmt.Errorf("%s.max_temperature: must be a non-negative number, got %v", prefix, p.MaxTemperature))
	}
	for i, m := range p.VolatileMarkers {
		if normalizeText(m) == "" {
			errs = append(errs, fmt.Errorf("%s.volatile_markers[%d]: must contain a word, got %q", prefix, i, m))
		}
	}
	return errs
}

// with returns p with the keys that o sets replaced.
func (p Policy) with(o ScenarioPolicy) Policy {
	if o.Cacheable != nil {
		p.Cacheable = *o.Cacheable
	}
	if o.TTL != nil {
		p.TTL = *o.TTL
	}
	if o.MaxTemperature != nil {
		p.MaxTemperature = *o.MaxTemperature
	}
	if o.VolatileMarkers != nil {
		p.VolatileMarkers = o.VolatileMarkers
	}
	return p
}
