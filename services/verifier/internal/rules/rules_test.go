package rules

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

func newEngine(t testing.TB, limit uint64) *Engine {
	t.Helper()
	e, err := NewEngine(limit)
	if err != nil {
		t.Fatalf("NewEngine: %v", err)
	}
	return e
}

func load(t testing.TB, e *Engine, rules ...Rule) *Set {
	t.Helper()
	s, err := e.Load(rules)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return s
}

// jsonInput parses text as the verifier does (numbers as float64) for output.
func jsonInput(t testing.TB, scenario, question, text string) *Input {
	t.Helper()
	var out any
	if err := json.Unmarshal([]byte(text), &out); err != nil {
		t.Fatalf("test answer is not JSON: %v", err)
	}
	return &Input{Scenario: scenario, Question: question, Text: text, Output: out, ResponseFormat: "json_object"}
}

func textInput(scenario, question, text string) *Input {
	return &Input{Scenario: scenario, Question: question, Text: text, ResponseFormat: "text"}
}

// run evaluates rules against in and applies the matches.
func run(t testing.TB, e *Engine, in *Input, rules ...Rule) (Result, Outcome) {
	t.Helper()
	s := load(t, e, rules...)
	res := s.Evaluate(in)
	return res, Apply(in, res.Matches, in.Output != nil)
}

const hedging = `has(output.diagnosis) && ["可能", "疑似", "possibly", "probably"].exists(w, string(output.diagnosis).contains(w))`

