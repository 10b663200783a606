package verifier

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/mantle-mesh/mantle/pkg/formatcheck"
	"github.com/mantle-mesh/mantle/services/verifier/internal/review"
	"github.com/mantle-mesh/mantle/services/verifier/internal/rules"
)

// Config is the verifier block of mantle's YAML configuration. DefaultConfig documents
// every default; the sample rules it ships are scoped to the medical and legal scenarios.
//
//	verifier:
//	  confidence_threshold: 0.3
//	  repetition_threshold: 4
//	  degraded: {confidence_threshold: 0.2, review_threshold_factor: 1.3}
//	  rules: [{id: ..., scenarios: [...], condition: <CEL>, action: {type: block}}]
//	  rules_file: /etc/mantle/rules.yaml   # watched; reloaded without restart
//	  risk: {weights: {input: 0.25, output: 0.5, context: 0.25}, review_threshold: 0.75}
//	  scenarios: {medical: {review_timeout: 10m, default_action: {type: replace, text: ...}}}
//	  review: {timeout: 15m, lease: 5m, spool_dir: /var/lib/mantle/review-spool}
//	  l3: {enabled: true, judge: {enabled: false}}
type Config struct {
	// ConfidenceThreshold fails a JSON answer whose top-level numeric "confidence" field is
	// strictly below it (0 to 1).
	ConfidenceThreshold float64 `yaml:"confidence_threshold"`
	// RefusalPhrases replace the built-in English and Chinese list when set. Matching
	// ignores case, punctuation, spacing and full/half width, so "抱歉，我不能" also
	// matches "抱歉, 我不能". Absent or null means the defaults; [] turns refusal detection
	// off.
	RefusalPhrases []string `yaml:"refusal_phrases"`
	// RepetitionThreshold is how many times in a row the same sentence (or cycle of up to
	// three sentences) may appear before the answer counts as a decoding loop (at least 2).
	RepetitionThreshold int `yaml:"repetition_threshold"`
	// MaxContentBytes bounds the answer a caller may send; larger answers are refused
	// (INVALID_ARGUMENT) rather than checked, so that one request cannot pin a CPU. The
	// router counts such an answer as failed verification and asks the next candidate; it
	// never sends it out unverified.
	MaxContentBytes int `yaml:"max_content_bytes"`
	// SchemaCacheSize is how many compiled JSON Schemas are kept (schemas arrive with each
	// request; compiling one costs far more than validating against it).
	SchemaCacheSize int `yaml:"schema_cache_size"`
	// MaxSchemaFindings bounds the schema findings reported for one answer.
	MaxSchemaFindings int `yaml:"max_schema_findings"`
	// MaxSchemaBytes is the largest JSON Schema a request may carry. Compiling and
	// validating grow far faster than the document, so a schema over any of the
	// max_schema_* limits is refused (INVALID_ARGUMENT, 400 at the front door) before it is
	// compiled and before any model is asked. The router applies the defaults.
	MaxSchemaBytes int `yaml:"max_schema_bytes"`
	// MaxSchemaDepth bounds a request's JSON Schema's nesting, in JSON levels.
	MaxSchemaDepth int `yaml:"max_schema_depth"`
	// MaxSchemaNodes bounds a request's JSON Schema's subschemas, counted as written and
	// again from the root with every "#/..." reference expanded (a chain of anyOf branches
	// referring to the next level doubles per level). $anchor, $dynamicRef, a nested $id
	// and references outside the schema are refused.
	MaxSchemaNodes int `yaml:"max_schema_nodes"`

	// Degraded adapts the checks to answers that did not come from the primary model.
	Degraded DegradedConfig `yaml:"degraded"`

	// Rules are the L2 business rules, validated (compiled) at start; change them with a
	// restart. The defaults are three sample rules for the medical and legal scenarios; []
	// removes them.
	Rules []rules.Rule `yaml:"rules"`
	// RulesFile is a YAML file with more rules ("rules: [...]"), watched and reloaded
	// without a restart when it changes and on the ReloadRules RPC. A file that fails to
	// compile is rejected and the last good set stays.
	RulesFile string `yaml:"rules_file"`
	// RulesReloadInterval is how often the rules file is checked for changes.
	RulesReloadInterval time.Duration `yaml:"rules_reload_interval"`
	// RuleCostLimit is the CEL cost one condition may spend on one answer; beyond it the
	// rule does not apply.
	RuleCostLimit uint64 `yaml:"rule_cost_limit"`

	// Risk scores every delivered answer; a high score sends it to human review.
	Risk RiskConfig `yaml:"risk"`
	// Scenarios override risk weights, the review threshold and timeout, the default action
	// and reference snippets per scenario.
	Scenarios map[string]ScenarioConfig `yaml:"scenarios"`
	// Review is the human review queue, kept in NATS JetStream when events go to NATS.
	Review ReviewConfig `yaml:"review"`
	// L3 is the asynchronous semantic layer: relevance, consistency and divergence of
	// answers, and an optional LLM judge.
	L3 L3Config `yaml:"l3"`
}

