package verifier

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.yaml.in/yaml/v3"

	"github.com/mantle-mesh/mantle/pkg/formatcheck"
	"github.com/mantle-mesh/mantle/services/verifier/internal/review"
	"github.com/mantle-mesh/mantle/services/verifier/internal/rules"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr []string // substrings; nil means valid
	}{
		{name: "defaults", mutate: func(*Config) {}},
		{name: "no refusal phrases", mutate: func(c *Config) { c.RefusalPhrases = nil }},
		{name: "threshold 0 and 1 are allowed", mutate: func(c *Config) { c.ConfidenceThreshold = 1 }},
		{name: "negative threshold", mutate: func(c *Config) { c.ConfidenceThreshold = -0.1 },
			wantErr: []string{"confidence_threshold: must be between 0 and 1, got -0.1"}},
		{name: "threshold above 1", mutate: func(c *Config) { c.ConfidenceThreshold = 30 },
			wantErr: []string{"confidence_threshold: must be between 0 and 1, got 30"}},
		{name: "punctuation-only phrase", mutate: func(c *Config) { c.RefusalPhrases = []string{"I cannot", "!!!"} },
			wantErr: []string{`refusal_phrases[1]: must contain a letter or digit, got "!!!"`}},
		{name: "repetition threshold 1", mutate: func(c *Config) { c.RepetitionThreshold = 1 },
			wantErr: []string{"repetition_threshold: must be at least 2, got 1"}},
		{name: "degraded threshold", mutate: func(c *Config) { c.Degraded.ConfidenceThreshold = 1.2 },
			wantErr: []string{"degraded.confidence_threshold: must be between 0 and 1, got 1.2"}},
		{name: "schema limits", mutate: func(c *Config) { c.SchemaCacheSize, c.MaxSchemaFindings = 0, -1 },
			wantErr: []string{"schema_cache_size: must be positive, got 0", "max_schema_findings: must be positive, got -1"}},
		{name: "zero max content", mutate: func(c *Config) { c.MaxContentBytes = 0 },
			wantErr: []string{"max_content_bytes: must be positive, got 0"}},
		{name: "degraded factor 0", mutate: func(c *Config) { c.Degraded.ReviewThresholdFactor = 0 },
			wantErr: []string{"degraded.review_threshold_factor: must be in (0, 2], got 0"}},
		{name: "unknown skip level", mutate: func(c *Config) { c.Degraded.SkipL3Levels = []string{"cached"} },
			wantErr: []string{`degraded.skip_l3_levels[0]: want one of primary, backup_model, cached_approximate, template, got "cached"`}},
		{name: "rule that does not compile", mutate: func(c *Config) {
			c.Rules = append(c.Rules, rules.Rule{ID: "broken", Condition: "text.contains(", Action: rules.Action{Type: rules.ActionBlock}})
		}, wantErr: []string{"rules[3] (broken): condition:"}},
		{name: "zero cost limit", mutate: func(c *Config) { c.RuleCostLimit = 0 }, wantErr: []string{"rule_cost_limit: must be positive"}},
		{name: "rules file needs an interval", mutate: func(c *Config) { c.RulesFile, c.RulesReloadInterval = "/x.yaml", 0 },
			wantErr: []string{"rules_reload_interval: must be positive"}},
		{name: "negative weight", mutate: func(c *Config) { c.Risk.Weights.Input = -1 }, wantErr: []string{"risk.weights: must not be negative"}},
		{name: "all weights zero", mutate: func(c *Config) { c.Risk.Weights = RiskWeights{} }, wantErr: []string{"risk.weights: at least one must be positive"}},
		{name: "threshold above 1", mutate: func(c *Config) { c.Risk.ReviewThreshold = 75 }, wantErr: []string{"risk.review_threshold: must be between 0 and 1, got 75"}},
		{name: "blank sensitive term", mutate: func(c *Config) { c.Risk.SensitiveTerms = []string{" "} }, wantErr: []string{"risk.sensitive_terms[0]: must not be empty"}},
		{name: "scenario default action", mutate: func(c *Config) {
			c.Scenarios = map[string]ScenarioConfig{"medical": {DefaultAction: review.DefaultAction{Type: review.DefaultReplace}}}
		}, wantErr: []string{"scenarios.medical.default_action.text: required for replace"}},
		{name: "scenario threshold", mutate: func(c *Config) { c.Scenarios = map[string]ScenarioConfig{"x": {ReviewThreshold: 2}} },
			wantErr: []string{"scenarios.x.review_threshold: must be between 0 and 1, got 2"}},
		{name: "review timeout", mutate: func(c *Config) { c.Review.Timeout = 0 }, wantErr: []string{"review.timeout: must be positive, got 0s"}},
		{name: "lease above max", mutate: func(c *Config) { c.Review.MaxLease = time.Minute }, wantErr: []string{"review.max_lease: must be at least review.lease (5m0s), got 1m0s"}},
		{name: "unknown default action", mutate: func(c *Config) { c.Review.DefaultAction.Type = "ignore" },
			wantErr: []string{`review.default_action.type: want keep, retract or replace, got "ignore"`}},
		{name: "bad stream name", mutate: func(c *Config) { c.Review.Stream = "mantle.reviews" },
			wantErr: []string{`review.stream: want letters, digits, '-' or '_', got "mantle.reviews"`}},
		{name: "no l3 workers", mutate: func(c *Config) { c.L3.Workers = 0 }, wantErr: []string{"l3.workers: must be positive, got 0"}},
		{name: "negative l3 batch delay", mutate: func(c *Config) { c.L3.BatchDelay = -time.Millisecond }, wantErr: []string{"l3.batch_delay: must be from 0 to 1m, got -1ms"}},
		{name: "l3 batch delay over a minute", mutate: func(c *Config) { c.L3.BatchDelay = time.Hour }, wantErr: []string{"l3.batch_delay: must be from 0 to 1m, got 1h0m0s"}},
		{name: "no l3 batch delay", mutate: func(c *Config) { c.L3.BatchDelay = 0 }},
		{name: "l3 off skips its checks", mutate: func(c *Config) { c.L3.Enabled, c.L3.Workers = false, 0 }},
		{name: "judge without a route", mutate: func(c *Config) { c.L3.Judge.Enabled, c.L3.Judge.Route = true, "" },
			wantErr: []string{"l3.judge: route and scenario are required when enabled"}},
		{
			name: "every problem is reported",
			mutate: func(c *Config) {
				c.ConfidenceThreshold, c.RepetitionThreshold, c.MaxContentBytes = 2, 0, -1
			},
			wantErr: []string{"confidence_threshold:", "repetition_threshold:", "max_content_bytes: must be positive, got -1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := DefaultConfig()
			tt.mutate(&cfg)
			err := cfg.Validate()
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want errors containing %q", tt.wantErr)
			}
			for _, want := range tt.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Validate() = %q, want it to contain %q", err, want)
				}
			}
		})
	}
}

