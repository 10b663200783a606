package quota

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/mantle-mesh/mantle/pkg/tlsconfig"
	"github.com/mantle-mesh/mantle/services/quota/internal/tokencount"
)

// Config is the quota block of mantle's YAML file. Durations are strings such as "2m"
// or "30s": yaml v3 parses them into time.Duration and prints them back the same way.
//
// A minimal block needs nothing: every tenant gets default_limits, state lives in memory.
// A fuller one:
//
//	quota:
//	  default_limits: {rpm: 600, tpm: 200000}
//	  tenants:
//	    acme: {tpm: 1000000}
//	    trial: {rpm: 60, tpm: 20000, shadow: true}   # counted, not enforced yet
//	  model_limits:
//	    "*": {gpt-4o: {tpm: 100000}}                 # every tenant, per model
//	    acme: {gpt-4o: {tpm: 400000}}
//	  budgets:
//	    tenants: {acme: {daily_usd: 50}}
//	    prices: {gpt-4o: {input_per_million: 2.5, output_per_million: 10}}
//	    day_offset: 8h                               # the budget day starts at 00:00 UTC+8
//	  upstream_keys: {openai-1: {rpm: 5000, tpm: 800000}}
//	  queue: {size: 10000, max_wait: 30s, weights: {acme: 3}}
//	  backend: redis
//	  redis: {address: "redis:6379", replicas: 3}
type Config struct {
	// DefaultLimits are the per-minute request and token buckets of every tenant without an
	// entry in tenants.
	DefaultLimits RateLimits `yaml:"default_limits"`
	// Tenants overrides limits per tenant id: {rpm, tpm, shadow}. A limit left out (or 0)
	// inherits the default, so acme: {tpm: 500000} raises only acme's token limit.
	Tenants map[string]RateLimits `yaml:"tenants"`
	// ModelLimits adds tenant × model buckets: model_limits.<tenant>.<model> = {rpm, tpm,
	// shadow}. Tenant "*" applies to every tenant without its own entry for that model. A
	// limit left at 0 adds no bucket. Model names are the router's, matched ignoring case;
	// the router charges the route's first candidate.
	ModelLimits map[string]map[string]RateLimits `yaml:"model_limits"`
	// DefaultMaxOutputTokens is reserved for the answer when a request sets no
	// max_tokens.
	DefaultMaxOutputTokens int64 `yaml:"default_max_output_tokens"`
	// ReservationTTL is how long a reservation can be settled. After it, the reservation
	// is dropped and its charge stands.
	ReservationTTL time.Duration `yaml:"reservation_ttl"`
	// SweepInterval is how often expired reservation records are deleted.
	SweepInterval time.Duration `yaml:"sweep_interval"`
	// Budgets are daily money budgets per tenant, and the model prices they are charged
	// by.
	Budgets BudgetsConfig `yaml:"budgets"`
	// UpstreamKeys mirrors the limits of provider API keys, {rpm, tpm, shadow} by the
	// router's key id, so that mantle slows down before the provider answers 429. The
	// provider's rate-limit headers correct them (ObserveUpstream). The router names the
	// first key of the route's first candidate.
	UpstreamKeys map[string]RateLimits `yaml:"upstream_keys"`
	// UpstreamMaxReset is the longest reset an upstream observation may report: providers'
	// request and token windows reset within the hour, so a longer one is implausible and
	// the observation is ignored (and counted), never applied.
	UpstreamMaxReset time.Duration `yaml:"upstream_max_reset"`
	// Queue is where requests wait for quota. They wait in strict priority classes
	// (critical, high, normal, batch, from x-mantle-priority), with weighted fair sharing
	// between tenants within a class. A waiting request's buckets are held for it against
	// its own class and lower ones, so that a stream of small batch requests cannot starve
	// it (docs/quota.md).
	Queue QueueConfig `yaml:"queue"`
	// NearLimitRatio is the share of a bucket or budget in use past which a
	// QuotaNearLimitEvent is published (at most once per bucket per minute and replica).
	NearLimitRatio float64 `yaml:"near_limit_ratio"`
	// RetryBudget is the mesh-wide retry budget behind AcquireRetry: it caps retries across
	// every router replica, by the same rule as router.retry_budget.
	RetryBudget RetryBudgetConfig `yaml:"retry_budget"`
	// Tokens configures token counting: CountTokens and the input estimate of Reserve.
	Tokens TokensConfig `yaml:"tokens"`
	// Backend keeps the state: memory (one replica, mantle dev) or redis (buckets, budgets
	// and the retry budget shared by every quota replica).
	Backend string `yaml:"backend"`
	// Redis is used when backend is redis: every decision is one Lua operation, and the
	// decisions that arrive together go to Redis as one call. The key layout, the Redis
	// versions and ACLs it needs, and rolling deploys are in docs/quota.md.
	Redis RedisConfig `yaml:"redis"`
}