// DegradedConfig: once the router has fallen back, the checks must fit the
// model that answered, or the review pool floods with acceptable degraded answers.
type DegradedConfig struct {
	// ConfidenceThreshold replaces confidence_threshold for degraded answers (smaller models
	// report lower confidence for the same quality).
	ConfidenceThreshold float64 `yaml:"confidence_threshold"`
	// ReviewThresholdFactor multiplies the review threshold for degraded answers, in
	// (0, 2]: 1.3 reviews them only at a 30% higher score. Below 1 reviews degraded answers
	// more eagerly.
	ReviewThresholdFactor float64 `yaml:"review_threshold_factor"`
	// SkipL3Levels are fallback levels (primary, backup_model, cached_approximate,
	// template) whose answers get no L3 check: cached answers were checked when first
	// given, templates are fixed texts.
	SkipL3Levels []string `yaml:"skip_l3_levels"`
}

// RiskWeights weigh the three risk dimensions; they are normalised to sum to 1.
type RiskWeights struct {
	// Input weighs the input risk: sensitive terms, long conversations.
	Input float64 `yaml:"input"`
	// Output weighs the output risk: low L3 confidence, divergence, repetition.
	Output float64 `yaml:"output"`
	// Context weighs the session's risk: degraded streaks, dissatisfied users.
	Context float64 `yaml:"context"`
}

// RiskConfig is the risk model. Each dimension is the strongest of its
// signals, each signal in [0,1]; the score is the weighted sum of the dimensions.
type RiskConfig struct {
	// Weights weigh the three risk dimensions; they are normalised to sum to 1.
	Weights RiskWeights `yaml:"weights"`
	// ReviewThreshold: a delivered answer at or above it goes to human review.
	ReviewThreshold float64 `yaml:"review_threshold"`
	// SensitiveTerms are terms in a user message that raise input risk (case-insensitive).
	SensitiveTerms []string `yaml:"sensitive_terms"`
	// LongInputChars: a conversation longer than this (in characters) raises input risk.
	LongInputChars int `yaml:"long_input_chars"`
	// LowConfidence: an L3 confidence below it raises output risk.
	LowConfidence float64 `yaml:"low_confidence"`
	// Divergence: an L3 divergence from earlier answers above it raises output risk.
	Divergence float64 `yaml:"divergence"`
	// RepetitionRatio: a share of repeated sentences (or JSON string values) above it
	// raises output risk (a hallucination symptom).
	RepetitionRatio float64 `yaml:"repetition_ratio"`
	// DegradedStreak: this many degraded answers in a row in a session raise context risk.
	DegradedStreak int `yaml:"degraded_streak"`
	// FeedbackWindow: a dissatisfied user raises the context risk of the session this long.
	FeedbackWindow time.Duration `yaml:"feedback_window"`
	// SessionTTL bounds the per-replica session memory: a session idle this long is
	// forgotten.
	SessionTTL time.Duration `yaml:"session_ttl"`
	// MaxSessions bounds the per-replica session memory: the sessions remembered.
	MaxSessions int `yaml:"max_sessions"`
}

// ScenarioConfig overrides defaults for one scenario; zero values inherit.
type ScenarioConfig struct {
	// Weights are this scenario's risk weights instead of risk.weights.
	Weights *RiskWeights `yaml:"weights,omitempty"`
	// ReviewThreshold is this scenario's threshold instead of risk.review_threshold.
	ReviewThreshold float64 `yaml:"review_threshold,omitempty"`
	// ReviewTimeout is how long this scenario's reviews wait for a decision, instead of
	// review.timeout.
	ReviewTimeout time.Duration `yaml:"review_timeout,omitempty"`
	// DefaultAction applies when one of this scenario's reviews times out, instead of
	// review.default_action.
	DefaultAction review.DefaultAction `yaml:"default_action,omitempty"`
	// References are snippets every answer in the scenario should agree with (L3
	// consistency).
	References []string `yaml:"references,omitempty"`
}

