package router

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/mantle-mesh/mantle/pkg/resilience"
	"github.com/mantle-mesh/mantle/pkg/sim"
	"github.com/mantle-mesh/mantle/services/router/internal/overload"
)

// Provider types.
const (
	ProviderOpenAI    = "openai"
	ProviderAnthropic = "anthropic"
	// ProviderSim runs the built-in simulated provider in this process and reaches it
	// through the OpenAI adapter over loopback HTTP, so the real HTTP path is exercised.
	ProviderSim = "sim"
)

// Off as a service address runs the router without that service. A router alone
// (--target=router with every address off) is a plain resilient proxy: retries, breakers,
// hedging, fallback and the ladder's template, without the hops a deployment has not
// set up, where an unreachable address would cost every request a failed call.
const Off = "off"

// Config is the router block of mantle.yaml.
type Config struct {
	// CacheAddress is where to dial the cache when it does not run in this process; off
	// runs the router without a cache, in process or not.
	CacheAddress string `yaml:"cache_address"`
	// QuotaAddress is where to dial quota when it does not run in this process; off runs
	// the router without admission control.
	QuotaAddress string `yaml:"quota_address"`
	// VerifierAddress is where to dial the verifier when it does not run in this process;
	// off leaves only the router's own L1 format check, and answers are marked unverified;
	// the agent then has nobody to confirm action outcomes, and one that becomes unknown
	// stays pending_confirmation.
	VerifierAddress string `yaml:"verifier_address"`
	// AgentAddress is where to dial the agent (the tool gateway) when it does not run in
	// this process; off runs the router without tools: /v1/tools and /mcp answer that tools
	// are not served here.
	AgentAddress string `yaml:"agent_address"`

	// DefaultBudget is the whole-request deadline when neither the caller nor the route
	// sets one.
	DefaultBudget time.Duration `yaml:"default_budget"`
	// HopReserve is kept back from every hop's timeout so that the router can still fail
	// over, settle and answer when a hop uses its whole share. Must be below
	// default_budget.
	HopReserve time.Duration `yaml:"hop_reserve"`
	// MaxPromptBytes bounds the total size of a request's messages.
	MaxPromptBytes int `yaml:"max_prompt_bytes"`
	// MaxOutputTokens is the upper bound on a request's max_tokens; 0 means no bound.
	MaxOutputTokens int `yaml:"max_output_tokens"`
	// EmbeddingsCache is the exact cache of embeddings answers, kept in each router
	// process: identical inputs, route, dimensions and encoding of one tenant get the stored
	// vectors without an upstream call (never a similar input's).
	EmbeddingsCache EmbeddingsCacheConfig `yaml:"embeddings_cache"`
	// FirstTokenTimeout cancels a stream without a first token after this long (class
	// timeout), and it fails over; for routes that set none.
	FirstTokenTimeout time.Duration `yaml:"first_token_timeout"`
	// StallTimeout cancels a stream that makes no progress for this long; for routes that
	// set none.
	StallTimeout time.Duration `yaml:"stall_timeout"`
	// StreamRescueShare is the share of the time left that a stream's first-token and stall
	// limits keep for a fallback to continue or restart a stream that broke: an attempt's
	// limits never exceed (1 - share) of the time left when it starts, so a stream that
	// never starts or stalls early still leaves that share to finish the answer elsewhere.
	// Route limits above (1 - share) of the route's budget are clamped with a warning at
	// start and reload. 0 turns the clamp off; below 1.
	StreamRescueShare float64 `yaml:"stream_rescue_share"`
	// SideScouts sends an open breaker's scout (breaker.scout_interval) beside the request
	// that drew it, a copy of that request whose answer only tells the breaker whether the
	// model is back, while the request itself goes on to the next candidate at once: a
	// scout then costs one call and no caller's time. A candidate with no other to go on to
	// is scouted with the request itself, as it is with this off.
	SideScouts bool `yaml:"side_scouts"`
	// AsyncCacheStore offers a verified answer to the cache after it has gone to the
	// caller, rather than before, when the request holds the cache's coalescing lease for
	// its prompt: an identical request that arrives before the store waits on that lease
	// and gets the answer, so the caller's next identical request still finds it. The
	// lease lives in one cache replica: with several, an identical request that reaches
	// another one may miss until the store lands, and so may a reworded one anywhere (a
	// similar question does not wait on a lease). A request without a lease stores before
	// it answers, as with this off. A request with a lease that finds
	// max_async_cache_stores stores already in flight sheds its store
	// (mantle_router_cache_stores_shed_total) and releases its lease, rather than make
	// its caller wait for the cache's backlog. On a nearly idle
	// replica an HTTP answer (chat completions, messages) is stored by its own request once
	// it has gone out, and that connection's next request waits for the store; otherwise
	// the router's store workers make it. On by default: the store's index write is then
	// off every caller's latency (docs/design/009-store-after-the-answer.md).
	AsyncCacheStore bool `yaml:"async_cache_store"`
	// MaxAsyncCacheStores bounds the stores the router's store workers have in flight
	// after their answers (async_cache_store) on this replica; past it a request sheds
	// its store and releases its lease, so the identical requests waiting on it ask the
	// models themselves. Each store in flight holds its answer's memory and one goroutine
	// until it lands, within a few seconds. (An HTTP request that stores its own answer
	// on a nearly idle replica is not counted: there are two at most.) Reloadable; 1 to
	// 65536.
	MaxAsyncCacheStores int `yaml:"max_async_cache_stores"`
	// AllowMissingKeys starts the router when a provider key's environment variable is
	// unset or empty, with a warning naming it; every call on that key then fails at once
	// with an auth error (nothing is sent), so its breaker opens and requests go to the
	// other keys and candidates. False (the default) refuses to start, naming the key.
	AllowMissingKeys bool `yaml:"allow_missing_keys,omitempty"`
	// QuotaFailOpen admits requests when the quota service cannot be reached; false
	// refuses them instead. Availability wins by default; set false where overspending is
	// worse than refusing.
	QuotaFailOpen bool `yaml:"quota_fail_open"`
	// QuotaFallbackRPM bounds each tenant's requests per minute on this replica while the
	// quota service is unreachable and quota_fail_open admits them; 0 means no bound.
	QuotaFallbackRPM int `yaml:"quota_fallback_rpm"`

	// Retry decides how often and how soon a failed candidate is tried again.
	Retry RetryConfig `yaml:"retry"`
	// RetryBudget caps retries and failovers as a share of requests per replica (retries
	// on a model, as a share of its key's requests), so that a provider incident cannot
	// turn into a retry storm.
	RetryBudget BudgetConfig `yaml:"retry_budget"`
	// HedgeBudget caps hedges as a share of the requests that may be hedged (unary, on a
	// route with hedging), per replica: the retry budget's rule without format-only mode.
	// Hedges have a budget of their own so that requests which are merely slow never take
	// the place of a failover after a real failure (with one budget for both, a provider
	// incident answered failed probes with templates because hedges had spent it).
	HedgeBudget HedgeBudgetConfig `yaml:"hedge_budget"`
	// Breaker configures the circuit breaker of every (provider, model, key, scenario).
	Breaker BreakerConfig `yaml:"breaker"`
	// Idempotency keeps the answer of every request id so that a replay is not billed
	// twice.
	Idempotency IdempotencyConfig `yaml:"idempotency"`
	// Status configures the status page (GET /status on the HTTP port).
	Status StatusConfig `yaml:"status"`
	// Overload sheds a share of new requests while this process is short of CPU.
	Overload overload.Config `yaml:"overload"`

	// Providers are the upstream APIs.
	Providers []ProviderConfig `yaml:"providers"`
	// Models are what callers and routes name. Every model is also a one-candidate route
	// under its own name. The router needs at least one model.
	Models []ModelConfig `yaml:"models"`
	// Routes are names callers use for an ordered list of candidate models.
	Routes []RouteConfig `yaml:"routes"`

	// SimProfiles defines sim profiles by name, for the sim_profile of sim providers and
	// models, next to the built-in ones (a definition here replaces a built-in of the same
	// name). Same YAML as mantle sim --profile-file. Each starts from the zero profile:
	// instant answers, no errors, no rate-limit headers, so that a fault drill states only
	// the fault ("errors: {overloaded: 1}", or "script: [server_error]" for a 500 once).
	SimProfiles map[string]sim.Profile `yaml:"sim_profiles,omitempty" doc:"leaf"`
}

