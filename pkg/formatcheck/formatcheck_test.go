package formatcheck

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// Classes, short for the tables (malformed is the package's own).
const (
	none          = mantlev1.ErrorClass_ERROR_CLASS_NONE
	refusal       = mantlev1.ErrorClass_ERROR_CLASS_REFUSAL
	truncated     = mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED
	lowConfidence = mantlev1.ErrorClass_ERROR_CLASS_VERIFICATION_FAILED
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

func messages(findings []Finding) []string {
	var out []string
	for _, f := range findings {
		out = append(out, f.Message)
	}
	return out
}

func newTestChecker(t testing.TB, cfg Config) *Checker {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c
}

func jsonObject(required ...string) Format {
	return Format{Type: FormatJSONObject, RequiredFields: required}
}

func ptr[T any](v T) *T { return &v }

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

func TestCheck(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		cfg    func(*Config) // adjusts DefaultConfig, when set
		answer Answer
		// wantClass none means the answer must pass.
		wantClass    mantlev1.ErrorClass
		wantFindings []wantFinding
		// wantContent is the delivered content; nil means the input, unchanged.
		wantContent *string
	}{
		// JSON answers.
		{
			name:      "valid JSON object",
			answer:    Answer{Content: validJSON, FinishReason: "stop", Format: jsonObject("answer", "order_id")},
			wantClass: none,
		},
		{
			name:         "fenced JSON is unwrapped with a warning",
			answer:       Answer{Content: "```json\n" + validJSON + "\n```\n", Format: jsonObject("answer", "order_id")},
			wantClass:    none,
			wantFindings: []wantFinding{{Code: CodeMarkdownFence}},
			wantContent:  ptr(validJSON),
		},
		{
			name:         "fence without a language tag",
			answer:       Answer{Content: "```\n" + validJSON + "\n```", Format: jsonObject("answer")},
			wantClass:    none,
			wantFindings: []wantFinding{{Code: CodeMarkdownFence}},
			wantContent:  ptr(validJSON),
		},
		{
			name:         "prose around a fence is not unwrapped",
			answer:       Answer{Content: "Here you go:\n```json\n" + validJSON + "\n```", Format: jsonObject()},
			wantClass:    malformed,
			wantFindings: []wantFinding{{Code: CodeJSONParse, Blocking: true}},
		},
		{
			name:         "broken JSON",
			answer:       Answer{Content: `{"answer": "Your order ships", "order_id": }`, Format: jsonObject("answer")},
			wantClass:    malformed,
			wantFindings: []wantFinding{{Code: CodeJSONParse, Blocking: true}},
		},
		{
			name:         "prose after the JSON",
			answer:       Answer{Content: validJSON + " Hope this helps!", Format: jsonObject()},
			wantClass:    malformed,
			wantFindings: []wantFinding{{Code: CodeJSONParse, Blocking: true}},
		},
		{
			name:         "empty fence",
			answer:       Answer{Content: "```json\n```", Format: jsonObject()},
			wantClass:    malformed,
			wantFindings: []wantFinding{{Code: CodeMarkdownFence}, {Code: CodeJSONParse, Blocking: true}},
			wantContent:  ptr(""),
		},
		{
			name:         "array where an object was asked for",
			answer:       Answer{Content: `[{"answer": "yes"}]`, Format: jsonObject()},
			wantClass:    malformed,
			wantFindings: []wantFinding{{Code: CodeJSONType, Blocking: true}},
		},
		{
			name:      "array allowed under a schema",
			answer:    Answer{Content: `["a", "b"]`, Format: Format{Type: FormatJSONSchema, JSONSchema: `{"type": "array"}`}},
			wantClass: none,
		},
		{
			name:         "required field in an array answer under a schema",
			answer:       Answer{Content: `["a"]`, Format: Format{Type: FormatJSONSchema, JSONSchema: `true`, RequiredFields: []string{"answer"}}},
			wantClass:    malformed,
			wantFindings: []wantFinding{{Code: CodeRequiredField, Path: "answer", Blocking: true}},
		},
		{
			name:         "missing required field",
			answer:       Answer{Content: `{"answer": "Ships tomorrow.", "confidence": 0.9}`, Format: jsonObject("answer", "order_id")},
			wantClass:    malformed,
			wantFindings: []wantFinding{{Code: CodeRequiredField, Path: "order_id", Blocking: true}},
		},
		{
			name: "empty required fields; zero and false are values",
			answer: Answer{
				Content: `{"a": null, "b": "", "c": [ ], "d": {}, "e": "  ", "f": 0, "g": false, "h": [0]}`,
				Format:  jsonObject("a", "b", "c", "d", "e", "f", "g", "h"),
			},
			wantClass: malformed,
			wantFindings: []wantFinding{
				{Code: CodeRequiredField, Path: "a", Blocking: true},
				{Code: CodeRequiredField, Path: "b", Blocking: true},
				{Code: CodeRequiredField, Path: "c", Blocking: true},
				{Code: CodeRequiredField, Path: "d", Blocking: true},
				{Code: CodeRequiredField, Path: "e", Blocking: true},
			},
		},
		{
			// As json.Unmarshal reads an object: escaped keys unquoted, the last of
			// duplicate keys kept.
			name:         "escaped and duplicate keys",
			answer:       Answer{Content: `{"\u0061nswer": "Ships tomorrow.", "answer": "", "order_id": "", "order_id": "A-1"}`, Format: jsonObject("answer", "order_id")},
			wantClass:    malformed,
			wantFindings: []wantFinding{{Code: CodeRequiredField, Path: "answer", Blocking: true}},
		},
		{
			name:         "low confidence",
			answer:       Answer{Content: `{"answer": "Maybe Tuesday?", "confidence": 0.12}`, Format: jsonObject("answer")},
			wantClass:    lowConfidence,
			wantFindings: []wantFinding{{Code: CodeLowConfidence, Path: "confidence", Blocking: true}},
		},
		{
			name:      "confidence at the threshold passes",
			answer:    Answer{Content: `{"answer": "Tuesday.", "confidence": 0.3}`, Format: jsonObject("answer")},
			wantClass: none,
		},
		{
			name:      "non-numeric confidence is left to L2",
			answer:    Answer{Content: `{"answer": "Tuesday.", "confidence": "low"}`, Format: jsonObject("answer")},
			wantClass: none,
		},
		{
			name:         "configured confidence threshold",
			cfg:          func(c *Config) { c.ConfidenceThreshold = 0.5 },
			answer:       Answer{Content: `{"answer": "Tuesday.", "confidence": 0.4}`, Format: jsonObject("answer")},
			wantClass:    lowConfidence,
			wantFindings: []wantFinding{{Code: CodeLowConfidence, Path: "confidence", Blocking: true}},
		},
		{
			name:      "missing field comes before low confidence",
			answer:    Answer{Content: `{"answer": "Maybe.", "confidence": 0.1}`, Format: jsonObject("answer", "order_id")},
			wantClass: malformed,
			wantFindings: []wantFinding{
				{Code: CodeRequiredField, Path: "order_id", Blocking: true},
				{Code: CodeLowConfidence, Path: "confidence", Blocking: true},
			},
		},
		{
			name:      "fenced JSON in text mode is left alone",
			answer:    Answer{Content: "```json\n" + validJSON + "\n```", Format: Format{Type: FormatText}},
			wantClass: none,
		},

		// Refusals.
		{
			name:         "refusal in English",
			answer:       Answer{Content: "I'm sorry, but I can't help with that request.", FinishReason: "stop"},
			wantClass:    refusal,
			wantFindings: []wantFinding{{Code: CodeRefusal, Blocking: true}},
		},
		{
			name:         "refusal with curly apostrophes and no comma",
			answer:       Answer{Content: "I’m sorry but I can’t share internal pricing."},
			wantClass:    refusal,
			wantFindings: []wantFinding{{Code: CodeRefusal, Blocking: true}},
		},
		{
			name:         "refusal in Chinese",
			answer:       Answer{Content: "抱歉，我不能回答这个问题。"},
			wantClass:    refusal,
			wantFindings: []wantFinding{{Code: CodeRefusal, Blocking: true}},
		},
		{
			name:         "refusal in Chinese with a half-width comma",
			answer:       Answer{Content: "抱歉, 我不能提供该用户的个人信息。"},
			wantClass:    refusal,
			wantFindings: []wantFinding{{Code: CodeRefusal, Blocking: true}},
		},
		{
			name:         "Chinese as-an-AI disclaimer",
			answer:       Answer{Content: "作为一个AI语言模型，我没有个人观点。"},
			wantClass:    refusal,
			wantFindings: []wantFinding{{Code: CodeRefusal, Blocking: true}},
		},
		{
			name:         "long answer that opens with a disclaimer",
			answer:       Answer{Content: longAIOpening},
			wantClass:    refusal,
			wantFindings: []wantFinding{{Code: CodeRefusal, Blocking: true}},
		},
		{
			name: "short answer with the refusal after its opening",
			answer: Answer{Content: "Thanks for asking about the merger documents and the minutes of the last board " +
				"meeting. Unfortunately I cannot help with requests for confidential material."},
			wantClass:    refusal,
			wantFindings: []wantFinding{{Code: CodeRefusal, Blocking: true}},
		},
		{
			name:         "refusal to a JSON request",
			answer:       Answer{Content: "I cannot help with that.", Format: jsonObject("answer")},
			wantClass:    refusal,
			wantFindings: []wantFinding{{Code: CodeRefusal, Blocking: true}, {Code: CodeJSONParse, Blocking: true}},
		},
		{
			name:      "long answer that merely apologises",
			answer:    Answer{Content: longApology},
			wantClass: none,
		},
		{
			name:      "long answer quoting a refusal phrase mid-way",
			answer:    Answer{Content: longQuotedRefusal},
			wantClass: none,
		},
		{
			name:      "phrases match whole words only",
			answer:    Answer{Content: "This app has a language model built in."},
			wantClass: none,
		},
		{
			name:      "an apology inside a JSON value is left to L2",
			answer:    Answer{Content: `{"answer": "I'm sorry, but I can't find order A-9.", "confidence": 0.8}`, Format: jsonObject("answer")},
			wantClass: none,
		},
		{
			name:         "configured phrases replace the defaults",
			cfg:          func(c *Config) { c.RefusalPhrases = []string{"no can do"} },
			answer:       Answer{Content: "No can do, friend."},
			wantClass:    refusal,
			wantFindings: []wantFinding{{Code: CodeRefusal, Blocking: true}},
		},
		{
			name:      "an empty phrase list turns detection off",
			cfg:       func(c *Config) { c.RefusalPhrases = []string{} },
			answer:    Answer{Content: "I'm sorry, but I can't help with that request."},
			wantClass: none,
		},

		// Truncation.
		{
			name:         "truncated answer",
			answer:       Answer{Content: "The three steps are: first, open the", FinishReason: "length"},
			wantClass:    truncated,
			wantFindings: []wantFinding{{Code: CodeTruncated, Blocking: true}},
		},
		{
			name:         "truncated JSON is truncated first",
			answer:       Answer{Content: `{"answer": "Your order ships`, FinishReason: "length", Format: jsonObject("answer")},
			wantClass:    truncated,
			wantFindings: []wantFinding{{Code: CodeTruncated, Blocking: true}, {Code: CodeJSONParse, Blocking: true}},
		},

		// Repetition.
		{
			name:         "same line four times",
			answer:       Answer{Content: "Checking your order now\nChecking your order now\nChecking your order now\nChecking your order now\n"},
			wantClass:    malformed,
			wantFindings: []wantFinding{{Code: CodeRepetition, Blocking: true}},
		},
		{
			name:         "same sentence four times on one line",
			answer:       Answer{Content: "Your order has shipped. " + strings.Repeat("I will check that for you. ", 4)},
			wantClass:    malformed,
			wantFindings: []wantFinding{{Code: CodeRepetition, Blocking: true}},
		},
		{
			name:         "a cycle of two sentences four times",
			answer:       Answer{Content: strings.Repeat("我来查一下订单。请稍等片刻。", 4)},
			wantClass:    malformed,
			wantFindings: []wantFinding{{Code: CodeRepetition, Blocking: true}},
		},
		{
			name:      "three repeats are below the threshold",
			answer:    Answer{Content: strings.Repeat("I will check that for you. ", 3)},
			wantClass: none,
		},
		{
			name:      "a refrain that is not consecutive",
			answer:    Answer{Content: "- Step one done\n- Step two done\n- Step one done\n- Step three done\n- Step one done\n- Step four done\n- Step one done"},
			wantClass: none,
		},
		{
			name:      "separate doubled lines do not add up",
			answer:    Answer{Content: "Order received.\nOrder received.\nPayment cleared.\nPayment cleared.\nParcel shipped.\nParcel shipped.\nParcel delivered.\nParcel delivered."},
			wantClass: none,
		},
		{
			name:      "short lines such as code braces do not count",
			answer:    Answer{Content: "if a {\n}\n}\n}\n}\n}\nreturn nil"},
			wantClass: none,
		},
		{
			name:         "configured repetition threshold",
			cfg:          func(c *Config) { c.RepetitionThreshold = 2 },
			answer:       Answer{Content: "Please wait. Please wait."},
			wantClass:    malformed,
			wantFindings: []wantFinding{{Code: CodeRepetition, Blocking: true}},
		},

		// Encoding.
		{
			name:         "invalid UTF-8",
			answer:       Answer{Content: "caf\xe9 au lait"},
			wantClass:    malformed,
			wantFindings: []wantFinding{{Code: CodeEncoding, Blocking: true}},
		},
		{
			name:         "replacement character",
			answer:       Answer{Content: "caf\uFFFD au lait"},
			wantClass:    malformed,
			wantFindings: []wantFinding{{Code: CodeEncoding, Blocking: true}},
		},
		{
			name:         "Latin mojibake of an accent",
			answer:       Answer{Content: "Meet me at the cafÃ© on the corner."},
			wantClass:    malformed,
			wantFindings: []wantFinding{{Code: CodeEncoding, Blocking: true}},
		},
		{
			name:         "Latin mojibake of a curly apostrophe",
			answer:       Answer{Content: "Itâ€™s on the corner."},
			wantClass:    malformed,
			wantFindings: []wantFinding{{Code: CodeEncoding, Blocking: true}},
		},
		{
			name:         "GBK mojibake",
			answer:       Answer{Content: "订单状态：锟斤拷锟斤拷"},
			wantClass:    malformed,
			wantFindings: []wantFinding{{Code: CodeEncoding, Blocking: true}},
		},
		{
			name:      "Portuguese capitals are not mojibake",
			answer:    Answer{Content: "NÃO, a loja de SÃO PAULO abre às nove."},
			wantClass: none,
		},

		// Empty answers.
		{
			name:         "empty",
			answer:       Answer{Content: ""},
			wantClass:    malformed,
			wantFindings: []wantFinding{{Code: CodeEmpty, Blocking: true}},
		},
		{
			name:         "whitespace only, JSON asked",
			answer:       Answer{Content: " \n\t ", Format: jsonObject("answer")},
			wantClass:    malformed,
			wantFindings: []wantFinding{{Code: CodeEmpty, Blocking: true}},
		},
		{
			name:      "plain text answer",
			answer:    Answer{Content: "Your order A-1042 ships tomorrow.", FinishReason: "stop"},
			wantClass: none,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := DefaultConfig()
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			got := newTestChecker(t, cfg).Check(tt.answer)
			if wantPassed := tt.wantClass == none; got.Passed != wantPassed {
				t.Errorf("Passed = %v, want %v (findings %+v)", got.Passed, wantPassed, got.Findings)
			}
			if got.Class != tt.wantClass {
				t.Errorf("Class = %v, want %v", got.Class, tt.wantClass)
			}
			if diff := cmp.Diff(tt.wantFindings, findingKeys(got.Findings)); diff != "" {
				t.Errorf("findings mismatch (-want +got):\n%s(messages: %q)", diff, messages(got.Findings))
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
				if f.Blocking == (f.Class == mantlev1.ErrorClass_ERROR_CLASS_UNSPECIFIED) {
					t.Errorf("finding %+v: a blocking finding needs a class, a warning none", f)
				}
			}
		})
	}
}

