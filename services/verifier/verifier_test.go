package verifier

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/verifier/internal/rules"
)

// wantFinding is the part of a Finding the tests pin down; messages are for humans and may
// be reworded freely.
type wantFinding struct {
	Code     string
	Path     string
	Blocking bool
}

func findingKeys(findings []Finding) []wantFinding {
	var keys []wantFinding
	for _, f := range findings {
		keys = append(keys, wantFinding{Code: f.Code, Path: f.Path, Blocking: f.Blocking})
	}
	return keys
}

func newTestVerifier(t testing.TB, cfg Config) *Verifier {
	t.Helper()
	v, err := New(cfg, clockwork.NewFakeClock(), nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return v
}

func jsonObject(required ...string) Format {
	return Format{Type: FormatJSONObject, RequiredFields: required}
}

const validJSON = `{"answer": "Your order ships tomorrow.", "order_id": "A-1042", "confidence": 0.92}`

// Long answers for the refusal position rule: each is well past refusalShortAnswerBytes.
const (
	longApology = "Thanks for reaching out about order A-1042. We're sorry for the delay: the parcel left " +
		"our warehouse on Monday and the carrier has since confirmed it is in transit. You can follow it " +
		"with the tracking link in your confirmation email. If it has not arrived by Friday, reply to this " +
		"message and we will send a replacement or refund the full amount, whichever you prefer."
	longQuotedRefusal = "Handling payment difficulties starts with listening. Greet the customer by name, " +
		"confirm the order number and check the payment history before suggesting anything. When a " +
		"customer writes \"I'm sorry, but I can't pay this month\", offer the instalment plan first, then " +
		"the 30-day deferral, and never mention collection in the first reply. Tag the conversation " +
		"payment-plan so that finance can follow up."
	longAIOpening = "As an AI language model, I don't have personal opinions, but here is an overview of the " +
		"main arguments. Supporters of a four-day week point to studies in which output held steady while " +
		"sick leave and staff turnover fell. Critics answer that those trials were short, voluntary and " +
		"concentrated in office work, and that shift-based sectors such as healthcare and retail would need " +
		"more staff to keep the same opening hours."
)

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
		// JSON answers.
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
			name:      "fence without a language tag",
			answer:    Answer{Content: "```\n" + validJSON + "\n```", Format: jsonObject("answer")},
			wantClass: ClassNone, wantGrade: GradeMedium,
			wantFindings: []wantFinding{{Code: CodeMarkdownFence}},
			wantContent:  ptr(validJSON),
		},
		{
			name:      "prose around a fence is not unwrapped",
			answer:    Answer{Content: "Here you go:\n```json\n" + validJSON + "\n```", Format: jsonObject()},
			wantClass: ClassMalformedOutput, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeJSONParse, Blocking: true}},
		},
		{
			name:      "broken JSON",
			answer:    Answer{Content: `{"answer": "Your order ships", "order_id": }`, Format: jsonObject("answer")},
			wantClass: ClassMalformedOutput, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeJSONParse, Blocking: true}},
		},
		{
			name:      "prose after the JSON",
			answer:    Answer{Content: validJSON + " Hope this helps!", Format: jsonObject()},
			wantClass: ClassMalformedOutput, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeJSONParse, Blocking: true}},
		},
		{
			name:      "empty fence",
			answer:    Answer{Content: "```json\n```", Format: jsonObject()},
			wantClass: ClassMalformedOutput, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeMarkdownFence}, {Code: CodeJSONParse, Blocking: true}},
			wantContent:  ptr(""),
		},
		{
			name:      "array where an object was asked for",
			answer:    Answer{Content: `[{"answer": "yes"}]`, Format: jsonObject()},
			wantClass: ClassMalformedOutput, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeJSONType, Blocking: true}},
		},
		{
			name:      "array allowed under a schema",
			answer:    Answer{Content: `["a", "b"]`, Format: Format{Type: FormatJSONSchema, JSONSchema: `{"type": "array"}`}},
			wantClass: ClassNone, wantGrade: GradeHigh,
		},
		{
			name:      "required field in an array answer under a schema",
			answer:    Answer{Content: `["a"]`, Format: Format{Type: FormatJSONSchema, JSONSchema: `true`, RequiredFields: []string{"answer"}}},
			wantClass: ClassMalformedOutput, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeRequiredField, Path: "answer", Blocking: true}},
		},
		{
			name:      "missing required field",
			answer:    Answer{Content: `{"answer": "Ships tomorrow.", "confidence": 0.9}`, Format: jsonObject("answer", "order_id")},
			wantClass: ClassMalformedOutput, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeRequiredField, Path: "order_id", Blocking: true}},
		},
		{
			name: "empty required fields; zero and false are values",
			answer: Answer{
				Content: `{"a": null, "b": "", "c": [ ], "d": {}, "e": "  ", "f": 0, "g": false, "h": [0]}`,
				Format:  jsonObject("a", "b", "c", "d", "e", "f", "g", "h"),
			},
			wantClass: ClassMalformedOutput, wantGrade: GradeLow,
			wantFindings: []wantFinding{
				{Code: CodeRequiredField, Path: "a", Blocking: true},
				{Code: CodeRequiredField, Path: "b", Blocking: true},
				{Code: CodeRequiredField, Path: "c", Blocking: true},
				{Code: CodeRequiredField, Path: "d", Blocking: true},
				{Code: CodeRequiredField, Path: "e", Blocking: true},
			},
		},
		{
			name:      "low confidence",
			answer:    Answer{Content: `{"answer": "Maybe Tuesday?", "confidence": 0.12}`, Format: jsonObject("answer")},
			wantClass: ClassVerificationFailed, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeLowConfidence, Path: "confidence", Blocking: true}},
		},
		{
			name:      "confidence at the threshold passes",
			answer:    Answer{Content: `{"answer": "Tuesday.", "confidence": 0.3}`, Format: jsonObject("answer")},
			wantClass: ClassNone, wantGrade: GradeHigh,
		},
		{
			name:      "non-numeric confidence is left to L2",
			answer:    Answer{Content: `{"answer": "Tuesday.", "confidence": "low"}`, Format: jsonObject("answer")},
			wantClass: ClassNone, wantGrade: GradeHigh,
		},
		{
			name:      "configured confidence threshold",
			cfg:       func(c *Config) { c.ConfidenceThreshold = 0.5 },
			answer:    Answer{Content: `{"answer": "Tuesday.", "confidence": 0.4}`, Format: jsonObject("answer")},
			wantClass: ClassVerificationFailed, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeLowConfidence, Path: "confidence", Blocking: true}},
		},
		{
			name:      "missing field comes before low confidence",
			answer:    Answer{Content: `{"answer": "Maybe.", "confidence": 0.1}`, Format: jsonObject("answer", "order_id")},
			wantClass: ClassMalformedOutput, wantGrade: GradeLow,
			wantFindings: []wantFinding{
				{Code: CodeRequiredField, Path: "order_id", Blocking: true},
				{Code: CodeLowConfidence, Path: "confidence", Blocking: true},
			},
		},
		{
			name:      "fenced JSON in text mode is left alone",
			answer:    Answer{Content: "```json\n" + validJSON + "\n```", Format: Format{Type: FormatText}},
			wantClass: ClassNone, wantGrade: GradeHigh,
		},

		// Refusals.
		{
			name:      "refusal in English",
			answer:    Answer{Content: "I'm sorry, but I can't help with that request.", FinishReason: "stop"},
			wantClass: ClassRefusal, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeRefusal, Blocking: true}},
		},
		{
			name:      "refusal with curly apostrophes and no comma",
			answer:    Answer{Content: "I’m sorry but I can’t share internal pricing."},
			wantClass: ClassRefusal, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeRefusal, Blocking: true}},
		},
		{
			name:      "refusal in Chinese",
			answer:    Answer{Content: "抱歉，我不能回答这个问题。"},
			wantClass: ClassRefusal, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeRefusal, Blocking: true}},
		},
		{
			name:      "refusal in Chinese with a half-width comma",
			answer:    Answer{Content: "抱歉, 我不能提供该用户的个人信息。"},
			wantClass: ClassRefusal, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeRefusal, Blocking: true}},
		},
		{
			name:      "Chinese as-an-AI disclaimer",
			answer:    Answer{Content: "作为一个AI语言模型，我没有个人观点。"},
			wantClass: ClassRefusal, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeRefusal, Blocking: true}},
		},
		{
			name:      "long answer that opens with a disclaimer",
			answer:    Answer{Content: longAIOpening},
			wantClass: ClassRefusal, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeRefusal, Blocking: true}},
		},
		{
			name: "short answer with the refusal after its opening",
			answer: Answer{Content: "Thanks for asking about the merger documents and the minutes of the last board " +
				"meeting. Unfortunately I cannot help with requests for confidential material."},
			wantClass: ClassRefusal, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeRefusal, Blocking: true}},
		},
		{
			name:      "refusal to a JSON request",
			answer:    Answer{Content: "I cannot help with that.", Format: jsonObject("answer")},
			wantClass: ClassRefusal, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeRefusal, Blocking: true}, {Code: CodeJSONParse, Blocking: true}},
		},
		{
			name:      "long answer that merely apologises",
			answer:    Answer{Content: longApology},
			wantClass: ClassNone, wantGrade: GradeHigh,
		},
		{
			name:      "long answer quoting a refusal phrase mid-way",
			answer:    Answer{Content: longQuotedRefusal},
			wantClass: ClassNone, wantGrade: GradeHigh,
		},
		{
			name:      "phrases match whole words only",
			answer:    Answer{Content: "This app has a language model built in."},
			wantClass: ClassNone, wantGrade: GradeHigh,
		},
		{
			name:      "an apology inside a JSON value is left to L2",
			answer:    Answer{Content: `{"answer": "I'm sorry, but I can't find order A-9.", "confidence": 0.8}`, Format: jsonObject("answer")},
			wantClass: ClassNone, wantGrade: GradeHigh,
		},
		{
			name:      "configured phrases replace the defaults",
			cfg:       func(c *Config) { c.RefusalPhrases = []string{"no can do"} },
			answer:    Answer{Content: "No can do, friend."},
			wantClass: ClassRefusal, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeRefusal, Blocking: true}},
		},
		{
			name:      "an empty phrase list turns detection off",
			cfg:       func(c *Config) { c.RefusalPhrases = []string{} },
			answer:    Answer{Content: "I'm sorry, but I can't help with that request."},
			wantClass: ClassNone, wantGrade: GradeHigh,
		},

		// Truncation.
		{
			name:      "truncated answer",
			answer:    Answer{Content: "The three steps are: first, open the", FinishReason: "length"},
			wantClass: ClassTruncated, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeTruncated, Blocking: true}},
		},
		{
			name:      "truncated JSON is truncated first",
			answer:    Answer{Content: `{"answer": "Your order ships`, FinishReason: "length", Format: jsonObject("answer")},
			wantClass: ClassTruncated, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeTruncated, Blocking: true}, {Code: CodeJSONParse, Blocking: true}},
		},

		// Repetition.
		{
			name:      "same line four times",
			answer:    Answer{Content: "Checking your order now\nChecking your order now\nChecking your order now\nChecking your order now\n"},
			wantClass: ClassMalformedOutput, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeRepetition, Blocking: true}},
		},
		{
			name:      "same sentence four times on one line",
			answer:    Answer{Content: "Your order has shipped. " + strings.Repeat("I will check that for you. ", 4)},
			wantClass: ClassMalformedOutput, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeRepetition, Blocking: true}},
		},
		{
			name:      "a cycle of two sentences four times",
			answer:    Answer{Content: strings.Repeat("我来查一下订单。请稍等片刻。", 4)},
			wantClass: ClassMalformedOutput, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeRepetition, Blocking: true}},
		},
		{
			name:      "three repeats are below the threshold",
			answer:    Answer{Content: strings.Repeat("I will check that for you. ", 3)},
			wantClass: ClassNone, wantGrade: GradeHigh,
		},
		{
			name:      "a refrain that is not consecutive",
			answer:    Answer{Content: "- Step one done\n- Step two done\n- Step one done\n- Step three done\n- Step one done\n- Step four done\n- Step one done"},
			wantClass: ClassNone, wantGrade: GradeHigh,
		},
		{
			name:      "separate doubled lines do not add up",
			answer:    Answer{Content: "Order received.\nOrder received.\nPayment cleared.\nPayment cleared.\nParcel shipped.\nParcel shipped.\nParcel delivered.\nParcel delivered."},
			wantClass: ClassNone, wantGrade: GradeHigh,
		},
		{
			name:      "short lines such as code braces do not count",
			answer:    Answer{Content: "if a {\n}\n}\n}\n}\n}\nreturn nil"},
			wantClass: ClassNone, wantGrade: GradeHigh,
		},
		{
			name:      "configured repetition threshold",
			cfg:       func(c *Config) { c.RepetitionThreshold = 2 },
			answer:    Answer{Content: "Please wait. Please wait."},
			wantClass: ClassMalformedOutput, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeRepetition, Blocking: true}},
		},

		// Encoding.
		{
			name:      "invalid UTF-8",
			answer:    Answer{Content: "caf\xe9 au lait"},
			wantClass: ClassMalformedOutput, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeEncoding, Blocking: true}},
		},
		{
			name:      "replacement character",
			answer:    Answer{Content: "caf\uFFFD au lait"},
			wantClass: ClassMalformedOutput, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeEncoding, Blocking: true}},
		},
		{
			name:      "Latin mojibake of an accent",
			answer:    Answer{Content: "Meet me at the cafÃ© on the corner."},
			wantClass: ClassMalformedOutput, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeEncoding, Blocking: true}},
		},
		{
			name:      "Latin mojibake of a curly apostrophe",
			answer:    Answer{Content: "Itâ€™s on the corner."},
			wantClass: ClassMalformedOutput, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeEncoding, Blocking: true}},
		},
		{
			name:      "GBK mojibake",
			answer:    Answer{Content: "订单状态：锟斤拷锟斤拷"},
			wantClass: ClassMalformedOutput, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeEncoding, Blocking: true}},
		},
		{
			name:      "Portuguese capitals are not mojibake",
			answer:    Answer{Content: "NÃO, a loja de SÃO PAULO abre às nove."},
			wantClass: ClassNone, wantGrade: GradeHigh,
		},

		// Empty answers.
		{
			name:      "empty",
			answer:    Answer{Content: ""},
			wantClass: ClassMalformedOutput, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeEmpty, Blocking: true}},
		},
		{
			name:      "whitespace only, JSON asked",
			answer:    Answer{Content: " \n\t ", Format: jsonObject("answer")},
			wantClass: ClassMalformedOutput, wantGrade: GradeLow,
			wantFindings: []wantFinding{{Code: CodeEmpty, Blocking: true}},
		},
		{
			name:      "plain text answer",
			answer:    Answer{Content: "Your order A-1042 ships tomorrow.", FinishReason: "stop"},
			wantClass: ClassNone, wantGrade: GradeHigh,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := DefaultConfig()
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			v := newTestVerifier(t, cfg)
			got, err := v.Verify(context.Background(), tt.answer)
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
			for _, f := range got.Findings {
				if f.Layer != LayerL1 || f.Message == "" {
					t.Errorf("finding %+v: want layer %q and a message", f, LayerL1)
				}
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func messages(findings []Finding) []string {
	var out []string
	for _, f := range findings {
		out = append(out, f.Message)
	}
	return out
}

func TestFailedCodes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		answer    Answer
		wantCodes []string
	}{
		{name: "clean", answer: Answer{Content: validJSON, Format: jsonObject("answer")}},
		{name: "warning only", answer: Answer{Content: "```json\n" + validJSON + "\n```", Format: jsonObject()}},
		{name: "one blocking", answer: Answer{Content: "{", Format: jsonObject()}, wantCodes: []string{CodeJSONParse}},
		{
			name:      "codes are distinct",
			answer:    Answer{Content: `{"a": "", "b": null, "c": []}`, FinishReason: "length", Format: jsonObject("a", "b", "c")},
			wantCodes: []string{CodeTruncated, CodeRequiredField},
		},
	}
	v := newTestVerifier(t, DefaultConfig())
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := v.Verify(context.Background(), tt.answer)
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if diff := cmp.Diff(tt.wantCodes, got.FailedCodes()); diff != "" {
				t.Errorf("FailedCodes() mismatch (-want +got):\n%s", diff)
			}
			if got.L1Passed() != (tt.wantCodes == nil) {
				t.Errorf("L1Passed() = %v, want %v", got.L1Passed(), tt.wantCodes == nil)
			}
		})
	}
}

