package session

import (
	"errors"
	"fmt"
	"time"
)

// Backends, as written in agent.sessions.backend.
const (
	BackendMemory    = "memory"
	BackendJetStream = "jetstream"
)

// Config is the agent.sessions block: where sessions live, their default and largest
// budgets, how much of their results is recorded, and how they degrade.
type Config struct {
	// Backend is memory (this replica only: a resumed session must come back to it) or
	// jetstream (a KV bucket every replica shares, so any replica serves a session's next
	// step; needs NATS).
	Backend string `yaml:"backend"`
	// Bucket is the JetStream KV bucket.
	Bucket string `yaml:"bucket"`
	// MaxBucketBytes bounds the bucket's size; a new session or result past it is refused
	// (0: the server's limits only).
	MaxBucketBytes int64 `yaml:"max_bucket_bytes"`
	// MaxMemoryKeys bounds the memory backend: sessions and recorded results together.
	MaxMemoryKeys int `yaml:"max_memory_keys"`
	// Retention is how long a session is kept after its deadline, for GetSession and for
	// an agent resuming it: every change keeps it until its deadline plus retention.
	Retention time.Duration `yaml:"retention"`
	// DefaultBudget is a new session's budget where its first step asks for none.
	DefaultBudget BudgetConfig `yaml:"default_budget"`
	// MaxBudget is the largest budget a session may ask for; a larger ask is refused.
	MaxBudget BudgetConfig `yaml:"max_budget"`
	// MaxModelResultBytes bounds a model step's recorded result; a larger one is not
	// recorded (the step is marked record_too_large and runs again on a resume).
	MaxModelResultBytes int `yaml:"max_model_result_bytes"`
	// MaxToolResultBytes bounds a tool step's recorded result, as max_model_result_bytes.
	MaxToolResultBytes int `yaml:"max_tool_result_bytes"`
	// MaxSessionResultBytes bounds the results one session records in total.
	MaxSessionResultBytes int `yaml:"max_session_result_bytes"`
	// MaxStepLease bounds how long a running step holds its step id when its caller set no
	// deadline: past it the runner is presumed gone and the step may be begun again.
	MaxStepLease time.Duration `yaml:"max_step_lease"`
	// NewSessionsPerMinute bounds the sessions one tenant opens per minute on one replica,
	// so that no tenant fills the store that every tenant's sessions share.
	NewSessionsPerMinute int `yaml:"new_sessions_per_minute"`
	// Degradation keeps a degraded session degraded (sticky) and decides when it recovers.
	Degradation DegradationConfig `yaml:"degradation"`
	// Scheduler caps a session's parallel tool calls, lower while a tool times out.
	Scheduler SchedulerConfig `yaml:"scheduler"`
}

// BudgetConfig bounds a session.
type BudgetConfig struct {
	// Deadline is the session's wall-clock time from its first step.
	Deadline time.Duration `yaml:"deadline"`
	// MaxTokens bounds model tokens (input and output) over the session's steps.
	MaxTokens int64 `yaml:"max_tokens"`
	// MaxCostUSD bounds the money the session's steps cost, in US dollars.
	MaxCostUSD float64 `yaml:"max_cost_usd"`
	// MaxSteps bounds the steps the session begins (replays are not counted).
	MaxSteps int `yaml:"max_steps"`
}

// DegradationConfig is sticky degradation.
type DegradationConfig struct {
	// StickyFor is how long a session that degraded (a fallback model, a backup or stale
	// tool result) keeps serving its degraded form before one step tries the full form.
	StickyFor time.Duration `yaml:"sticky_for"`
	// RecoveryInterval is how long a session waits for its next recovery try after one
	// that degraded again or failed.
	RecoveryInterval time.Duration `yaml:"recovery_interval"`
	// ConfirmActionsAfter is the number of degradations after which the session's action
	// tools need a person's confirmation before they run (0: never).
	ConfirmActionsAfter int `yaml:"confirm_actions_after"`
}

// SchedulerConfig caps parallel tool calls. A tool whose calls time out at timeout_rate
// or more (over min_calls calls in a window) halves the cap of the sessions that call it,
// then takes them to one call at a time; each window without timeouts steps the cap back
// up.
type SchedulerConfig struct {
	// ParallelCap is a session's cap on tool calls running at once when no tool times out.
	ParallelCap int `yaml:"parallel_cap"`
	// TimeoutRate is the share of a tool's calls that time out at which the cap drops.
	TimeoutRate float64 `yaml:"timeout_rate"`
	// MinCalls is how many calls a window needs before its timeout rate counts.
	MinCalls int `yaml:"min_calls"`
	// Window is the period over which a tool's timeout rate is measured; the cap moves at
	// most one level per window.
	Window time.Duration `yaml:"window"`
}

