package session

import (
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		change  func(*Config)
		wantErr string
	}{
		{name: "defaults", change: func(*Config) {}},
		{name: "memory", change: func(c *Config) { c.Backend = BackendMemory; c.Bucket = "" }},
		{name: "jetstream", change: func(c *Config) { c.Backend = BackendJetStream }},
		{name: "unknown backend", change: func(c *Config) { c.Backend = "redis" }, wantErr: "backend"},
		{name: "jetstream without a bucket", change: func(c *Config) { c.Backend = BackendJetStream; c.Bucket = "" }, wantErr: "bucket"},
		{name: "negative bucket bytes", change: func(c *Config) { c.MaxBucketBytes = -1 }, wantErr: "max_bucket_bytes"},
		{name: "no memory keys", change: func(c *Config) { c.MaxMemoryKeys = 0 }, wantErr: "max_memory_keys"},
		{name: "no retention", change: func(c *Config) { c.Retention = 0 }, wantErr: "retention"},
		{name: "a default budget field at zero", change: func(c *Config) { c.DefaultBudget.MaxTokens = 0 }, wantErr: "default_budget"},
		{name: "default over max", change: func(c *Config) { c.DefaultBudget.Deadline = 48 * time.Hour }, wantErr: "default_budget: must not exceed"},
		{name: "too many steps", change: func(c *Config) { c.MaxBudget.MaxSteps = maxStepsRecorded + 1 }, wantErr: "max_budget.max_steps"},
		{name: "result bound over a message", change: func(c *Config) { c.MaxModelResultBytes = 2 << 20 }, wantErr: "one NATS message"},
		{name: "no result bound", change: func(c *Config) { c.MaxSessionResultBytes = 0 }, wantErr: "must be positive"},
		{name: "no lease", change: func(c *Config) { c.MaxStepLease = 0 }, wantErr: "max_step_lease"},
		{name: "no new sessions", change: func(c *Config) { c.NewSessionsPerMinute = 0 }, wantErr: "new_sessions_per_minute"},
		{name: "no stickiness", change: func(c *Config) { c.Degradation.StickyFor = 0 }, wantErr: "degradation"},
		{name: "negative confirm count", change: func(c *Config) { c.Degradation.ConfirmActionsAfter = -1 }, wantErr: "confirm_actions_after"},
		{name: "cap zero", change: func(c *Config) { c.Scheduler.ParallelCap = 0 }, wantErr: "parallel_cap"},
		{name: "rate over one", change: func(c *Config) { c.Scheduler.TimeoutRate = 1.5 }, wantErr: "timeout_rate"},
		{name: "no min calls", change: func(c *Config) { c.Scheduler.MinCalls = 0 }, wantErr: "min_calls"},
		{name: "no window", change: func(c *Config) { c.Scheduler.Window = 0 }, wantErr: "window"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.change(&c)
			err := c.Validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Validate = %v, want nil", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("Validate = %v, want an error naming %q", err, tt.wantErr)
			}
		})
	}
}