// ReviewConfig is the human review queue.
type ReviewConfig struct {
	// Timeout is how long a review may wait for a decision before the default action
	// applies.
	Timeout time.Duration `yaml:"timeout"`
	// DefaultAction applies on timeout for scenarios that set none.
	DefaultAction review.DefaultAction `yaml:"default_action"`
	// Lease is how long a claim lasts when the reviewer asks for no particular length.
	Lease time.Duration `yaml:"lease"`
	// MaxLease is the longest claim a reviewer may ask for.
	MaxLease time.Duration `yaml:"max_lease"`
	// SweepInterval is how often deadlines are checked.
	SweepInterval time.Duration `yaml:"sweep_interval"`
	// SpoolDir is where review requests wait until JetStream has them (with NATS). One
	// directory per process, on a persistent volume in production; empty means a fresh
	// temporary directory per process, lost on restart.
	SpoolDir string `yaml:"spool_dir"`
	// Stream names the JetStream work-queue stream of review requests.
	Stream string `yaml:"stream"`
	// Consumer names the stream's durable intake consumer.
	Consumer string `yaml:"consumer"`
	// Bucket names the key-value bucket of review state and audit; approved draft rules
	// are in <bucket>_rules.
	Bucket string `yaml:"bucket"`
	// Retention is how long reviews and their audit trail are kept in the bucket.
	Retention time.Duration `yaml:"retention"`
	// OperatorTenants is no longer read: operators authenticate with their own keys
	// (auth.operators) and see every tenant's reviews; a tenant key sees its tenant's.
	// Setting it is an error, so that no deployment loses its operators in silence.
	OperatorTenants []string `yaml:"operator_tenants,omitempty"`
}

// L3Config is the asynchronous semantic layer.
type L3Config struct {
	// Enabled runs the semantic checks.
	Enabled bool `yaml:"enabled"`
	// Workers is how many goroutines run the L3 checks.
	Workers int `yaml:"workers"`
	// QueueSize is how many answers may wait for the workers; beyond it answers get no L3.
	QueueSize int `yaml:"queue_size"`
	// BatchDelay is how long an answer may wait for its checks so that the workers take
	// several at once instead of waking for each. A queue a quarter full, or a caller
	// waiting for a result (GetFollowUp), does not wait for it; 0 checks every answer at
	// once.
	BatchDelay time.Duration `yaml:"batch_delay"`
	// EmbeddingDim is the size of the built-in lexical embedder's vectors.
	EmbeddingDim int `yaml:"embedding_dim"`
	// RelevanceFull is the cosine similarity between question and answer that counts as
	// fully relevant (the default suits the built-in lexical embedder).
	RelevanceFull float64 `yaml:"relevance_full"`
	// ConsistencyFull is the cosine similarity to a scenario's references that counts as
	// fully consistent (the default suits the built-in lexical embedder).
	ConsistencyFull float64 `yaml:"consistency_full"`
	// HistoryQuestions is how many questions are remembered for divergence.
	HistoryQuestions int `yaml:"history_questions"`
	// HistoryAnswers is how many answers are kept per remembered question.
	HistoryAnswers int `yaml:"history_answers"`
	// FollowUps is how many L3 results are kept for GetFollowUp.
	FollowUps int `yaml:"follow_ups"`
	// Judge asks an LLM, through the router, to rate answers.
	Judge JudgeConfig `yaml:"judge"`
}

// JudgeConfig is the optional LLM judge, called through the router.
type JudgeConfig struct {
	// Enabled asks the judge to rate answers; it needs the router in the same process.
	Enabled bool `yaml:"enabled"`
	// Route is the router route that judges.
	Route string `yaml:"route"`
	// Scenario marks judge calls, so that L3 skips them.
	Scenario string `yaml:"scenario"`
	// Timeout bounds one judge call.
	Timeout time.Duration `yaml:"timeout"`
	// MaxTokens bounds the judge's answer.
	MaxTokens int `yaml:"max_tokens"`
	// PerMinute is how many answers the judge rates per minute; beyond it answers are
	// scored without it.
	PerMinute int `yaml:"per_minute"`
	// APIKeyEnv names the environment variable with the tenant key the judge calls the
	// router with.
	APIKeyEnv string `yaml:"api_key_env"`
}

