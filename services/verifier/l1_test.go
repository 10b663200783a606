package verifier

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// TestVerifyL1 checks how the verifier serves L1 (package formatcheck tests the checks
// themselves): each failure class becomes the verdict's class, grade and failed layer, the
// delivered content is formatcheck's (unwrapped from a fence), and the L1 keys of the
// verifier's configuration reach the checker.
func TestVerifyL1(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		cfg    func(*Config) // adjusts DefaultConfig, when set
		answer Answer
		// wantClass ClassNone means the answer must pass.
		wantClass    FailureClass
		wantGrade    Grade
		wantFindings []wantFinding
		// wantContent is the delivered content; nil means the input, unchanged.
		wantContent *string
	}{
		{
			name:      "valid JSON object",
			answer:    Answer{Content: validJSON, FinishReason: "stop", Format: jsonObject("answer", "order_id")},
			wantClass: ClassNone, wantGrade: GradeHigh,
		},
		{
			name:      "fenced JSON is unwrapped with a warning",
			answer:    Answer{Content: "```json\n" + validJSON + "\n```\n", Format: jsonObject("answer", "order_id")},
			wantClass: ClassNone, wantGrade: GradeMedium,
			wantFindings: []wantFinding{{Code: CodeMarkdownFence}},
			wantContent:  ptr(validJSON),
		},
		{
			name:      "broken JSON",
			answer:    Answer{Content: `{"answer": "Your order ships", "order_id": }`, Format: jsonObject("answer")},
			wantClass: ClassMalformedOutput, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeJSONParse, Blocking: true}},
		},
		{
			name:      "refusal",
			answer:    Answer{Content: "I'm sorry, but I can't help with that request.", FinishReason: "stop"},
			wantClass: ClassRefusal, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeRefusal, Blocking: true}},
		},
		{
			name:      "truncated JSON is truncated first",
			answer:    Answer{Content: `{"answer": "Your order ships`, FinishReason: "length", Format: jsonObject("answer")},
			wantClass: ClassTruncated, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeTruncated, Blocking: true}, {Code: CodeJSONParse, Blocking: true}},
		},
		{
			name:      "low confidence",
			answer:    Answer{Content: `{"answer": "Maybe Tuesday?", "confidence": 0.12}`, Format: jsonObject("answer")},
			wantClass: ClassVerificationFailed, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeLowConfidence, Path: "confidence", Blocking: true}},
		},
		{
			name:      "schema violation",
			answer:    Answer{Content: `{"id": 7}`, Format: Format{Type: FormatJSONSchema, JSONSchema: `{"properties": {"id": {"type": "string"}}}`}},
			wantClass: ClassMalformedOutput, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeSchema, Path: "/id", Blocking: true}},
		},
		{
			name:      "html is a warning",
			answer:    Answer{Content: "Your order ships<br/>tomorrow"},
			wantClass: ClassNone, wantGrade: GradeMedium,
			wantFindings: []wantFinding{{Code: CodeHTML}},
		},

		// Configuration keys.
		{
			name:      "confidence_threshold",
			cfg:       func(c *Config) { c.ConfidenceThreshold = 0.5 },
			answer:    Answer{Content: `{"answer": "Tuesday.", "confidence": 0.4}`, Format: jsonObject("answer")},
			wantClass: ClassVerificationFailed, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeLowConfidence, Path: "confidence", Blocking: true}},
		},
		{
			name:      "refusal_phrases replace the defaults",
			cfg:       func(c *Config) { c.RefusalPhrases = []string{"no can do"} },
			answer:    Answer{Content: "No can do, friend."},
			wantClass: ClassRefusal, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeRefusal, Blocking: true}},
		},
		{
			name:      "an empty refusal_phrases list turns detection off",
			cfg:       func(c *Config) { c.RefusalPhrases = []string{} },
			answer:    Answer{Content: "I'm sorry, but I can't help with that request."},
			wantClass: ClassNone, wantGrade: GradeHigh,
		},
		{
			name:      "repetition_threshold",
			cfg:       func(c *Config) { c.RepetitionThreshold = 2 },
			answer:    Answer{Content: "Please wait. Please wait."},
			wantClass: ClassMalformedOutput, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeRepetition, Blocking: true}},
		},
		{
			name: "max_schema_findings",
			cfg:  func(c *Config) { c.MaxSchemaFindings = 1 },
			answer: Answer{Content: `[1, 2, 3]`, Format: Format{Type: FormatJSONSchema,
				JSONSchema: `{"type": "array", "items": {"type": "string"}}`}},
			wantClass: ClassMalformedOutput, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeSchema, Blocking: true}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := DefaultConfig()
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			got, err := newTestVerifier(t, cfg).Verify(context.Background(), tt.answer)
			if err != nil {
				t.Fatalf("Verify: unexpected error %v", err)
			}
			if wantPassed := tt.wantClass == ClassNone; got.Passed != wantPassed {
				t.Errorf("Passed = %v, want %v (findings %+v)", got.Passed, wantPassed, got.Findings)
			}
			if got.FailureClass != tt.wantClass {
				t.Errorf("FailureClass = %v, want %v", got.FailureClass, tt.wantClass)
			}
			if got.Grade != tt.wantGrade {
				t.Errorf("Grade = %v, want %v", got.Grade, tt.wantGrade)
			}
			if diff := cmp.Diff(tt.wantFindings, findingKeys(got.Findings)); diff != "" {
				t.Errorf("findings mismatch (-want +got):\n%s(messages: %q)", diff, messages(got.Findings))
			}
			wantLayer := ""
			if tt.wantClass != ClassNone {
				wantLayer = LayerL1
			}
			if got.FailedLayer != wantLayer {
				t.Errorf("FailedLayer = %q, want %q", got.FailedLayer, wantLayer)
			}
			wantContent := tt.answer.Content
			if tt.wantContent != nil {
				wantContent = *tt.wantContent
			}
			if got.Content != wantContent {
				t.Errorf("Content = %q, want %q", got.Content, wantContent)
			}
		})
	}
}

