package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"time"

	"github.com/mantle-mesh/mantle/pkg/formatcheck"
	"github.com/mantle-mesh/mantle/pkg/resilience"
	"github.com/mantle-mesh/mantle/services/agent/internal/session"
)

// ServiceName is the agent's module name (--target=agent).
const ServiceName = "agent"

// Tool kinds, as written in agent.tools[].kind.
const (
	KindQuery    = "query"
	KindAction   = "action"
	KindExternal = "external"
)

// Backend types, as written in agent.tools[].backend.type.
const (
	BackendHTTP = "http"
	BackendMCP  = "mcp"
)

// Idempotency backends, as written in agent.idempotency.backend.
const (
	IdempotencyMemory    = "memory"
	IdempotencyJetStream = "jetstream"
)

// Config is the agent block of mantle.yaml: the tool registry and the limits of tool
// calls. The registry reloads without a restart; breakers, bulkheads and stale results of
// tools whose configuration did not change survive a reload.
//
//	agent:
//	  tools:
//	    - name: weather
//	      description: Current weather for a city.
//	      kind: query
//	      input_schema: {type: object, properties: {city: {type: string}}, required: [city]}
//	      backend: {type: http, url: "http://weather.internal/v1/current"}
//	      timeout: 2s
//	      backup: weather-backup
//	      cache: {ttl: 1m, max_staleness: 30m}
//	    - name: place-order
//	      kind: action
//	      input_schema: {type: object, properties: {sku: {type: string}, qty: {type: integer}}}
//	      backend: {type: mcp, url: "http://shop.internal/mcp", tool: order}
type Config struct {
	// Tools is the tool registry; names are unique.
	Tools []ToolConfig `yaml:"tools"`
	// MaxArgumentBytes bounds a call's arguments (JSON text).
	MaxArgumentBytes int `yaml:"max_argument_bytes"`
	// MaxArgumentDepth bounds the nesting of a call's arguments.
	MaxArgumentDepth int `yaml:"max_argument_depth"`
	// MaxArgumentNodes bounds the number of values (objects, arrays, scalars) in a call's
	// arguments.
	MaxArgumentNodes int `yaml:"max_argument_nodes"`
	// MaxResultBytes bounds what a backend may answer; a longer answer is a bad response.
	MaxResultBytes int `yaml:"max_result_bytes"`
	// Idempotency keeps the records that make an action run at most once per key.
	Idempotency IdempotencyConfig `yaml:"idempotency"`
	// Stale bounds the per-replica store of last good query results that the stale gear
	// answers from.
	Stale StaleConfig `yaml:"stale"`
	// Sessions keeps agent sessions: where they live, their budgets, how much of their
	// steps' results is recorded, sticky degradation and the cap on parallel tool calls
	// (docs/agents.md#sessions).
	Sessions session.Config `yaml:"sessions"`
}

// ToolConfig is one tool of the registry.
type ToolConfig struct {
	// Name is how agents call the tool: 1 to 64 characters of [A-Za-z0-9_.-].
	Name string `yaml:"name"`
	// Description tells a model what the tool does and when to call it.
	Description string `yaml:"description"`
	// Kind is query (no side effects), action (side effects: never retried, idempotency
	// key, confirmation) or external (a third party's query, rate limited).
	Kind string `yaml:"kind"`
	// InputSchema is the JSON Schema of the arguments, as a YAML mapping; a call whose
	// arguments do not validate never reaches the backend. Empty: any JSON object.
	InputSchema map[string]any `yaml:"input_schema"`
	// OutputSchema is the JSON Schema of the result, when the tool declares one; a result
	// that does not validate is a bad response.
	OutputSchema map[string]any `yaml:"output_schema"`
	// Backend is where the tool runs.
	Backend BackendConfig `yaml:"backend"`
	// Timeout bounds one backend call, within what is left of the caller's deadline
	// (default 10s).
	Timeout time.Duration `yaml:"timeout"`
	// Retry is the backoff of query and external tools; action tools are never retried
	// and must leave it unset. Left out, a query tool retries twice (base 1s, multiplier 4,
	// max_delay 4s: the first retry after 0.5-1 s, the second after 2-4 s); max_retries: 0
	// with any other key set turns retries off.
	Retry RetryConfig `yaml:"retry"`
	// Backup is the tool called when this one fails (query and external tools): a tool of
	// the registry of the same kind family, without cycles.
	Backup string `yaml:"backup"`
	// Cache keeps results of query and external tools: fresh within ttl (answered without
	// a backend call), and kept as a stale fallback for max_staleness.
	Cache CacheConfig `yaml:"cache"`
	// RateLimit bounds calls to the backend per replica; external tools need one.
	RateLimit RateLimitConfig `yaml:"rate_limit"`
	// Breaker is the tool's circuit breaker; unset keys take the defaults (the router's,
	// with min_calls 10 and slow_call the tool's timeout).
	Breaker resilience.BreakerConfig `yaml:"breaker"`
	// MaxInFlight is the tool's bulkhead: calls in flight at once on a replica; a call
	// beyond it does not queue, it goes to the next gear (default 64).
	MaxInFlight int `yaml:"max_in_flight"`
	// RetryBudget caps retries and backup calls as a share of the tool's calls, so that an
	// outage cannot multiply the load on it; unset keys take the defaults (ratio 0.2,
	// floor 5, window 1m).
	RetryBudget resilience.BudgetConfig `yaml:"retry_budget"`
}

