package verifier

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/formatcheck"
	"github.com/mantle-mesh/mantle/pkg/openaiapi"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/verifier/internal/review"
	"github.com/mantle-mesh/mantle/services/verifier/internal/rules"
	"github.com/mantle-mesh/mantle/services/verifier/internal/semantic"
)

// ServiceName is the module name and the service recorded in audit steps.
const ServiceName = "verifier"

// Layers, as named in findings and in a verdict's FailedLayer.
const (
	LayerL1 = formatcheck.LayerL1
	LayerL2 = "l2"
	LayerL3 = "l3"
)

// Stable L1 finding codes (package formatcheck defines and documents them). Callers and
// dashboards key on them, so they never change meaning. L2 findings carry the id of their
// rule as code.
const (
	CodeTruncated     = formatcheck.CodeTruncated
	CodeEncoding      = formatcheck.CodeEncoding
	CodeEmpty         = formatcheck.CodeEmpty
	CodeRefusal       = formatcheck.CodeRefusal
	CodeRepetition    = formatcheck.CodeRepetition
	CodeMarkdownFence = formatcheck.CodeMarkdownFence
	CodeMarkdown      = formatcheck.CodeMarkdown
	CodeHTML          = formatcheck.CodeHTML
	CodeJSONParse     = formatcheck.CodeJSONParse
	CodeJSONType      = formatcheck.CodeJSONType
	CodeSchema        = formatcheck.CodeSchema
	CodeRequiredField = formatcheck.CodeRequiredField
	CodeLowConfidence = formatcheck.CodeLowConfidence

	CodeToolCallArguments = formatcheck.CodeToolCallArguments
	CodeToolCallSchema    = formatcheck.CodeToolCallSchema
	CodeToolCallUnknown   = formatcheck.CodeToolCallUnknown
	CodeToolChoice        = formatcheck.CodeToolChoice
)

// FormatType is the output shape the request asked for.
type FormatType = formatcheck.FormatType

// The output shapes.
const (
	FormatText       = formatcheck.FormatText
	FormatJSONObject = formatcheck.FormatJSONObject
	FormatJSONSchema = formatcheck.FormatJSONSchema
)

// Format is the requested output format.
type Format = formatcheck.Format

// Message is one turn of the request's conversation.
type Message struct {
	Role    string
	Content string
}

// Answer is what Verify checks: one model answer, the format it was asked for, and what is
// known about the request.
type Answer struct {
	Content      string
	FinishReason string
	// ToolCalls are the answer's tool calls; L1 checks each against Tools and ToolChoice.
	ToolCalls []formatcheck.ToolCall
	// Tools are the tools the request offered; ToolChoice is its tool_choice.
	Tools      []formatcheck.Tool
	ToolChoice formatcheck.ToolChoice
	Format     Format
	// Model is the model that answered.
	Model    string
	Messages []Message
	// Quality is the request's QualityContext (read only); nil is an empty one.
	Quality *mantlev1.QualityContext
	// Tenant is the tenant the call acts for.
	Tenant string
	// SessionID groups a user's requests for context risk.
	SessionID string
	// References are snippets the answer should agree with (L3), besides the scenario's.
	References []string
}

func (a Answer) scenario() string { return a.Quality.GetScenario() }

// question is the last user message: what the answer answers.
func (a Answer) question() string {
	for i := len(a.Messages) - 1; i >= 0; i-- {
		if a.Messages[i].Role == "user" {
			return a.Messages[i].Content
		}
	}
	return ""
}

// degraded reports whether the answer comes from anything but the route's first choice.
func (a Answer) degraded() bool {
	l := a.Quality.GetFallbackLevel()
	return l != mantlev1.FallbackLevel_FALLBACK_LEVEL_UNSPECIFIED && l != mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY
}

// FailureClass is why an answer failed, in the terms the router routes on.
type FailureClass int