func TestActions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		rule Rule
		in   *Input
		// wantText is the delivered answer; empty means unchanged.
		wantText    string
		wantApplied []Applied
		wantBlocked string
		wantDegrade string
		wantReview  []string
		wantNotices []string
		wantSkipped []string // rule ids
	}{
		{
			name:        "block: Chinese diagnosis with a hedging word",
			rule:        Rule{ID: "diagnosis-hedging", Condition: hedging, Action: Action{Type: ActionBlock}},
			in:          jsonInput(t, "medical", "白细胞12.5是什么情况", `{"diagnosis": "疑似细菌感染", "confidence": 0.8}`),
			wantApplied: []Applied{{RuleID: "diagnosis-hedging", Action: ActionBlock}},
			wantBlocked: "diagnosis-hedging",
		},
		{
			name: "block does not fire on a firm diagnosis",
			rule: Rule{ID: "diagnosis-hedging", Condition: hedging, Action: Action{Type: ActionBlock}},
			in:   jsonInput(t, "medical", "白细胞12.5是什么情况", `{"diagnosis": "细菌感染", "confidence": 0.8}`),
		},
		{
			name: "replace: English hedging diagnosis becomes a referral, with a notice",
			rule: Rule{ID: "diagnosis-hedging", Condition: hedging, Action: Action{
				Type: ActionReplace, Field: "diagnosis", Value: "Please consult a doctor.", Notice: "This conclusion needs a doctor's review."}},
			in:          jsonInput(t, "medical", "What does WBC 12.5 mean?", `{"diagnosis": "possibly a bacterial infection", "next_steps": ["blood culture"], "id": 12345678901234567890}`),
			wantText:    `{"diagnosis":"Please consult a doctor.","id":12345678901234567890,"next_steps":["blood culture"]}`,
			wantApplied: []Applied{{RuleID: "diagnosis-hedging", Action: ActionReplace, Path: "diagnosis"}},
			wantNotices: []string{"This conclusion needs a doctor's review."},
		},
		{
			name: "mask: a whole nested field",
			rule: Rule{ID: "mask-id-number", Condition: `has(output.patient) && has(output.patient.id_number)`,
				Action: Action{Type: ActionMask, Field: "patient.id_number"}},
			in:          jsonInput(t, "", "查询", `{"patient": {"name": "张三", "id_number": "110101199003074578"}}`),
			wantText:    `{"patient":{"id_number":"***","name":"张三"}}`,
			wantApplied: []Applied{{RuleID: "mask-id-number", Action: ActionMask, Path: "patient.id_number"}},
		},
		{
			name: "mask: a pattern inside an array element",
			rule: Rule{ID: "mask-phone", Condition: `true`,
				Action: Action{Type: ActionMask, Field: "contacts.0", Pattern: `1[3-9]\d{9}`, Value: "[phone]"}},
			in:          jsonInput(t, "", "联系方式", `{"contacts": ["call 13812345678 or 13987654321"]}`),
			wantText:    `{"contacts":["call [phone] or [phone]"]}`,
			wantApplied: []Applied{{RuleID: "mask-phone", Action: ActionMask, Path: "contacts.0"}},
		},
		{
			name: "mask: a pattern in a text answer",
			rule: Rule{ID: "mask-email", Condition: `text.contains("@")`,
				Action: Action{Type: ActionMask, Pattern: `\w+@\w+\.\w+`}},
			in:          textInput("support", "who do I contact?", "Write to alice@example.com or 联系 bob@example.cn."),
			wantText:    "Write to *** or 联系 ***.",
			wantApplied: []Applied{{RuleID: "mask-email", Action: ActionMask}},
		},
		{
			name: "notice: a Chinese answer on 工伤认定 that cites no regulation gets the citation",
			rule: Rule{ID: "work-injury-cite", Condition: `question.contains("工伤认定") && !text.contains("工伤保险条例")`,
				Action: Action{Type: ActionNotice, Notice: "依据《工伤保险条例》第二十条。"}},
			in:          textInput("legal", "工伤认定需要多久？", "一般需要两个月左右。\n"),
			wantText:    "一般需要两个月左右。\n\n依据《工伤保险条例》第二十条。",
			wantApplied: []Applied{{RuleID: "work-injury-cite", Action: ActionNotice}},
			wantNotices: []string{"依据《工伤保险条例》第二十条。"},
		},
		{
			name: "notice: not added when the answer already cites it",
			rule: Rule{ID: "work-injury-cite", Condition: `question.contains("工伤认定") && !text.contains("工伤保险条例")`,
				Action: Action{Type: ActionNotice, Notice: "依据《工伤保险条例》第二十条。"}},
			in: textInput("legal", "工伤认定需要多久？", "依据《工伤保险条例》第二十条，60日内作出决定。"),
		},
		{
			name:        "notice: written into a new JSON field",
			rule:        Rule{ID: "notice-field", Condition: `true`, Action: Action{Type: ActionNotice, Field: "notice", Notice: "Check with HR."}},
			in:          jsonInput(t, "", "q", `{"answer": "yes"}`),
			wantText:    `{"answer":"yes","notice":"Check with HR."}`,
			wantApplied: []Applied{{RuleID: "notice-field", Action: ActionNotice, Path: "notice"}},
			wantNotices: []string{"Check with HR."},
		},
		{
			name:        "notice without a field leaves a JSON answer intact",
			rule:        Rule{ID: "notice-json", Condition: `true`, Action: Action{Type: ActionNotice, Notice: "注意"}},
			in:          jsonInput(t, "", "q", `{"answer": "yes"}`),
			wantNotices: []string{"注意"},
			wantSkipped: []string{"notice-json"},
		},
		{
			name:        "degrade",
			rule:        Rule{ID: "degrade-long", Condition: `size(text) > 10`, Action: Action{Type: ActionDegrade}},
			in:          textInput("", "q", "a rather long answer"),
			wantApplied: []Applied{{RuleID: "degrade-long", Action: ActionDegrade}},
			wantDegrade: "degrade-long",
		},
		{
			name: "review: 工伤认定 answer that says no appraisal is needed",
			rule: Rule{ID: "no-appraisal-review", Condition: `question.contains("工伤认定") && text.contains("无需鉴定")`,
				Action: Action{Type: ActionReview}},
			in:          textInput("legal", "工伤认定要做劳动能力鉴定吗", "无需鉴定，直接申请即可。"),
			wantApplied: []Applied{{RuleID: "no-appraisal-review", Action: ActionReview}},
			wantReview:  []string{"no-appraisal-review"},
		},
		{
			name:        "field action on a text answer is skipped",
			rule:        Rule{ID: "mask-field", Condition: `true`, Action: Action{Type: ActionMask, Field: "diagnosis"}},
			in:          textInput("", "q", "plain text"),
			wantSkipped: []string{"mask-field"},
		},
		{
			name:        "replace of a missing field is skipped",
			rule:        Rule{ID: "replace-missing", Condition: `true`, Action: Action{Type: ActionReplace, Field: "missing", Value: "x"}},
			in:          jsonInput(t, "", "q", `{"answer": "yes"}`),
			wantSkipped: []string{"replace-missing"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			res, out := run(t, newEngine(t, 0), tt.in, tt.rule)
			if len(res.Errors) > 0 {
				t.Fatalf("evaluation errors: %v", res.Errors)
			}
			want := tt.wantText
			if want == "" {
				want = tt.in.Text
			}
			if out.Text != want {
				t.Errorf("text = %q, want %q", out.Text, want)
			}
			if diff := cmp.Diff(tt.wantApplied, out.Applied, cmpopts.IgnoreFields(Applied{}, "Detail"), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("applied (-want +got):\n%s", diff)
			}
			if out.BlockedBy != tt.wantBlocked || out.DegradedBy != tt.wantDegrade {
				t.Errorf("blocked, degraded = %q, %q; want %q, %q", out.BlockedBy, out.DegradedBy, tt.wantBlocked, tt.wantDegrade)
			}
			if diff := cmp.Diff(tt.wantReview, out.ReviewBy, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("review (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantNotices, out.Notices, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("notices (-want +got):\n%s", diff)
			}
			var skipped []string
			for _, s := range out.Skipped {
				skipped = append(skipped, s.RuleID)
			}
			if diff := cmp.Diff(tt.wantSkipped, skipped, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("skipped (-want +got):\n%s", diff)
			}
		})
	}
}

