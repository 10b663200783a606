package verifier

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// ServiceName is the module name and the service recorded in audit steps.
const ServiceName = "verifier"

// LayerL1 names the format layer in findings and in a verdict's FailedLayer.
const LayerL1 = "l1"

// Stable finding codes. Callers and dashboards key on them, so they never change meaning.
const (
	CodeTruncated     = "truncated"
	CodeEncoding      = "encoding"
	CodeEmpty         = "empty"
	CodeRefusal       = "refusal"
	CodeRepetition    = "repetition"
	CodeMarkdownFence = "markdown_fence"
	CodeJSONParse     = "json_parse"
	CodeJSONType      = "json_type"
	CodeRequiredField = "required_field"
	CodeLowConfidence = "low_confidence"
)

// FormatType is the output shape the request asked for.
type FormatType int

const (
	// FormatText is free text; also what an unspecified format means.
	FormatText FormatType = iota
	// FormatJSONObject asks for a JSON object.
	FormatJSONObject
	// FormatJSONSchema asks for JSON matching a schema (the schema itself is checked from a
	// later issue on; for now the answer only has to be JSON).
	FormatJSONSchema
)

func (t FormatType) wantsJSON() bool { return t == FormatJSONObject || t == FormatJSONSchema }

// Format is the requested output format.
type Format struct {
	Type FormatType
	// JSONSchema is the schema document for FormatJSONSchema.
	JSONSchema string
	// RequiredFields are top-level fields a JSON answer must carry with a non-empty value.
	// They are ignored for FormatText.
	RequiredFields []string
}

// Answer is what Verify checks: one model answer and the format it was asked for.
type Answer struct {
	Content      string
	FinishReason string
	Format       Format
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
	// ClassVerificationFailed: well-formed, but a check on its content failed.
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

// Grade summarises a verdict for callers.
type Grade int

const (
	// GradeHigh: passed without findings.
	GradeHigh Grade = iota + 1
	// GradeMedium: passed with non-blocking findings.
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

// Finding is one check's observation.
type Finding struct {
	Layer string
	Code  string
	// Path is the JSON field the finding refers to, or "" for the whole answer.
	Path    string
	Message string
	// Blocking findings fail the answer; the others (a markdown fence) are warnings.
	Blocking bool
	// Class is the failure class a blocking finding gives the verdict when it is first.
	Class FailureClass
}

// Verdict is the outcome of verifying one answer.
type Verdict struct {
	Passed bool
	// FailedLayer is LayerL1 when the answer failed, "" when it passed.
	FailedLayer string
	// FailureClass is the class of the first blocking finding; ClassNone when passed.
	FailureClass FailureClass
	Findings     []Finding
	// Content is the answer to deliver: the input, or the JSON inside a markdown fence.
	Content   string
	Grade     Grade
	RiskScore float64
	// StartedAt and Duration time the verification, for the audit trail.
	StartedAt time.Time
	Duration  time.Duration
}

// FailedCodes returns the distinct codes of the blocking findings, in finding order.
func (v Verdict) FailedCodes() []string {
	var codes []string
	for _, f := range v.Findings {
		if f.Blocking && !slices.Contains(codes, f.Code) {
			codes = append(codes, f.Code)
		}
	}
	return codes
}

// Verifier runs the verification layers. It is safe for concurrent use.
type Verifier struct {
	cfg      Config
	clock    clockwork.Clock
	refusals refusalMatcher
	metrics  *metrics
}

// New builds a Verifier. A nil RefusalPhrases means the defaults; reg may be nil (tests),
// in which case the metrics are kept but not exported.
func New(cfg Config, clock clockwork.Clock, reg prometheus.Registerer) (*Verifier, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid config: %w", err)
	}
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	phrases := cfg.RefusalPhrases
	if phrases == nil {
		phrases = DefaultRefusalPhrases()
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	return &Verifier{
		cfg:      cfg,
		clock:    clock,
		refusals: newRefusalMatcher(phrases),
		metrics:  m,
	}, nil
}

// Verify checks one answer. It returns a *rpc.ValidationError when the request itself is
// unusable (oversized content, an unparseable schema) and the context's error when the call
// is already over; a failed check is a Verdict with Passed false, never an error.
func (v *Verifier) Verify(ctx context.Context, a Answer) (Verdict, error) {
	if err := ctx.Err(); err != nil {
		return Verdict{}, fmt.Errorf("verify: %w", err)
	}
	if err := v.validate(a); err != nil {
		return Verdict{}, err
	}
	start := v.clock.Now()
	findings, content := v.checkL1(a)
	verdict := newVerdict(findings, content)
	verdict.StartedAt = start
	verdict.Duration = v.clock.Since(start)
	v.metrics.observe(verdict)
	return verdict, nil
}

// validate rejects requests that cannot be verified at all. Field names are the request's
// wire names because they travel to the caller in a BadRequest.
func (v *Verifier) validate(a Answer) error {
	verr := &rpc.ValidationError{}
	if len(a.Content) > v.cfg.MaxContentBytes {
		verr.Add("content", "is %d bytes; the limit is %d", len(a.Content), v.cfg.MaxContentBytes)
	}
	if a.Format.Type == FormatJSONSchema {
		// Full JSON Schema validation comes with L2; until then a schema that is not even
		// JSON is the caller's bug and must not pass silently.
		switch schema := strings.TrimSpace(a.Format.JSONSchema); {
		case schema == "":
			verr.Add("response_format.json_schema", "is required for TYPE_JSON_SCHEMA")
		case !json.Valid([]byte(schema)):
			verr.Add("response_format.json_schema", "is not valid JSON")
		case schema[0] != '{' && schema != "true" && schema != "false":
			verr.Add("response_format.json_schema", "must be a JSON object or boolean")
		}
	}
	if a.Format.Type.wantsJSON() {
		for i, field := range a.Format.RequiredFields {
			if field == "" {
				verr.Add(fmt.Sprintf("response_format.required_fields[%d]", i), "must not be empty")
			}
		}
	}
	return verr.OrNil()
}

func newVerdict(findings []Finding, content string) Verdict {
	v := Verdict{Passed: true, FailureClass: ClassNone, Findings: findings, Content: content}
	for _, f := range findings {
		if f.Blocking {
			v.Passed = false
			v.FailedLayer = f.Layer
			v.FailureClass = f.Class
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
	v.RiskScore = riskScore(findings)
	return v
}

// riskScore is a placeholder until the weighted model (input, output and context risk, with
// the 0.75 review threshold) arrives in a later issue: 0 for a clean answer, 0.1 per
// warning, 0.4 per blocking finding, capped at 1. Route on Passed and FailureClass, not on
// this number.
func riskScore(findings []Finding) float64 {
	var score float64
	for _, f := range findings {
		if f.Blocking {
			score += 0.4
		} else {
			score += 0.1
		}
	}
	return min(score, 1)
}