const (
	// ClassNone: the answer passed.
	ClassNone FailureClass = iota
	// ClassMalformedOutput: the answer is not in the requested shape or is unreadable.
	ClassMalformedOutput
	// ClassRefusal: the model declined to answer.
	ClassRefusal
	// ClassTruncated: the model stopped at its token limit.
	ClassTruncated
	// ClassVerificationFailed: well-formed, but a check on its content failed (a low
	// confidence, or an L2 rule that blocks or degrades).
	ClassVerificationFailed
)

func (c FailureClass) String() string {
	switch c {
	case ClassNone:
		return "none"
	case ClassMalformedOutput:
		return "malformed_output"
	case ClassRefusal:
		return "refusal"
	case ClassTruncated:
		return "truncated"
	case ClassVerificationFailed:
		return "verification_failed"
	}
	return fmt.Sprintf("FailureClass(%d)", int(c))
}

// classFromProto maps the class of a finding (formatcheck speaks the router's ErrorClass)
// to the verdict's. It is the inverse of classToProto on the classes findings carry.
func classFromProto(c mantlev1.ErrorClass) FailureClass {
	switch c {
	case mantlev1.ErrorClass_ERROR_CLASS_UNSPECIFIED, mantlev1.ErrorClass_ERROR_CLASS_NONE:
		return ClassNone
	case mantlev1.ErrorClass_ERROR_CLASS_REFUSAL:
		return ClassRefusal
	case mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED:
		return ClassTruncated
	case mantlev1.ErrorClass_ERROR_CLASS_VERIFICATION_FAILED:
		return ClassVerificationFailed
	}
	return ClassMalformedOutput
}

// Grade summarises a verdict for callers.
type Grade int

const (
	// GradeHigh: passed without findings.
	GradeHigh Grade = iota + 1
	// GradeMedium: passed with non-blocking findings or rule actions.
	GradeMedium
	// GradeLow: failed.
	GradeLow
)

func (g Grade) String() string {
	switch g {
	case GradeHigh:
		return "high"
	case GradeMedium:
		return "medium"
	case GradeLow:
		return "low"
	}
	return fmt.Sprintf("Grade(%d)", int(g))
}

// Finding is one check's observation: L1 findings come from package formatcheck, L2
// findings (one per applied rule action) have the same shape. Class is the class a
// blocking finding gives the verdict when it is the first.
type Finding = formatcheck.Finding

// Action is an L2 rule action applied to the answer.
type Action = rules.Applied

// Verdict is the outcome of verifying one answer.
type Verdict struct {
	Passed bool
	// FailedLayer is the layer of the first blocking finding, "" when the answer passed.
	FailedLayer string
	// FailureClass is the class of the first blocking finding; ClassNone when passed.
	FailureClass FailureClass
	Findings     []Finding
	// Content is the answer to deliver: the input, unwrapped from a fence, rewritten by rules.
	Content string
	// Actions are the L2 actions applied, in order.
	Actions []Action
	// Degrade: a rule asked for the degraded form of the answer.
	Degrade bool
	// UserNotice collects the notices of the rules that applied.
	UserNotice string
	Grade      Grade
	RiskScore  float64
	Risk       Risk
	// L3Pending: the semantic checks run in the background.
	L3Pending bool
	// ReviewID is the review opened for this answer, if any.
	ReviewID string
	// StartedAt and Duration time the verification, for the audit trail.
	StartedAt time.Time
	Duration  time.Duration
}

// L1Passed reports whether no L1 finding blocked the answer.
func (v Verdict) L1Passed() bool { return len(v.FailedCodes()) == 0 }

// FailedCodes returns the distinct codes of the blocking L1 findings, in finding order.
func (v Verdict) FailedCodes() []string {
	var codes []string
	for _, f := range v.Findings {
		if f.Blocking && f.Layer == LayerL1 && !slices.Contains(codes, f.Code) {
			codes = append(codes, f.Code)
		}
	}
	return codes
}

