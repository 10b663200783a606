package agent

import (
	"strings"
	"testing"
	"time"
)

// validTool is a query tool that passes validation; tests change one thing in it.
func validTool(name string) ToolConfig {
	return ToolConfig{
		Name: name, Kind: KindQuery,
		InputSchema: map[string]any{"type": "object"},
		Backend:     BackendConfig{Type: BackendHTTP, URL: "http://tools.internal/" + name},
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	action := func(name string) ToolConfig {
		tc := validTool(name)
		tc.Kind = KindAction
		return tc
	}
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr []string // substrings; nil means valid
	}{
		{name: "defaults", mutate: func(*Config) {}},
		{name: "a query and an action", mutate: func(c *Config) { c.Tools = []ToolConfig{validTool("q"), action("a")} }},
		{name: "bad name", mutate: func(c *Config) { c.Tools = []ToolConfig{validTool("no spaces")} },
			wantErr: []string{`tools[0].name: want 1 to 64 characters of [A-Za-z0-9_.-], got "no spaces"`}},
		{name: "duplicate", mutate: func(c *Config) { c.Tools = []ToolConfig{validTool("q"), validTool("q")} },
			wantErr: []string{`tools[1].name: "q" is already tools[0]`}},
		{name: "unknown kind", mutate: func(c *Config) { tc := validTool("q"); tc.Kind = "write"; c.Tools = []ToolConfig{tc} },
			wantErr: []string{`tools[0].kind: want query, action or external, got "write"`}},
		{name: "backend", mutate: func(c *Config) {
			tc := validTool("q")
			tc.Backend = BackendConfig{Type: "grpc", URL: "ftp://x"}
			c.Tools = []ToolConfig{tc}
		}, wantErr: []string{`tools[0].backend.type: want http or mcp, got "grpc"`, `tools[0].backend.url: want an http or https URL, got "ftp://x"`}},
		{name: "credentials in the URL", mutate: func(c *Config) {
			tc := validTool("q")
			tc.Backend.URL = "https://user:secret@tools.internal/q"
			c.Tools = []ToolConfig{tc}
		}, wantErr: []string{"tools[0].backend.url: credentials in the URL"}},
		{name: "action with retry, backup and cache", mutate: func(c *Config) {
			a := action("a")
			a.Retry, a.Backup, a.Cache = defaultRetry, "q", CacheConfig{TTL: time.Minute}
			c.Tools = []ToolConfig{validTool("q"), a}
		}, wantErr: []string{"tools[1].retry: action tools are never retried", "tools[1].backup: action tools have no backup", "tools[1].cache: action tools' results are not cached"}},
		{name: "external without a rate limit", mutate: func(c *Config) { tc := validTool("e"); tc.Kind = KindExternal; c.Tools = []ToolConfig{tc} },
			wantErr: []string{"tools[0].rate_limit: external tools need one"}},
		{name: "backup of another family", mutate: func(c *Config) { q := validTool("q"); q.Backup = "a"; c.Tools = []ToolConfig{q, action("a")} },
			wantErr: []string{`tools[0].backup: "a" is a action tool`}},
		{name: "backup missing", mutate: func(c *Config) { q := validTool("q"); q.Backup = "nope"; c.Tools = []ToolConfig{q} },
			wantErr: []string{`tools[0].backup: no tool "nope"`}},
		{name: "backup cycle", mutate: func(c *Config) {
			a, b, d := validTool("a"), validTool("b"), validTool("d")
			a.Backup, b.Backup, d.Backup = "b", "d", "a"
			c.Tools = []ToolConfig{a, b, d}
		}, wantErr: []string{`tools[0].backup: the backups of "a" come back to "a"`}},
		{name: "external backs up a query", mutate: func(c *Config) {
			q, e := validTool("q"), validTool("e")
			e.Kind, e.RateLimit = KindExternal, RateLimitConfig{PerSecond: 5, Burst: 5}
			q.Backup = "e"
			c.Tools = []ToolConfig{q, e}
		}},
		{name: "retry bounds", mutate: func(c *Config) {
			q := validTool("q")
			q.Retry = RetryConfig{MaxRetries: 9, Base: time.Second, Multiplier: 0.5, MaxDelay: time.Millisecond}
			c.Tools = []ToolConfig{q}
		}, wantErr: []string{"retry.max_retries: want 0 to 5, got 9", "retry.multiplier: must be at least 1", "retry.max_delay: must be at least base"}},
		{name: "limits", mutate: func(c *Config) { c.MaxArgumentBytes, c.Idempotency.Backend = 0, "redis" },
			wantErr: []string{"max_argument_bytes: want 1 to 16 MiB, got 0", `idempotency.backend: want memory or jetstream, got "redis"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := DefaultConfig()
			tc.mutate(&c)
			err := c.Validate()
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate = nil, want %q", tc.wantErr)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Validate = %v\nwant it to contain %q", err, want)
				}
			}
		})
	}
}

func TestToolDefaults(t *testing.T) {
	t.Parallel()
	q := validTool("q").withDefaults()
	if q.Timeout != defaultToolTimeout || q.MaxInFlight != defaultToolMaxInFlight || q.Retry != defaultRetry {
		t.Errorf("query defaults = timeout %s, max_in_flight %d, retry %+v", q.Timeout, q.MaxInFlight, q.Retry)
	}
	if q.Breaker.SlowCall != q.Timeout || q.Breaker.MinCalls != 10 || q.RetryBudget.Floor != 5 {
		t.Errorf("breaker and budget defaults = %+v, %+v", q.Breaker, q.RetryBudget)
	}
	a := validTool("a")
	a.Kind = KindAction
	if got := a.withDefaults().Retry; got != (RetryConfig{}) {
		t.Errorf("action retry = %+v, want none", got)
	}
	off := validTool("q")
	off.Retry = RetryConfig{Base: time.Second}
	if got := off.withDefaults().Retry.MaxRetries; got != 0 {
		t.Errorf("retry with max_retries 0 set = %d retries, want 0", got)
	}
}