// RateLimits are the per-minute limits of one rule. Each is both the bucket's capacity
// and how much it refills per minute.
type RateLimits struct {
	// RPM is requests per minute: the request bucket's capacity and its refill per minute.
	RPM int64 `yaml:"rpm"`
	// TPM is tokens per minute: the token bucket's capacity and its refill per minute.
	TPM int64 `yaml:"tpm"`
	// Shadow counts the limits this rule sets without enforcing them: they are charged
	// when they can be, a request they would refuse is admitted, and the refusal is
	// published (reason SHADOW_...) and counted in mantle_quota_shadow_refusals_total. For
	// safe roll-out of new limits.
	Shadow bool `yaml:"shadow,omitempty"`
}

// BudgetsConfig is the money budget block.
type BudgetsConfig struct {
	// Tenants sets a daily money budget per tenant id, {daily_usd, shadow}; tenants without
	// an entry have none.
	Tenants map[string]Budget `yaml:"tenants"`
	// Prices are per model name (matched ignoring case): {input_per_million,
	// output_per_million} in US dollars.
	Prices map[string]Price `yaml:"prices"`
	// DefaultPrice applies to models missing from prices. Without it, a budgeted tenant's
	// request for an unpriced model is refused (PRICE_UNKNOWN): a budget that cannot be
	// computed is not silently bypassed.
	DefaultPrice *Price `yaml:"default_price,omitempty"`
	// DayOffset moves the day boundary from 00:00 UTC: 8h resets budgets at midnight in
	// China (UTC+8), -5h at midnight in New York winter time.
	DayOffset time.Duration `yaml:"day_offset"`
}

// Budget is a tenant's daily money budget.
type Budget struct {
	// DailyUSD is the most the tenant may spend in a budget day, in US dollars.
	DailyUSD float64 `yaml:"daily_usd"`
	// Shadow counts spending against the budget without refusing requests.
	Shadow bool `yaml:"shadow,omitempty"`
}

// Price is what a model costs, in US dollars per million tokens.
type Price struct {
	// InputPerMillion is the price of a million input tokens, in US dollars.
	InputPerMillion float64 `yaml:"input_per_million"`
	// OutputPerMillion is the price of a million output tokens, in US dollars.
	OutputPerMillion float64 `yaml:"output_per_million"`
}

// QueueConfig bounds waiting for quota.
type QueueConfig struct {
	// Size is how many requests may wait for quota at once in this replica. When it is
	// full, a newcomer displaces the newest waiter of a lower priority class, or is
	// refused. 0 turns waiting off.
	Size int `yaml:"size"`
	// MaxWait caps any wait, whatever the caller's deadline. A Reserve call without a
	// deadline never waits.
	MaxWait time.Duration `yaml:"max_wait"`
	// DeadlineMargin is kept free at the end of the caller's deadline for the answer to
	// travel back.
	DeadlineMargin time.Duration `yaml:"deadline_margin"`
	// Weights share contended quota between tenants of the same priority class in
	// proportion, by tokens; tenants without an entry weigh 1.
	Weights map[string]float64 `yaml:"weights"`
}