// BackendConfig says where a tool runs.
type BackendConfig struct {
	// Type is http (POST the arguments as JSON to url; the answer's body is the result) or
	// mcp (call tool on the MCP server at url over streamable HTTP).
	Type string `yaml:"type"`
	// URL is the endpoint (http) or the MCP server (mcp): http or https.
	URL string `yaml:"url"`
	// Tool is the MCP server's name of the tool (mcp); empty means the registry's name.
	Tool string `yaml:"tool"`
	// HeadersEnv adds headers to every call, each value read from the environment
	// variable named (header name: variable), so that credentials stay out of the file.
	HeadersEnv map[string]string `yaml:"headers_env"`
}

// RetryConfig is a query tool's backoff: retry n waits a uniformly drawn delay in
// [d/2, d] with d = min(base * multiplier^n, max_delay).
type RetryConfig struct {
	// MaxRetries is how many times a failed call is retried on the same tool.
	MaxRetries int `yaml:"max_retries"`
	// Base is the first retry's upper delay.
	Base time.Duration `yaml:"base"`
	// Multiplier grows the delay from one retry to the next.
	Multiplier float64 `yaml:"multiplier"`
	// MaxDelay caps a retry's delay.
	MaxDelay time.Duration `yaml:"max_delay"`
}

// CacheConfig keeps results of a query tool.
type CacheConfig struct {
	// TTL is how long a result answers the same call without a backend call; 0 turns the
	// fresh cache off.
	TTL time.Duration `yaml:"ttl"`
	// MaxStaleness is how old a last good result may be and still answer, marked stale,
	// when every backend failed; 0 turns the stale gear off.
	MaxStaleness time.Duration `yaml:"max_staleness"`
}

// RateLimitConfig is a token bucket per tool and replica.
type RateLimitConfig struct {
	// PerSecond is the sustained rate of backend calls; 0 is unlimited.
	PerSecond float64 `yaml:"per_second"`
	// Burst is how many calls may go at once above the rate.
	Burst int `yaml:"burst"`
}

// IdempotencyConfig keeps action records.
type IdempotencyConfig struct {
	// Backend is memory (this replica only) or jetstream (a KV bucket every replica
	// shares; needs NATS). Without NATS, jetstream refuses actions and serves queries.
	Backend string `yaml:"backend"`
	// Bucket is the JetStream KV bucket.
	Bucket string `yaml:"bucket"`
	// TTL is how long a key's record answers a repeated call.
	TTL time.Duration `yaml:"ttl"`
}

// StaleConfig bounds the stale-result store.
type StaleConfig struct {
	// MaxEntries bounds results kept per tool.
	MaxEntries int `yaml:"max_entries"`
	// MaxBytes bounds the store's results in total.
	MaxBytes int `yaml:"max_bytes"`
}

// DefaultConfig returns the built-in defaults: an empty registry.
func DefaultConfig() Config {
	return Config{
		MaxArgumentBytes: 64 << 10,
		MaxArgumentDepth: 32,
		MaxArgumentNodes: 10000,
		MaxResultBytes:   1 << 20,
		Idempotency:      IdempotencyConfig{Backend: IdempotencyJetStream, Bucket: "mantle_tool_actions", TTL: 24 * time.Hour},
		Stale:            StaleConfig{MaxEntries: 1000, MaxBytes: 32 << 20},
		Sessions:         session.DefaultConfig(),
	}
}