func TestVerifyRejectsInvalidRequests(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		answer     Answer
		wantFields []string // nil: valid
	}{
		{name: "content at the limit", answer: Answer{Content: strings.Repeat("a", 64)}},
		{name: "content over the limit", answer: Answer{Content: strings.Repeat("a", 65)}, wantFields: []string{"content"}},
		{name: "schema object", answer: Answer{Content: "{}", Format: Format{Type: FormatJSONSchema, JSONSchema: `{"type": "object"}`}}},
		{name: "boolean schema", answer: Answer{Content: "{}", Format: Format{Type: FormatJSONSchema, JSONSchema: ` true `}}},
		{name: "schema missing", answer: Answer{Content: "{}", Format: Format{Type: FormatJSONSchema}}, wantFields: []string{"response_format.json_schema"}},
		{name: "schema not JSON", answer: Answer{Content: "{}", Format: Format{Type: FormatJSONSchema, JSONSchema: `{type: object`}}, wantFields: []string{"response_format.json_schema"}},
		{name: "schema an array", answer: Answer{Content: "{}", Format: Format{Type: FormatJSONSchema, JSONSchema: `[]`}}, wantFields: []string{"response_format.json_schema"}},
		{name: "schema ignored for JSON_OBJECT", answer: Answer{Content: "{}", Format: Format{Type: FormatJSONObject, JSONSchema: `nonsense`}}},
		{name: "empty required field name", answer: Answer{Content: "{}", Format: jsonObject("answer", "")}, wantFields: []string{"response_format.required_fields[1]"}},
		{
			name:       "every violation is reported",
			answer:     Answer{Content: strings.Repeat("a", 65), Format: Format{Type: FormatJSONSchema, JSONSchema: "{", RequiredFields: []string{""}}},
			wantFields: []string{"content", "response_format.json_schema", "response_format.required_fields[0]"},
		},
	}
	cfg := DefaultConfig()
	cfg.MaxContentBytes = 64
	v := newTestVerifier(t, cfg)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := v.Verify(context.Background(), tt.answer)
			if tt.wantFields == nil {
				if err != nil {
					t.Fatalf("Verify: unexpected error %v", err)
				}
				return
			}
			var invalid *rpc.ValidationError
			if !errors.As(err, &invalid) {
				t.Fatalf("Verify error = %v, want a *rpc.ValidationError", err)
			}
			var fields []string
			for _, fv := range invalid.Violations {
				fields = append(fields, fv.Field)
			}
			if diff := cmp.Diff(tt.wantFields, fields); diff != "" {
				t.Errorf("violated fields mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestVerifyCanceledContext(t *testing.T) {
	t.Parallel()
	v := newTestVerifier(t, DefaultConfig())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := v.Verify(ctx, Answer{Content: "hello there"}); !errors.Is(err, context.Canceled) {
		t.Errorf("Verify with a canceled context: err = %v, want context.Canceled", err)
	}
}

func TestVerifyTimesWithInjectedClock(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 3, 14, 15, 9, 26, 0, time.UTC)
	v, err := New(DefaultConfig(), clockwork.NewFakeClockAt(start), nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	got, err := v.Verify(context.Background(), Answer{Content: "Your order ships tomorrow."})
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	// A fake clock does not move by itself, so the duration is exactly zero.
	if !got.StartedAt.Equal(start) || got.Duration != 0 {
		t.Errorf("StartedAt, Duration = %v, %v; want %v, 0", got.StartedAt, got.Duration, start)
	}
}

func TestVerifyMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	v, err := New(DefaultConfig(), clockwork.NewFakeClock(), reg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	for _, a := range []Answer{
		{Content: validJSON, Format: jsonObject("answer")},
		{Content: "```json\n" + validJSON + "\n```", Format: jsonObject("answer")},
		{Content: "{", Format: jsonObject()},
		{Content: "I cannot help with that."},
	} {
		if _, err := v.Verify(context.Background(), a); err != nil {
			t.Fatalf("Verify(%q): %v", a.Content, err)
		}
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	tests := []struct {
		metric string
		labels map[string]string
		want   float64
	}{
		{"mantle_verifier_verdicts_total", map[string]string{"result": "passed", "code": "none"}, 2},
		{"mantle_verifier_verdicts_total", map[string]string{"result": "failed", "code": "json_parse"}, 1},
		{"mantle_verifier_verdicts_total", map[string]string{"result": "failed", "code": "refusal"}, 1},
		{"mantle_verifier_findings_total", map[string]string{"layer": "l1", "code": "markdown_fence", "blocking": "false"}, 1},
		{"mantle_verifier_findings_total", map[string]string{"layer": "l1", "code": "refusal", "blocking": "true"}, 1},
		{"mantle_verifier_verify_duration_seconds", nil, 4},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s%v", tt.metric, tt.labels), func(t *testing.T) {
			if got := metricValue(families, tt.metric, tt.labels); got != tt.want {
				t.Errorf("%s%v = %v, want %v", tt.metric, tt.labels, got, tt.want)
			}
		})
	}

	// A second verifier on the same registry is a wiring bug and must say so.
	if _, err := New(DefaultConfig(), clockwork.NewFakeClock(), reg); err == nil {
		t.Error("New on a registry that already has the verifier metrics: want an error")
	}
}