// SampleRules are the example L2 rules (a medical and a work-injury scenario), shipped in the default
// configuration and scoped to the scenarios they were written for.
func SampleRules() []rules.Rule {
	return []rules.Rule{
		{
			ID:          "diagnosis-no-hedging",
			Description: "A diagnosis may not hedge: the field becomes a referral and the user is told a doctor must confirm.",
			Scenarios:   []string{"medical"},
			Condition: `has(output.diagnosis) && ["可能", "疑似", "或许", "大概", "maybe", "possibly", "probably", "likely"]` +
				`.exists(w, string(output.diagnosis).lowerAscii().contains(w))`,
			Action: rules.Action{Type: rules.ActionReplace, Field: "diagnosis", Value: "请咨询医生",
				Notice: "根据诊疗规范，此结论需医生复核。"},
		},
		{
			ID:          "work-injury-cite-regulation",
			Description: "Answers about 工伤认定 must cite the regulation.",
			Scenarios:   []string{"legal"},
			Condition:   `question.contains("工伤认定") && !text.contains("工伤保险条例")`,
			Action: rules.Action{Type: rules.ActionNotice,
				Notice: "依据《工伤保险条例》第二十条：社会保险行政部门应当自受理工伤认定申请之日起60日内作出工伤认定的决定。"},
		},
		{
			ID:          "work-injury-no-appraisal-review",
			Description: "An answer telling a 工伤认定 asker that no appraisal is needed goes to a human.",
			Scenarios:   []string{"legal"},
			Condition:   `question.contains("工伤认定") && text.contains("无需鉴定")`,
			Action:      rules.Action{Type: rules.ActionReview},
		},
	}
}

// DefaultConfig returns the configuration used when the file says nothing. The L1 defaults
// are formatcheck's, which the router also uses when it checks answers itself.
func DefaultConfig() Config {
	l1 := formatcheck.DefaultConfig()
	return Config{
		ConfidenceThreshold: l1.ConfidenceThreshold,
		RefusalPhrases:      l1.RefusalPhrases,
		RepetitionThreshold: l1.RepetitionThreshold,
		MaxContentBytes:     1 << 20,
		SchemaCacheSize:     l1.SchemaCacheSize,
		MaxSchemaFindings:   l1.MaxSchemaFindings,
		MaxSchemaBytes:      l1.MaxSchemaBytes,
		MaxSchemaDepth:      l1.MaxSchemaDepth,
		MaxSchemaNodes:      l1.MaxSchemaNodes,
		Degraded: DegradedConfig{
			ConfidenceThreshold:   l1.DegradedConfidenceThreshold,
			ReviewThresholdFactor: 1.3,
			SkipL3Levels:          []string{"cached_approximate", "template"},
		},
		Rules:               SampleRules(),
		RulesReloadInterval: 10 * time.Second,
		RuleCostLimit:       rules.DefaultCostLimit,
		Risk: RiskConfig{
			Weights:         RiskWeights{Input: 0.25, Output: 0.5, Context: 0.25},
			ReviewThreshold: 0.75,
			SensitiveTerms:  []string{"癌症", "自杀", "自残", "轻生", "cancer", "suicide", "self-harm"},
			LongInputChars:  2000,
			LowConfidence:   0.4,
			Divergence:      0.8,
			RepetitionRatio: 0.7,
			DegradedStreak:  3,
			FeedbackWindow:  30 * time.Minute,
			SessionTTL:      time.Hour,
			MaxSessions:     100_000,
		},
		Review: ReviewConfig{
			Timeout:       15 * time.Minute,
			DefaultAction: review.DefaultAction{Type: review.DefaultKeep},
			Lease:         5 * time.Minute,
			MaxLease:      time.Hour,
			SweepInterval: 10 * time.Second,
			Stream:        "MANTLE_REVIEWS",
			Consumer:      "verifier-intake",
			Bucket:        "mantle_reviews",
			Retention:     30 * 24 * time.Hour,
		},
		L3: L3Config{
			Enabled:          true,
			Workers:          2,
			QueueSize:        1024,
			BatchDelay:       50 * time.Millisecond,
			EmbeddingDim:     512,
			RelevanceFull:    0.25,
			ConsistencyFull:  0.3,
			HistoryQuestions: 2000,
			HistoryAnswers:   3,
			FollowUps:        10_000,
			Judge: JudgeConfig{
				Route:     "judge",
				Scenario:  "verifier-judge",
				Timeout:   5 * time.Second,
				MaxTokens: 16,
				PerMinute: 30,
			},
		},
	}
}