func TestActionsApplyInRuleOrder(t *testing.T) {
	t.Parallel()
	in := jsonInput(t, "medical", "q", `{"diagnosis": "可能是感染", "phone": "13812345678"}`)
	_, out := run(t, newEngine(t, 0), in,
		Rule{ID: "a-replace", Condition: hedging, Action: Action{Type: ActionReplace, Field: "diagnosis", Value: "请咨询医生"}},
		Rule{ID: "b-mask", Condition: `has(output.phone)`, Action: Action{Type: ActionMask, Field: "phone"}},
		Rule{ID: "c-review", Condition: `true`, Action: Action{Type: ActionReview}},
	)
	if want := `{"diagnosis":"请咨询医生","phone":"***"}`; out.Text != want {
		t.Errorf("text = %s, want %s", out.Text, want)
	}
	if diff := cmp.Diff([]string{"a-replace", "b-mask", "c-review"}, out.RuleIDs()); diff != "" {
		t.Errorf("RuleIDs (-want +got):\n%s", diff)
	}
}

func TestConditionsSeeEveryVariable(t *testing.T) {
	t.Parallel()
	in := &Input{
		Scenario: "legal", Tenant: "acme", Model: "m-3b", Question: "工伤认定", Text: "答复",
		Messages:       []Message{{Role: "system", Content: "你是律师"}, {Role: "user", Content: "工伤认定"}},
		ResponseFormat: "text", Degraded: true,
		Quality: &mantlev1.QualityContext{
			FallbackLevel: mantlev1.FallbackLevel_FALLBACK_LEVEL_BACKUP_MODEL, RetryCount: 2,
			Verification: &mantlev1.Verification{L1Passed: true},
		},
	}
	conditions := []string{
		`scenario == "legal" && tenant == "acme" && model == "m-3b"`,
		`request.messages.size() == 2 && request.messages[0].role == "system"`,
		`request.question == question && request.response_format == "text"`,
		`degraded && quality.fallback_level == mantle.v1.FallbackLevel.FALLBACK_LEVEL_BACKUP_MODEL`,
		`quality.retry_count >= 2 && quality.verification.l1_passed`,
		`output == null && text.lowerAscii() == "答复"`,
	}
	e := newEngine(t, 0)
	for i, cond := range conditions {
		s := load(t, e, Rule{ID: fmt.Sprintf("r%d", i), Condition: cond, Action: Action{Type: ActionReview}})
		res := s.Evaluate(in)
		if len(res.Errors) > 0 || len(res.Matches) != 1 {
			t.Errorf("%s: matches %d, errors %v; want a match", cond, len(res.Matches), res.Errors)
		}
	}
	// A nil QualityContext is an empty one, not an error.
	s := load(t, e, Rule{ID: "q", Condition: `quality.retry_count == 0`, Action: Action{Type: ActionReview}})
	if res := s.Evaluate(textInput("", "", "x")); len(res.Matches) != 1 {
		t.Errorf("nil quality: %+v, want a match", res)
	}
}

