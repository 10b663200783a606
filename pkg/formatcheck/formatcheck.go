package formatcheck

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// LayerL1 is the layer every finding of this package names.
const LayerL1 = "l1"

// Stable finding codes. Callers and dashboards key on them, so they never change meaning.
const (
	CodeTruncated     = "truncated"
	CodeEncoding      = "encoding"
	CodeEmpty         = "empty"
	CodeRefusal       = "refusal"
	CodeRepetition    = "repetition"
	CodeMarkdownFence = "markdown_fence"
	CodeMarkdown      = "markdown"
	CodeHTML          = "html"
	CodeJSONParse     = "json_parse"
	CodeJSONType      = "json_type"
	CodeSchema        = "schema"
	CodeRequiredField = "required_field"
	CodeLowConfidence = "low_confidence"
	// Tool calls: arguments that are not a JSON object, arguments that do not validate
	// against the tool's parameters schema, a call of a tool the request did not offer, a
	// call tool_choice forbids (or no call where it demands one).
	CodeToolCallArguments = "tool_call_arguments"
	CodeToolCallSchema    = "tool_call_schema"
	CodeToolCallUnknown   = "tool_call_unknown"
	CodeToolChoice        = "tool_choice"
)

// Config tunes the checks. The zero value is not usable; start from DefaultConfig.
// Validate names each field by its key in the verifier's configuration block, where
// operators set them.
type Config struct {
	// ConfidenceThreshold fails a JSON answer whose top-level numeric "confidence" field is
	// strictly below it (confidence_threshold). A common choice is 0.3.
	ConfidenceThreshold float64
	// DegradedConfidenceThreshold replaces ConfidenceThreshold for answers marked Degraded
	// (degraded.confidence_threshold): smaller fallback models report lower confidence for
	// the same quality.
	DegradedConfidenceThreshold float64
	// RefusalPhrases (refusal_phrases) replace DefaultRefusalPhrases when non-nil. Matching
	// ignores case, punctuation, whitespace and full/half width, so "抱歉，我不能" also
	// matches "抱歉, 我不能". nil means the defaults; an empty list turns refusal detection
	// off.
	RefusalPhrases []string
	// RepetitionThreshold (repetition_threshold) is how many times in a row the same
	// sentence (or cycle of up to three sentences) may appear before the answer counts as a
	// decoding loop.
	RepetitionThreshold int
	// SchemaCacheSize (schema_cache_size) is how many compiled JSON Schemas are kept:
	// schemas arrive with each request, and compiling one costs far more than validating.
	SchemaCacheSize int
	// MaxSchemaFindings (max_schema_findings) bounds the schema findings of one answer.
	MaxSchemaFindings int
	// MaxSchemaBytes (max_schema_bytes), MaxSchemaDepth (max_schema_depth, JSON nesting
	// levels) and MaxSchemaNodes (max_schema_nodes, subschemas with references expanded)
	// bound a request's schema: compiling and validating grow much faster than the
	// document, so a schema over a limit is refused before it is compiled.
	MaxSchemaBytes int
	MaxSchemaDepth int
	MaxSchemaNodes int
}

// DefaultConfig returns the defaults the verifier ships and the router falls back to.
func DefaultConfig() Config {
	return Config{
		ConfidenceThreshold:         0.3,
		DegradedConfidenceThreshold: 0.2,
		RefusalPhrases:              DefaultRefusalPhrases(),
		RepetitionThreshold:         4,
		SchemaCacheSize:             256,
		MaxSchemaFindings:           10,
		MaxSchemaBytes:              64 << 10,
		MaxSchemaDepth:              32,
		MaxSchemaNodes:              2000,
	}
}

// Validate reports every invalid field, each message naming the verifier's key for it.
func (c Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	for key, v := range map[string]float64{
		"confidence_threshold":          c.ConfidenceThreshold,
		"degraded.confidence_threshold": c.DegradedConfidenceThreshold,
	} {
		if math.IsNaN(v) || v < 0 || v > 1 {
			add("%s: must be between 0 and 1, got %v", key, v)
		}
	}
	for i, phrase := range c.RefusalPhrases {
		if key, _ := appendMatchKey(nil, phrase, math.MaxInt); len(key) == 0 {
			add("refusal_phrases[%d]: must contain a letter or digit, got %q", i, phrase)
		}
	}
	if c.RepetitionThreshold < 2 {
		add("repetition_threshold: must be at least 2, got %d", c.RepetitionThreshold)
	}
	if c.SchemaCacheSize <= 0 {
		add("schema_cache_size: must be positive, got %d", c.SchemaCacheSize)
	}
	for key, v := range map[string]int{
		"max_schema_findings": c.MaxSchemaFindings,
		"max_schema_bytes":    c.MaxSchemaBytes,
		"max_schema_depth":    c.MaxSchemaDepth,
		"max_schema_nodes":    c.MaxSchemaNodes,
	} {
		if v <= 0 {
			add("%s: must be positive, got %d", key, v)
		}
	}
	// Map order must not decide the order of the messages.
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return errors.Join(errs...)
}

