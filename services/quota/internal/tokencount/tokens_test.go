package tokencount

import (
	"strings"
	"sync"
	"testing"

	"github.com/tiktoken-go/tokenizer"
)

func TestFamilyFor(t *testing.T) {
	t.Parallel()
	tests := []struct {
		model string
		want  string
	}{
		{"gpt-4o-mini", "o200k_base"},
		{"openai/gpt-4o", "o200k_base"},
		{"GPT-4.1", "o200k_base"},
		{"o3-mini", "o200k_base"},
		{"gpt-5", "o200k_base"},
		{"gpt-4", "cl100k_base"},
		{"gpt-4-turbo", "cl100k_base"},
		{"gpt-3.5-turbo", "cl100k_base"},
		{"claude-3-5-sonnet", "estimate/claude"},
		{"anthropic/claude-sonnet-4", "estimate/claude"},
		{"qwen2.5-72b-instruct", "estimate/zh-optimized"},
		{"deepseek/deepseek-chat", "estimate/deepseek"},
		{"glm-4", "estimate/zh-optimized"},
		{"meta-llama/llama-3.1-70b", "estimate/llama"},
		{"gemini-2.0-flash", "estimate/gemini"},
		{"chat", "estimate/generic"},
		{"", "estimate/generic"},
	}
	for _, tt := range tests {
		t.Run(tt.model, func(t *testing.T) {
			t.Parallel()
			if got := familyFor(tt.model).name; got != tt.want {
				t.Errorf("familyFor(%q) = %s, want %s", tt.model, got, tt.want)
			}
		})
	}
}

// Exact counts. The cl100k_base ones are OpenAI's own examples (tiktoken's README and
// cookbook).
func TestExactCounts(t *testing.T) {
	t.Parallel()
	tc := NewCounter(DefaultConfig())
	tests := []struct {
		name  string
		model string
		text  string
		want  int64
	}{
		{"cl100k english", "gpt-4", "hello world", 2},
		{"o200k english", "gpt-4o", "hello world", 2},
		{"cl100k tiktoken is great", "gpt-3.5-turbo", "tiktoken is great!", 6},
		{"empty", "gpt-4o", "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := tc.Count(tt.model, nil, nil, tt.text, false)
			if !got.Exact || got.Tokens != tt.want {
				t.Errorf("count(%q, %q) = %+v, want exactly %d", tt.model, tt.text, got, tt.want)
			}
		})
	}
}

// The chat formula of OpenAI's cookbook ("How to count tokens with tiktoken"): 3 per
// message plus its role and content, 1 more per name, 3 to prime the reply. The
// cookbook's example conversation is 129 prompt tokens for gpt-4 and 124 for gpt-4o,
// as the OpenAI API reported them.
func TestExactChatCount(t *testing.T) {
	t.Parallel()
	tc := NewCounter(DefaultConfig())
	msgs := []Message{
		{Role: "system", Content: "You are a helpful, pattern-following assistant that translates corporate jargon into plain English."},
		{Role: "system", Name: "example_user", Content: "New synergies will help drive top-line growth."},
		{Role: "system", Name: "example_assistant", Content: "Things working well together will increase revenue."},
		{Role: "system", Name: "example_user", Content: "Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage."},
		{Role: "system", Name: "example_assistant", Content: "Let's talk later when we're less busy about how to do better."},
		{Role: "user", Content: "This late pivot means we don't have time to boil the ocean for the client deliverable."},
	}
	for model, want := range map[string]int64{"gpt-4": 129, "gpt-4o": 124} {
		if got := tc.Count(model, msgs, nil, "", true); !got.Exact || got.Tokens != want {
			t.Errorf("%s: %+v, want exactly %d", model, got, want)
		}
	}
}