var toolNamePattern = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// Validate checks the block; each message names its key.
func (c Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.MaxArgumentBytes <= 0 || c.MaxArgumentBytes > 16<<20 {
		add("max_argument_bytes: want 1 to 16 MiB, got %d", c.MaxArgumentBytes)
	}
	if c.MaxArgumentDepth <= 0 || c.MaxArgumentDepth > 1000 {
		add("max_argument_depth: want 1 to 1000, got %d", c.MaxArgumentDepth)
	}
	if c.MaxArgumentNodes <= 0 {
		add("max_argument_nodes: must be positive, got %d", c.MaxArgumentNodes)
	}
	if c.MaxResultBytes <= 0 || c.MaxResultBytes > 64<<20 {
		add("max_result_bytes: want 1 to 64 MiB, got %d", c.MaxResultBytes)
	}
	switch c.Idempotency.Backend {
	case IdempotencyMemory, IdempotencyJetStream:
	default:
		add("idempotency.backend: want memory or jetstream, got %q", c.Idempotency.Backend)
	}
	if c.Idempotency.Bucket == "" {
		add("idempotency.bucket: required")
	}
	if c.Idempotency.TTL <= 0 {
		add("idempotency.ttl: must be positive, got %s", c.Idempotency.TTL)
	}
	if c.Stale.MaxEntries <= 0 {
		add("stale.max_entries: must be positive, got %d", c.Stale.MaxEntries)
	}
	if c.Stale.MaxBytes <= 0 {
		add("stale.max_bytes: must be positive, got %d", c.Stale.MaxBytes)
	}
	if err := c.Sessions.Validate(); err != nil {
		for _, e := range joined(err) {
			add("sessions.%w", e)
		}
	}
	checker, err := formatcheck.New(formatcheck.DefaultConfig())
	if err != nil {
		return err
	}
	byName := map[string]int{}
	for i, t := range c.Tools {
		at := fmt.Sprintf("tools[%d]", i)
		if !toolNamePattern.MatchString(t.Name) {
			add("%s.name: want 1 to 64 characters of [A-Za-z0-9_.-], got %q", at, t.Name)
		} else if j, dup := byName[t.Name]; dup {
			add("%s.name: %q is already tools[%d]", at, t.Name, j)
		} else {
			byName[t.Name] = i
		}
		for _, err := range t.withDefaults().validate() {
			add("%s.%w", at, err)
		}
		if err := checkSchema(checker, t.InputSchema); err != nil {
			add("%s.input_schema: %w", at, err)
		}
		if err := checkSchema(checker, t.OutputSchema); err != nil {
			add("%s.output_schema: %w", at, err)
		}
	}
	errs = append(errs, validateBackups(c.Tools, byName)...)
	return errors.Join(errs...)
}

// validate checks one tool on its own; Config.Validate adds what needs the registry.
func (t ToolConfig) validate() []error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	switch t.Kind {
	case KindQuery, KindAction, KindExternal:
	default:
		add("kind: want query, action or external, got %q", t.Kind)
	}
	switch t.Backend.Type {
	case BackendHTTP, BackendMCP:
	default:
		add("backend.type: want http or mcp, got %q", t.Backend.Type)
	}
	if u, err := url.Parse(t.Backend.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		add("backend.url: want an http or https URL, got %q", t.Backend.URL)
	} else if u.User != nil {
		add("backend.url: credentials in the URL would be logged and shown; use backend.headers_env")
	}
	if t.Backend.Tool != "" && t.Backend.Type != BackendMCP {
		add("backend.tool: only for mcp backends")
	}
	if t.Timeout <= 0 {
		add("timeout: must be positive, got %s", t.Timeout)
	}
	if t.Kind == KindAction {
		if t.Retry != (RetryConfig{}) {
			add("retry: action tools are never retried; remove the block")
		}
		if t.Backup != "" {
			add("backup: action tools have no backup (a second backend could run the action twice)")
		}
		if t.Cache != (CacheConfig{}) {
			add("cache: action tools' results are not cached")
		}
	}
	if t.Retry.MaxRetries < 0 || t.Retry.MaxRetries > 5 {
		add("retry.max_retries: want 0 to 5, got %d", t.Retry.MaxRetries)
	}
	if t.Retry.MaxRetries > 0 {
		if t.Retry.Base <= 0 {
			add("retry.base: must be positive, got %s", t.Retry.Base)
		}
		if t.Retry.Multiplier < 1 {
			add("retry.multiplier: must be at least 1, got %v", t.Retry.Multiplier)
		}
		if t.Retry.MaxDelay < t.Retry.Base {
			add("retry.max_delay: must be at least base (%s), got %s", t.Retry.Base, t.Retry.MaxDelay)
		}
	}
	if t.Cache.TTL < 0 || t.Cache.MaxStaleness < 0 {
		add("cache: ttl and max_staleness must not be negative")
	}
	if t.RateLimit.PerSecond < 0 {
		add("rate_limit.per_second: must not be negative, got %v", t.RateLimit.PerSecond)
	}
	if t.RateLimit.PerSecond > 0 && t.RateLimit.Burst < 1 {
		add("rate_limit.burst: must be at least 1 with a rate, got %d", t.RateLimit.Burst)
	}
	if t.Kind == KindExternal && t.RateLimit.PerSecond == 0 {
		add("rate_limit: external tools need one (per_second and burst)")
	}
	if t.MaxInFlight <= 0 {
		add("max_in_flight: must be positive, got %d", t.MaxInFlight)
	}
	if err := t.Breaker.Validate(); err != nil {
		add("breaker.%w", err)
	}
	if err := t.RetryBudget.Validate(); err != nil {
		add("retry_budget.%w", err)
	}
	return errs
}