// FormatType is the output shape the request asked for.
type FormatType int

const (
	// FormatText is free text; also what an unspecified format means.
	FormatText FormatType = iota
	// FormatJSONObject asks for a JSON object.
	FormatJSONObject
	// FormatJSONSchema asks for JSON matching a schema.
	FormatJSONSchema
)

// WantsJSON reports whether the format asks for JSON.
func (t FormatType) WantsJSON() bool { return t == FormatJSONObject || t == FormatJSONSchema }

func (t FormatType) String() string {
	switch t {
	case FormatJSONObject:
		return "json_object"
	case FormatJSONSchema:
		return "json_schema"
	}
	return "text"
}

// FormatFromProto converts a request's response_format. A nil format, TYPE_UNSPECIFIED and
// TYPE_TEXT are text; an unknown type is reported (ok false) for the caller to reject or
// treat as text.
func FormatFromProto(rf *mantlev1.ResponseFormat) (f Format, ok bool) {
	switch rf.GetType() {
	case mantlev1.ResponseFormat_TYPE_UNSPECIFIED, mantlev1.ResponseFormat_TYPE_TEXT:
		f.Type = FormatText
	case mantlev1.ResponseFormat_TYPE_JSON_OBJECT:
		f.Type = FormatJSONObject
	case mantlev1.ResponseFormat_TYPE_JSON_SCHEMA:
		f.Type = FormatJSONSchema
	default:
		return Format{}, false
	}
	f.JSONSchema, f.RequiredFields = rf.GetJsonSchema(), rf.GetRequiredFields()
	return f, true
}

// Format is the requested output format.
type Format struct {
	Type FormatType
	// JSONSchema is the schema document for FormatJSONSchema.
	JSONSchema string
	// RequiredFields are top-level fields a JSON answer must carry with a non-empty value.
	// They are ignored for FormatText.
	RequiredFields []string
}

// Answer is what Check looks at.
type Answer struct {
	Content      string
	FinishReason string
	Format       Format
	// Degraded: the answer comes from a fallback, not the route's first choice; it is held
	// to Config.DegradedConfidenceThreshold.
	Degraded bool
	// ToolCalls are the answer's tool calls: an answer that is only tool calls has no
	// content, and is not empty. Each is checked against Tools and ToolChoice.
	ToolCalls []ToolCall
	// Tools are the tools the request offered; ToolChoice is its tool_choice.
	Tools      []Tool
	ToolChoice ToolChoice
	// KeepValue asks for the whole JSON document decoded into Result.Value even without a
	// schema (the verifier's L2 rules read it). Otherwise only the top level is decoded,
	// which is several times cheaper on large answers.
	KeepValue bool
}

// Finding is one check's observation. The verifier reports its L2 findings in the same
// shape, with their own layer.
type Finding struct {
	Layer string
	Code  string
	// Path is the JSON field the finding refers to, or "" for the whole answer.
	Path    string
	Message string
	// Blocking findings fail the answer; the others (a markdown fence) are warnings.
	Blocking bool
	// Class is the class a blocking finding gives the answer when it is the first one;
	// warnings leave it unspecified.
	Class mantlev1.ErrorClass
}

// Result is what Check found.
type Result struct {
	// Passed is true when no finding is blocking.
	Passed bool
	// Class is the class of the first blocking finding; ERROR_CLASS_NONE when passed.
	Class    mantlev1.ErrorClass
	Findings []Finding
	// Content is the answer to deliver: unwrapped from a markdown fence when it was one.
	Content string
	// JSON is true when the format asked for JSON and the answer (after unwrapping) parsed.
	JSON bool
	// Value is the decoded JSON document (objects as map[string]any, numbers as float64)
	// when it was decoded whole: with a schema, or when Answer.KeepValue asked for it.
	Value any
	// top reads the top-level members of a JSON object answer; nil otherwise.
	top topLevel
}

// FailedCodes returns the distinct codes of the blocking findings, in finding order.
func (r Result) FailedCodes() []string {
	var codes []string
	for _, f := range r.Findings {
		if f.Blocking && !slices.Contains(codes, f.Code) {
			codes = append(codes, f.Code)
		}
	}
	return codes
}

// Strings returns the non-empty string values of a JSON answer: every one when the
// document was decoded whole, the top-level ones otherwise; nil for other answers.
func (r Result) Strings() []string {
	var out []string
	switch {
	case r.Value != nil:
		collectStrings(r.Value, &out)
	case r.top != nil:
		out = r.top.strings()
	}
	return out
}

// Checker runs the checks. It is safe for concurrent use.
type Checker struct {
	cfg      Config
	refusals refusalMatcher
	schemas  *schemaCache
}