// RetryBudgetConfig is the mesh-wide retry budget; its keys match the router's own
// retry_budget block so that the two can be swapped.
type RetryBudgetConfig struct {
	// Ratio is the largest share of requests that retries and failovers may add.
	Ratio float64 `yaml:"ratio"`
	// Floor is how many retries a window always allows, so that a quiet mesh can still
	// retry.
	Floor int `yaml:"floor"`
	// Window is the sliding window requests and retries are counted over; whole seconds.
	Window time.Duration `yaml:"window"`
	// FormatOnlyAbove: above this retry rate only format retries (malformed output,
	// refusal, truncation) are allowed.
	FormatOnlyAbove float64 `yaml:"format_only_above"`
	// FlushInterval is how often a replica adds the requests it counted to the shared
	// (Redis) counters; retries themselves are counted at once.
	FlushInterval time.Duration `yaml:"flush_interval"`
	// TenantShare is the largest share of the budget's allowance (max of floor and ratio
	// times the requests) one tenant's retries may take over the window, so that one
	// tenant cannot use up every tenant's retries. It is counted where the budget is: in
	// Redis, shared by the quota replicas, with backend redis.
	TenantShare float64 `yaml:"tenant_share"`
}

// TokensConfig configures token counting.
type TokensConfig struct {
	// ExactMaxBytes caps exact counting: prompts up to this size are counted exactly with
	// OpenAI's BPE vocabularies (OpenAI models); longer ones, and other families, are
	// estimated (and the estimate corrected by what providers report), which is ten times
	// cheaper. BPE
	// costs about 350 µs of CPU for 2 KB of chat (BenchmarkCountTokens), and Reserve
	// counts every prompt that arrives without input_tokens.
	ExactMaxBytes int `yaml:"exact_max_bytes"`
	// LearnCorrection adjusts estimates (never exact counts) by the ratio of the input
	// tokens providers report in Settle to the estimate, per model.
	LearnCorrection bool `yaml:"learn_correction"`
	// CorrectionMinSamples is how many reports a model needs before its factor applies.
	CorrectionMinSamples int `yaml:"correction_min_samples"`
}

// RedisConfig connects to Redis. The password comes from the environment only.
type RedisConfig struct {
	// Address is host:port; required with backend redis.
	Address string `yaml:"address"`
	// Username is the Redis user (ACL); empty for the default user.
	Username string `yaml:"username,omitempty"`
	// PasswordEnv names the environment variable that holds the password.
	PasswordEnv string `yaml:"password_env,omitempty"`
	// DB is the database number.
	DB int `yaml:"db"`
	// KeyPrefix starts every key, so that several meshes can share a Redis (no { or }).
	KeyPrefix string `yaml:"key_prefix"`
	// PoolSize is the connection pool size; 0 keeps go-redis's default (10 per CPU).
	PoolSize int `yaml:"pool_size"`
	// DialTimeout bounds connecting.
	DialTimeout time.Duration `yaml:"dial_timeout"`
	// Timeout bounds every command. A command that times out counts as Redis being
	// unreachable: the replica falls back to its local limiter.
	Timeout time.Duration `yaml:"timeout"`
	// Replicas is how many quota replicas share this Redis. While Redis is unreachable,
	// each replica enforces limit/replicas locally, so the mesh stays near the limit.
	Replicas int `yaml:"replicas"`
	// ProbeInterval is how often an unreachable Redis is tried again.
	ProbeInterval time.Duration `yaml:"probe_interval"`
	// OverLimitCache remembers, for this long, buckets Redis refused, and refuses requests
	// they cannot cover without asking Redis again; 0 turns the cache off. Refunds made by
	// other replicas are seen only when an entry expires.
	OverLimitCache time.Duration `yaml:"over_limit_cache"`
	// AutoPipeline shares pipelines between concurrent requests with go-redis's
	// auto-pipeliner (experimental upstream) instead of the store's own batcher, which
	// already sends the operations of concurrent requests together. It measured no better;
	// it stays for comparison and may go.
	AutoPipeline bool `yaml:"auto_pipeline"`
	// TLS secures the connections to Redis; each new connection reads the current
	// certificate and CA files, so they can be rotated without a restart.
	TLS tlsconfig.ClientConfig `yaml:"tls"`
}

// Backends.
const (
	backendMemory = "memory"
	backendRedis  = "redis"
)