func TestScenarioScope(t *testing.T) {
	t.Parallel()
	e := newEngine(t, 0)
	s := load(t, e,
		Rule{ID: "everywhere", Condition: `true`, Action: Action{Type: ActionReview}},
		Rule{ID: "medical-only", Scenarios: []string{"medical"}, Condition: `true`, Action: Action{Type: ActionReview}},
		Rule{ID: "legal-and-gov", Scenarios: []string{"legal", "gov"}, Condition: `true`, Action: Action{Type: ActionReview}},
	)
	for scenario, want := range map[string][]string{
		"medical": {"everywhere", "medical-only"},
		"gov":     {"everywhere", "legal-and-gov"},
		"chat":    {"everywhere"},
		"":        {"everywhere"},
	} {
		var got []string
		for _, m := range s.Evaluate(textInput(scenario, "", "x")).Matches {
			got = append(got, m.Rule.ID)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("scenario %q (-want +got):\n%s", scenario, diff)
		}
	}
}

func TestCostLimitStopsARunawayRule(t *testing.T) {
	t.Parallel()
	e := newEngine(t, 2_000)
	s := load(t, e,
		// Quadratic in the answer's length: over the limit on a few hundred characters.
		Rule{ID: "runaway", Condition: `text.split("").exists(a, text.split("").exists(b, a + b == "zz"))`, Action: Action{Type: ActionBlock}},
		Rule{ID: "cheap", Condition: `text.contains("复核")`, Action: Action{Type: ActionReview}},
	)
	res := s.Evaluate(textInput("", "", strings.Repeat("需要人工复核。", 40)))
	if len(res.Errors) != 1 || res.Errors[0].RuleID != "runaway" || !res.Errors[0].CostExceeded {
		t.Fatalf("errors = %+v, want runaway stopped at the cost limit", res.Errors)
	}
	if len(res.Matches) != 1 || res.Matches[0].Rule.ID != "cheap" {
		t.Errorf("matches = %+v, want only the cheap rule: a stopped rule must not stop the others", res.Matches)
	}
	// The same rule is fine within a generous limit on a short answer.
	s2 := load(t, newEngine(t, 0), s.Rules()...)
	if res := s2.Evaluate(textInput("", "", "ab")); len(res.Errors) != 0 {
		t.Errorf("short answer: errors %+v, want none", res.Errors)
	}
}

func TestEvaluationErrorsDoNotMatch(t *testing.T) {
	t.Parallel()
	s := load(t, newEngine(t, 0),
		Rule{ID: "no-has", Condition: `output.diagnosis == "x"`, Action: Action{Type: ActionBlock}},
	)
	res := s.Evaluate(jsonInput(t, "", "", `{"answer": 1}`))
	if len(res.Matches) != 0 || len(res.Errors) != 1 || res.Errors[0].CostExceeded {
		t.Errorf("result = %+v, want one non-cost error and no match", res)
	}
}

