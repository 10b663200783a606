package tokencount

import (
	"strings"
	"testing"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// BenchmarkCountTokens counts a 2 KB chat prompt exactly (o200k_base) and by estimate.
func BenchmarkCountTokens(b *testing.B) {
	tc := NewCounter(DefaultConfig())
	msgs := []Message{
		{Role: "system", Content: "You are a careful assistant. Answer in JSON with the fields answer and confidence."},
		{Role: "user", Content: strings.Repeat("Summarise the incident: retries rose to 42% and latency to 6.3 s. 重试率飙升至42%。", 20)},
	}
	for _, model := range []string{"gpt-4o", "qwen-max"} {
		b.Run(model, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				tc.Count(model, msgs, nil, "", true)
			}
		})
	}
}

// BenchmarkCountTokensTools counts a typical tool-calling request: a system prompt, a
// question, three tool definitions, an earlier call, its result and a low-detail image
// (about 3 KB of text), exactly (o200k_base) and by estimate.
func BenchmarkCountTokensTools(b *testing.B) {
	tc := NewCounter(DefaultConfig())
	params := `{"type":"object","properties":{"city":{"type":"string","description":"City name, e.g. Paris"},` +
		`"unit":{"type":"string","enum":["celsius","fahrenheit"]},"days":{"type":"integer","minimum":1,"maximum":14}},"required":["city"]}`
	tools := []*mantlev1.Tool{
		{Type: "function", Name: "get_weather", Description: "Current weather and a forecast for a city.", Parameters: params},
		{Type: "function", Name: "get_time", Description: "The local time in a time zone.", Parameters: `{"type":"object","properties":{"tz":{"type":"string"}},"required":["tz"]}`},
		{Type: "function", Name: "search_flights", Description: strings.Repeat("Search flights between two airports on a date. ", 6), Parameters: params},
	}
	msgs := []Message{
		{Role: "system", Content: strings.Repeat("You are a travel assistant. Use the tools; never guess the weather. ", 8)},
		{Role: "user", Parts: []*mantlev1.ContentPart{
			{Part: &mantlev1.ContentPart_Text{Text: "Is this Paris? If so, what is the weather there this week?"}},
			{Part: &mantlev1.ContentPart_Image{Image: &mantlev1.ImagePart{Url: "https://example.com/photo.jpg", Detail: "low"}}},
		}},
		{Role: "assistant", ToolCalls: []*mantlev1.ToolCall{{Id: "call_1", Type: "function", Name: "get_weather", Arguments: `{"city":"Paris","unit":"celsius","days":7}`}}},
		{Role: "tool", ToolCallID: "call_1", Content: strings.Repeat(`{"day":"mon","high":21,"low":12,"sky":"sunny"},`, 14)},
	}
	for _, model := range []string{"gpt-4o", "qwen-max"} {
		b.Run(model, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				tc.Count(model, msgs, tools, "", true)
			}
		})
	}
}