// TestConfigYAML decodes the block the way the lead's strict loader does: defaults first,
// then the file, unknown keys rejected.
func TestConfigYAML(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		yaml    string
		want    func() Config
		wantErr string
		// emptyIsNil: YAML writes a nil list or map as an empty one.
		emptyIsNil bool
	}{
		{
			name: "every key",
			yaml: `
confidence_threshold: 0.5
refusal_phrases: ["no can do"]
repetition_threshold: 6
max_content_bytes: 4096
schema_cache_size: 8
max_schema_findings: 3
max_schema_bytes: 32768
max_schema_depth: 16
max_schema_nodes: 500
degraded: {confidence_threshold: 0.1, review_threshold_factor: 1.5, skip_l3_levels: [template]}
rules:
  - id: no-guarantees
    description: never promise
    scenarios: [support]
    condition: text.contains("保证")
    action: {type: mask, pattern: "保证", value: "[已屏蔽]", notice: 仅供参考}
rules_file: /etc/mantle/rules.yaml
rules_reload_interval: 30s
rule_cost_limit: 5000
risk:
  weights: {input: 1, output: 2, context: 1}
  review_threshold: 0.6
  sensitive_terms: [诈骗]
  long_input_chars: 500
  low_confidence: 0.5
  divergence: 0.7
  repetition_ratio: 0.6
  degraded_streak: 2
  feedback_window: 10m
  session_ttl: 2h
  max_sessions: 10
scenarios:
  medical:
    weights: {input: 0.5, output: 0.5, context: 0}
    review_threshold: 0.5
    review_timeout: 5m
    default_action: {type: replace, text: 请拨打人工热线}
    references: [白细胞参考值4.0-10.0]
review:
  timeout: 20m
  default_action: {type: retract}
  lease: 2m
  max_lease: 10m
  sweep_interval: 5s
  spool_dir: /var/lib/mantle/spool
  stream: REVIEWS
  consumer: intake
  bucket: reviews
  retention: 240h
l3:
  enabled: false
  workers: 1
  queue_size: 10
  batch_delay: 5ms
  embedding_dim: 64
  relevance_full: 0.5
  consistency_full: 0.6
  history_questions: 10
  history_answers: 2
  follow_ups: 10
  judge: {enabled: true, route: judge-small, scenario: judging, timeout: 2s, max_tokens: 8, per_minute: 5, api_key_env: JUDGE_KEY}
`,
			want: func() Config {
				return Config{
					ConfidenceThreshold: 0.5, RefusalPhrases: []string{"no can do"}, RepetitionThreshold: 6, MaxContentBytes: 4096,
					SchemaCacheSize: 8, MaxSchemaFindings: 3, MaxSchemaBytes: 32768, MaxSchemaDepth: 16, MaxSchemaNodes: 500,
					Degraded: DegradedConfig{ConfidenceThreshold: 0.1, ReviewThresholdFactor: 1.5, SkipL3Levels: []string{"template"}},
					Rules: []rules.Rule{{ID: "no-guarantees", Description: "never promise", Scenarios: []string{"support"},
						Condition: `text.contains("保证")`, Action: rules.Action{Type: rules.ActionMask, Pattern: "保证", Value: "[已屏蔽]", Notice: "仅供参考"}}},
					RulesFile: "/etc/mantle/rules.yaml", RulesReloadInterval: 30 * time.Second, RuleCostLimit: 5000,
					Risk: RiskConfig{
						Weights: RiskWeights{Input: 1, Output: 2, Context: 1}, ReviewThreshold: 0.6, SensitiveTerms: []string{"诈骗"},
						LongInputChars: 500, LowConfidence: 0.5, Divergence: 0.7, RepetitionRatio: 0.6, DegradedStreak: 2,
						FeedbackWindow: 10 * time.Minute, SessionTTL: 2 * time.Hour, MaxSessions: 10,
					},
					Scenarios: map[string]ScenarioConfig{"medical": {
						Weights: &RiskWeights{Input: 0.5, Output: 0.5}, ReviewThreshold: 0.5, ReviewTimeout: 5 * time.Minute,
						DefaultAction: review.DefaultAction{Type: review.DefaultReplace, Text: "请拨打人工热线"},
						References:    []string{"白细胞参考值4.0-10.0"},
					}},
					Review: ReviewConfig{
						Timeout: 20 * time.Minute, DefaultAction: review.DefaultAction{Type: review.DefaultRetract},
						Lease: 2 * time.Minute, MaxLease: 10 * time.Minute, SweepInterval: 5 * time.Second,
						SpoolDir: "/var/lib/mantle/spool", Stream: "REVIEWS", Consumer: "intake", Bucket: "reviews",
						Retention: 240 * time.Hour,
					},
					L3: L3Config{
						Workers: 1, QueueSize: 10, BatchDelay: 5 * time.Millisecond, EmbeddingDim: 64, RelevanceFull: 0.5, ConsistencyFull: 0.6,
						HistoryQuestions: 10, HistoryAnswers: 2, FollowUps: 10,
						Judge: JudgeConfig{Enabled: true, Route: "judge-small", Scenario: "judging", Timeout: 2 * time.Second,
							MaxTokens: 8, PerMinute: 5, APIKeyEnv: "JUDGE_KEY"},
					},
				}
			},
		},
		{
			name: "defaults survive a YAML round trip",
			yaml: func() string {
				out, err := yaml.Marshal(DefaultConfig())
				if err != nil {
					panic(err)
				}
				return string(out)
			}(),
			want:       DefaultConfig,
			emptyIsNil: true,
		},
		{
			name: "absent refusal_phrases keeps the defaults",
			yaml: "confidence_threshold: 0.4\n",
			want: func() Config { c := DefaultConfig(); c.ConfidenceThreshold = 0.4; return c },
		},
		{
			name: "an empty list turns refusal detection off",
			yaml: "refusal_phrases: []\n",
			want: func() Config { c := DefaultConfig(); c.RefusalPhrases = []string{}; return c },
		},
		{name: "unknown key", yaml: "confidence: 0.3\n", wantErr: "field confidence not found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := DefaultConfig()
			dec := yaml.NewDecoder(bytes.NewBufferString(tt.yaml))
			dec.KnownFields(true)
			err := dec.Decode(&cfg)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Decode: err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			var opts []cmp.Option
			if tt.emptyIsNil {
				opts = append(opts, cmpopts.EquateEmpty())
			}
			if diff := cmp.Diff(tt.want(), cfg, opts...); diff != "" {
				t.Errorf("decoded config mismatch (-want +got):\n%s", diff)
			}
			if err := cfg.Validate(); err != nil {
				t.Errorf("Validate() = %v, want nil", err)
			}
		})
	}
}