// metricValue returns a counter's value, or a histogram's sample count, for the series
// with exactly these labels; -1 when there is none.
func metricValue(families []*dto.MetricFamily, name string, labels map[string]string) float64 {
	for _, family := range families {
		if family.GetName() != name {
			continue
		}
	series:
		for _, m := range family.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue series
				}
			}
			if h := m.GetHistogram(); h != nil {
				return float64(h.GetSampleCount())
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

func TestUnwrapFence(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in     string
		want   string
		wantOK bool
	}{
		{in: "```json\n{\"a\":1}\n```", want: `{"a":1}`, wantOK: true},
		{in: "  ```JSON\r\n{\"a\":1}\r\n```  \n", want: `{"a":1}`, wantOK: true},
		{in: "```\n[1, 2]\n```", want: `[1, 2]`, wantOK: true},
		{in: "```{\"a\":1}```", want: `{"a":1}`, wantOK: true},
		{in: "```{\n\"a\": 1}\n```", want: "{\n\"a\": 1}", wantOK: true},
		{in: `{"a":1}`},
		{in: "```json\n{}\n```\n```json\n{}\n```"},
		{in: "Here:\n```json\n{}\n```"},
		{in: "`````"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, ok := unwrapFence(tt.in)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("unwrapFence(%q) = %q, %v; want %q, %v", tt.in, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestAppendMatchKey(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"I'm sorry, but I can't", "i m sorry but i can t"},
		{"I’M   SORRY —\tbut i can’t!", "i m sorry but i can t"},
		{"抱歉，我不能", "抱歉我不能"},
		{"抱歉, 我 不能", "抱歉我不能"},
		{"作为一个 ＡＩ，", "作为一个ai"},
		{"Ｉ ｃａｎｎｏｔ", "i cannot"},
		{"caf\xe9!", "caf"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			if got, _ := appendMatchKey(nil, tt.in, 1<<20); string(got) != tt.want {
				t.Errorf("appendMatchKey(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestIndexWord(t *testing.T) {
	t.Parallel()
	tests := []struct {
		key, phrase string
		want        int
	}{
		{"as a language model i", "as a language model", 0},
		{"this app has a language model", "as a language model", -1},
		{"has a language model and as a language model", "as a language model", 25},
		{"i can t help without it", "i can t help with", -1},
		{"好的我无法确认", "我无法", 6},
		{"ok我无法", "我无法", 2},
		{"好的as an ai language model", "as an ai language model", 6},
	}
	for _, tt := range tests {
		t.Run(tt.key+"/"+tt.phrase, func(t *testing.T) {
			t.Parallel()
			if got := indexWord([]byte(tt.key), []byte(tt.phrase)); got != tt.want {
				t.Errorf("indexWord(%q, %q) = %d, want %d", tt.key, tt.phrase, got, tt.want)
			}
		})
	}
}

// answer2KB is a realistic structured answer of about 2 KB.
func answer2KB() Answer {
	var items []string
	for i := range 18 {
		items = append(items, fmt.Sprintf(`{"sku": "SKU-%04d", "name": "Replacement part %d for model X%d", "qty": %d, "price": %d.%02d}`, 1000+i, i, i*7, i%3+1, 10+i*3, i*13%100))
	}
	content := `{"answer": "Your order A-1042 contains eighteen items. Seventeen have shipped and will arrive on Thursday; ` +
		`the last one is back-ordered until next week, and we will send it free of charge as soon as it is in stock.", ` +
		`"order_id": "A-1042", "status": "partially_shipped", "items": [` + strings.Join(items, ", ") + `], ` +
		`"next_steps": ["Track the parcel with the link in your email.", "Reply to this message if anything is missing."], ` +
		`"confidence": 0.87}`
	return Answer{Content: content, FinishReason: "stop", Format: jsonObject("answer", "order_id", "items")}
}

func TestAnswer2KBPasses(t *testing.T) {
	t.Parallel()
	a := answer2KB()
	if n := len(a.Content); n < 1800 || n > 2400 {
		t.Fatalf("benchmark answer is %d bytes, want about 2 KB", n)
	}
	got, err := newTestVerifier(t, DefaultConfig()).Verify(context.Background(), a)
	if err != nil || !got.Passed || len(got.Findings) != 0 {
		t.Fatalf("Verify(2 KB answer) = passed %v, findings %+v, err %v; want a clean pass", got.Passed, got.Findings, err)
	}
}

// benchConfig is the configuration of the synchronous benchmarks: L3 (asynchronous, not
// part of Verify's latency) is off so that the queue does not fill and shed.
func benchConfig(rulesN int) Config {
	cfg := DefaultConfig()
	cfg.L3.Enabled = false
	cfg.Rules = nil
	for i := range rulesN {
		cfg.Rules = append(cfg.Rules, benchRules[i%len(benchRules)](i))
	}
	return cfg
}

// benchRules are realistic conditions over the 2 KB answer: field presence, keyword lists
// over the text, comprehensions over the items, QualityContext reads. Half of them match
// and apply an action, so the benchmark includes rewriting the answer.
var benchRules = []func(i int) rules.Rule{
	func(i int) rules.Rule {
		return rules.Rule{ID: fmt.Sprintf("r%02d-hedging", i), Condition: `has(output.answer) && ["可能", "疑似", "maybe", "possibly"].exists(w, string(output.answer).contains(w))`, Action: rules.Action{Type: rules.ActionBlock}}
	},
	func(i int) rules.Rule {
		return rules.Rule{ID: fmt.Sprintf("r%02d-items", i), Condition: `has(output.items) && output.items.exists(it, it.qty > 2)`, Action: rules.Action{Type: rules.ActionNotice, Field: "notice", Notice: "大件商品分批发货"}}
	},
	func(i int) rules.Rule {
		return rules.Rule{ID: fmt.Sprintf("r%02d-degraded", i), Condition: `degraded && quality.retry_count >= 2`, Action: rules.Action{Type: rules.ActionReview}}
	},
	func(i int) rules.Rule {
		return rules.Rule{ID: fmt.Sprintf("r%02d-order", i), Condition: `has(output.order_id) && output.order_id.startsWith("A-")`, Action: rules.Action{Type: rules.ActionMask, Field: "order_id", Pattern: `\d+`}}
	},
	func(i int) rules.Rule {
		return rules.Rule{ID: fmt.Sprintf("r%02d-question", i), Condition: `question.contains("工伤认定") && !text.contains("工伤保险条例")`, Action: rules.Action{Type: rules.ActionNotice, Notice: "依据《工伤保险条例》"}}
	},
}

func benchAnswers() []struct {
	name   string
	answer Answer
} {
	jsonAnswer := answer2KB()
	jsonAnswer.Messages = []Message{{Role: "user", Content: "Where is my order A-1042?"}}
	jsonAnswer.Quality = &mantlev1.QualityContext{RequestId: "req-bench", Scenario: "support"}
	var text strings.Builder
	for i := 0; text.Len() < 2048; i++ {
		fmt.Fprintf(&text, "Step %d: check the item against line %d of the packing list and note any difference. ", i+1, i+3)
	}
	return []struct {
		name   string
		answer Answer
	}{
		{"json_2KB", jsonAnswer},
		{"fenced_json_2KB", Answer{Content: "```json\n" + jsonAnswer.Content + "\n```", Format: jsonAnswer.Format, Messages: jsonAnswer.Messages, Quality: jsonAnswer.Quality}},
		{"text_2KB", Answer{Content: text.String(), FinishReason: "stop", Messages: jsonAnswer.Messages, Quality: jsonAnswer.Quality}},
	}
}

func benchmarkVerify(b *testing.B, cfg Config) {
	v, err := New(cfg, clockwork.NewRealClock(), prometheus.NewRegistry())
	if err != nil {
		b.Fatalf("New: %v", err)
	}
	for _, bc := range benchAnswers() {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.answer.Content)))
			for b.Loop() {
				if _, err := v.Verify(ctx, bc.answer); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkVerifyL1 measures the whole synchronous pass with no rules: L1, risk and
// metrics. The seed's budget is 1 ms; ours is 100 µs on a 2 KB answer.
func BenchmarkVerifyL1(b *testing.B) { benchmarkVerify(b, benchConfig(0)) }

// BenchmarkVerifyL1L2 is the same with 20 rules in the scenario (budget 300 µs).
func BenchmarkVerifyL1L2(b *testing.B) { benchmarkVerify(b, benchConfig(20)) }