// RetryConfig is the retry policy of a candidate.
type RetryConfig struct {
	// MaxRetries is the attempts per candidate after its first one.
	MaxRetries int `yaml:"max_retries"`
	// BackoffBase is the base of the full-jitter exponential backoff: the n-th wait is
	// uniform in [0, min(backoff_cap, backoff_base·2ⁿ)).
	BackoffBase time.Duration `yaml:"backoff_base"`
	// BackoffCap caps the backoff; it is also the cooldown of a key that answered 429
	// without a hint.
	BackoffCap time.Duration `yaml:"backoff_cap"`
	// MaxRetryAfter is the longest provider Retry-After hint the router waits for; longer
	// hints fail over instead (the hint must also fit in the remaining budget).
	MaxRetryAfter time.Duration `yaml:"max_retry_after"`
}

// BudgetConfig is the retry budget of the router block (retry_budget): the resilience
// package owns the type, its yaml keys, defaults and validation.
type BudgetConfig = resilience.BudgetConfig

// BreakerConfig is the circuit breaker policy of the router block (breaker).
type BreakerConfig = resilience.BreakerConfig

// IdempotencyConfig says where request records live and for how long.
type IdempotencyConfig struct {
	// Backend is memory (one replica, development) or jetstream (the NATS KV bucket
	// mantle_idempotency, shared by replicas; needs events.nats_url or events.embedded,
	// reachable at start).
	Backend string `yaml:"backend"`
	// TTL is how long a finished request's answer can be replayed.
	TTL time.Duration `yaml:"ttl"`
	// InflightTTL is how long a claim of a request in progress holds before a duplicate may
	// take it over (the owner is presumed dead); below ttl for jetstream.
	InflightTTL time.Duration `yaml:"inflight_ttl"`
	// MaxRecordsPerTenant bounds the claims and records one tenant may hold, in either
	// backend, so that a tenant sending endless distinct keys fills only its own share;
	// past it, that tenant's new keys are served without replay protection (audited as a
	// skipped idempotency step) until some expire. With jetstream the count is the
	// bucket's, shared by the replicas, each of which reads it at most once a second per
	// tenant once its own count reaches half the bound. 0 means no bound.
	MaxRecordsPerTenant int `yaml:"max_records_per_tenant,omitempty"`
}