// DefaultConfig returns the built-in defaults.
func DefaultConfig() Config {
	return Config{
		Backend:               BackendMemory,
		Bucket:                "mantle_sessions",
		MaxBucketBytes:        1 << 30,
		MaxMemoryKeys:         100_000,
		Retention:             24 * time.Hour,
		DefaultBudget:         BudgetConfig{Deadline: 30 * time.Minute, MaxTokens: 1_000_000, MaxCostUSD: 10, MaxSteps: 100},
		MaxBudget:             BudgetConfig{Deadline: 24 * time.Hour, MaxTokens: 100_000_000, MaxCostUSD: 1000, MaxSteps: 500},
		MaxModelResultBytes:   64 << 10,
		MaxToolResultBytes:    12 << 10,
		MaxSessionResultBytes: 768 << 10,
		MaxStepLease:          5 * time.Minute,
		NewSessionsPerMinute:  600,
		Degradation:           DegradationConfig{StickyFor: 5 * time.Minute, RecoveryInterval: time.Minute, ConfirmActionsAfter: 3},
		Scheduler:             SchedulerConfig{ParallelCap: 4, TimeoutRate: 0.2, MinCalls: 5, Window: time.Minute},
	}
}

// maxStepsRecorded bounds max_budget.max_steps, which bounds a session's record: with
// bounded ids and reasons, the record stays well inside one NATS message.
const maxStepsRecorded = 1000

// Validate checks the block; each message names its key.
func (c Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	switch c.Backend {
	case BackendMemory, BackendJetStream:
	default:
		add("backend: want memory or jetstream, got %q", c.Backend)
	}
	if c.Backend == BackendJetStream && c.Bucket == "" {
		add("bucket: required with the jetstream backend")
	}
	if c.MaxBucketBytes < 0 {
		add("max_bucket_bytes: must not be negative, got %d", c.MaxBucketBytes)
	}
	if c.MaxMemoryKeys <= 0 {
		add("max_memory_keys: must be positive, got %d", c.MaxMemoryKeys)
	}
	if c.Retention <= 0 {
		add("retention: must be positive, got %s", c.Retention)
	}
	for _, b := range []struct {
		name string
		b    BudgetConfig
	}{{"default_budget", c.DefaultBudget}, {"max_budget", c.MaxBudget}} {
		if b.b.Deadline <= 0 || b.b.MaxTokens <= 0 || b.b.MaxCostUSD <= 0 || b.b.MaxSteps <= 0 {
			add("%s: deadline, max_tokens, max_cost_usd and max_steps must all be positive, got %+v", b.name, b.b)
		}
	}
	if c.MaxBudget.MaxSteps > maxStepsRecorded {
		add("max_budget.max_steps: at most %d, got %d", maxStepsRecorded, c.MaxBudget.MaxSteps)
	}
	if c.DefaultBudget.Deadline > c.MaxBudget.Deadline || c.DefaultBudget.MaxTokens > c.MaxBudget.MaxTokens ||
		c.DefaultBudget.MaxCostUSD > c.MaxBudget.MaxCostUSD || c.DefaultBudget.MaxSteps > c.MaxBudget.MaxSteps {
		add("default_budget: must not exceed max_budget in any field")
	}
	if c.MaxModelResultBytes <= 0 || c.MaxToolResultBytes <= 0 || c.MaxSessionResultBytes <= 0 {
		add("max_model_result_bytes, max_tool_result_bytes and max_session_result_bytes must be positive")
	}
	// A NATS message is 1 MiB by default; a result is one message.
	if c.MaxModelResultBytes > 1<<20 || c.MaxToolResultBytes > 1<<20 {
		add("max_model_result_bytes and max_tool_result_bytes: at most 1 MiB (one NATS message)")
	}
	if c.MaxStepLease <= 0 {
		add("max_step_lease: must be positive, got %s", c.MaxStepLease)
	}
	if c.NewSessionsPerMinute <= 0 {
		add("new_sessions_per_minute: must be positive, got %d", c.NewSessionsPerMinute)
	}
	if c.Degradation.StickyFor <= 0 || c.Degradation.RecoveryInterval <= 0 {
		add("degradation: sticky_for and recovery_interval must be positive")
	}
	if c.Degradation.ConfirmActionsAfter < 0 {
		add("degradation.confirm_actions_after: must not be negative, got %d", c.Degradation.ConfirmActionsAfter)
	}
	if c.Scheduler.ParallelCap < 1 || c.Scheduler.ParallelCap > 64 {
		add("scheduler.parallel_cap: want 1 to 64, got %d", c.Scheduler.ParallelCap)
	}
	if c.Scheduler.TimeoutRate <= 0 || c.Scheduler.TimeoutRate > 1 {
		add("scheduler.timeout_rate: want more than 0 and at most 1, got %v", c.Scheduler.TimeoutRate)
	}
	if c.Scheduler.MinCalls < 1 {
		add("scheduler.min_calls: must be at least 1, got %d", c.Scheduler.MinCalls)
	}
	if c.Scheduler.Window <= 0 {
		add("scheduler.window: must be positive, got %s", c.Scheduler.Window)
	}
	return errors.Join(errs...)
}
