package verifier

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/services/verifier/internal/review"
	"github.com/mantle-mesh/mantle/services/verifier/internal/rules"
)

func medical(question string) []Message { return []Message{{Role: "user", Content: question}} }

func inScenario(scenario, requestID string) *mantlev1.QualityContext {
	return &mantlev1.QualityContext{RequestId: requestID, Scenario: scenario}
}

// memoryReviews attaches an in-memory review service to v, as the module does without NATS.
func memoryReviews(t *testing.T, v *Verifier) *review.Service {
	t.Helper()
	svc := review.NewService(review.Config{Lease: time.Minute, MaxLease: time.Hour}, review.NewStore(review.NewMemoryKV(), nil),
		v.clock, discard{}, v.rules, slog.New(slog.DiscardHandler))
	v.SetReviewSink(directSink{svc})
	return svc
}

func TestSampleRulesThroughVerify(t *testing.T) {
	t.Parallel()
	v := newTestVerifier(t, DefaultConfig())
	reviews := memoryReviews(t, v)
	ctx := context.Background()

	t.Run("a hedging diagnosis is replaced and the user told", func(t *testing.T) {
		got, err := v.Verify(ctx, Answer{
			Content:  `{"diagnosis": "疑似细菌感染", "next_steps": ["复查血常规"], "confidence": 0.8}`,
			Format:   jsonObject("diagnosis"),
			Messages: medical("白细胞12.5是什么情况"), Quality: inScenario("medical", "req-med-1"), Tenant: "acme",
		})
		if err != nil {
			t.Fatal(err)
		}
		if !got.Passed || got.Grade != GradeMedium {
			t.Errorf("passed %v grade %v, want a pass graded medium", got.Passed, got.Grade)
		}
		if want := `{"confidence":0.8,"diagnosis":"请咨询医生","next_steps":["复查血常规"]}`; got.Content != want {
			t.Errorf("content = %s, want %s", got.Content, want)
		}
		if got.UserNotice != "根据诊疗规范，此结论需医生复核。" {
			t.Errorf("user notice = %q", got.UserNotice)
		}
		if diff := cmp.Diff([]string{"diagnosis-no-hedging"}, got.RulesApplied()); diff != "" {
			t.Errorf("rules applied (-want +got):\n%s", diff)
		}
		if !slices.Contains(got.Risk.Signals, SignalRuleApplied) {
			t.Errorf("signals %v, want rule_applied", got.Risk.Signals)
		}
	})
	t.Run("the same answer in another scenario is untouched", func(t *testing.T) {
		got, err := v.Verify(ctx, Answer{Content: `{"diagnosis": "疑似细菌感染"}`, Format: jsonObject(), Quality: inScenario("chat", "req-chat-1")})
		if err != nil || len(got.Actions) != 0 || got.Content != `{"diagnosis": "疑似细菌感染"}` {
			t.Errorf("verdict = %+v, %v; want no rule applied", got, err)
		}
	})
	t.Run("a 工伤认定 answer gets the regulation appended", func(t *testing.T) {
		got, err := v.Verify(ctx, Answer{Content: "一般需要两个月左右。", Messages: medical("工伤认定需要多久？"),
			Quality: inScenario("legal", "req-legal-1"), Tenant: "acme"})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(got.Content, "依据《工伤保险条例》第二十条：社会保险行政部门应当自受理工伤认定申请之日起60日内作出工伤认定的决定。") {
			t.Errorf("content = %q, want the regulation appended", got.Content)
		}
		if got.ReviewID != "" {
			t.Errorf("review %s opened, want none", got.ReviewID)
		}
	})
	t.Run("a 工伤认定 answer saying 无需鉴定 goes to review", func(t *testing.T) {
		got, err := v.Verify(ctx, Answer{Content: "无需鉴定，直接申请即可。依据《工伤保险条例》。", Messages: medical("工伤认定要做鉴定吗"),
			Quality: inScenario("legal", "req-legal-2"), Tenant: "acme"})
		if err != nil {
			t.Fatal(err)
		}
		if !got.Passed || got.ReviewID != review.ID("acme", "req-legal-2") {
			t.Fatalf("passed %v review %q, want a delivered answer with a review", got.Passed, got.ReviewID)
		}
		r, err := reviews.Get(ctx, "", got.ReviewID)
		if err != nil {
			t.Fatal(err)
		}
		if r.Reason != "rule:work-injury-no-appraisal-review" || r.State != review.StatePending ||
			!r.DueAt.Equal(r.CreatedAt.Add(15*time.Minute)) || r.Question != "工伤认定要做鉴定吗" {
			t.Errorf("review = %+v", r)
		}
	})
}