// StatusConfig configures the status page.
type StatusConfig struct {
	// Refresh is how often the HTML page reloads itself; 0 turns auto-refresh off.
	Refresh time.Duration `yaml:"refresh"`
	// RecentDegradations is how many of this replica's last degradation events the page
	// lists.
	RecentDegradations int `yaml:"recent_degradations"`
}

// ProviderConfig is one upstream API.
type ProviderConfig struct {
	// Name is the unique name models refer to.
	Name string `yaml:"name"`
	// Type is openai (any OpenAI-compatible API), anthropic, or sim (a simulated provider
	// inside the router process, reached through the OpenAI adapter over loopback HTTP).
	Type string `yaml:"type"`
	// BaseURL is the API root: https://api.openai.com/v1 (the default for openai) or
	// https://api.anthropic.com/v1 (the default for anthropic). Redirects are not
	// followed: a call answered with one fails (class unknown), naming where it pointed.
	BaseURL string `yaml:"base_url,omitempty"`
	// Keys are the API keys, required for openai and anthropic; their values come from
	// environment variables only. Calls rotate over the keys; each has its own breakers,
	// cooldown and retry budget. A sim provider has one key, sim.
	Keys []KeyConfig `yaml:"keys,omitempty"`
	// Timeout is the per-try timeout of one call (required).
	Timeout time.Duration `yaml:"timeout"`
	// DialTimeout bounds connecting to the provider (TCP and TLS handshake), apart from
	// the call's timeout: a provider that cannot be reached fails in seconds and the request
	// fails over, instead of spending the whole per-try timeout on a connection attempt. 0
	// means 3s; it must be below timeout.
	DialTimeout time.Duration `yaml:"dial_timeout,omitempty"`
	// SimProfile is the profile of this provider's models, for type sim (built in, or from
	// sim_profiles); fast when empty. models[].sim_profile overrides it per model.
	SimProfile string `yaml:"sim_profile,omitempty"`
	// SimSeed is the random seed of a sim provider: the same seed replays the same run.
	SimSeed int64 `yaml:"sim_seed,omitempty"`
	// MaxConcurrency is the bulkhead of each model of this provider: calls in flight beyond
	// it fail over at once instead of queueing. 0 means unlimited.
	MaxConcurrency int `yaml:"max_concurrency,omitempty"`
}

// defaultDialTimeout is how long connecting to a provider may take when dial_timeout is
// unset: long enough for a TLS handshake across continents, short enough to fail over well
// inside a request's budget.
const defaultDialTimeout = 3 * time.Second

// dialTimeout is DialTimeout with its default; a provider whose timeout is shorter than the
// default dials for at most half its timeout.
func (p ProviderConfig) dialTimeout() time.Duration {
	if p.DialTimeout > 0 {
		return p.DialTimeout
	}
	if p.Timeout > 0 && p.Timeout <= defaultDialTimeout {
		return p.Timeout / 2
	}
	return defaultDialTimeout
}

// KeyConfig is one API key.
type KeyConfig struct {
	// ID names the key in logs, metrics, QualityContexts and quota's upstream_keys.
	ID string `yaml:"id"`
	// Env is the environment variable holding the key.
	Env string `yaml:"env"`
}

// ModelConfig is one model callers can name and routes can use.
type ModelConfig struct {
	// Name is what callers and routes use.
	Name string `yaml:"name"`
	// Provider is a providers[].name.
	Provider string `yaml:"provider"`
	// Upstream is the provider's model name; name when empty.
	Upstream string `yaml:"upstream,omitempty"`
	// ContextWindow is the model's context window in tokens, 0 when unknown. After a context overflow only models with
	// a larger window are tried.
	ContextWindow int `yaml:"context_window,omitempty"`
	// InputPricePerMillion is the price of a million input tokens in US dollars, for
	// cost_usd.
	InputPricePerMillion float64 `yaml:"input_price_per_million,omitempty"`
	// OutputPricePerMillion is the price of a million output tokens in US dollars, for
	// cost_usd.
	OutputPricePerMillion float64 `yaml:"output_price_per_million,omitempty"`
	// SimProfile is this model's profile instead of the provider's, for sim providers.
	SimProfile string `yaml:"sim_profile,omitempty"`
	// MaxConcurrency is this model's bulkhead, instead of the provider's.
	MaxConcurrency int `yaml:"max_concurrency,omitempty"`

	// The fields below are the capability profile the fallback matrix chooses by.

	// FormatStability is how reliably the model keeps to a requested format, 0 to 1. After
	// malformed output, a refusal or a truncation, the remaining candidate with the highest
	// value is next.
	FormatStability float64 `yaml:"format_stability,omitempty"`
	// Freshness ranks knowledge recency; higher is fresher. After a failed verification,
	// the freshest remaining candidate is next.
	Freshness int `yaml:"freshness,omitempty"`
	// Tier ranks capability; higher is stronger. Recorded in the configuration; the router
	// does not route by it (ladder L1 models are usually lower tiers).
	Tier int `yaml:"tier,omitempty"`
	// AcceptsPrefill says the model continues a partial assistant message, so that it can
	// finish a stream that broke mid-answer.
	AcceptsPrefill bool `yaml:"accepts_prefill,omitempty"`
	// Capabilities say what requests the model can serve; a request needing one it lacks
	// is never sent to it. Unset: the model is not restricted (its provider type still is).
	Capabilities *Capabilities `yaml:"capabilities,omitempty"`
}