func TestLoadRejectsABadSetAndKeepsTheLastGood(t *testing.T) {
	t.Parallel()
	good := []Rule{
		{ID: "cite", Condition: `question.contains("工伤认定") && !text.contains("工伤保险条例")`, Action: Action{Type: ActionNotice, Notice: "依据《工伤保险条例》"}},
	}
	tests := []struct {
		name    string
		rules   []Rule
		wantErr []string
	}{
		{"syntax error", []Rule{{ID: "bad", Condition: `text.contains(`, Action: Action{Type: ActionBlock}}}, []string{"rules[0] (bad): condition:"}},
		{"not a bool", []Rule{{ID: "bad", Condition: `size(text)`, Action: Action{Type: ActionBlock}}}, []string{"must be a bool, is int"}},
		{"unknown variable", []Rule{{ID: "bad", Condition: `answer == ""`, Action: Action{Type: ActionBlock}}}, []string{"undeclared reference to 'answer'"}},
		{"unknown action", []Rule{{ID: "bad", Condition: `true`, Action: Action{Type: "explode"}}}, []string{`action.type: want block, mask, replace, notice, degrade or review, got "explode"`}},
		{"notice without text", []Rule{{ID: "bad", Condition: `true`, Action: Action{Type: ActionNotice}}}, []string{"action.notice: required"}},
		{"block with a field", []Rule{{ID: "bad", Condition: `true`, Action: Action{Type: ActionBlock, Field: "x"}}}, []string{"block takes no field"}},
		{"bad pattern", []Rule{{ID: "bad", Condition: `true`, Action: Action{Type: ActionMask, Pattern: "("}}}, []string{"action.pattern:"}},
		{"bad field path", []Rule{{ID: "bad", Condition: `true`, Action: Action{Type: ActionMask, Field: "a..b"}}}, []string{"action.field:"}},
		{"bad id", []Rule{{ID: "Bad Id", Condition: `true`, Action: Action{Type: ActionBlock}}}, []string{"id: want"}},
		{"duplicate id", []Rule{good[0], good[0]}, []string{"rules[1] (cite): id: duplicates rules[0]"}},
		{
			"one bad rule rejects the whole set, every error reported",
			[]Rule{good[0], {ID: "x", Condition: `1 +`, Action: Action{Type: ActionBlock}}, {ID: "y", Condition: `true`, Action: Action{Type: "nope"}}},
			[]string{"rules[1] (x)", "rules[2] (y)"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEngine(t, 0)
			v1 := load(t, e, good...)
			_, err := e.Load(tt.rules)
			if err == nil {
				t.Fatal("Load accepted a bad set")
			}
			for _, want := range tt.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
			live := e.Live()
			if live != v1 || live.Version != 1 {
				t.Fatalf("live set is version %d, want the last good set (version 1)", live.Version)
			}
			if res := live.Evaluate(textInput("", "工伤认定多久", "两个月")); len(res.Matches) != 1 {
				t.Errorf("last good set no longer matches: %+v", res)
			}
			// A good set afterwards is accepted with the next version.
			if s, err := e.Load(nil); err != nil || s.Version != 2 || e.Live().Len() != 0 {
				t.Errorf("Load(empty) = %v, %v; want version 2 with no rules", s, err)
			}
		})
	}
}

func TestReloadWhileEvaluating(t *testing.T) {
	t.Parallel()
	e := newEngine(t, 0)
	load(t, e, Rule{ID: "a", Condition: `true`, Action: Action{Type: ActionReview}})
	in := textInput("", "q", "answer")
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				// Every evaluation sees one whole set: exactly one rule matches.
				if got := len(e.Live().Evaluate(in).Matches); got != 1 {
					t.Errorf("matches = %d, want 1", got)
					return
				}
			}
		})
	}
	for i := range 50 {
		load(t, e, Rule{ID: fmt.Sprintf("r%d", i), Condition: `true`, Action: Action{Type: ActionReview}})
	}
	close(stop)
	wg.Wait()
	if got := e.Live().Version; got != 51 {
		t.Errorf("version = %d, want 51", got)
	}
}