// counterValue reads a counter without the testutil package (whose dependencies are not
// in go.mod).
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func TestBlockAndDegradeRulesFailTheAnswer(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.Rules = []rules.Rule{
		{ID: "no-guarantee", Condition: `text.contains("保证") || text.lowerAscii().contains("guarantee")`, Action: rules.Action{Type: rules.ActionBlock}},
		{ID: "too-long-for-sms", Scenarios: []string{"sms"}, Condition: `size(text) > 20`, Action: rules.Action{Type: rules.ActionDegrade}},
		{ID: "tag", Condition: `true`, Action: rules.Action{Type: rules.ActionNotice, Notice: "AI生成"}},
	}
	v := newTestVerifier(t, cfg)
	tests := []struct {
		name        string
		answer      Answer
		wantPassed  bool
		wantDegrade bool
		wantLayer   string
		wantCodes   []string // L2 finding codes
	}{
		{"block in Chinese", Answer{Content: "我们保证三天到账。"}, false, false, LayerL2, []string{"no-guarantee", "tag"}},
		{"block in English", Answer{Content: "We GUARANTEE delivery."}, false, false, LayerL2, []string{"no-guarantee", "tag"}},
		{"degrade", Answer{Content: "您的订单已经从上海仓库发出，预计周四送达。", Quality: inScenario("sms", "r1")}, false, true, LayerL2, []string{"tag", "too-long-for-sms"}},
		{"block wins over degrade", Answer{Content: "我们保证周四送达，请您耐心等待快递员的电话联系。", Quality: inScenario("sms", "r2")}, false, false, LayerL2, []string{"no-guarantee", "tag", "too-long-for-sms"}},
		{"notice only", Answer{Content: "周四送达。"}, true, false, "", []string{"tag"}},
		{"L1 failure skips L2", Answer{Content: "我们保证", FinishReason: "length"}, false, false, LayerL1, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := v.Verify(context.Background(), tt.answer)
			if err != nil {
				t.Fatal(err)
			}
			var codes []string
			for _, f := range got.Findings {
				if f.Layer == LayerL2 {
					codes = append(codes, f.Code)
				}
			}
			if got.Passed != tt.wantPassed || got.Degrade != tt.wantDegrade || got.FailedLayer != tt.wantLayer {
				t.Errorf("passed %v degrade %v layer %q; want %v %v %q", got.Passed, got.Degrade, got.FailedLayer, tt.wantPassed, tt.wantDegrade, tt.wantLayer)
			}
			if !tt.wantPassed && tt.wantLayer == LayerL2 && got.FailureClass != ClassVerificationFailed {
				t.Errorf("class = %v, want verification_failed", got.FailureClass)
			}
			if diff := cmp.Diff(tt.wantCodes, codes, cmpopts.SortSlices(func(a, b string) bool { return a < b }), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("L2 findings (-want +got):\n%s", diff)
			}
			if !tt.wantPassed && got.L1Passed() != (tt.wantLayer == LayerL2) {
				t.Errorf("L1Passed = %v", got.L1Passed())
			}
		})
	}
}

func TestRuleErrorsAreCountedNotFatal(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.RuleCostLimit = 500
	cfg.Rules = []rules.Rule{
		{ID: "runaway", Condition: `text.split("").exists(a, text.split("").exists(b, a + b == "zz"))`, Action: rules.Action{Type: rules.ActionBlock}},
		{ID: "no-has", Condition: `output.missing == 1`, Action: rules.Action{Type: rules.ActionBlock}},
	}
	reg := prometheus.NewRegistry()
	v, err := New(cfg, clockwork.NewFakeClock(), reg)
	if err != nil {
		t.Fatal(err)
	}
	got, err := v.Verify(context.Background(), Answer{Content: `{"answer": "` + strings.Repeat("很长的回答", 30) + `"}`, Format: jsonObject()})
	if err != nil || !got.Passed {
		t.Fatalf("Verify = passed %v, %v; a rule that cannot be evaluated must not fail the answer", got.Passed, err)
	}
	if n := counterValue(t, v.metrics.ruleErrors.WithLabelValues("runaway", "cost_limit")); n != 1 {
		t.Errorf("cost-limit errors = %v, want 1", n)
	}
	if n := counterValue(t, v.metrics.ruleErrors.WithLabelValues("no-has", "evaluation")); n != 1 {
		t.Errorf("evaluation errors = %v, want 1", n)
	}
}