func TestSchemaRejectsExternalReferences(t *testing.T) {
	t.Parallel()
	v := newTestVerifier(t, DefaultConfig())
	for _, ref := range []string{"file:///etc/passwd", "http://169.254.169.254/latest/meta-data", "other.json"} {
		a := Answer{Content: `{}`, Format: Format{Type: FormatJSONSchema, JSONSchema: `{"$ref": "` + ref + `"}`}}
		if _, err := v.Verify(context.Background(), a); err == nil || !strings.Contains(err.Error(), "json_schema") {
			t.Errorf("schema referring to %s: err = %v, want it rejected as invalid", ref, err)
		}
	}
	// A schema with an internal reference is fine.
	doc := `{"$defs": {"id": {"type": "string"}}, "type": "object", "properties": {"id": {"$ref": "#/$defs/id"}}}`
	got, err := v.Verify(context.Background(), Answer{Content: `{"id": 7}`, Format: Format{Type: FormatJSONSchema, JSONSchema: doc}})
	if err != nil || got.Passed {
		t.Fatalf("Verify = passed %v, %v; want a schema failure", got.Passed, err)
	}
}

// TestDegradedAnswersGetAdaptedThresholds: the checks fit the model that
// answered.
func TestDegradedAnswersGetAdaptedThresholds(t *testing.T) {
	t.Parallel()
	v := newTestVerifier(t, DefaultConfig())
	answer := Answer{Content: `{"answer": "退款将在五个工作日内到账", "confidence": 0.25}`, Format: jsonObject("answer")}
	for _, tt := range []struct {
		level     mantlev1.FallbackLevel
		wantPass  bool
		threshold float64
	}{
		{mantlev1.FallbackLevel_FALLBACK_LEVEL_UNSPECIFIED, false, 0.75},
		{mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY, false, 0.75},
		{mantlev1.FallbackLevel_FALLBACK_LEVEL_BACKUP_MODEL, true, 0.75 * 1.3},
		{mantlev1.FallbackLevel_FALLBACK_LEVEL_TEMPLATE, true, 0.75 * 1.3},
	} {
		a := answer
		a.Quality = &mantlev1.QualityContext{FallbackLevel: tt.level}
		got, err := v.Verify(context.Background(), a)
		if err != nil {
			t.Fatal(err)
		}
		if got.Passed != tt.wantPass || math.Abs(got.Risk.Threshold-tt.threshold) > 1e-9 {
			t.Errorf("%v: passed %v threshold %v; want %v, %v", tt.level, got.Passed, got.Risk.Threshold, tt.wantPass, tt.threshold)
		}
	}
}
