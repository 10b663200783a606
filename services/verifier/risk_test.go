package verifier

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// repetitive is a JSON answer whose values repeat: 3 of 4 strings are duplicates (75%).
const repetitive = `{"summary": "药物可以治愈", "detail": "药物可以治愈", "advice": "药物可以治愈", "note": "请遵医嘱"}`

func TestRiskScore(t *testing.T) {
	t.Parallel()
	user := func(s string) []Message {
		return []Message{{Role: "system", Content: "你是医生助手"}, {Role: "user", Content: s}}
	}
	tests := []struct {
		name        string
		cfg         func(*Config)
		answer      Answer
		wantScore   float64
		wantSignals []string
		wantReview  bool
	}{
		{name: "clean", answer: Answer{Content: "周四送达。", Messages: user("什么时候送达？")}},
		{name: "sensitive term (Chinese)", answer: Answer{Content: "请尽快就医。", Messages: user("我是不是得了癌症")},
			wantScore: 0.25, wantSignals: []string{SignalSensitiveTerm}},
		{name: "sensitive term (English, any case)", answer: Answer{Content: "Please call a helpline.", Messages: user("thoughts of SUICIDE")},
			wantScore: 0.25, wantSignals: []string{SignalSensitiveTerm}},
		{name: "a sensitive term in the system prompt does not count", answer: Answer{Content: "好的。",
			Messages: []Message{{Role: "system", Content: "遇到自杀话题请转人工"}, {Role: "user", Content: "你好"}}}},
		{name: "long input", answer: Answer{Content: "好的。", Messages: user(strings.Repeat("长", 2001))},
			wantScore: 0.25, wantSignals: []string{SignalLongInput}},
		{name: "garbled input", answer: Answer{Content: "好的。", Messages: user("锟斤拷锟斤拷")},
			wantScore: 0.25, wantSignals: []string{SignalInputEncoding}},
		{name: "repeated values in the output", answer: Answer{Content: repetitive, Format: jsonObject(), Messages: user("能治好吗")},
			wantScore: 0.5, wantSignals: []string{SignalRepetition}},
		{name: "sensitive question and repetitive answer reach the threshold",
			answer:    Answer{Content: repetitive, Format: jsonObject(), Messages: user("癌症能治好吗")},
			wantScore: 0.75, wantSignals: []string{SignalSensitiveTerm, SignalRepetition}, wantReview: true},
		{name: "degraded answers get a 30% higher threshold",
			answer: Answer{Content: repetitive, Format: jsonObject(), Messages: user("癌症能治好吗"),
				Quality: &mantlev1.QualityContext{FallbackLevel: mantlev1.FallbackLevel_FALLBACK_LEVEL_BACKUP_MODEL}},
			wantScore: 0.75, wantSignals: []string{SignalSensitiveTerm, SignalRepetition}},
		{name: "format warning", answer: Answer{Content: "```json\n{\"a\": \"b\"}\n```", Format: jsonObject()},
			wantScore: 0.15, wantSignals: []string{SignalFormatWarning}},
		{name: "retries", answer: Answer{Content: "好的。", Quality: &mantlev1.QualityContext{RetryCount: 2}},
			wantScore: 0.125, wantSignals: []string{SignalRetries}},
		{name: "failed answer", answer: Answer{Content: "{", Format: jsonObject()}, wantScore: 0.5, wantSignals: []string{SignalFailed}},
		{
			name: "scenario weights and threshold",
			cfg: func(c *Config) {
				c.Scenarios = map[string]ScenarioConfig{"medical": {Weights: &RiskWeights{Input: 3, Output: 1}, ReviewThreshold: 0.7}}
			},
			answer:    Answer{Content: "请尽快就医。", Messages: user("癌症晚期怎么办"), Quality: &mantlev1.QualityContext{Scenario: "medical"}},
			wantScore: 0.75, wantSignals: []string{SignalSensitiveTerm}, wantReview: true,
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
			reviews := memoryReviews(t, v)
			got, err := v.Verify(context.Background(), tt.answer)
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(got.RiskScore-tt.wantScore) > 1e-9 {
				t.Errorf("risk = %v (%+v), want %v", got.RiskScore, got.Risk, tt.wantScore)
			}
			if diff := cmp.Diff(tt.wantSignals, got.Risk.Signals, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("signals (-want +got):\n%s", diff)
			}
			if (got.ReviewID != "") != tt.wantReview {
				t.Errorf("review %q, want one: %v", got.ReviewID, tt.wantReview)
			}
			if tt.wantReview {
				r, err := reviews.Get(context.Background(), "", got.ReviewID)
				if err != nil || r.Reason != "risk" || r.RiskScore != got.RiskScore {
					t.Errorf("review = %+v, %v", r, err)
				}
			}
		})
	}
}

func TestContextRiskFollowsTheSession(t *testing.T) {
	t.Parallel()
	v := newTestVerifier(t, DefaultConfig())
	ctx := context.Background()
	degraded := func(requestID string) Answer {
		return Answer{Content: "这是备用模型的回答。", Tenant: "acme", SessionID: "s-1",
			Quality: &mantlev1.QualityContext{RequestId: requestID, FallbackLevel: mantlev1.FallbackLevel_FALLBACK_LEVEL_BACKUP_MODEL}}
	}
	verify := func(a Answer) Verdict {
		t.Helper()
		got, err := v.Verify(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	verify(degraded("r1"))
	// A second candidate of the same request does not count twice.
	verify(degraded("r1"))
	if got := verify(degraded("r2")); got.Risk.Context != 0 {
		t.Fatalf("second degraded request: context risk %v, want 0", got.Risk.Context)
	}
	third := verify(degraded("r3"))
	if third.Risk.Context != 1 || !strings.Contains(strings.Join(third.Risk.Signals, ","), SignalDegradedStreak) {
		t.Errorf("third degraded request in a row: %+v, want the degraded streak", third.Risk)
	}
	// Another tenant's session with the same id is another session.
	other := degraded("r4")
	other.Tenant = "globex"
	if got := verify(other); got.Risk.Context != 0 {
		t.Errorf("other tenant: context risk %v, want 0", got.Risk.Context)
	}
	// A primary answer ends the streak.
	primary := Answer{Content: "主模型的回答。", Tenant: "acme", SessionID: "s-1", Quality: &mantlev1.QualityContext{RequestId: "r5"}}
	if got := verify(primary); got.Risk.Context != 0 {
		t.Errorf("primary answer: context risk %v, want the streak broken", got.Risk.Context)
	}
	if got := verify(degraded("r6")); got.Risk.Context != 0 {
		t.Errorf("first degraded after a primary: context risk %v, want 0", got.Risk.Context)
	}

	// Dissatisfaction, reported by request id, raises the session's context risk.
	if session := v.sessions.feedback("acme", "", "r5", true); session != "s-1" {
		t.Fatalf("feedback found session %q, want s-1", session)
	}
	if got := verify(primary); got.Risk.Context != 1 || !strings.Contains(strings.Join(got.Risk.Signals, ","), SignalUserDissatisfied) {
		t.Errorf("after dissatisfaction: %+v", got.Risk)
	}
	// It wears off after the feedback window.
	v.clock.(interface{ Advance(d time.Duration) }).Advance(DefaultConfig().Risk.FeedbackWindow)
	if got := verify(primary); got.Risk.Context != 0 {
		t.Errorf("after the feedback window: context risk %v, want 0", got.Risk.Context)
	}
	if session := v.sessions.feedback("acme", "", "unknown-request", true); session != "" {
		t.Errorf("feedback on an unknown request found session %q", session)
	}
}
