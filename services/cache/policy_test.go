package cache

import (
	"testing"
)

func TestContainsMarker(t *testing.T) {
	t.Parallel()
	markers := normalizeAll([]string{"Now", "today", "in stock", "今天", "库存", "오늘"})
	tests := []struct {
		text string
		want bool
	}{
		{"what is the weather now", true},
		{"now?", true},
		{"today's specials", true},
		{"is it in stock", true},
		{"i don't know", false},
		{"nowhere to go", false},
		{"snowfall records", false},
		{"stock in shops", false},
		{"今天天气怎么样", true},
		{"查询库存", true},
		{"오늘은 날씨가 어때", true}, // 오늘 (today) with its particle
		{"how do i reset my password", false},
	}
	for _, tt := range tests {
		t.Run(tt.text, func(t *testing.T) {
			t.Parallel()
			if got := containsMarker(normalizeText(tt.text), nil, markers); got != tt.want {
				t.Errorf("containsMarker(%q) = %v, want %v", tt.text, got, tt.want)
			}
		})
	}
}

func TestPromptSkip(t *testing.T) {
	t.Parallel()
	p := compilePolicy(DefaultConfig().DefaultPolicy, defaultThresholds(EmbedderLexical))
	tests := []struct {
		user string
		want SkipReason
	}{
		{"How do I reset my password?", ""},
		{"What changed in version 2024-05-01?", ""},
		{"What is the latest version?", SkipVolatilePrompt},
		{"我的订单到哪了", SkipVolatilePrompt},
		{"What is my balance?", SkipPersonalPrompt},
		{"How do I delete my account?", ""},
		{"我的余额还有多少", SkipPersonalPrompt},
		{"Send the invoice to jane.doe@example.com", SkipPersonalPrompt},
		{"我的手机号是13812345678，怎么改绑", SkipPersonalPrompt},
		{"Call me at +1 415 555 0100", SkipPersonalPrompt},
		{"call 415-555-0100 please", SkipPersonalPrompt},
		{"card 6222021234567890123 was declined", SkipPersonalPrompt},
		{"Is 1,000,000 a lot?", ""},
	}
	for _, tt := range tests {
		t.Run(tt.user, func(t *testing.T) {
			t.Parallel()
			prompt := basePrompt(tt.user)
			if got := p.promptSkip(prompt, normalizeText(tt.user)); got != tt.want {
				t.Errorf("promptSkip(%q) = %q, want %q", tt.user, got, tt.want)
			}
		})
	}
}

func TestIsErrorObject(t *testing.T) {
	t.Parallel()
	tests := []struct {
		content string
		want    bool
	}{
		{`{"error": {"message": "rate limited"}}`, true},
		{` {"error":"x"} `, true},
		{`{"answer": "the error was fixed"}`, false},
		{`An error occurred when you ...`, false},
		{`{not json`, false},
	}
	for _, tt := range tests {
		if got := isErrorObject(tt.content); got != tt.want {
			t.Errorf("isErrorObject(%q) = %v, want %v", tt.content, got, tt.want)
		}
	}
}