func TestChecksInChineseAndEnglish(t *testing.T) {
	t.Parallel()
	schema := Format{Type: FormatJSONSchema, JSONSchema: `{"type": "object", "required": ["answer", "confidence"],
		"properties": {"answer": {"type": "string", "minLength": 2}, "confidence": {"type": "number", "maximum": 1},
		"steps": {"type": "array", "items": {"type": "string"}}}}`}
	type lang struct{ bad, good Answer }
	tests := []struct {
		check string
		zh    lang
		en    lang
		want  []wantFinding
	}{
		{
			check: "json_parse",
			zh:    lang{Answer{Content: `{"回答": "您的订单明天发货",}`, Format: jsonObject()}, Answer{Content: `{"回答": "您的订单明天发货"}`, Format: jsonObject()}},
			en:    lang{Answer{Content: `{"answer": "ships tomorrow"`, Format: jsonObject()}, Answer{Content: `{"answer": "ships tomorrow"}`, Format: jsonObject()}},
			want:  []wantFinding{{Code: CodeJSONParse, Blocking: true}},
		},
		{
			check: "markdown_fence (a warning; the fence is removed)",
			zh:    lang{Answer{Content: "```json\n{\"回答\": \"明天发货\"}\n```", Format: jsonObject()}, Answer{Content: `{"回答": "明天发货"}`, Format: jsonObject()}},
			en:    lang{Answer{Content: "```\n{\"answer\": \"tomorrow\"}\n```", Format: jsonObject()}, Answer{Content: `{"answer": "tomorrow"}`, Format: jsonObject()}},
			want:  []wantFinding{{Code: CodeMarkdownFence}},
		},
		{
			check: "json_type",
			zh:    lang{Answer{Content: `["明天发货"]`, Format: jsonObject()}, Answer{Content: `{"回答": ["明天发货"]}`, Format: jsonObject()}},
			en:    lang{Answer{Content: `"ships tomorrow"`, Format: jsonObject()}, Answer{Content: `{"answer": "ships tomorrow"}`, Format: jsonObject()}},
			want:  []wantFinding{{Code: CodeJSONType, Blocking: true}},
		},
		{
			check: "schema",
			zh:    lang{Answer{Content: `{"answer": "好", "confidence": "高"}`, Format: schema}, Answer{Content: `{"answer": "明天发货", "confidence": 0.9}`, Format: schema}},
			en:    lang{Answer{Content: `{"answer": "a", "confidence": "high"}`, Format: schema}, Answer{Content: `{"answer": "tomorrow", "confidence": 0.9}`, Format: schema}},
			want:  []wantFinding{{Code: CodeSchema, Path: "/answer", Blocking: true}, {Code: CodeSchema, Path: "/confidence", Blocking: true}},
		},
		{
			check: "required_field",
			zh:    lang{Answer{Content: `{"回答": "  ", "订单": "A-1"}`, Format: jsonObject("回答")}, Answer{Content: `{"回答": "明天", "订单": "A-1"}`, Format: jsonObject("回答")}},
			en:    lang{Answer{Content: `{"order": "A-1"}`, Format: jsonObject("answer")}, Answer{Content: `{"answer": "ok", "order": "A-1"}`, Format: jsonObject("answer")}},
			want:  []wantFinding{{Code: CodeRequiredField, Path: "回答", Blocking: true}},
		},
		{
			check: "low_confidence",
			zh:    lang{Answer{Content: `{"回答": "可能是感染", "confidence": 0.12}`, Format: jsonObject()}, Answer{Content: `{"回答": "细菌感染", "confidence": 0.82}`, Format: jsonObject()}},
			en:    lang{Answer{Content: `{"answer": "maybe", "confidence": 0.1}`, Format: jsonObject()}, Answer{Content: `{"answer": "yes", "confidence": 0.9}`, Format: jsonObject()}},
			want:  []wantFinding{{Code: CodeLowConfidence, Path: "confidence", Blocking: true}},
		},
		{
			check: "encoding: invalid UTF-8",
			zh:    lang{Answer{Content: "订单\xe6\x98发货"}, Answer{Content: "订单明天发货"}},
			en:    lang{Answer{Content: "order \xff ships"}, Answer{Content: "order ships"}},
			want:  []wantFinding{{Code: CodeEncoding, Blocking: true}},
		},
		{
			check: "encoding: replacement character",
			zh:    lang{Answer{Content: "订单�发货"}, Answer{Content: "订单已发货"}},
			en:    lang{Answer{Content: "caf� au lait"}, Answer{Content: "café au lait"}},
			want:  []wantFinding{{Code: CodeEncoding, Blocking: true}},
		},
		{
			check: "encoding: mojibake",
			zh:    lang{Answer{Content: "锟斤拷锟斤拷订单"}, Answer{Content: "订单已发货"}},
			en:    lang{Answer{Content: "Itâ€™s shipped"}, Answer{Content: "It’s shipped"}},
			want:  []wantFinding{{Code: CodeEncoding, Blocking: true}},
		},
		{
			check: "refusal",
			zh:    lang{Answer{Content: "很抱歉，我无法回答这个问题。"}, Answer{Content: "这个问题的答案是：明天发货。"}},
			en:    lang{Answer{Content: "I'm sorry, but I can't help with that request."}, Answer{Content: "Sorry for the wait: it ships tomorrow."}},
			want:  []wantFinding{{Code: CodeRefusal, Blocking: true}},
		},
		{
			check: "truncated",
			zh:    lang{Answer{Content: "订单明天", FinishReason: "length"}, Answer{Content: "订单明天发货。", FinishReason: "stop"}},
			en:    lang{Answer{Content: "Your order", FinishReason: "max_tokens"}, Answer{Content: "Your order ships.", FinishReason: "stop"}},
			want:  []wantFinding{{Code: CodeTruncated, Blocking: true}},
		},
		{
			check: "repetition",
			zh:    lang{Answer{Content: strings.Repeat("请检查订单状态。", 4)}, Answer{Content: strings.Repeat("请检查订单状态。", 3)}},
			en:    lang{Answer{Content: strings.Repeat("Please check the order. ", 5)}, Answer{Content: "Please check the order. Then reply."}},
			want:  []wantFinding{{Code: CodeRepetition, Blocking: true}},
		},
		{
			check: "empty",
			zh:    lang{Answer{Content: "\u3000 \n"}, Answer{Content: "好"}},
			en:    lang{Answer{Content: "   "}, Answer{Content: "ok"}},
			want:  []wantFinding{{Code: CodeEmpty, Blocking: true}},
		},
		{
			check: "html (a warning)",
			zh:    lang{Answer{Content: "<div class=\"answer\">订单明天发货</div>"}, Answer{Content: "订单明天发货 <5件 的部分先发"}},
			en:    lang{Answer{Content: "Your order ships<br/>tomorrow"}, Answer{Content: "Use List<T> when 3 < 4"}},
			want:  []wantFinding{{Code: CodeHTML}},
		},
		{
			check: "markdown: an unclosed code fence (a warning)",
			zh:    lang{Answer{Content: "示例：\n```python\nprint('你好')\n"}, Answer{Content: "示例：\n```python\nprint('你好')\n```\n"}},
			en:    lang{Answer{Content: "Run:\n```\nmake test\n"}, Answer{Content: "Run:\n```\nmake test\n```"}},
			want:  []wantFinding{{Code: CodeMarkdown}},
		},
	}
	c := newTestChecker(t, DefaultConfig())
	for _, tt := range tests {
		for name, l := range map[string]lang{"zh": tt.zh, "en": tt.en} {
			t.Run(tt.check+"/"+name, func(t *testing.T) {
				t.Parallel()
				bad := c.Check(l.bad)
				want := tt.want
				if name == "en" && tt.check == "required_field" {
					want = []wantFinding{{Code: CodeRequiredField, Path: "answer", Blocking: true}}
				}
				got := findingKeys(bad.Findings)
				if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("findings on %q (-want +got):\n%s\nmessages: %q", l.bad.Content, diff, messages(bad.Findings))
				}
				if wantPass := !want[0].Blocking; bad.Passed != wantPass {
					t.Errorf("passed = %v, want %v", bad.Passed, wantPass)
				}
				good := c.Check(l.good)
				if !good.Passed || len(good.Findings) != 0 {
					t.Errorf("good twin %q: passed %v, findings %q; want a clean pass", l.good.Content, good.Passed, messages(good.Findings))
				}
			})
		}
	}
}