// RulesApplied returns the ids of the L2 rules whose actions were applied.
func (v Verdict) RulesApplied() []string {
	var ids []string
	for _, a := range v.Actions {
		if !slices.Contains(ids, a.RuleID) {
			ids = append(ids, a.RuleID)
		}
	}
	return ids
}

// Publisher sends an event without blocking (app.Publisher satisfies it).
type Publisher interface {
	Publish(ctx context.Context, subject string, msg proto.Message)
}

// ReviewSink takes review requests. The JetStream queue spools them durably; without NATS
// they go straight to the in-memory review service.
type ReviewSink interface {
	Enqueue(ctx context.Context, ev *eventsv1.ReviewRequestEvent) error
}

// Embedder turns text into vectors for L3 (the built-in lexical embedder by default).
type Embedder = semantic.Embedder

// Judge grades an answer for L3 (an LLM called through the router, when enabled).
type Judge = semantic.Judge

// Deps are the verifier's collaborators; every field may be left zero.
type Deps struct {
	Clock   clockwork.Clock
	Metrics prometheus.Registerer
	Events  Publisher
	Log     *slog.Logger
	// Embedder replaces the built-in lexical embedder.
	Embedder Embedder
	// Judge is the L3 judge; nil leaves it off.
	Judge Judge
}

// Verifier runs the verification layers. It is safe for concurrent use.
type Verifier struct {
	cfg      Config
	clock    clockwork.Clock
	log      *slog.Logger
	events   Publisher
	l1       *formatcheck.Checker
	metrics  *metrics
	rules    *ruleLoader
	sessions *sessions
	l3       *l3Runner // nil when L3 is off
	skipL3   levelSet  // degraded.skip_l3_levels
	reviews  ReviewSink
}

type discard struct{}

func (discard) Publish(context.Context, string, proto.Message) {}

// New builds a Verifier with only a clock and a metrics registry (reg may be nil: the
// metrics are kept but not exported). Events are dropped and no reviews are opened until a
// ReviewSink is attached with SetReviewSink.
func New(cfg Config, clock clockwork.Clock, reg prometheus.Registerer) (*Verifier, error) {
	return NewWithDeps(cfg, Deps{Clock: clock, Metrics: reg})
}

// NewWithDeps builds a Verifier. Background work (L3, rule file reloads) runs in Run.
func NewWithDeps(cfg Config, deps Deps) (*Verifier, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid config: %w", err)
	}
	if deps.Clock == nil {
		deps.Clock = clockwork.NewRealClock()
	}
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	if deps.Events == nil {
		deps.Events = discard{}
	}
	l1, err := formatcheck.New(cfg.l1())
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(deps.Metrics)
	if err != nil {
		return nil, err
	}
	v := &Verifier{
		cfg:      cfg,
		clock:    deps.Clock,
		log:      deps.Log,
		events:   deps.Events,
		l1:       l1,
		metrics:  m,
		sessions: newSessions(cfg.Risk, deps.Clock),
		skipL3:   levelsNamed(cfg.Degraded.SkipL3Levels),
	}
	if v.rules, err = newRuleLoader(cfg, deps.Clock, deps.Log, m); err != nil {
		return nil, err
	}
	if cfg.L3.Enabled {
		emb := deps.Embedder
		if emb == nil {
			emb = semantic.NewLexical(cfg.L3.EmbeddingDim)
		}
		scorer := semantic.NewScorer(semantic.Config{
			RelevanceFull: cfg.L3.RelevanceFull, ConsistencyFull: cfg.L3.ConsistencyFull,
		}, emb, semantic.NewHistory(cfg.L3.HistoryQuestions, cfg.L3.HistoryAnswers), deps.Judge)
		v.l3 = newL3Runner(cfg.L3, scorer, v)
	}
	return v, nil
}

// SetReviewSink attaches the review queue. Call it before serving.
func (v *Verifier) SetReviewSink(s ReviewSink) { v.reviews = s }

