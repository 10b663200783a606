package router

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
)

func TestFastRequest(t *testing.T) {
	t.Parallel()
	conversation := []provider.Message{
		{Role: "system", Content: "A long policy manual."},
		{Role: "developer", Content: "More instructions."},
		{Role: "user", Content: "Where is my parcel?"},
		{Role: "assistant", Content: "Let me look."},
		{Role: "user", Content: "Please hurry."},
	}
	for _, tt := range []struct {
		name      string
		maxTokens int // the request's
		rung      int // fast_answer.max_tokens
		wantMax   int
	}{
		{"no max_tokens asked: the rung's", 0, 64, 64},
		{"more asked than the rung allows: the rung's", 4000, 64, 64},
		{"fewer asked: the request's own", 10, 64, 10},
		{"rung without max_tokens: the default", 0, 0, defaultFastAnswerTokens},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tools := []provider.Tool{{Name: "track"}}
			in := provider.Request{Messages: conversation, MaxTokens: tt.maxTokens, Tools: tools, JSON: true}
			got := fastRequest(in, FastAnswerConfig{Model: "small", Prompt: "Answer in one sentence.", MaxTokens: tt.rung})
			want := []provider.Message{
				{Role: "system", Content: "Answer in one sentence."},
				{Role: "user", Content: "Where is my parcel?"},
				{Role: "assistant", Content: "Let me look."},
				{Role: "user", Content: "Please hurry."},
			}
			if diff := cmp.Diff(want, got.Messages); diff != "" {
				t.Errorf("messages (-want +got):\n%s", diff)
			}
			if got.MaxTokens != tt.wantMax {
				t.Errorf("max_tokens = %d, want %d", got.MaxTokens, tt.wantMax)
			}
			if !got.JSON || len(got.Tools) != 1 {
				t.Errorf("the response format or tools were not forwarded: json %v, tools %v", got.JSON, got.Tools)
			}
			if len(in.Messages) != len(conversation) || in.Messages[0].Role != "system" {
				t.Error("fastRequest changed the request it was given")
			}
		})
	}
}

// TestFastAnswerRung: the rung answers after every candidate and smaller model failed,
// with the short prompt, and says so; it is not asked while a model answers, and its
// failure leaves the rest of the ladder.
func TestFastAnswerRung(t *testing.T) {
	t.Parallel()
	withRung := func(c *Config) {
		c.Models = append(c.Models, ModelConfig{Name: "quick", Provider: "p"})
		c.Routes[0].Candidates = []string{"a", "b"}
		c.Routes[0].Ladder = LadderConfig{Smaller: []string{"c"}, Template: "We will get back to you.",
			FastAnswer: FastAnswerConfig{Model: "quick", Prompt: "Answer briefly.", MaxTokens: 64}}
	}
	down := []result{failure(classMalformed, "x")}
	for _, tt := range []struct {
		name       string
		results    map[string][]result
		wantModel  string
		wantLevel  mantlev1.FallbackLevel
		simplified bool
		quickCalls int
	}{
		{"the route's model answers: the rung is not asked",
			map[string][]result{"a": {reply("thorough", 1, 1)}}, "a", levelPrimary, false, 0},
		{"candidates and the smaller model failed: the fast answer",
			map[string][]result{"a": down, "b": down, "c": down, "quick": {reply("short", 1, 1)}}, "quick", levelBackup, true, 1},
		{"the rung fails too: the template",
			map[string][]result{"a": down, "b": down, "c": down, "quick": down}, templateModel, levelTemplate, false, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig()
			withRung(&cfg)
			providers := map[string]*fakeProvider{}
			for name, rs := range tt.results {
				providers[name] = newFakeProvider(rs...)
			}
			h := newHarness(t, cfg, &harness{providers: providers})
			req := ask("chat")
			req.Messages = append([]*mantlev1.ChatMessage{{Role: "system", Content: "A long policy manual."}}, req.Messages...)
			req.MaxTokens = 1000
			resp, err := h.router.Complete(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			qc := resp.GetQuality()
			if resp.Model != tt.wantModel || qc.GetFallbackLevel() != tt.wantLevel || qc.GetSimplifiedPrompt() != tt.simplified {
				t.Errorf("answered by %s at %v, simplified_prompt %v; want %s at %v, %v",
					resp.Model, qc.GetFallbackLevel(), qc.GetSimplifiedPrompt(), tt.wantModel, tt.wantLevel, tt.simplified)
			}
			// A fast answer is to another prompt: never stored for the caller's.
			if wantStored := map[bool]int{true: 1}[tt.wantLevel == levelPrimary]; h.cache.stored() != wantStored {
				t.Errorf("%d answers stored, want %d", h.cache.stored(), wantStored)
			}
			if got := h.calls("quick"); got != tt.quickCalls {
				t.Fatalf("the fast-answer model was called %d times, want %d", got, tt.quickCalls)
			}
			if tt.quickCalls == 0 {
				return
			}
			sent := h.providers["quick"].requests()[0]
			if sent.Messages[0].Content != "Answer briefly." || len(sent.Messages) != 2 || sent.Messages[1].Content != req.Messages[1].Content || sent.MaxTokens != 64 {
				t.Errorf("the fast-answer model got %+v (max_tokens %d); want the short prompt, the user's message and max_tokens 64", sent.Messages, sent.MaxTokens)
			}
		})
	}
}

// TestFastAnswerIsNeverAHedge: a hedge races a slow first choice with an equivalent
// model; the rung answers a simplified request and is not one.
func TestFastAnswerIsNeverAHedge(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Models = append(cfg.Models, ModelConfig{Name: "quick", Provider: "p"})
	cfg.Routes[0].Candidates = []string{"a"}
	cfg.Routes[0].Hedge = HedgeConfig{Enabled: true}
	cfg.Routes[0].Ladder.FastAnswer = FastAnswerConfig{Model: "quick", Prompt: "Answer briefly."}
	h := newHarness(t, cfg, nil)
	rt := h.router.table().routes["chat"]
	p := h.router.newPlan(rt, "")
	if len(p.cands) != 2 || !p.cands[1].fast {
		t.Fatalf("plan candidates %d, the last fast %v; want the route's model and the rung", len(p.cands), len(p.cands) == 2 && p.cands[1].fast)
	}
	if _, release, ok := h.router.hedgeCandidate(p, p.cands[0]); ok {
		release()
		t.Error("the fast-answer rung was chosen as a hedge")
	}
}

// TestStickyDegradationKeepsTheOnlyFullModel: a degraded session skips the route's first
// choice only for another model that answers its request, not for the fast-answer rung.
func TestStickyDegradationKeepsTheOnlyFullModel(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name       string
		candidates []string
		wantSkip   bool
	}{
		{"one model and the rung: the model is still asked", []string{"a"}, false},
		{"two models and the rung: the first is skipped", []string{"a", "b"}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig()
			cfg.Routes[0].Candidates = tt.candidates
			cfg.Routes[0].Ladder.FastAnswer = FastAnswerConfig{Model: "c", Prompt: "Be brief."}
			h := newHarness(t, cfg, nil)
			p := h.router.newPlan(h.router.table().routes["chat"], "")
			stickyDegradation(p, &mantlev1.QualityContext{SessionDegraded: true})
			if p.cands[0].exhausted != tt.wantSkip {
				t.Errorf("first choice skipped %v, want %v", p.cands[0].exhausted, tt.wantSkip)
			}
		})
	}
}