// DefaultConfig returns the defaults; the file and flags override them.
func DefaultConfig() Config {
	return Config{
		DefaultLimits:          RateLimits{RPM: 600, TPM: 200_000},
		Tenants:                map[string]RateLimits{}, // printed as {} so the key is discoverable
		ModelLimits:            map[string]map[string]RateLimits{},
		DefaultMaxOutputTokens: 1024,
		ReservationTTL:         2 * time.Minute,
		SweepInterval:          30 * time.Second,
		Budgets: BudgetsConfig{
			Tenants: map[string]Budget{},
			Prices:  map[string]Price{},
		},
		UpstreamKeys: map[string]RateLimits{},
		Queue: QueueConfig{
			Size:           10_000,
			MaxWait:        30 * time.Second,
			DeadlineMargin: 10 * time.Millisecond,
			Weights:        map[string]float64{},
		},
		NearLimitRatio: 0.8,
		RetryBudget: RetryBudgetConfig{
			Ratio: 0.2, Floor: 10, Window: time.Minute, FormatOnlyAbove: 0.15, FlushInterval: time.Second, TenantShare: 0.5,
		},
		UpstreamMaxReset: time.Hour,
		Tokens:           TokensConfig(tokencount.DefaultConfig()),
		Backend:          backendMemory,
		Redis: RedisConfig{
			KeyPrefix:     "mantle:quota:",
			DialTimeout:   time.Second,
			Timeout:       250 * time.Millisecond,
			Replicas:      1,
			ProbeInterval: time.Second,
		},
	}
}

// maxBudgetUSD and maxPricePerMillion keep money, in nano-dollars, exact in Redis's Lua
// numbers (below 2^53): a budget is at most 10^15 nano-dollars, and maxUsageTokens
// tokens at 10^7 nano-dollars a token are at most 5x10^14.
const (
	maxBudgetUSD       = 1_000_000
	maxPricePerMillion = 10_000
)

// Validate reports every invalid key, named relative to the quota block.
func (c Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.DefaultLimits.RPM <= 0 {
		add("default_limits.rpm: must be positive, got %d", c.DefaultLimits.RPM)
	}
	if c.DefaultLimits.TPM <= 0 {
		add("default_limits.tpm: must be positive, got %d", c.DefaultLimits.TPM)
	}
	// Sorted so the same file always produces the same message.
	for _, tenant := range slices.Sorted(maps.Keys(c.Tenants)) {
		limits := c.Tenants[tenant]
		if tenant == "" {
			add("tenants: tenant id must not be empty")
		}
		if limits.RPM < 0 {
			add("tenants.%s.rpm: must not be negative (omit it to inherit default_limits.rpm), got %d", tenant, limits.RPM)
		}
		if limits.TPM < 0 {
			add("tenants.%s.tpm: must not be negative (omit it to inherit default_limits.tpm), got %d", tenant, limits.TPM)
		}
	}
	for _, tenant := range slices.Sorted(maps.Keys(c.ModelLimits)) {
		if tenant == "" {
			add("model_limits: tenant id must not be empty (use \"*\" for every tenant)")
		}
		models := c.ModelLimits[tenant]
		for _, model := range slices.Sorted(maps.Keys(models)) {
			l := models[model]
			if model == "" {
				add("model_limits.%s: model name must not be empty", tenant)
			}
			if l.RPM < 0 || l.TPM < 0 {
				add("model_limits.%s.%s: limits must not be negative, got rpm %d, tpm %d", tenant, model, l.RPM, l.TPM)
			}
			if l.RPM == 0 && l.TPM == 0 {
				add("model_limits.%s.%s: set rpm, tpm or both", tenant, model)
			}
		}
	}
	if c.DefaultMaxOutputTokens <= 0 {
		add("default_max_output_tokens: must be positive, got %d", c.DefaultMaxOutputTokens)
	}
	if c.ReservationTTL <= 0 {
		add("reservation_ttl: must be positive, got %s", c.ReservationTTL)
	}
	if c.SweepInterval <= 0 {
		add("sweep_interval: must be positive, got %s", c.SweepInterval)
	}
	errs = append(errs, c.Budgets.validate()...)
	for _, key := range slices.Sorted(maps.Keys(c.UpstreamKeys)) {
		l := c.UpstreamKeys[key]
		if key == "" {
			add("upstream_keys: key id must not be empty")
		}
		if l.RPM < 0 || l.TPM < 0 {
			add("upstream_keys.%s: limits must not be negative, got rpm %d, tpm %d", key, l.RPM, l.TPM)
		}
		if l.RPM == 0 && l.TPM == 0 {
			add("upstream_keys.%s: set rpm, tpm or both", key)
		}
	}
	if c.UpstreamMaxReset <= 0 {
		add("upstream_max_reset: must be positive, got %s", c.UpstreamMaxReset)
	}
	errs = append(errs, c.Queue.validate()...)
	if c.NearLimitRatio <= 0 || c.NearLimitRatio > 1 {
		add("near_limit_ratio: must be in (0, 1], got %v", c.NearLimitRatio)
	}
	errs = append(errs, c.RetryBudget.validate()...)
	if c.Tokens.ExactMaxBytes < 0 {
		add("tokens.exact_max_bytes: must not be negative, got %d", c.Tokens.ExactMaxBytes)
	}
	if c.Tokens.CorrectionMinSamples < 1 {
		add("tokens.correction_min_samples: must be at least 1, got %d", c.Tokens.CorrectionMinSamples)
	}
	switch c.Backend {
	case backendMemory:
	case backendRedis:
		errs = append(errs, c.Redis.validate()...)
	default:
		add("backend: must be %q or %q, got %q", backendMemory, backendRedis, c.Backend)
	}
	return errors.Join(errs...)
}

