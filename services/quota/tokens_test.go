package quota

import "testing"

func TestEstimatorFor(t *testing.T) {
	t.Parallel()
	tests := []struct {
		model string
		want  string
	}{
		{"gpt-4o-mini", "estimate/o200k-like"},
		{"openai/gpt-4o", "estimate/o200k-like"},
		{"GPT-4.1", "estimate/o200k-like"},
		{"o3-mini", "estimate/o200k-like"},
		{"gpt-4", "estimate/cl100k-like"},
		{"gpt-3.5-turbo", "estimate/cl100k-like"},
		{"claude-3-5-sonnet", "estimate/cl100k-like"},
		{"qwen2.5-72b-instruct", "estimate/zh-optimized"},
		{"deepseek/deepseek-chat", "estimate/zh-optimized"},
		{"glm-4", "estimate/zh-optimized"},
		{"", "estimate/cl100k-like"},
	}
	for _, tt := range tests {
		t.Run(tt.model, func(t *testing.T) {
			t.Parallel()
			if got := estimatorFor(tt.model).name; got != tt.want {
				t.Errorf("estimatorFor(%q) = %s, want %s", tt.model, got, tt.want)
			}
		})
	}
}

func TestCountText(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		text string
		// Estimates for cl100k-like, o200k-like and zh-optimized families.
		wantCL100k, wantO200k, wantZH int64
	}{
		{"empty", "", 0, 0, 0},
		{"short words: one per word", "the cat sat on the mat", 6, 6, 6},
		{"punctuation counts", "Hello, world!", 4, 4, 4},
		{"long word: one per 4 bytes", "internationalization", 5, 5, 5},
		{"JSON: one per symbol", `{"key": [1, 2, 3]}`, 13, 13, 13},
		{"Cyrillic: 2 bytes a letter", "Привет, мир", 5, 5, 5},
		{"emoji", "👍", 1, 1, 1},
		// Chinese is priced per character, and that price is what differs by family.
		{"Chinese", "我们今天讨论令牌计数", 10, 8, 7},
		{"Chinese with punctuation", "你好，世界。", 6, 6, 5},
		{"Japanese kana", "こんにちは", 5, 4, 4},
		{"Korean", "안녕하세요", 5, 4, 4},
		{"mixed Chinese and English", "用 Go 写 gRPC 服务", 7, 7, 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for _, c := range []struct {
				est  estimator
				want int64
			}{{cl100kLike, tt.wantCL100k}, {o200kLike, tt.wantO200k}, {zhLike, tt.wantZH}} {
				if got := c.est.countText(tt.text); got != c.want {
					t.Errorf("%s.countText(%q) = %d, want %d", c.est.name, tt.text, got, c.want)
				}
			}
		})
	}
}

func TestCountMessages(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		msgs []Message
		want int64
	}{
		{"no messages: reply priming only", nil, 3},
		{"one message: 4 framing + content", []Message{{Role: "user", Content: "hi"}}, 3 + 4 + 1},
		{"a name costs one more plus itself", []Message{{Role: "user", Content: "hi", Name: "bob"}}, 3 + 4 + 1 + 1 + 1},
		{"a conversation", []Message{
			{Role: "system", Content: "You are terse."},
			{Role: "user", Content: "你好"},
		}, 3 + (4 + 4) + (4 + 2)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := cl100kLike.countMessages(tt.msgs); got != tt.want {
				t.Errorf("countMessages = %d, want %d", got, tt.want)
			}
		})
	}
}