// TestDegradedThreshold: a fallback model's confidence is judged against its
// own (lower) threshold.
func TestDegradedThreshold(t *testing.T) {
	t.Parallel()
	c := newTestChecker(t, DefaultConfig())
	answer := Answer{Content: `{"answer": "Refund in five working days.", "confidence": 0.25}`, Format: jsonObject("answer")}
	for _, tt := range []struct {
		degraded bool
		want     mantlev1.ErrorClass
	}{
		{degraded: false, want: lowConfidence},
		{degraded: true, want: none},
	} {
		a := answer
		a.Degraded = tt.degraded
		if got := c.Check(a); got.Class != tt.want {
			t.Errorf("degraded %v: class %v, want %v (findings %q)", tt.degraded, got.Class, tt.want, messages(got.Findings))
		}
	}
}

// TestResultValue: the whole document is decoded when a schema or the caller needs it, and
// Strings reads whichever form there is.
func TestResultValue(t *testing.T) {
	t.Parallel()
	c := newTestChecker(t, DefaultConfig())
	nested := `{"answer": "ok", "steps": ["one", "two"], "empty": " "}`
	tests := []struct {
		name        string
		answer      Answer
		wantJSON    bool
		wantValue   bool
		wantStrings []string
	}{
		{name: "top level only", answer: Answer{Content: nested, Format: jsonObject()}, wantJSON: true, wantStrings: []string{"ok"}},
		{name: "kept whole", answer: Answer{Content: nested, Format: jsonObject(), KeepValue: true}, wantJSON: true, wantValue: true,
			wantStrings: []string{"ok", "one", "two"}},
		{name: "schema decodes whole", answer: Answer{Content: nested, Format: Format{Type: FormatJSONSchema, JSONSchema: `{"type": "object"}`}},
			wantJSON: true, wantValue: true, wantStrings: []string{"ok", "one", "two"}},
		{name: "array without a schema", answer: Answer{Content: `["a", "b"]`, Format: Format{Type: FormatJSONSchema, JSONSchema: `true`}},
			wantJSON: true, wantValue: true, wantStrings: []string{"a", "b"}},
		{name: "did not parse", answer: Answer{Content: `{"answer": `, Format: jsonObject(), KeepValue: true}},
		{name: "text", answer: Answer{Content: "ok", KeepValue: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := c.Check(tt.answer)
			if got.JSON != tt.wantJSON || (got.Value != nil) != tt.wantValue {
				t.Errorf("JSON %v, Value %v; want JSON %v, a value %v", got.JSON, got.Value, tt.wantJSON, tt.wantValue)
			}
			if diff := cmp.Diff(tt.wantStrings, got.Strings(), cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
				t.Errorf("Strings() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestFailedCodes(t *testing.T) {
	t.Parallel()
	c := newTestChecker(t, DefaultConfig())
	tests := []struct {
		name   string
		answer Answer
		want   []string
	}{
		{name: "clean", answer: Answer{Content: validJSON, Format: jsonObject("answer")}},
		{name: "warning only", answer: Answer{Content: "```json\n" + validJSON + "\n```", Format: jsonObject()}},
		{name: "codes are distinct, in order", answer: Answer{Content: `{"a": "", "b": null}`, FinishReason: "length", Format: jsonObject("a", "b")},
			want: []string{CodeTruncated, CodeRequiredField}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if diff := cmp.Diff(tt.want, c.Check(tt.answer).FailedCodes()); diff != "" {
				t.Errorf("FailedCodes() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMisencoded(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want bool
	}{
		{"订单明天发货", false},
		{"NÃO, SÃO PAULO", false},
		{"caf\xe9", true},
		{"caf\uFFFD", true},
		{"Itâ€™s", true},
		{"锟斤拷", true},
	}
	for _, tt := range tests {
		if got := Misencoded(tt.in); got != tt.want {
			t.Errorf("Misencoded(%q) = %v, want %v", tt.in, got, tt.want)
		}
		// It must agree with the finding Check reports.
		got := slices.ContainsFunc(appendEncodingFindings(nil, tt.in), func(f Finding) bool { return f.Code == CodeEncoding })
		if got != tt.want {
			t.Errorf("appendEncodingFindings(%q) reports encoding %v, Misencoded says %v", tt.in, got, tt.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr []string // substrings; nil means valid
	}{
		{name: "defaults", mutate: func(*Config) {}},
		{name: "no refusal phrases", mutate: func(c *Config) { c.RefusalPhrases = []string{} }},
		{name: "confidence", mutate: func(c *Config) { c.ConfidenceThreshold = 1.5 },
			wantErr: []string{"confidence_threshold: must be between 0 and 1, got 1.5"}},
		{name: "degraded confidence", mutate: func(c *Config) { c.DegradedConfidenceThreshold = -1 },
			wantErr: []string{"degraded.confidence_threshold: must be between 0 and 1, got -1"}},
		{name: "punctuation-only phrase", mutate: func(c *Config) { c.RefusalPhrases = []string{"sorry", "!!!"} },
			wantErr: []string{`refusal_phrases[1]: must contain a letter or digit, got "!!!"`}},
		{name: "everything", mutate: func(c *Config) { *c = Config{} },
			wantErr: []string{"repetition_threshold: must be at least 2, got 0", "schema_cache_size: must be positive",
				"max_schema_findings: must be positive"}},
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
				if _, err := New(cfg); err != nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want errors containing %q", tt.wantErr)
			}
			for _, want := range tt.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Validate() = %v, want it to contain %q", err, want)
				}
			}
			if _, err := New(cfg); err == nil {
				t.Error("New accepted an invalid config")
			}
		})
	}
}

func TestFormatFromProto(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in     *mantlev1.ResponseFormat
		want   Format
		wantOK bool
	}{
		{in: nil, want: Format{Type: FormatText}, wantOK: true},
		{in: &mantlev1.ResponseFormat{Type: mantlev1.ResponseFormat_TYPE_TEXT}, want: Format{Type: FormatText}, wantOK: true},
		{in: &mantlev1.ResponseFormat{Type: mantlev1.ResponseFormat_TYPE_JSON_OBJECT, RequiredFields: []string{"a"}},
			want: Format{Type: FormatJSONObject, RequiredFields: []string{"a"}}, wantOK: true},
		{in: &mantlev1.ResponseFormat{Type: mantlev1.ResponseFormat_TYPE_JSON_SCHEMA, JsonSchema: `{}`},
			want: Format{Type: FormatJSONSchema, JSONSchema: `{}`}, wantOK: true},
		{in: &mantlev1.ResponseFormat{Type: 99}},
	}
	for _, tt := range tests {
		got, ok := FormatFromProto(tt.in)
		if ok != tt.wantOK {
			t.Errorf("FormatFromProto(%v) ok = %v, want %v", tt.in, ok, tt.wantOK)
		}
		if diff := cmp.Diff(tt.want, got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("FormatFromProto(%v) (-want +got):\n%s", tt.in, diff)
		}
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

// BenchmarkCheck measures the checks alone on 2 KB answers (the verifier's
// BenchmarkVerifyL1 adds risk scoring and metrics; the usual budget is 1 ms).
func BenchmarkCheck(b *testing.B) {
	c := newTestChecker(b, DefaultConfig())
	jsonAnswer := answer2KB()
	var text strings.Builder
	for i := 0; text.Len() < 2048; i++ {
		fmt.Fprintf(&text, "Step %d: check the item against line %d of the packing list and note any difference. ", i+1, i+3)
	}
	for _, bc := range []struct {
		name   string
		answer Answer
	}{
		{"json_2KB", jsonAnswer},
		{"fenced_json_2KB", Answer{Content: "```json\n" + jsonAnswer.Content + "\n```", Format: jsonAnswer.Format}},
		{"text_2KB", Answer{Content: text.String(), FinishReason: "stop"}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			if res := c.Check(bc.answer); !res.Passed {
				b.Fatalf("benchmark answer fails: %q", messages(res.Findings))
			}
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.answer.Content)))
			for b.Loop() {
				c.Check(bc.answer)
			}
		})
	}
}