// EmbeddingsCacheConfig bounds the router's exact cache of embeddings answers.
type EmbeddingsCacheConfig struct {
	// MaxBytes bounds the vectors kept (4 bytes a dimension); the least recently used go
	// first. 0 turns the cache off.
	MaxBytes int64 `yaml:"max_bytes"`
	// TTL is how long an answer is served from the cache.
	TTL time.Duration `yaml:"ttl"`
}

// Capabilities are what a model can act on. The context window is ModelConfig.ContextWindow.
type Capabilities struct {
	// Tools says the model calls functions (tools offered, tool turns in the conversation).
	Tools bool `yaml:"tools"`
	// ParallelTools says it makes several tool calls in one answer (parallel_tool_calls: true).
	ParallelTools bool `yaml:"parallel_tools"`
	// Vision says it reads image parts.
	Vision bool `yaml:"vision"`
	// Audio says it reads input_audio parts.
	Audio bool `yaml:"audio"`
	// Files says it reads file parts.
	Files bool `yaml:"files"`
	// JSONSchema says it follows a json_schema response format.
	JSONSchema bool `yaml:"json_schema"`
	// Logprobs says it returns log probabilities when asked.
	Logprobs bool `yaml:"logprobs"`
	// MaxOutput is the most output tokens the model produces; 0 is unknown (no limit).
	MaxOutput int `yaml:"max_output,omitempty"`
	// Embeddings says the model is an embeddings model: it answers POST /v1/embeddings
	// (the router's Embed) and never chat, and a chat model never answers embeddings. Its
	// provider must be of type openai (the Anthropic API has no embeddings).
	Embeddings bool `yaml:"embeddings,omitempty"`
}

// RouteConfig is a name callers use for an ordered list of candidate models.
type RouteConfig struct {
	// Name is what callers use as model; it must not be a model name.
	Name string `yaml:"name"`
	// Scenario is the route's scenario (default when empty; 1 to 64 characters of a-z, A-Z,
	// 0-9, _ - . :): recorded in QualityContexts, it selects cache.scenarios.<scenario> and
	// keys the breakers. A caller may name another scenario (x-mantle-scenario, same
	// charset); its breakers are that scenario's when a route is configured with it, the
	// route's otherwise.
	Scenario string `yaml:"scenario,omitempty"`
	// Candidates are model names, first choice first.
	Candidates []string `yaml:"candidates"`
	// Budget is this route's deadline budget instead of default_budget; more than
	// hop_reserve.
	Budget time.Duration `yaml:"budget,omitempty"`
	// FirstTokenTimeout cancels a stream whose first token has not arrived in time,
	// instead of the router's first_token_timeout (4 to 10 s suits most chat models).
	FirstTokenTimeout time.Duration `yaml:"first_token_timeout,omitempty"`
	// StallTimeout cancels a stream that makes no progress for this long, instead of the
	// router's stall_timeout.
	StallTimeout time.Duration `yaml:"stall_timeout,omitempty"`
	// Hedge sends a second request when the first is slow.
	Hedge HedgeConfig `yaml:"hedge,omitempty"`
	// Ladder is what the route degrades to when its candidates cannot answer.
	Ladder LadderConfig `yaml:"ladder,omitempty"`
	// Cache is how the route uses the answer cache.
	Cache RouteCacheConfig `yaml:"cache,omitempty"`
	// ContextCompression shortens a conversation too long for the route's models: its
	// oldest turns are summarised by a small model instead of the request failing.
	ContextCompression ContextCompressionConfig `yaml:"context_compression,omitempty"`
}

// ContextCompressionConfig: when a conversation does not fit any candidate's context
// window (by the prompt's counted size, or after a provider's context-length error), the
// messages between the system messages and the most recent KeepRecent are summarised by
// Model and replace them as one system message; the request goes on with the shorter
// prompt, and its QualityContext says so (context_compression). The summary's tokens are
// billed with the request. Off while Model is empty.
type ContextCompressionConfig struct {
	// Model writes the summary: a small, fast chat model with a large context window.
	Model string `yaml:"model,omitempty"`
	// KeepRecent is how many of the latest messages stay as they are; 0 takes 6. The
	// boundary moves back so that tool results stay with the call that asked for them.
	KeepRecent int `yaml:"keep_recent,omitempty"`
	// MaxSummaryTokens bounds each summarising call's answer; 0 takes 512.
	MaxSummaryTokens int `yaml:"max_summary_tokens,omitempty"`
	// Prompt is the summariser's instruction; empty takes a built-in one that keeps facts,
	// names, numbers, decisions and open questions.
	Prompt string `yaml:"prompt,omitempty"`
}

// RouteCacheConfig is a route's use of the answer cache. Which requests may share an
// answer is not configurable: every field that changes the answer is part of the scope.
type RouteCacheConfig struct {
	// ToolCalls stores answers that call tools (finish_reason tool_calls), so an identical
	// request gets the same calls without asking a model. Off by default: a tool call
	// usually acts on the world (book, send, pay), and replaying one is only right when
	// the application treats the tools as pure functions of their arguments.
	ToolCalls bool `yaml:"tool_calls,omitempty"`
}

