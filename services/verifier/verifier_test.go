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
	"google.golang.org/protobuf/proto"

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
// metrics. The usual budget for such checks is 1 ms; ours is 100 µs on a 2 KB answer.
func BenchmarkVerifyL1(b *testing.B) { benchmarkVerify(b, benchConfig(0)) }

// BenchmarkVerifyL1L2 is the same with 20 rules in the scenario (budget 300 µs).
func BenchmarkVerifyL1L2(b *testing.B) { benchmarkVerify(b, benchConfig(20)) }

// TestReviewKeepsACopyOfTheQuality: a review outlives the call, while Verify answers with
// the request's QualityContext extended in place (qualityWithVerdict); the review keeps an
// equal copy, never the request's own.
func TestReviewKeepsACopyOfTheQuality(t *testing.T) {
	t.Parallel()
	a := Answer{Tenant: "acme", Model: "m", Quality: &mantlev1.QualityContext{RequestId: "req-1", Tenant: "acme", Scenario: "legal",
		Audit: []*mantlev1.AuditStep{{Service: "router", Step: "route"}}}}
	ev := reviewFor(a, Verdict{Passed: true}, riskInputs{}, "rule:r", DefaultConfig(), testNow)
	if ev.GetQuality() == a.Quality || (len(ev.GetQuality().GetAudit()) > 0 && ev.GetQuality().GetAudit()[0] == a.Quality.Audit[0]) {
		t.Error("the review shares the request's QualityContext")
	}
	if !proto.Equal(ev.GetQuality(), a.Quality) {
		t.Errorf("review quality = %v, want %v", ev.GetQuality(), a.Quality)
	}
}
