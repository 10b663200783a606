package verifier

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// TestL1ChecksInChineseAndEnglish runs every L1 check on a Chinese and an English answer:
// the check must fire on the bad one and stay quiet on its good twin.
func TestL1ChecksInChineseAndEnglish(t *testing.T) {
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
	v := newTestVerifier(t, DefaultConfig())
	for _, tt := range tests {
		for name, l := range map[string]lang{"zh": tt.zh, "en": tt.en} {
			t.Run(tt.check+"/"+name, func(t *testing.T) {
				t.Parallel()
				bad, err := v.Verify(context.Background(), l.bad)
				if err != nil {
					t.Fatalf("Verify(bad): %v", err)
				}
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
				good, err := v.Verify(context.Background(), l.good)
				if err != nil {
					t.Fatalf("Verify(good): %v", err)
				}
				if !good.Passed || len(good.Findings) != 0 {
					t.Errorf("good twin %q: passed %v, findings %q; want a clean pass", l.good.Content, good.Passed, messages(good.Findings))
				}
			})
		}
	}
}

func TestSchemaFindings(t *testing.T) {
	t.Parallel()
	v := newTestVerifier(t, func() Config { c := DefaultConfig(); c.MaxSchemaFindings = 3; return c }())
	list := Format{Type: FormatJSONSchema, JSONSchema: `{"type": "array", "items": {"type": "object", "required": ["sku"],
		"properties": {"sku": {"type": "string", "pattern": "^SKU-"}, "a/b": {"type": "integer"}}}}`}
	tests := []struct {
		name    string
		content string
		want    []wantFinding
		wantMsg string
	}{
		{name: "valid", content: `[{"sku": "SKU-1"}]`},
		{name: "nested paths are JSON pointers", content: `[{"sku": "SKU-1"}, {"sku": "X-2", "a/b": 1.5}]`,
			want:    []wantFinding{{Code: CodeSchema, Path: "/1/a~1b", Blocking: true}, {Code: CodeSchema, Path: "/1/sku", Blocking: true}},
			wantMsg: "at /1/sku:"},
		{name: "missing property is reported at its object", content: `[{}]`,
			want: []wantFinding{{Code: CodeSchema, Path: "/0", Blocking: true}}, wantMsg: "missing property 'sku'"},
		{name: "findings are capped", content: `[{}, {}, {}, {}, {}]`,
			want:    []wantFinding{{Code: CodeSchema, Path: "/0", Blocking: true}, {Code: CodeSchema, Path: "/1", Blocking: true}, {Code: CodeSchema, Blocking: true}},
			wantMsg: "and 3 more schema violations"},
		{name: "wrong top level", content: `{"sku": "SKU-1"}`, want: []wantFinding{{Code: CodeSchema, Blocking: true}}, wantMsg: "at the top level"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := v.Verify(context.Background(), Answer{Content: tt.content, Format: list})
			if err != nil {
				t.Fatal(err)
			}
			keys := findingKeys(got.Findings)
			less := func(a, b wantFinding) bool { return a.Path < b.Path }
			if len(tt.want) == 3 { // the cap keeps order: two violations, then the summary
				less = nil
			}
			opts := []cmp.Option{cmpopts.EquateEmpty()}
			if less != nil {
				opts = append(opts, cmpopts.SortSlices(less))
			}
			if diff := cmp.Diff(tt.want, keys, opts...); diff != "" {
				t.Errorf("findings (-want +got):\n%s\n%q", diff, messages(got.Findings))
			}
			if tt.wantMsg != "" && !strings.Contains(strings.Join(messages(got.Findings), "\n"), tt.wantMsg) {
				t.Errorf("messages %q do not mention %q", messages(got.Findings), tt.wantMsg)
			}
			if got.Passed != (len(tt.want) == 0) || (len(tt.want) > 0 && got.FailureClass != ClassMalformedOutput) {
				t.Errorf("passed %v class %v", got.Passed, got.FailureClass)
			}
		})
	}
}

func TestSchemaRejectsExternalReferencesAndCaches(t *testing.T) {
	t.Parallel()
	v := newTestVerifier(t, DefaultConfig())
	for _, ref := range []string{"file:///etc/passwd", "http://169.254.169.254/latest/meta-data", "other.json"} {
		a := Answer{Content: `{}`, Format: Format{Type: FormatJSONSchema, JSONSchema: `{"$ref": "` + ref + `"}`}}
		if _, err := v.Verify(context.Background(), a); err == nil || !strings.Contains(err.Error(), "json_schema") {
			t.Errorf("schema referring to %s: err = %v, want it rejected as invalid", ref, err)
		}
	}
	// A schema with an internal reference is fine, and is compiled once.
	doc := `{"$defs": {"id": {"type": "string"}}, "type": "object", "properties": {"id": {"$ref": "#/$defs/id"}}}`
	for range 3 {
		got, err := v.Verify(context.Background(), Answer{Content: `{"id": 7}`, Format: Format{Type: FormatJSONSchema, JSONSchema: doc}})
		if err != nil || got.Passed {
			t.Fatalf("Verify = passed %v, %v; want a schema failure", got.Passed, err)
		}
	}
	if n := v.schemas.order.Len(); n != 1 {
		t.Errorf("schema cache holds %d entries, want 1", n)
	}
	small := newSchemaCache(2)
	for _, d := range []string{`{"type":"string"}`, `{"type":"number"}`, `{"type":"object"}`} {
		if _, err := small.get(d); err != nil {
			t.Fatal(err)
		}
	}
	if small.order.Len() != 2 {
		t.Errorf("a cache of 2 holds %d schemas", small.order.Len())
	}
}

// TestDegradedAnswersGetAdaptedThresholds: seed 001 5.1, the checks fit the model that
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
