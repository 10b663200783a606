package openai

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"

	"pgregory.net/rapid"

	"github.com/mantle-mesh/mantle/pkg/provider"
)

// plainRequest is chatRequest without its MarshalJSON: what json.Marshal makes of the
// fields alone, which appendBody must reproduce byte for byte.
type plainRequest chatRequest

func TestAppendBodyMatchesMarshal(t *testing.T) {
	temp, tiny, huge, neg := 0.7, 1e-7, 1e21, math.Copysign(0, -1)
	n, seed, top := 2, int64(-42), 3
	yes, no := true, false
	cases := map[string]chatRequest{
		"minimal":     {Model: "gpt-4o", Messages: []chatMessage{{Role: "user", Content: content{text: "hi"}}}},
		"no messages": {Model: "m"},
		"escapes": {Model: "a<b>&\"c\\", Messages: []chatMessage{
			{Role: "user", Content: content{text: "tab\t nl\n cr\r bs\b ff\f nul\x00 \x1f del\x7f"}},
			{Role: "user", Content: content{text: "bad \xff utf8 \u2028 \u2029 é 中文 😀"}},
		}},
		"every scalar": {
			Model: "m", MaxTokens: 10, MaxCompletionTokens: 20, Temperature: &temp, TopP: &tiny,
			N: &n, Stop: []string{"a", "<b>"}, Seed: &seed, PresencePenalty: &huge,
			FrequencyPenalty: &neg, Logprobs: &yes, TopLogprobs: &top, ParallelToolCalls: &no,
			ReasoningEffort: "high", ServiceTier: "flex", Modalities: []string{"text"},
			Store: &no, User: "u", Stream: true, StreamOptions: &streamOptions{IncludeUsage: true},
		},
		"shaped values": {
			Model:          "m",
			LogitBias:      map[string]int{"50256": -100, "1": 5},
			Metadata:       map[string]string{"b": "<x>", "a": "y"},
			Tools:          []tool{{Type: "function", Function: toolFunction{Name: "f", Parameters: json.RawMessage(`{"type": "object", "d":"<&>"}`), Strict: &yes}}},
			ToolChoice:     "auto",
			ResponseFormat: &responseFormat{Type: "json_schema", JSONSchema: &jsonSchemaSpec{Name: "s", Schema: json.RawMessage(`{}`)}},
		},
		"message fields": {Model: "m", Messages: []chatMessage{
			{Role: "assistant", Content: content{null: true}, Name: "bot", ToolCalls: []toolCall{{ID: "c1", Type: "function"}}},
			{Role: "tool", Content: content{text: "42"}, ToolCallID: "c1"},
			{Role: "user", Content: content{parts: []provider.Part{{Type: provider.PartText, Text: "look"}, {Type: provider.PartImage, ImageURL: "https://x/y.png?a=1&b=2", Detail: "low"}}}},
			{Role: "user", Content: content{parts: []provider.Part{}}},
			{Role: "assistant", Content: content{text: "So"}, Refusal: "no", Prefix: true},
		}},
	}
	for name, req := range cases {
		t.Run(name, func(t *testing.T) {
			checkAppendBody(t, req)
		})
	}
}

func TestAppendBodyRefusesWhatMarshalRefuses(t *testing.T) {
	for _, f := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		req := chatRequest{Model: "m", Temperature: &f}
		if _, ok := appendBody(nil, req); ok {
			t.Errorf("temperature %v: appendBody ok, json.Marshal refuses it", f)
		}
		if _, err := req.EncodeJSON(); err == nil {
			t.Errorf("temperature %v: EncodeJSON succeeded", f)
		}
	}
}

func TestAppendBodyMatchesMarshalProperty(t *testing.T) {
	str := rapid.OneOf(rapid.String(), rapid.StringOf(rapid.SampledFrom([]rune("a<>&\"\\\t\n\x00\x1f\u2028\u2029é中\uFFFD"))),
		rapid.Custom(func(t *rapid.T) string { return string(rapid.SliceOf(rapid.Byte()).Draw(t, "bytes")) }))
	float := rapid.Custom(func(t *rapid.T) *float64 {
		if rapid.Bool().Draw(t, "nil") {
			return nil
		}
		f := rapid.OneOf(rapid.Float64(), rapid.SampledFrom([]float64{0, 1e-6, 9.99e-7, 1e20, 1e21, -1e-300, 5e-324, math.MaxFloat64})).Draw(t, "f")
		return &f
	})
	rapid.Check(t, func(t *rapid.T) {
		req := chatRequest{
			Model:               str.Draw(t, "model"),
			MaxTokens:           rapid.IntRange(-1, 1<<20).Draw(t, "max"),
			MaxCompletionTokens: rapid.IntRange(0, 10).Draw(t, "maxc"),
			Temperature:         float.Draw(t, "temperature"),
			TopP:                float.Draw(t, "top_p"),
			PresencePenalty:     float.Draw(t, "presence"),
			FrequencyPenalty:    float.Draw(t, "frequency"),
			Stop:                rapid.SliceOfN(str, 0, 3).Draw(t, "stop"),
			ReasoningEffort:     str.Draw(t, "effort"),
			User:                str.Draw(t, "user"),
			Stream:              rapid.Bool().Draw(t, "stream"),
		}
		for range rapid.IntRange(0, 4).Draw(t, "messages") {
			m := chatMessage{Role: str.Draw(t, "role"), Name: str.Draw(t, "name"), Refusal: str.Draw(t, "refusal"), Prefix: rapid.Bool().Draw(t, "prefix")}
			switch rapid.IntRange(0, 2).Draw(t, "content") {
			case 0:
				m.Content.text = str.Draw(t, "text")
			case 1:
				m.Content.null = true
			case 2:
				m.Content.parts = []provider.Part{{Type: provider.PartText, Text: str.Draw(t, "part")}}
			}
			req.Messages = append(req.Messages, m)
		}
		checkAppendBody(t, req)
	})
}

func checkAppendBody(t interface {
	Helper()
	Fatalf(string, ...any)
}, req chatRequest) {
	t.Helper()
	want, err := json.Marshal(plainRequest(req))
	got, ok := appendBody(nil, req)
	if err != nil {
		if ok {
			t.Fatalf("json.Marshal refused the request (%v), appendBody did not", err)
		}
		return
	}
	if !ok {
		t.Fatalf("appendBody refused a request json.Marshal renders: %s", want)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("appendBody differs from json.Marshal\n got: %s\nwant: %s", got, want)
	}
}

func BenchmarkEncodeRequest(b *testing.B) {
	temp := 0.0
	req := chatBody(provider.Request{Model: "gpt-4o-mini", Temperature: &temp, MaxTokens: 256, Messages: []provider.Message{
		{Role: "system", Content: "You are a helpful support agent for a parcel company."},
		{Role: "user", Content: "Benchmark request 12345: how long does a parcel to Lisbon take?"},
	}}, false)
	// json.Marshal of the plain fields is what encoding a request cost before appendBody.
	b.Run("encoder=json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(plainRequest(req)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoder=appendBody", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := req.EncodeJSON(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