// HedgeConfig: after a delay a second request goes to the best other healthy candidate, if
// the hedge budget (Config.HedgeBudget) allows; the first valid answer wins. The delay is the
// time by which all but one in twenty of the key's recent calls had answered, timeouts
// counted as never answering (its p95 while none time out; MinDelay once one in twenty
// times out), bounded by MinDelay and MaxDelay.
type HedgeConfig struct {
	// Enabled hedges a unary request's first attempt that runs past the delay (once per
	// request: a retry after a call that failed at once may be the one).
	Enabled bool `yaml:"enabled"`
	// MinDelay is the lower bound of the hedge delay, and the delay itself while the key's
	// recent calls time out; 0 takes 200ms.
	MinDelay time.Duration `yaml:"min_delay,omitempty"`
	// MaxDelay is the upper bound of the hedge delay; 0 takes 3s.
	MaxDelay time.Duration `yaml:"max_delay,omitempty"`
}

// HedgeBudgetConfig is the router's hedge budget (hedge_budget): the retry budget's rule
// without its format-only mode, which hedges (never format retries) have no use for.
type HedgeBudgetConfig struct {
	// Ratio is the largest share of hedgeable requests that may be hedged.
	Ratio float64 `yaml:"ratio"`
	// Floor is how many hedges a window always allows.
	Floor int `yaml:"floor"`
	// Window is the sliding window requests and hedges are counted over.
	Window time.Duration `yaml:"window"`
}

// budget is the resilience budget that enforces c: format-only mode never engages, since a
// rate above 1 cannot happen once the ratio (at most 1) holds.
func (c HedgeBudgetConfig) budget() BudgetConfig {
	b := resilience.DefaultBudgetConfig()
	b.Ratio, b.Floor, b.Window, b.FormatOnlyAbove = c.Ratio, c.Floor, c.Window, 1
	return b
}

// LadderConfig is the degradation ladder of a route below its own candidates (L0).
type LadderConfig struct {
	// Smaller are L1: smaller or faster model names tried after every candidate failed, at
	// the same level as a backup (BACKUP_MODEL).
	Smaller []string `yaml:"smaller,omitempty"`
	// Cache turns on L2: answer with the closest verified cached answer, marked as
	// related.
	Cache bool `yaml:"cache,omitempty"`
	// Template is L3: a fixed answer (an FAQ text, a "we'll get back to you") that is always
	// available; a review event is raised with it. Empty turns L3 off.
	Template string `yaml:"template,omitempty"`
	// Notice is the user_notice of L2 and L3 answers; empty takes a built-in one per level.
	Notice string `yaml:"notice,omitempty"`
	// FastAnswer sits between L1 and L2: after every candidate and smaller model failed,
	// one call to a small model with a short prompt, answering briefly instead of not at
	// all.
	FastAnswer FastAnswerConfig `yaml:"fast_answer,omitempty"`
	// ForceLevel pins the route to a level: "" (automatic), cache (answer from L2, then L3,
	// without calling models, for an outage; needs cache: true) or template (answer from
	// L3).
	ForceLevel string `yaml:"force_level,omitempty"`
}

// FastAnswerConfig is a route's fast-answer rung: the agent drops from its thorough mode
// to a quick one rather than leaving the user waiting. The answer is at the BACKUP_MODEL
// level with simplified_prompt set in its QualityContext. The request's other messages,
// tools, response format and sampling fields go to the model as given. Off while Model is
// empty.
type FastAnswerConfig struct {
	// Model is the small, fast model asked.
	Model string `yaml:"model,omitempty"`
	// Prompt replaces the request's system messages (a route's long instructions are what
	// makes a small model slow and unreliable); required with model.
	Prompt string `yaml:"prompt,omitempty"`
	// MaxTokens caps the answer's length (a request asking for fewer keeps its own); 0
	// takes 256.
	MaxTokens int `yaml:"max_tokens,omitempty"`
}

// maxAsyncCacheStoresLimit caps router.max_async_cache_stores: past it the bound would
// not bound the goroutines and answers a slow cache can hold.
const maxAsyncCacheStoresLimit = 1 << 16

// DefaultConfig returns the router defaults: no providers (the composition root adds the
// sim models for development).
func DefaultConfig() Config {
	return Config{
		DefaultBudget:       30 * time.Second,
		HopReserve:          200 * time.Millisecond,
		MaxPromptBytes:      1 << 20,
		EmbeddingsCache:     EmbeddingsCacheConfig{MaxBytes: 64 << 20, TTL: 24 * time.Hour},
		QuotaFailOpen:       true,
		FirstTokenTimeout:   10 * time.Second,
		StallTimeout:        10 * time.Second,
		StreamRescueShare:   0.3,
		SideScouts:          true,
		AsyncCacheStore:     true,
		MaxAsyncCacheStores: 256,
		Retry: RetryConfig{
			MaxRetries:    2,
			BackoffBase:   300 * time.Millisecond,
			BackoffCap:    1500 * time.Millisecond,
			MaxRetryAfter: 5 * time.Second,
		},
		RetryBudget: resilience.DefaultBudgetConfig(),
		// Hedging at a key's p95 sends about one request in twenty twice; twice that leaves
		// room for a tail that grew, and no more.
		HedgeBudget: HedgeBudgetConfig{Ratio: 0.1, Floor: 10, Window: time.Minute},
		Breaker:     defaultBreaker(),
		Idempotency: IdempotencyConfig{Backend: "memory", TTL: 24 * time.Hour, InflightTTL: time.Minute, MaxRecordsPerTenant: 100000},
		Status:      StatusConfig{Refresh: 5 * time.Second, RecentDegradations: 50},
		// At 20 ms P90 for a CPU, requests already queue for seconds behind locks whose
		// holders wait for one (docs/design/010-shed-on-a-short-cpu-wait.md); 64 in flight
		// keeps a process with little to do from shedding.
		Overload: overload.Config{MaxSchedulingDelay: 20 * time.Millisecond, MinInFlight: 64, MaxShare: 0.9},
	}
}