// family groups kinds whose tools may stand in for each other: a query's backup is a
// query or an external tool; actions have none.
func family(kind string) string {
	if kind == KindExternal {
		return KindQuery
	}
	return kind
}

// validateBackups checks that every backup names a tool of the same family and that
// following backups never comes back to a tool.
func validateBackups(tools []ToolConfig, byName map[string]int) []error {
	var errs []error
	for i, t := range tools {
		if t.Backup == "" {
			continue
		}
		j, ok := byName[t.Backup]
		if !ok {
			errs = append(errs, fmt.Errorf("tools[%d].backup: no tool %q in the registry", i, t.Backup))
			continue
		}
		if family(tools[j].Kind) != family(t.Kind) {
			errs = append(errs, fmt.Errorf("tools[%d].backup: %q is a %s tool; a %s tool's backup must be a query or external tool", i, t.Backup, tools[j].Kind, t.Kind))
		}
		seen := map[string]bool{t.Name: true}
		for next := t.Backup; next != ""; {
			if seen[next] {
				errs = append(errs, fmt.Errorf("tools[%d].backup: the backups of %q come back to %q (a cycle)", i, t.Name, next))
				break
			}
			seen[next] = true
			k, ok := byName[next]
			if !ok {
				break
			}
			next = tools[k].Backup
		}
	}
	return errs
}

// Defaults of a tool's keys left out.
const (
	defaultToolTimeout     = 10 * time.Second
	defaultToolMaxInFlight = 64
)

// defaultRetry is a query tool's backoff when its retry block is left out.
var defaultRetry = RetryConfig{MaxRetries: 2, Base: time.Second, Multiplier: 4, MaxDelay: 4 * time.Second}

// withDefaults fills the keys a tool left out.
func (t ToolConfig) withDefaults() ToolConfig {
	if t.Timeout == 0 {
		t.Timeout = defaultToolTimeout
	}
	if t.MaxInFlight == 0 {
		t.MaxInFlight = defaultToolMaxInFlight
	}
	if t.Kind != KindAction && t.Retry == (RetryConfig{}) {
		t.Retry = defaultRetry
	}
	t.Breaker = fillBreaker(t.Breaker, t.Timeout)
	t.RetryBudget = fillBudget(t.RetryBudget)
	return t
}

// fillBreaker gives every key left at zero the tool default.
func fillBreaker(c resilience.BreakerConfig, timeout time.Duration) resilience.BreakerConfig {
	d := resilience.DefaultBreakerConfig()
	d.MinCalls = 10
	d.SlowCall = timeout
	fill(&c.Window, d.Window)
	fill(&c.Buckets, d.Buckets)
	fill(&c.MinCalls, d.MinCalls)
	fill(&c.FailureRate, d.FailureRate)
	fill(&c.SlowCall, d.SlowCall)
	fill(&c.SlowCallRate, d.SlowCallRate)
	fill(&c.ConsecutiveFailures, d.ConsecutiveFailures)
	fill(&c.OpenDuration, d.OpenDuration)
	fill(&c.MaxOpenDuration, d.MaxOpenDuration)
	fill(&c.OpenJitter, d.OpenJitter)
	fill(&c.HalfOpenProbes, d.HalfOpenProbes)
	return c
}

// fillBudget gives every key left at zero the tool default.
func fillBudget(c resilience.BudgetConfig) resilience.BudgetConfig {
	d := resilience.DefaultBudgetConfig()
	d.Floor = 5
	fill(&c.Ratio, d.Ratio)
	fill(&c.Floor, d.Floor)
	fill(&c.Window, d.Window)
	fill(&c.Buckets, d.Buckets)
	fill(&c.FormatOnlyAbove, d.FormatOnlyAbove)
	return c
}

func fill[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// checkSchema reports a schema mapping that is not a JSON Schema mantle can compile, under
// the bounds every schema in mantle has (formatcheck's).
func checkSchema(checker *formatcheck.Checker, schema map[string]any) error {
	doc, err := compactJSON(schema)
	if err != nil {
		return fmt.Errorf("not representable as JSON: %w", err)
	}
	if doc == "" {
		return nil
	}
	return checker.CompileSchema(context.Background(), doc)
}

// compactJSON re-encodes a schema mapping from the configuration as JSON text ("" for
// none).
func compactJSON(v map[string]any) (string, error) {
	if len(v) == 0 {
		return "", nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// joined lists the errors errors.Join put together (or err alone).
func joined(err error) []error {
	var j interface{ Unwrap() []error }
	if errors.As(err, &j) {
		return j.Unwrap()
	}
	return []error{err}
}