func TestExactCountIsSafeForConcurrentUse(t *testing.T) {
	t.Parallel()
	tc := NewCounter(DefaultConfig())
	text := strings.Repeat("Concurrency is not parallelism. 并发不是并行。", 20)
	want := tc.Count("gpt-4o", nil, nil, text, false).Tokens
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 20 {
				if got := tc.Count("gpt-4o", nil, nil, text, false).Tokens; got != want {
					t.Errorf("concurrent count = %d, want %d", got, want)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestExactMaxBytesFallsBackToEstimate(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.ExactMaxBytes = 10
	tc := NewCounter(cfg)
	got := tc.Count("gpt-4o", nil, nil, "a text longer than ten bytes", false)
	if got.Exact || got.Tokenizer != "estimate/o200k_base" || got.Tokens == 0 {
		t.Errorf("count = %+v, want an o200k-like estimate", got)
	}
}

// The estimator is calibrated against the real vocabularies: on this corpus it must stay
// within [-10%, +40%] of cl100k_base for Latin text (erring high is by design), and its
// CJK rates must bracket what cl100k_base and o200k_base really spend on Chinese.
func TestEstimatorCalibration(t *testing.T) {
	t.Parallel()
	cl100k, err := tokenizer.Get(tokenizer.Cl100kBase)
	if err != nil {
		t.Fatal(err)
	}
	o200k, err := tokenizer.Get(tokenizer.O200kBase)
	if err != nil {
		t.Fatal(err)
	}
	latin := map[string]string{
		"prose": "The quick brown fox jumps over the lazy dog. Reliability engineering for model gateways needs admission that counts tokens, not requests, because requests differ in size by orders of magnitude.",
		"code":  "func (s *Service) Reserve(ctx context.Context, req ReserveRequest) (Reserved, error) {\n\tif err := validate(req); err != nil {\n\t\treturn Reserved{}, err\n\t}\n\treturn s.queue.admit(ctx, req)\n}\n",
		"json":  `{"answer": "42", "confidence_score": 0.93, "sources": [{"id": 7, "title": "Handbook"}], "ok": true}`,
	}
	for name, text := range latin {
		n, _ := cl100k.Count(text)
		est := estimateText(familyGeneric, text)
		if ratio := float64(est) / float64(n); ratio < 0.9 || ratio > 1.4 {
			t.Errorf("%s: estimate %d vs cl100k %d (ratio %.2f), want within [0.9, 1.4]", name, est, n, ratio)
		}
	}
	legal := strings.Repeat("根据《中华人民共和国劳动合同法》第三十九条规定，劳动者严重违反用人单位的规章制度的，用人单位可以解除劳动合同。", 4)
	chars := float64(len([]rune(legal)))
	n100, _ := cl100k.Count(legal)
	n200, _ := o200k.Count(legal)
	per100, per200 := float64(n100)/chars, float64(n200)/chars
	// The measured rates that tokens.go quotes: about 1.1 and 0.6 tokens per character.
	if per100 < 1.0 || per100 > 1.2 || per200 < 0.5 || per200 > 0.7 {
		t.Errorf("tokens per character: cl100k %.2f, o200k %.2f; tokens.go's comment is out of date", per100, per200)
	}
	// Chinese-tuned families sit between o200k and cl100k; Claude above cl100k.
	for _, f := range []family{familyZH, familyDeepSeek} {
		if f.cjk < per200 || f.cjk > per100 {
			t.Errorf("%s: %.2f tokens per character, want within [%.2f, %.2f]", f.name, f.cjk, per200, per100)
		}
	}
	if familyClaude.cjk <= per100 {
		t.Errorf("claude: %.2f tokens per character, want above cl100k's %.2f", familyClaude.cjk, per100)
	}
}

func TestEstimateText(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		text string
		// Estimates for the generic, zh-optimized and claude families.
		wantGeneric, wantZH, wantClaude int64
	}{
		{"empty", "", 0, 0, 0},
		{"short words: one per word", "the cat sat on the mat", 6, 6, 7},
		{"punctuation counts", "Hello, world!", 4, 4, 5},
		{"long word: one per 4 bytes", "internationalization", 5, 5, 6},
		{"JSON: one per symbol", `{"key": [1, 2, 3]}`, 13, 13, 15},
		{"Cyrillic: 2 bytes a letter", "Привет, мир", 5, 5, 6},
		{"emoji", "👍", 1, 1, 2},
		// Chinese is priced per character, and that price is what differs by family.
		{"Chinese", "我们今天讨论令牌计数", 10, 7, 13},
		{"Chinese with punctuation", "你好，世界。", 6, 5, 9},
		{"Japanese kana", "こんにちは", 5, 4, 7},
		{"mixed Chinese and English", "用 Go 写 gRPC 服务", 7, 6, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for _, c := range []struct {
				fam  family
				want int64
			}{{familyGeneric, tt.wantGeneric}, {familyZH, tt.wantZH}, {familyClaude, tt.wantClaude}} {
				if got := estimateText(c.fam, tt.text); got != c.want {
					t.Errorf("%s: estimateText(%q) = %d, want %d", c.fam.name, tt.text, got, c.want)
				}
			}
		})
	}
}

func TestEstimatedChatFraming(t *testing.T) {
	t.Parallel()
	tc := NewCounter(DefaultConfig())
	tests := []struct {
		name  string
		model string
		msgs  []Message
		want  int64
	}{
		{"no messages: reply priming only", "m", []Message{}, 3},
		{"one message: framing + content", "m", []Message{{Role: "user", Content: "hi"}}, 3 + 4 + 1},
		{"a name costs one more plus itself", "m", []Message{{Role: "user", Content: "hi", Name: "bob"}}, 3 + 4 + 1 + 1 + 1},
		{"ChatML families cost more per message", "qwen-max", []Message{{Role: "user", Content: "hi"}}, 3 + 5 + 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := tc.Count(tt.model, tt.msgs, nil, "", true); got.Tokens != tt.want || got.Exact {
				t.Errorf("count = %+v, want an estimate of %d", got, tt.want)
			}
		})
	}
}

func TestCorrections(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.CorrectionMinSamples = 3
	c := newCorrections(cfg)
	steps := []struct {
		estimated, actual int64
		wantFactor        float64
	}{
		{100, 120, 1},                  // one sample: not applied yet
		{100, 120, 1},                  // two
		{100, 120, 1.2},                // three: applied
		{10, 1000, 1.2},                // too small an estimate to learn from
		{100, 1000, 1.2 + 0.1*(4-1.2)}, // one wild report moves it by a tenth, bounded
	}
	for i, s := range steps {
		c.learn("Qwen-Max", s.estimated, s.actual)
		if got := c.factor("qwen-max"); got < s.wantFactor-1e-9 || got > s.wantFactor+1e-9 {
			t.Errorf("step %d: factor = %v, want %v", i, got, s.wantFactor)
		}
	}
	for range 100 {
		c.learn("qwen-max", 100, 10_000)
	}
	if got := c.factor("qwen-max"); got != maxCorrection {
		t.Errorf("after absurd reports: factor = %v, want the bound %v", got, maxCorrection)
	}
	off := newCorrections(Config{LearnCorrection: false, CorrectionMinSamples: 1})
	off.learn("m", 100, 200)
	if got := off.factor("m"); got != 1 {
		t.Errorf("disabled: factor = %v, want 1", got)
	}
}