func writeRules(t *testing.T, path, doc string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
}

const (
	rulesA = "rules:\n  - id: file-a\n    condition: text.contains(\"退款\")\n    action: {type: notice, notice: 退款规则A}\n"
	rulesB = "rules:\n  - id: file-b\n    condition: text.contains(\"退款\")\n    action: {type: notice, notice: 退款规则B}\n"
	rulesX = "rules:\n  - id: file-x\n    condition: text.contains(\n    action: {type: block}\n"
)

func noticeOf(t *testing.T, v *Verifier) string {
	t.Helper()
	got, err := v.Verify(context.Background(), Answer{Content: "退款五个工作日到账。"})
	if err != nil {
		t.Fatal(err)
	}
	return got.UserNotice
}

func TestRulesFileHotReload(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, path, rulesA)
	cfg := DefaultConfig()
	cfg.RulesFile = path
	v := newTestVerifier(t, cfg)
	if got := noticeOf(t, v); got != "退款规则A" {
		t.Fatalf("notice = %q, want the file's rule", got)
	}
	start := v.rules.engine.Live().Version

	// A set that does not compile is rejected; the last good set stays live.
	writeRules(t, path, rulesX)
	if _, err := v.rules.Reload(); !errors.Is(err, ErrRulesRejected) || !strings.Contains(err.Error(), "file-x") {
		t.Fatalf("Reload(bad) = %v, want ErrRulesRejected naming file-x", err)
	}
	if got := noticeOf(t, v); got != "退款规则A" || v.rules.engine.Live().Version != start {
		t.Errorf("after a rejected reload: notice %q version %d; want the last good set", got, v.rules.engine.Live().Version)
	}
	// So does a file that is not YAML of rules.
	writeRules(t, path, "rules: {not: a list}\n")
	if _, err := v.rules.Reload(); !errors.Is(err, ErrRulesRejected) {
		t.Errorf("Reload(not a list) = %v, want ErrRulesRejected", err)
	}
	// A good set replaces it, without a restart.
	writeRules(t, path, rulesB)
	set, err := v.rules.Reload()
	if err != nil {
		t.Fatal(err)
	}
	if got := noticeOf(t, v); got != "退款规则B" || set.Version != start+1 {
		t.Errorf("after a good reload: notice %q version %d; want rule B at version %d", got, set.Version, start+1)
	}
	if n := counterValue(t, v.metrics.reloads.WithLabelValues("rejected")); n != 2 {
		t.Errorf("rejected reloads = %v, want 2", n)
	}
}

func TestRulesFileWatcher(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, path, rulesA)
	cfg := DefaultConfig()
	cfg.RulesFile = path
	clock := clockwork.NewFakeClock()
	v, err := New(cfg, clock, nil)
	if err != nil {
		t.Fatal(err)
	}
	reloads := make(chan error, 4)
	v.rules.onReload = func(_ *rules.Set, err error) { reloads <- err }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		v.rules.watch(ctx)
	}()
	defer func() { cancel(); <-done }()

	tick := func() {
		t.Helper()
		if err := clock.BlockUntilContext(ctx, 1); err != nil {
			t.Fatal(err)
		}
		clock.Advance(cfg.RulesReloadInterval)
	}
	next := func() error {
		t.Helper()
		select {
		case err := <-reloads:
			return err
		case <-time.After(waitFor):
			t.Fatal("the watcher did not reload")
			return nil
		}
	}
	writeRules(t, path, rulesX)
	tick()
	if err := next(); !errors.Is(err, ErrRulesRejected) {
		t.Fatalf("watcher reload of a bad file = %v, want rejected", err)
	}
	if got := noticeOf(t, v); got != "退款规则A" {
		t.Errorf("notice = %q after a bad file, want the last good rule A", got)
	}
	writeRules(t, path, rulesB)
	tick()
	if err := next(); err != nil {
		t.Fatalf("watcher reload of a good file = %v", err)
	}
	if got := noticeOf(t, v); got != "退款规则B" {
		t.Errorf("notice = %q, want rule B live without a restart", got)
	}
	// Only a changed file is reloaded.
	if v.rules.changed() {
		t.Error("changed() = true for the file just loaded")
	}
	writeRules(t, path, rulesA)
	if !v.rules.changed() {
		t.Error("changed() = false after the file changed")
	}
}