// Run runs the background work — L3 workers and rule file reloads — until ctx is done.
func (v *Verifier) Run(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		v.rules.watch(ctx)
	}()
	if v.l3 != nil {
		v.l3.run(ctx)
	} else {
		<-ctx.Done()
	}
	<-done
	return nil
}

// Verify checks one answer. It returns a *rpc.ValidationError when the request itself is
// unusable (oversized content, an invalid schema) and the context's error when the call is
// already over; a failed check is a Verdict with Passed false, never an error.
func (v *Verifier) Verify(ctx context.Context, a Answer) (Verdict, error) {
	if err := ctx.Err(); err != nil {
		return Verdict{}, fmt.Errorf("verify: %w", err)
	}
	if err := v.validate(ctx, a); err != nil {
		return Verdict{}, err
	}
	start := v.clock.Now()
	degraded := a.degraded()
	set := v.rules.engine.Live()
	l1 := v.l1.Check(formatcheck.Answer{
		Content: a.Content, FinishReason: a.FinishReason, Format: a.Format, Degraded: degraded,
		ToolCalls: a.ToolCalls, Tools: a.Tools, ToolChoice: a.ToolChoice,
		KeepValue: set.Applies(a.scenario()), // the scenario's rules read the decoded answer
	})
	findings, content := l1.Findings, l1.Content

	// L2 only looks at answers L1 let through: a malformed answer is rejected anyway.
	var outcome rules.Outcome
	if !anyBlocking(findings) {
		outcome = v.checkL2(ctx, set, a, l1, degraded)
		content = outcome.Text
		findings = append(findings, l2Findings(outcome)...)
	}
	verdict := newVerdict(findings, content)
	verdict.Actions = outcome.Applied
	verdict.Degrade = outcome.DegradedBy != "" && outcome.BlockedBy == ""
	verdict.UserNotice = strings.Join(outcome.Notices, " ")
	if verdict.Passed && (len(outcome.Applied) > 0 || verdict.UserNotice != "") {
		verdict.Grade = GradeMedium
	}

	in := v.riskInputs(a, verdict, l1, degraded)
	verdict.Risk = in.score(nil)
	verdict.RiskScore = verdict.Risk.Score
	if verdict.Passed {
		v.sessions.delivered(a.Tenant, a.SessionID, a.Quality.GetRequestId(), degraded)
		if reason := reviewReason(verdict.Risk, outcome.ReviewBy); reason != "" {
			verdict.ReviewID = v.openReview(ctx, reviewFor(a, verdict, in, reason, v.cfg, start))
			if verdict.Grade == GradeHigh {
				verdict.Grade = GradeMedium // delivered, but a person will look at it
			}
		}
		verdict.L3Pending = v.submitL3(a, verdict, in, start)
	}
	verdict.StartedAt = start
	verdict.Duration = v.clock.Since(start)
	v.metrics.observe(verdict)
	return verdict, nil
}

// validate rejects requests that cannot be verified at all. Field names are the request's
// wire names because they travel to the caller in a BadRequest.
func (v *Verifier) validate(ctx context.Context, a Answer) error {
	verr := &rpc.ValidationError{}
	if len(a.Content) > v.cfg.MaxContentBytes {
		verr.Add("content", "is %d bytes; the limit is %d", len(a.Content), v.cfg.MaxContentBytes)
	}
	if err := v.validateTools(ctx, verr, a); err != nil {
		return err
	}
	if a.Format.Type == FormatJSONSchema {
		switch schema := strings.TrimSpace(a.Format.JSONSchema); {
		case schema == "":
			verr.Add("response_format.json_schema", "is required for TYPE_JSON_SCHEMA")
		case schema[0] != '{' && schema != "true" && schema != "false":
			verr.Add("response_format.json_schema", "must be a JSON object or boolean")
		default:
			// Compiled once per distinct schema; the answer is validated against it in L1.
			var serr *formatcheck.SchemaError
			if err := v.l1.CompileSchema(ctx, a.Format.JSONSchema); errors.As(err, &serr) {
				verr.Add("response_format.json_schema", "%s", serr.Problem)
			} else if err != nil {
				return fmt.Errorf("verify: %w", err)
			}
		}
	}
	if a.Format.Type.WantsJSON() {
		for i, field := range a.Format.RequiredFields {
			if field == "" {
				verr.Add(fmt.Sprintf("response_format.required_fields[%d]", i), "must not be empty")
			}
		}
	}
	return verr.OrNil()
}