// TestDefaultL1Config: the verifier ships formatcheck's defaults (the router falls back to
// the same ones), and its keys reach the checker.
func TestDefaultL1Config(t *testing.T) {
	t.Parallel()
	if diff := cmp.Diff(formatcheck.DefaultConfig(), DefaultConfig().l1()); diff != "" {
		t.Errorf("DefaultConfig().l1() differs from formatcheck.DefaultConfig() (-want +got):\n%s", diff)
	}
	cfg := DefaultConfig()
	cfg.ConfidenceThreshold, cfg.Degraded.ConfidenceThreshold = 0.5, 0.4
	cfg.RefusalPhrases, cfg.RepetitionThreshold, cfg.SchemaCacheSize, cfg.MaxSchemaFindings = []string{"no"}, 3, 7, 2
	cfg.MaxSchemaBytes, cfg.MaxSchemaDepth, cfg.MaxSchemaNodes = 100, 4, 9
	want := formatcheck.Config{ConfidenceThreshold: 0.5, DegradedConfidenceThreshold: 0.4, RefusalPhrases: []string{"no"},
		RepetitionThreshold: 3, SchemaCacheSize: 7, MaxSchemaFindings: 2, MaxSchemaBytes: 100, MaxSchemaDepth: 4, MaxSchemaNodes: 9}
	if diff := cmp.Diff(want, cfg.l1()); diff != "" {
		t.Errorf("l1() (-want +got):\n%s", diff)
	}
}