// Validate checks the block; messages name the key. Each part of the block has a
// validator of its own; the errors come in the order of the keys they name.
func (c Config) Validate() error {
	var p problems
	c.validateLimits(&p)
	c.Status.validate(&p)
	if c.EmbeddingsCache.MaxBytes < 0 || c.EmbeddingsCache.TTL < 0 {
		p.add("embeddings_cache: max_bytes and ttl must not be negative, got %d and %s", c.EmbeddingsCache.MaxBytes, c.EmbeddingsCache.TTL)
	}
	providerType := c.validateProviders(&p)
	models := c.validateModels(&p, providerType)
	c.validateRoutes(&p, models)
	if len(c.Models) == 0 {
		p.add("models: at least one model is required")
	}
	c.validateResilience(&p)
	c.Idempotency.validate(&p)
	c.validateRouteFallbacks(&p, models)
	for _, name := range slices.Sorted(maps.Keys(c.SimProfiles)) {
		if err := c.SimProfiles[name].Validate(); err != nil {
			p.add("sim_profiles.%s: %v", name, err)
		}
	}
	return errors.Join(p...)
}

// problems collects a configuration's errors, each naming its key.
type problems []error

func (p *problems) add(format string, args ...any) { *p = append(*p, fmt.Errorf(format, args...)) }

// validateLimits checks the block's own keys: the budget, the request bounds and the
// addresses of the other services.
func (c Config) validateLimits(p *problems) {
	if c.DefaultBudget <= 0 {
		p.add("default_budget: must be positive, got %s", c.DefaultBudget)
	}
	if c.HopReserve < 0 || c.HopReserve >= c.DefaultBudget {
		p.add("hop_reserve: must be between 0 and default_budget, got %s", c.HopReserve)
	}
	if c.MaxPromptBytes <= 0 {
		p.add("max_prompt_bytes: must be positive, got %d", c.MaxPromptBytes)
	}
	if c.QuotaFallbackRPM < 0 {
		p.add("quota_fallback_rpm: must not be negative, got %d", c.QuotaFallbackRPM)
	}
	if c.MaxOutputTokens < 0 {
		p.add("max_output_tokens: must not be negative, got %d", c.MaxOutputTokens)
	}
	if c.MaxAsyncCacheStores < 1 || c.MaxAsyncCacheStores > maxAsyncCacheStoresLimit {
		p.add("max_async_cache_stores: want 1 to %d (async_cache_store: false makes every store before its answer), got %d", maxAsyncCacheStoresLimit, c.MaxAsyncCacheStores)
	}
	for _, a := range []struct{ key, value string }{
		{"quota_address", c.QuotaAddress}, {"cache_address", c.CacheAddress}, {"verifier_address", c.VerifierAddress},
		{"agent_address", c.AgentAddress},
	} {
		// "OFF" would be dialled as a host name and fail on every request, later.
		if a.value != Off && strings.EqualFold(a.value, Off) {
			p.add("%s: write %q to run without the service, got %q", a.key, Off, a.value)
		}
	}
}

func (s StatusConfig) validate(p *problems) {
	if s.Refresh != 0 && s.Refresh < time.Second {
		p.add("status.refresh: want 0 (off) or at least 1s, got %s", s.Refresh)
	}
	if s.RecentDegradations < 0 || s.RecentDegradations > 10000 {
		p.add("status.recent_degradations: want 0 to 10000, got %d", s.RecentDegradations)
	}
}

// validateProviders checks the providers and returns each name's type.
func (c Config) validateProviders(p *problems) map[string]string {
	providerType := map[string]string{}
	for i, pc := range c.Providers {
		key := fmt.Sprintf("providers[%d]", i)
		switch _, dup := providerType[pc.Name]; {
		case pc.Name == "":
			p.add("%s.name: required", key)
		case dup:
			p.add("%s.name: duplicate provider %q", key, pc.Name)
		}
		providerType[pc.Name] = pc.Type
		pc.validate(p, key)
	}
	return providerType
}

func (pc ProviderConfig) validate(p *problems, key string) {
	if !slices.Contains([]string{ProviderOpenAI, ProviderAnthropic, ProviderSim}, pc.Type) {
		p.add("%s.type: want openai, anthropic or sim, got %q", key, pc.Type)
	}
	if pc.Type != ProviderSim && len(pc.Keys) == 0 {
		p.add("%s.keys: at least one key is required for type %s", key, pc.Type)
	}
	for j, k := range pc.Keys {
		if k.ID == "" {
			p.add("%s.keys[%d].id: required", key, j)
		}
		if k.Env == "" {
			p.add("%s.keys[%d].env: required (keys come from environment variables only)", key, j)
		}
	}
	if pc.Timeout <= 0 {
		p.add("%s.timeout: must be positive, got %s", key, pc.Timeout)
	}
	if pc.DialTimeout < 0 || (pc.Timeout > 0 && pc.dialTimeout() >= pc.Timeout) {
		p.add("%s.dial_timeout: must be positive and below timeout (%s), got %s", key, pc.Timeout, pc.dialTimeout())
	}
}