// validateTools bounds the tool calls and tools of a request and compiles the tools'
// parameter schemas with the limits of response_format schemas: a schema that does not
// compile is the request's fault, as it is for the router, which refuses it first.
func (v *Verifier) validateTools(ctx context.Context, verr *rpc.ValidationError, a Answer) error {
	if n := len(a.ToolCalls); n > openaiapi.MaxToolCalls {
		verr.Add("tool_calls", "at most %d tool calls, got %d", openaiapi.MaxToolCalls, n)
	}
	args := 0
	for _, c := range a.ToolCalls {
		args += len(c.Arguments) + len(c.Name)
	}
	if args > v.cfg.MaxContentBytes {
		verr.Add("tool_calls", "are %d bytes; the limit is %d", args, v.cfg.MaxContentBytes)
	}
	if n := len(a.Tools); n > openaiapi.MaxTools {
		verr.Add("tools", "at most %d tools, got %d", openaiapi.MaxTools, n)
		return nil
	}
	for i, t := range a.Tools {
		if strings.TrimSpace(t.Parameters) == "" {
			continue
		}
		var serr *formatcheck.SchemaError
		if err := v.l1.CompileSchema(ctx, t.Parameters); errors.As(err, &serr) {
			verr.Add(fmt.Sprintf("tools[%d].parameters", i), "%s", serr.Problem)
		} else if err != nil {
			return fmt.Errorf("verify: %w", err)
		}
	}
	switch a.ToolChoice.Mode {
	case "", "auto", "none", "required":
	case "function":
		if a.ToolChoice.Function == "" {
			verr.Add("tool_choice_function", "is required when tool_choice is function")
		}
	default:
		verr.Add("tool_choice", "want auto, none, required or function, got %q", a.ToolChoice.Mode)
	}
	return nil
}

func anyBlocking(findings []Finding) bool {
	for _, f := range findings {
		if f.Blocking {
			return true
		}
	}
	return false
}

// checkL2 evaluates the live rule set and applies the actions of the rules that matched.
func (v *Verifier) checkL2(ctx context.Context, set *rules.Set, a Answer, l1 formatcheck.Result, degraded bool) rules.Outcome {
	in := &rules.Input{
		Scenario:       a.scenario(),
		Tenant:         a.Tenant,
		Model:          a.Model,
		Question:       a.question(),
		ResponseFormat: a.Format.Type.String(),
		Text:           l1.Content,
		Output:         l1.Value,
		Degraded:       degraded,
		Quality:        a.Quality,
	}
	if set.Len() > 0 && len(a.Messages) > 0 {
		in.Messages = make([]rules.Message, len(a.Messages))
		for i, m := range a.Messages {
			in.Messages[i] = rules.Message{Role: m.Role, Content: m.Content}
		}
	}
	res := set.Evaluate(in)
	for _, e := range res.Errors {
		v.metrics.ruleErrors.WithLabelValues(e.RuleID, ruleErrorKind(e)).Inc()
		v.log.DebugContext(ctx, "rule not evaluated", "rule", e.RuleID, "cost_exceeded", e.CostExceeded, "err", e.Err)
	}
	return rules.Apply(in, res.Matches, l1.JSON)
}

func ruleErrorKind(e rules.RuleError) string {
	if e.CostExceeded {
		return "cost_limit"
	}
	return "evaluation"
}