func TestSampleRulesCompile(t *testing.T) {
	t.Parallel()
	engine, err := rules.NewEngine(0)
	if err != nil {
		t.Fatal(err)
	}
	set, err := engine.Compile(SampleRules())
	if err != nil {
		t.Fatalf("sample rules do not compile: %v", err)
	}
	if set.Len() != 3 {
		t.Errorf("sample rules = %d, want 3", set.Len())
	}
	for _, r := range SampleRules() {
		if len(r.Scenarios) == 0 {
			t.Errorf("sample rule %s applies to every scenario; samples must be scoped", r.ID)
		}
	}
}

func TestNewRejectsABadRulesFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tests := []struct {
		name    string
		content string
		wantErr string
	}{
		{"missing file", "", "rules_file:"},
		{"unknown key", "rules:\n  - id: a\n    condition: 'true'\n    action: {type: block}\n    colour: red\n", "field colour not found"},
		{"does not compile", "rules:\n  - id: a\n    condition: 'text +'\n    action: {type: block}\n", "rules[3] (a): condition:"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := DefaultConfig()
			cfg.RulesFile = filepath.Join(dir, fmt.Sprintf("rules%d.yaml", i))
			if tt.content != "" {
				if err := os.WriteFile(cfg.RulesFile, []byte(tt.content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := New(cfg, nil, nil); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("New = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}