// validateModels checks the models against the providers and returns the set of their
// names.
func (c Config) validateModels(p *problems, providerType map[string]string) map[string]bool {
	models := map[string]bool{}
	for i, m := range c.Models {
		key := fmt.Sprintf("models[%d]", i)
		switch {
		case m.Name == "":
			p.add("%s.name: required", key)
		case models[m.Name]:
			p.add("%s.name: duplicate model %q", key, m.Name)
		}
		models[m.Name] = true
		if _, known := providerType[m.Provider]; !known {
			p.add("%s.provider: unknown provider %q", key, m.Provider)
		}
		if m.embeddings() && providerType[m.Provider] == ProviderAnthropic {
			p.add("%s.capabilities.embeddings: provider %q is of type anthropic, whose API has no embeddings", key, m.Provider)
		}
		if m.InputPricePerMillion < 0 || m.OutputPricePerMillion < 0 {
			p.add("%s: prices must not be negative", key)
		}
	}
	return models
}

// validateRoutes checks the routes' names, candidates and budgets.
func (c Config) validateRoutes(p *problems, models map[string]bool) {
	routes := map[string]bool{}
	for i, r := range c.Routes {
		key := fmt.Sprintf("routes[%d]", i)
		switch {
		case r.Name == "":
			p.add("%s.name: required", key)
		case models[r.Name]:
			p.add("%s.name: %q is already a model name", key, r.Name)
		case routes[r.Name]:
			p.add("%s.name: duplicate route %q", key, r.Name)
		}
		routes[r.Name] = true
		if r.Scenario != "" && !validLabel(r.Scenario) {
			p.add("%s.scenario: must be 1 to %d characters of a-z, A-Z, 0-9, '_', '-', '.' or ':', got %q", key, maxLabelBytes, r.Scenario)
		}
		c.validateCandidates(p, key, r, models)
		if r.Budget < 0 {
			p.add("%s.budget: must not be negative", key)
		}
		if r.Budget > 0 && r.Budget <= c.HopReserve {
			p.add("%s.budget: must be more than hop_reserve (%s), got %s", key, c.HopReserve, r.Budget)
		}
	}
}

// validateCandidates checks that the route r (at key) has candidates, all of them known
// models of one kind.
func (c Config) validateCandidates(p *problems, key string, r RouteConfig, models map[string]bool) {
	if len(r.Candidates) == 0 {
		p.add("%s.candidates: at least one model is required", key)
	}
	for j, m := range r.Candidates {
		if !models[m] {
			p.add("%s.candidates[%d]: unknown model %q", key, j, m)
		}
	}
	// A route answers chat or embeddings, not both: a chat model cannot embed, and
	// vectors of two kinds of model would not compare.
	kinds := map[bool]string{}
	names := append(slices.Clone(r.Candidates), r.Ladder.Smaller...)
	for _, name := range []string{r.Ladder.FastAnswer.Model, r.ContextCompression.Model} {
		if name != "" {
			names = append(names, name)
		}
	}
	for _, name := range names {
		for _, m := range c.Models {
			if m.Name == name {
				kinds[m.embeddings()] = name
			}
		}
	}
	if len(kinds) > 1 {
		p.add("%s.candidates: %q is an embeddings model and %q a chat model; a route has one kind", key, kinds[true], kinds[false])
	}
}

// validateResilience checks retries, stream limits, budgets, breakers and overload.
func (c Config) validateResilience(p *problems) {
	if c.Retry.MaxRetries < 0 {
		p.add("retry.max_retries: must not be negative, got %d", c.Retry.MaxRetries)
	}
	if c.Retry.BackoffBase <= 0 || c.Retry.BackoffCap < c.Retry.BackoffBase {
		p.add("retry: backoff_base must be positive and backoff_cap at least backoff_base, got %s and %s", c.Retry.BackoffBase, c.Retry.BackoffCap)
	}
	if c.Retry.MaxRetryAfter < 0 {
		p.add("retry.max_retry_after: must not be negative, got %s", c.Retry.MaxRetryAfter)
	}
	if c.FirstTokenTimeout <= 0 || c.StallTimeout <= 0 {
		p.add("first_token_timeout and stall_timeout: must be positive, got %s and %s", c.FirstTokenTimeout, c.StallTimeout)
	}
	if !(c.StreamRescueShare >= 0 && c.StreamRescueShare < 1) {
		p.add("stream_rescue_share: must be at least 0 and below 1, got %v", c.StreamRescueShare)
	}
	if err := c.RetryBudget.Validate(); err != nil {
		p.add("retry_budget.%v", err)
	}
	if c.HedgeBudget.Ratio < 0 || c.HedgeBudget.Ratio > 1 {
		p.add("hedge_budget.ratio: want 0 to 1, got %v", c.HedgeBudget.Ratio)
	} else if err := c.HedgeBudget.budget().Validate(); err != nil {
		p.add("hedge_budget.%v", err)
	}
	if err := c.Breaker.Validate(); err != nil {
		p.add("breaker.%v", err)
	}
	if err := c.Overload.Validate(); err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			p.add("overload.%s", line)
		}
	}
}