// l1 is the part of the configuration that tunes the L1 checks.
func (c Config) l1() formatcheck.Config {
	return formatcheck.Config{
		ConfidenceThreshold:         c.ConfidenceThreshold,
		DegradedConfidenceThreshold: c.Degraded.ConfidenceThreshold,
		RefusalPhrases:              c.RefusalPhrases,
		RepetitionThreshold:         c.RepetitionThreshold,
		SchemaCacheSize:             c.SchemaCacheSize,
		MaxSchemaFindings:           c.MaxSchemaFindings,
		MaxSchemaBytes:              c.MaxSchemaBytes,
		MaxSchemaDepth:              c.MaxSchemaDepth,
		MaxSchemaNodes:              c.MaxSchemaNodes,
	}
}

var fallbackLevels = []string{"primary", "backup_model", "cached_approximate", "template"}

// Validate reports every invalid key, each message naming the key relative to this block.
// It compiles the inline rules, so a rule that would be rejected at start is reported here.
// Each part of the block has a validator of its own.
func (c Config) Validate() error {
	var p problems
	// confidence_threshold, refusal_phrases, repetition_threshold, schema_cache_size,
	// max_schema_findings, max_schema_bytes, max_schema_depth, max_schema_nodes and
	// degraded.confidence_threshold: formatcheck names them so.
	if err := c.l1().Validate(); err != nil {
		p = append(p, err)
	}
	if c.MaxContentBytes <= 0 {
		p.add("max_content_bytes: must be positive, got %d", c.MaxContentBytes)
	}
	c.Degraded.validate(&p)
	c.validateRules(&p)
	p = append(p, c.Risk.validate()...)
	for name, sc := range c.Scenarios {
		sc.validate(&p, "scenarios."+name)
	}
	c.Review.validate(&p)
	c.L3.validate(&p)
	return errors.Join(p...)
}

// problems collects a configuration's errors, each naming its key.
type problems []error

func (p *problems) add(format string, args ...any) { *p = append(*p, fmt.Errorf(format, args...)) }

// unit adds a problem when v (at key) is not between 0 and 1.
func (p *problems) unit(key string, v float64) {
	if math.IsNaN(v) || v < 0 || v > 1 {
		p.add("%s: must be between 0 and 1, got %v", key, v)
	}
}

// positive adds a problem when d (at key) is not positive.
func (p *problems) positive(key string, d time.Duration) {
	if d <= 0 {
		p.add("%s: must be positive, got %s", key, d)
	}
}

func (d DegradedConfig) validate(p *problems) {
	if f := d.ReviewThresholdFactor; math.IsNaN(f) || f <= 0 || f > 2 {
		p.add("degraded.review_threshold_factor: must be in (0, 2], got %v", f)
	}
	for i, l := range d.SkipL3Levels {
		if !slices.Contains(fallbackLevels, l) {
			p.add("degraded.skip_l3_levels[%d]: want one of %s, got %q", i, strings.Join(fallbackLevels, ", "), l)
		}
	}
}

// validateRules compiles the inline rules.
func (c Config) validateRules(p *problems) {
	if c.RulesFile != "" {
		p.positive("rules_reload_interval", c.RulesReloadInterval)
	}
	if c.RuleCostLimit == 0 {
		p.add("rule_cost_limit: must be positive")
	} else if engine, err := rules.NewEngine(c.RuleCostLimit); err != nil {
		p.add("rules: %v", err)
	} else if _, err := engine.Compile(c.Rules); err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			p.add("%s", line)
		}
	}
}

func (sc ScenarioConfig) validate(p *problems, key string) {
	if sc.Weights != nil {
		if err := sc.Weights.validate(); err != nil {
			p.add("%s.weights: %v", key, err)
		}
	}
	p.unit(key+".review_threshold", sc.ReviewThreshold)
	if sc.ReviewTimeout < 0 {
		p.add("%s.review_timeout: must not be negative, got %s", key, sc.ReviewTimeout)
	}
	if sc.DefaultAction != (review.DefaultAction{}) {
		if err := sc.DefaultAction.Validate(); err != nil {
			p.add("%s.default_action.%v", key, err)
		}
	}
}