func (b BudgetsConfig) validate() []error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	for _, tenant := range slices.Sorted(maps.Keys(b.Tenants)) {
		d := b.Tenants[tenant].DailyUSD
		if tenant == "" {
			add("budgets.tenants: tenant id must not be empty")
		}
		if d <= 0 || d > maxBudgetUSD || math.IsNaN(d) {
			add("budgets.tenants.%s.daily_usd: must be in (0, %d], got %v", tenant, maxBudgetUSD, d)
		}
	}
	checkPrice := func(key string, p Price) {
		for _, v := range []struct {
			name  string
			value float64
		}{{"input_per_million", p.InputPerMillion}, {"output_per_million", p.OutputPerMillion}} {
			if v.value < 0 || v.value > maxPricePerMillion || math.IsNaN(v.value) {
				add("%s.%s: must be in [0, %d], got %v", key, v.name, maxPricePerMillion, v.value)
			}
		}
	}
	for _, model := range slices.Sorted(maps.Keys(b.Prices)) {
		if model == "" {
			add("budgets.prices: model name must not be empty")
		}
		checkPrice("budgets.prices."+model, b.Prices[model])
	}
	if b.DefaultPrice != nil {
		checkPrice("budgets.default_price", *b.DefaultPrice)
	}
	if b.DayOffset <= -24*time.Hour || b.DayOffset >= 24*time.Hour || b.DayOffset%time.Second != 0 {
		add("budgets.day_offset: must be whole seconds within (-24h, 24h), got %s", b.DayOffset)
	}
	return errs
}

func (q QueueConfig) validate() []error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if q.Size < 0 {
		add("queue.size: must not be negative (0 turns waiting off), got %d", q.Size)
	}
	if q.MaxWait < 0 {
		add("queue.max_wait: must not be negative, got %s", q.MaxWait)
	}
	if q.DeadlineMargin < 0 {
		add("queue.deadline_margin: must not be negative, got %s", q.DeadlineMargin)
	}
	for _, tenant := range slices.Sorted(maps.Keys(q.Weights)) {
		if w := q.Weights[tenant]; !(w > 0) || math.IsInf(w, 0) {
			add("queue.weights.%s: must be positive, got %v", tenant, w)
		}
	}
	return errs
}