// l2Findings turns rule actions into findings: block and degrade fail the answer; the
// others are recorded as warnings so that the grade says the answer was changed.
func l2Findings(o rules.Outcome) []Finding {
	var out []Finding
	for _, a := range o.Applied {
		f := Finding{Layer: LayerL2, Code: a.RuleID, Path: a.Path, Message: fmt.Sprintf("rule %s: %s (%s)", a.RuleID, a.Action, a.Detail)}
		if a.Action == rules.ActionBlock || a.Action == rules.ActionDegrade {
			f.Blocking, f.Class = true, mantlev1.ErrorClass_ERROR_CLASS_VERIFICATION_FAILED
		}
		out = append(out, f)
	}
	return out
}

func newVerdict(findings []Finding, content string) Verdict {
	v := Verdict{Passed: true, FailureClass: ClassNone, Findings: findings, Content: content}
	for _, f := range findings {
		if f.Blocking {
			v.Passed = false
			v.FailedLayer = f.Layer
			v.FailureClass = classFromProto(f.Class)
			break
		}
	}
	switch {
	case !v.Passed:
		v.Grade = GradeLow
	case len(findings) > 0:
		v.Grade = GradeMedium
	default:
		v.Grade = GradeHigh
	}
	return v
}

// reviewReason says why a delivered answer goes to review, or "" when it does not: a rule
// asked for it, or the risk reached the threshold.
func reviewReason(r Risk, ruleIDs []string) string {
	switch {
	case len(ruleIDs) > 0:
		return "rule:" + ruleIDs[0]
	case r.Score >= r.Threshold:
		return "risk"
	}
	return ""
}

// reviewFor builds the review request for an answer.
func reviewFor(a Answer, verdict Verdict, in riskInputs, reason string, cfg Config, now time.Time) *eventsv1.ReviewRequestEvent {
	scenario := a.scenario()
	sc := cfg.Scenarios[scenario]
	timeout := cfg.Review.Timeout
	if sc.ReviewTimeout > 0 {
		timeout = sc.ReviewTimeout
	}
	def := cfg.Review.DefaultAction
	if sc.DefaultAction != (review.DefaultAction{}) {
		def = sc.DefaultAction
	}
	requestID := a.Quality.GetRequestId()
	id := review.ID(a.Tenant, requestID)
	if requestID == "" {
		id = "rv_" + randomHex(12) // nothing to de-duplicate on
	}
	signals := slices.Clone(verdict.Risk.Signals)
	for _, a := range verdict.Actions {
		signals = append(signals, "rule:"+a.RuleID)
	}
	ev := &eventsv1.ReviewRequestEvent{
		At: timestamppb.New(now), RequestId: requestID, Tenant: a.Tenant, Scenario: scenario,
		RiskScore: verdict.RiskScore, Reason: reason, Content: verdict.Content,
		DueAt: timestamppb.New(now.Add(timeout)), DefaultAction: string(def.Type), DefaultActionText: def.Text,
		ReviewId: id, Question: a.question(), Model: a.Model, SessionId: a.SessionID, Signals: signals,
		InputRisk: verdict.Risk.Input, OutputRisk: verdict.Risk.Output, ContextRisk: verdict.Risk.Context,
	}
	if a.Quality != nil {
		// A copy: the review outlives the call, and Verify answers with the request's
		// QualityContext, extended (qualityWithVerdict).
		ev.Quality = a.Quality.CloneVT()
	}
	return ev
}

// openReview hands a review request to the sink. A failure does not fail the verification
// (the answer was delivered either way): it is counted and logged.
func (v *Verifier) openReview(ctx context.Context, ev *eventsv1.ReviewRequestEvent) string {
	if v.reviews == nil {
		return ""
	}
	if err := v.reviews.Enqueue(ctx, ev); err != nil {
		v.metrics.reviews.WithLabelValues("failed").Inc()
		v.log.ErrorContext(ctx, "review request lost", "review_id", ev.GetReviewId(), "request_id", ev.GetRequestId(), "err", err)
		return ""
	}
	v.metrics.reviews.WithLabelValues("opened").Inc()
	return ev.GetReviewId()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