func (c IdempotencyConfig) validate(p *problems) {
	if !slices.Contains([]string{"memory", "jetstream"}, c.Backend) {
		p.add("idempotency.backend: want memory or jetstream, got %q", c.Backend)
	}
	if c.MaxRecordsPerTenant < 0 {
		p.add("idempotency.max_records_per_tenant: must not be negative (0: no bound), got %d", c.MaxRecordsPerTenant)
	}
	if c.TTL <= 0 || c.InflightTTL <= 0 {
		p.add("idempotency: ttl and inflight_ttl must be positive, got %s and %s", c.TTL, c.InflightTTL)
	}
}

// validateRouteFallbacks checks each route's ladder, hedge and stream limits.
func (c Config) validateRouteFallbacks(p *problems, models map[string]bool) {
	for i, r := range c.Routes {
		key := fmt.Sprintf("routes[%d]", i)
		for j, m := range r.Ladder.Smaller {
			if !models[m] {
				p.add("%s.ladder.smaller[%d]: unknown model %q", key, j, m)
			}
		}
		if fa := r.Ladder.FastAnswer; fa.Model != "" || fa.Prompt != "" || fa.MaxTokens != 0 {
			switch {
			case !models[fa.Model]:
				p.add("%s.ladder.fast_answer.model: unknown model %q", key, fa.Model)
			case strings.TrimSpace(fa.Prompt) == "":
				p.add("%s.ladder.fast_answer.prompt: required with a model (it replaces the request's system messages)", key)
			case fa.MaxTokens < 0:
				p.add("%s.ladder.fast_answer.max_tokens: must not be negative, got %d", key, fa.MaxTokens)
			}
		}
		if cc := r.ContextCompression; cc.Model != "" || cc.KeepRecent != 0 || cc.MaxSummaryTokens != 0 || cc.Prompt != "" {
			switch {
			case !models[cc.Model]:
				p.add("%s.context_compression.model: unknown model %q", key, cc.Model)
			case cc.KeepRecent < 0 || cc.MaxSummaryTokens < 0:
				p.add("%s.context_compression: keep_recent and max_summary_tokens must not be negative", key)
			}
		}
		switch r.Ladder.ForceLevel {
		case "", ForceCache, ForceTemplate:
		default:
			p.add("%s.ladder.force_level: want empty, cache or template, got %q", key, r.Ladder.ForceLevel)
		}
		if r.Ladder.ForceLevel == ForceCache && !r.Ladder.Cache {
			p.add("%s.ladder.force_level: cache needs ladder.cache: true", key)
		}
		if r.Ladder.ForceLevel == ForceCache && c.CacheAddress == Off {
			p.add("%s.ladder.force_level: cache needs the cache service, and cache_address is off", key)
		}
		if r.Hedge.MinDelay < 0 || (r.Hedge.MaxDelay > 0 && r.Hedge.MaxDelay < r.Hedge.MinDelay) {
			p.add("%s.hedge: min_delay must not be negative nor above max_delay", key)
		}
		if r.FirstTokenTimeout < 0 || r.StallTimeout < 0 {
			p.add("%s: first_token_timeout and stall_timeout must not be negative", key)
		}
	}
}

// simProfile resolves a sim_profile name: the configuration's own profiles first, then the
// built-in ones.
func (c Config) simProfile(name string) (sim.Profile, bool) {
	if p, ok := c.SimProfiles[name]; ok {
		if p.Name == "" {
			p.Name = name
		}
		return p, true
	}
	return sim.Builtin(name)
}

// simProfileNames lists every name simProfile resolves, for error messages.
func (c Config) simProfileNames() []string {
	names := sim.ProfileNames()
	for name := range c.SimProfiles {
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// defaultBreaker is the resilience default with a slow-call rule that trips on a long-tail
// incident: a provider with 30% of its calls over 8 s is in trouble although it returns no
// errors, and with a 50% rate it would never trip on such a tail.
//
// The open period starts at 30 s, doubling per re-trip up to 5 min, and while open a scout
// (one request admitted to the open key) goes every 5 s (+-20%). The doubling spares an
// upstream in a long outage; scouts make a recovery seen quickly whatever the outage's
// length. With requests every 4 s against a primary down for a minute, a scout interval
// of the open period (30 s) left the recovered primary unused for 40 s and more (a scout
// and the half-open probe both fell inside the outage, and the doubled period outlasted
// the traffic); every 5 s the primary answers again within 10 s of its recovery (a scout
// due 4 to 6 s after the last one, then the next request). A dead upstream gets one
// scout per 5 s per breaker (key and scenario) and replica; a scout that fails fails the
// request over like any failure, and neither lengthens the open period.
func defaultBreaker() BreakerConfig {
	b := resilience.DefaultBreakerConfig()
	b.SlowCall, b.SlowCallRate = 8*time.Second, 0.25
	b.ScoutInterval = 5 * time.Second
	return b
}

// embeddings reports whether m is an embeddings model.
func (m ModelConfig) embeddings() bool { return m.Capabilities != nil && m.Capabilities.Embeddings }