func TestDraft(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		hint      Hint
		wantRule  Rule
		wantErr   string
		matches   *Input
		unmatched *Input
	}{
		{
			name: "work injury: 工伤认定 + 无需鉴定 gets the regulation",
			hint: Hint{ReviewID: "rv_1", Scenario: "legal", QuestionTerms: []string{"工伤认定"}, AnswerTerms: []string{"无需鉴定"},
				Knowledge: "《工伤保险条例》第二十条规定…", Action: ActionNotice},
			wantRule: Rule{ID: "draft-rv-1", Description: "drafted from review rv_1", Scenarios: []string{"legal"},
				Condition: `question.contains("工伤认定") && text.contains("无需鉴定")`,
				Action:    Action{Type: ActionNotice, Notice: "《工伤保险条例》第二十条规定…"}},
			matches:   textInput("legal", "工伤认定流程", "无需鉴定，直接办理。"),
			unmatched: textInput("legal", "工伤认定流程", "需要先做鉴定。"),
		},
		{
			name: "mask drafted from answer terms, quoted",
			hint: Hint{ReviewID: "rv_2", AnswerTerms: []string{"v1.2 (beta)", "内部代号"}, Action: ActionMask},
			wantRule: Rule{ID: "draft-rv-1", Description: "drafted from review rv_2",
				Condition: `(text.contains("v1.2 (beta)") || text.contains("内部代号"))`,
				Action:    Action{Type: ActionMask, Pattern: `v1\.2 \(beta\)|内部代号`}},
			matches: textInput("", "q", "内部代号 is secret"),
		},
		{
			name: "quotes in terms are escaped",
			hint: Hint{ReviewID: "rv_3", QuestionTerms: []string{`say "hi"\`}, Action: ActionBlock},
			wantRule: Rule{ID: "draft-rv-1", Description: "drafted from review rv_3",
				Condition: `question.contains("say \"hi\"\\")`, Action: Action{Type: ActionBlock}},
			matches: textInput("", `please say "hi"\ now`, "x"),
		},
		{name: "no terms", hint: Hint{Action: ActionBlock}, wantErr: "needs question terms or answer terms"},
		{name: "notice without knowledge", hint: Hint{QuestionTerms: []string{"x"}, Action: ActionNotice}, wantErr: "needs the knowledge text"},
		{name: "mask without answer terms", hint: Hint{QuestionTerms: []string{"x"}, Action: ActionMask}, wantErr: "needs answer terms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r, err := Draft("draft-rv-1", tt.hint)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Draft error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Draft: %v", err)
			}
			if diff := cmp.Diff(tt.wantRule, r, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("rule (-want +got):\n%s", diff)
			}
			s := load(t, newEngine(t, 0), r)
			if res := s.Evaluate(tt.matches); len(res.Matches) != 1 {
				t.Errorf("drafted rule does not match its own example: %+v", res)
			}
			if tt.unmatched != nil {
				if res := s.Evaluate(tt.unmatched); len(res.Matches) != 0 {
					t.Errorf("drafted rule matches a good answer: %+v", res)
				}
			}
		})
	}
}

func TestJSONEditsKeepUntouchedValuesAsWritten(t *testing.T) {
	t.Parallel()
	in := jsonInput(t, "", "q", `{"z": {"b": 1.50, "a": [1, 2]}, "patient": {"phone": "13812345678", "age": 1e2}, "big": 9007199254740993}`)
	_, out := run(t, newEngine(t, 0), in,
		Rule{ID: "mask-phone", Condition: `true`, Action: Action{Type: ActionMask, Field: "patient.phone", Pattern: `\d{4}$`, Value: "****"}},
		Rule{ID: "mask-again", Condition: `true`, Action: Action{Type: ActionMask, Field: "patient.phone", Pattern: `^138`, Value: "1**"}},
		Rule{ID: "notice", Condition: `true`, Action: Action{Type: ActionNotice, Field: "notice", Notice: "<仅供参考>"}},
		Rule{ID: "missing", Condition: `true`, Action: Action{Type: ActionReplace, Field: "patient.name", Value: "x"}},
	)
	// Edited objects are rewritten with sorted keys; everything else, numbers included,
	// is copied byte for byte; <> is not HTML-escaped.
	want := `{"big":9007199254740993,"notice":"<仅供参考>","patient":{"age":1e2,"phone":"1**1234****"},"z":{"b": 1.50, "a": [1, 2]}}`
	if out.Text != want {
		t.Errorf("text =\n%s\nwant\n%s", out.Text, want)
	}
	if diff := cmp.Diff([]string{"mask-phone", "mask-again", "notice"}, out.RuleIDs()); diff != "" {
		t.Errorf("applied (-want +got):\n%s", diff)
	}
	if len(out.Skipped) != 1 || out.Skipped[0].RuleID != "missing" {
		t.Errorf("skipped = %+v, want the rule on a missing field", out.Skipped)
	}
}