func (r RetryBudgetConfig) validate() []error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if r.Ratio < 0 || math.IsNaN(r.Ratio) {
		add("retry_budget.ratio: must not be negative, got %v", r.Ratio)
	}
	if r.Floor < 0 {
		add("retry_budget.floor: must not be negative, got %d", r.Floor)
	}
	if r.Window < time.Second || r.Window%time.Second != 0 {
		add("retry_budget.window: must be whole seconds, at least 1s, got %s", r.Window)
	}
	if r.FormatOnlyAbove < 0 || math.IsNaN(r.FormatOnlyAbove) {
		add("retry_budget.format_only_above: must not be negative, got %v", r.FormatOnlyAbove)
	}
	if r.FlushInterval <= 0 {
		add("retry_budget.flush_interval: must be positive, got %s", r.FlushInterval)
	}
	if !(r.TenantShare > 0 && r.TenantShare <= 1) {
		add("retry_budget.tenant_share: must be in (0, 1], got %v", r.TenantShare)
	}
	return errs
}

func (r RedisConfig) validate() []error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if r.Address == "" {
		add("redis.address: is required when backend is redis")
	}
	if strings.ContainsAny(r.KeyPrefix, "{}") {
		add("redis.key_prefix: must not contain { or }, which Redis reads as a hash tag, got %q", r.KeyPrefix)
	}
	if r.DB < 0 {
		add("redis.db: must not be negative, got %d", r.DB)
	}
	if r.PoolSize < 0 {
		add("redis.pool_size: must not be negative, got %d", r.PoolSize)
	}
	if r.DialTimeout <= 0 {
		add("redis.dial_timeout: must be positive, got %s", r.DialTimeout)
	}
	if r.Timeout <= 0 {
		add("redis.timeout: must be positive, got %s", r.Timeout)
	}
	if r.Replicas < 1 {
		add("redis.replicas: must be at least 1, got %d", r.Replicas)
	}
	if r.ProbeInterval <= 0 {
		add("redis.probe_interval: must be positive, got %s", r.ProbeInterval)
	}
	if r.OverLimitCache < 0 {
		add("redis.over_limit_cache: must not be negative, got %s", r.OverLimitCache)
	}
	if err := r.TLS.Validate(); err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			add("redis.tls.%s", line)
		}
	}
	return errs
}

// ruleLimit is one limit and the rule that set it, for shadow mode.
type ruleLimit struct {
	limit  int64
	shadow bool
}

// tenantLimits returns the tenant's RPM and TPM: its override where set, the default
// elsewhere, each with the shadow flag of the rule that supplied it.
func (c Config) tenantLimits(tenant string) (rpm, tpm ruleLimit) {
	d := c.DefaultLimits
	rpm, tpm = ruleLimit{d.RPM, d.Shadow}, ruleLimit{d.TPM, d.Shadow}
	if o, ok := c.Tenants[tenant]; ok {
		if o.RPM > 0 {
			rpm = ruleLimit{o.RPM, o.Shadow}
		}
		if o.TPM > 0 {
			tpm = ruleLimit{o.TPM, o.Shadow}
		}
	}
	return rpm, tpm
}

// limitsFor returns the tenant's enforced-or-not RPM and TPM limits.
func (c Config) limitsFor(tenant string) RateLimits {
	rpm, tpm := c.tenantLimits(tenant)
	return RateLimits{RPM: rpm.limit, TPM: tpm.limit}
}

// modelLimits returns the tenant x model limits and whether there are any. The tenant's
// own entry for the model wins over the "*" entry.
func (c Config) modelLimits(tenant, model string) (RateLimits, bool) {
	for _, t := range []string{tenant, "*"} {
		models := c.ModelLimits[t]
		if l, ok := models[model]; ok {
			return l, true
		}
		// Case-insensitive fallback; configs are small, so a scan is fine.
		for name, l := range models {
			if strings.EqualFold(name, model) {
				return l, true
			}
		}
	}
	return RateLimits{}, false
}

// price returns the model's price, and false when neither Prices nor DefaultPrice has one.
func (b BudgetsConfig) price(model string) (Price, bool) {
	if p, ok := b.Prices[model]; ok {
		return p, true
	}
	for name, p := range b.Prices {
		if strings.EqualFold(name, model) {
			return p, true
		}
	}
	if b.DefaultPrice != nil {
		return *b.DefaultPrice, true
	}
	return Price{}, false
}