// New builds a Checker.
func New(cfg Config) (*Checker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("formatcheck: %w", err)
	}
	phrases := cfg.RefusalPhrases
	if phrases == nil {
		phrases = DefaultRefusalPhrases()
	}
	return &Checker{cfg: cfg, refusals: newRefusalMatcher(phrases), schemas: newSchemaCache(cfg.SchemaCacheSize, schemaLimits{bytes: cfg.MaxSchemaBytes, depth: cfg.MaxSchemaDepth, nodes: cfg.MaxSchemaNodes})}, nil
}

// CompileSchema compiles a request's JSON Schema (and caches it for Check), so that an
// invalid schema can be rejected as a bad request before any model is asked. The error is
// a *SchemaError naming the problem, or ctx's error. Check does not apply a schema that
// does not compile.
func (c *Checker) CompileSchema(ctx context.Context, doc string) error {
	_, err := c.schemas.get(ctx, doc)
	return err
}

// ValidateValue validates a decoded JSON value (what encoding/json decodes into an any)
// against the JSON Schema doc, compiled through the same bounded cache as CompileSchema.
// It returns one finding (code schema) per failing leaf, at most max_schema_findings of
// them, nil when value is valid; or the *SchemaError of a doc that does not compile, or
// ctx's error. The agent checks tool arguments and results with it.
func (c *Checker) ValidateValue(ctx context.Context, doc string, value any) ([]Finding, error) {
	schema, err := c.schemas.get(ctx, doc)
	if err != nil {
		return nil, err
	}
	return schemaFindings(schema, value, c.cfg.MaxSchemaFindings), nil
}

// Check runs the checks on one answer and returns their findings in the order the package
// doc explains.
func (c *Checker) Check(a Answer) Result {
	var findings []Finding
	if f, ok := checkTruncated(a.FinishReason); ok {
		findings = append(findings, f)
	}
	findings = appendEncodingFindings(findings, a.Content)
	toolFindings := c.checkToolCalls(a)
	if len(a.ToolCalls) > 0 {
		// The answer is the tool calls, with at most a preamble: the format asked for
		// applies to the final text answer, and a model that calls a tool did not refuse.
		return newResult(Result{Content: a.Content}, append(findings, toolFindings...))
	}
	if strings.TrimSpace(a.Content) == "" {
		// Nothing else can be said about an empty answer; json_parse would only repeat it.
		findings = append(findings, blocking(CodeEmpty, "", malformed, "the answer is empty"))
		return newResult(Result{Content: a.Content}, append(findings, toolFindings...))
	}

	res := Result{Content: a.Content}
	var jsonResult jsonCheck
	if a.Format.Type.WantsJSON() {
		confidence := c.cfg.ConfidenceThreshold
		if a.Degraded {
			confidence = c.cfg.DegradedConfidenceThreshold
		}
		jsonResult = c.checkJSON(a.Content, a.Format, confidence, a.KeepValue)
		res.Content, res.Value, res.JSON, res.top = jsonResult.content, jsonResult.value, jsonResult.parsed, jsonResult.top
	}
	// A refusal to a JSON request arrives as prose, so it is looked for only when the answer
	// did not parse. Apologetic text inside a well-formed JSON value is a business matter
	// for the verifier's rules, not a format failure.
	if !jsonResult.parsed {
		if phrase, ok := c.refusals.match(a.Content); ok {
			findings = append(findings, blocking(CodeRefusal, "", mantlev1.ErrorClass_ERROR_CLASS_REFUSAL,
				fmt.Sprintf("the answer is a refusal (%q)", phrase)))
		}
	}
	if f, ok := checkRepetition(a.Content, c.cfg.RepetitionThreshold); ok {
		findings = append(findings, f)
	}
	if tag, ok := findHTMLTag(res.Content); ok {
		findings = append(findings, warning(CodeHTML, "",
			fmt.Sprintf("the answer contains HTML markup (%q)", abbreviate(tag, 40))))
	}
	if !a.Format.Type.WantsJSON() && unclosedFence(a.Content) {
		findings = append(findings, warning(CodeMarkdown, "", "the answer opens a markdown code fence it never closes"))
	}
	findings = append(findings, jsonResult.findings...)
	// Last: a text answer where tool_choice demanded a call is wrong, but a refusal or a
	// truncation explains it better.
	return newResult(res, append(findings, toolFindings...))
}

// newResult completes res with findings and the verdict they imply.
func newResult(res Result, findings []Finding) Result {
	res.Findings, res.Passed, res.Class = findings, true, mantlev1.ErrorClass_ERROR_CLASS_NONE
	for _, f := range findings {
		if f.Blocking {
			res.Passed, res.Class = false, f.Class
			break
		}
	}
	return res
}

// malformed is the class of every blocking finding that is not about truncation, refusal
// or confidence.
const malformed = mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT

func blocking(code, path string, class mantlev1.ErrorClass, msg string) Finding {
	return Finding{Layer: LayerL1, Code: code, Path: path, Message: msg, Blocking: true, Class: class}
}

func warning(code, path, msg string) Finding {
	return Finding{Layer: LayerL1, Code: code, Path: path, Message: msg}
}