func (r ReviewConfig) validate(p *problems) {
	p.positive("review.timeout", r.Timeout)
	if err := r.DefaultAction.Validate(); err != nil {
		p.add("review.default_action.%v", err)
	}
	p.positive("review.lease", r.Lease)
	if r.MaxLease < r.Lease {
		p.add("review.max_lease: must be at least review.lease (%s), got %s", r.Lease, r.MaxLease)
	}
	p.positive("review.sweep_interval", r.SweepInterval)
	p.positive("review.retention", r.Retention)
	if len(r.OperatorTenants) > 0 {
		p.add("review.operator_tenants: replaced by auth.operators (operator keys, which see every tenant's reviews); move the operators' keys there and remove it")
	}
	for key, v := range map[string]string{"review.stream": r.Stream, "review.consumer": r.Consumer, "review.bucket": r.Bucket} {
		if !natsName(v) {
			p.add("%s: want letters, digits, '-' or '_', got %q", key, v)
		}
	}
}

func (l L3Config) validate(p *problems) {
	if !l.Enabled {
		return
	}
	if l.Workers <= 0 {
		p.add("l3.workers: must be positive, got %d", l.Workers)
	}
	if l.QueueSize <= 0 {
		p.add("l3.queue_size: must be positive, got %d", l.QueueSize)
	}
	if l.BatchDelay < 0 || l.BatchDelay > time.Minute {
		p.add("l3.batch_delay: must be from 0 to 1m, got %s", l.BatchDelay)
	}
	if l.EmbeddingDim <= 0 {
		p.add("l3.embedding_dim: must be positive, got %d", l.EmbeddingDim)
	}
	for key, v := range map[string]float64{"l3.relevance_full": l.RelevanceFull, "l3.consistency_full": l.ConsistencyFull} {
		if math.IsNaN(v) || v <= 0 || v > 1 {
			p.add("%s: must be in (0, 1], got %v", key, v)
		}
	}
	if l.HistoryQuestions <= 0 || l.HistoryAnswers <= 0 || l.FollowUps <= 0 {
		p.add("l3.history_questions, l3.history_answers, l3.follow_ups: must be positive")
	}
	if j := l.Judge; j.Enabled {
		if j.Route == "" || j.Scenario == "" {
			p.add("l3.judge: route and scenario are required when enabled")
		}
		p.positive("l3.judge.timeout", j.Timeout)
		if j.MaxTokens <= 0 || j.PerMinute <= 0 {
			p.add("l3.judge.max_tokens, l3.judge.per_minute: must be positive")
		}
	}
}

func (w RiskWeights) validate() error {
	for _, v := range []float64{w.Input, w.Output, w.Context} {
		if math.IsNaN(v) || v < 0 {
			return fmt.Errorf("must not be negative, got %+v", w)
		}
	}
	if w.Input+w.Output+w.Context <= 0 {
		return errors.New("at least one must be positive")
	}
	return nil
}

func (r RiskConfig) validate() []error {
	var errs []error
	if err := r.Weights.validate(); err != nil {
		errs = append(errs, fmt.Errorf("risk.weights: %w", err))
	}
	for key, v := range map[string]float64{
		"risk.review_threshold": r.ReviewThreshold, "risk.low_confidence": r.LowConfidence,
		"risk.divergence": r.Divergence, "risk.repetition_ratio": r.RepetitionRatio,
	} {
		if math.IsNaN(v) || v < 0 || v > 1 {
			errs = append(errs, fmt.Errorf("%s: must be between 0 and 1, got %v", key, v))
		}
	}
	for i, t := range r.SensitiveTerms {
		if strings.TrimSpace(t) == "" {
			errs = append(errs, fmt.Errorf("risk.sensitive_terms[%d]: must not be empty", i))
		}
	}
	if r.LongInputChars <= 0 {
		errs = append(errs, fmt.Errorf("risk.long_input_chars: must be positive, got %d", r.LongInputChars))
	}
	if r.DegradedStreak < 1 {
		errs = append(errs, fmt.Errorf("risk.degraded_streak: must be at least 1, got %d", r.DegradedStreak))
	}
	if r.FeedbackWindow <= 0 || r.SessionTTL <= 0 || r.MaxSessions <= 0 {
		errs = append(errs, errors.New("risk.feedback_window, risk.session_ttl, risk.max_sessions: must be positive"))
	}
	return errs
}

func natsName(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}
