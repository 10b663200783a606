package tokencount

import (
	"bytes"
	"encoding/base64"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"testing"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

const weatherParamsPretty = `{
  "type": "object",
  "properties": {"city": {"type": "string"}},
  "required": ["city"]
}`

var weatherTool = &mantlev1.Tool{Type: "function", Name: "get_weather", Description: "Weather of a city", Parameters: weatherParamsPretty}

func encodePNG(t testing.TB, w, h int) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := png.Encode(&b, image.NewPaletted(image.Rect(0, 0, w, h), color.Palette{color.Black})); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func encodeJPEG(t testing.TB, w, h int) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := jpeg.Encode(&b, image.NewGray(image.Rect(0, 0, w, h)), nil); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func encodeGIF(t testing.TB, w, h int) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := gif.Encode(&b, image.NewPaletted(image.Rect(0, 0, w, h), color.Palette{color.Black}), nil); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func dataURL(mime string, data []byte) string {
	return "data:" + mime + ";base64," + base64.StdEncoding.EncodeToString(data)
}

func imagePart(img *mantlev1.ImagePart) *mantlev1.ContentPart {
	return &mantlev1.ContentPart{Part: &mantlev1.ContentPart_Image{Image: img}}
}

// TestImageTokens pins the provider rules: OpenAI's (85 for detail low; 85 + 170 per
// 512-px tile after fitting 2048x2048 and a shortest side of 768, the figures of OpenAI's
// own examples) and Anthropic's (pixels / 750, at most 1600). Sizes come from the image's
// header; an image whose size is unknown costs the rule's maximum.
func TestImageTokens(t *testing.T) {
	t.Parallel()
	png1024 := encodePNG(t, 1024, 1024)
	png2048x4096 := encodePNG(t, 2048, 4096)
	jpeg1000x500 := encodeJPEG(t, 1000, 500)
	gif300x200 := encodeGIF(t, 300, 200)
	tests := []struct {
		name      string
		fam       family
		img       *mantlev1.ImagePart
		want      int64
		wantKnown bool
	}{
		{"low detail by URL", familyO200k, &mantlev1.ImagePart{Url: "https://example.com/a.png", Detail: "low"}, 85, true},
		{"URL of unknown size: the high-detail maximum", familyO200k, &mantlev1.ImagePart{Url: "https://example.com/a.png", Detail: "high"}, 1445, false},
		{"URL, detail unset", familyCL100k, &mantlev1.ImagePart{Url: "https://example.com/a.png"}, 1445, false},
		{"PNG 1024x1024 data URL, auto: 768x768, 4 tiles", familyO200k, &mantlev1.ImagePart{Url: dataURL("image/png", png1024), Detail: "auto"}, 765, true},
		{"PNG 2048x4096 bytes, high: 768x1536, 6 tiles", familyO200k, &mantlev1.ImagePart{Data: png2048x4096, MediaType: "image/png", Detail: "high"}, 1105, true},
		{"JPEG 1000x500: unscaled, 2 tiles", familyGeneric, &mantlev1.ImagePart{Url: dataURL("image/jpeg", jpeg1000x500)}, 425, true},
		{"GIF 300x200: 1 tile", familyGeneric, &mantlev1.ImagePart{Data: gif300x200}, 255, true},
		{"low detail of a big inline image", familyO200k, &mantlev1.ImagePart{Data: png2048x4096, Detail: "low"}, 85, true},
		{"a format whose header is not read", familyO200k, &mantlev1.ImagePart{Url: "data:image/webp;base64,UklGRiQAAABXRUJQ"}, 1445, false},
		{"a data URL that is not base64", familyO200k, &mantlev1.ImagePart{Url: "data:image/png,%89PNG"}, 1445, false},
		{"garbage bytes", familyO200k, &mantlev1.ImagePart{Data: []byte("not an image")}, 1445, false},
		{"Anthropic: 1000x500 / 750", familyClaude, &mantlev1.ImagePart{Url: dataURL("image/jpeg", jpeg1000x500), Detail: "low"}, 667, true},
		{"Anthropic: at most 1600", familyClaude, &mantlev1.ImagePart{Data: png2048x4096}, 1600, true},
		{"Anthropic: URL of unknown size", familyClaude, &mantlev1.ImagePart{Url: "https://example.com/a.png"}, 1600, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, known := imageTokens(tt.fam, tt.img)
			if got != tt.want || known != tt.wantKnown {
				t.Errorf("imageTokens = %d (known %t), want %d (known %t)", got, known, tt.want, tt.wantKnown)
			}
		})
	}
}

// TestOpenAIImageTiles checks the scaling steps on their own, with OpenAI's published
// examples (1024x1024 high: 765; 2048x4096: 1105) and the edges of each step.
func TestOpenAIImageTiles(t *testing.T) {
	t.Parallel()
	cases := map[[2]int]int64{
		{1024, 1024}: 765,  // 768x768: 2x2 tiles
		{2048, 4096}: 1105, // 1024x2048 -> 768x1536: 2x3
		{512, 512}:   255,  // 1x1
		{513, 512}:   425,  // 2x1
		{768, 768}:   765,  // not scaled: 2x2
		{4096, 1024}: 765,  // 2048x512: 4x1
		{3000, 3000}: 765,  // 2048x2048 -> 768x768
		{2048, 768}:  1445, // the most any image costs: 4x2
		{10000, 10}:  765,  // 2048x2: 4x1
	}
	for size, want := range cases {
		if got := openAIImageTokens(size[0], size[1]); got != want {
			t.Errorf("openAIImageTokens(%d, %d) = %d, want %d", size[0], size[1], got, want)
		}
	}
}

// TestChatCountsEveryPart counts a tool-calling conversation with gpt-4o (o200k_base,
// exact). Each line of the expected sum is one part, with its text's tokens in o200k_base.
func TestChatCountsEveryPart(t *testing.T) {
	t.Parallel()
	tc := NewCounter(DefaultConfig())
	msgs := []Message{
		// 3 framing + "system" 1 + "You are terse." 4
		{Role: "system", Content: "You are terse."},
		// 3 + "user" 1 + name 1 + "alice" 1 + "What is in this image?" 6 + low-detail image 85
		{Role: "user", Name: "alice", Parts: []*mantlev1.ContentPart{
			{Part: &mantlev1.ContentPart_Text{Text: "What is in this image?"}},
			imagePart(&mantlev1.ImagePart{Url: "https://example.com/cat.png", Detail: "low"}),
		}},
		// 3 + "assistant" 1 + per call 3 + "call_1" 3 + "get_weather" 2 + {"city":"Paris"} 5
		{Role: "assistant", ToolCalls: []*mantlev1.ToolCall{{Id: "call_1", Type: "function", Name: "get_weather", Arguments: `{"city":"Paris"}`}}},
		// 3 + "tool" 1 + "call_1" 3 + "sunny, 21°C" 6
		{Role: "tool", ToolCallID: "call_1", Content: "sunny, 21°C"},
		// 3 + "user" 1 + "weather in Paris?" 4
		{Role: "user", Content: "weather in Paris?"},
	}
	// Tools: 12 for the set + 7 per tool + "get_weather" 2 + "Weather of a city" 4 + the
	// parameters, compacted, 19.
	tools := []*mantlev1.Tool{weatherTool}
	const want = 8 + 97 + 17 + 13 + 8 + (12 + 7 + 2 + 4 + 19) + 3 // + 3 to prime the reply
	got := tc.Count("gpt-4o", msgs, tools, "", true)
	if got.Tokens != want || !got.Exact || got.Tokenizer != "o200k_base" {
		t.Errorf("count = %+v, want exactly %d", got, want)
	}
	// The same prompt without the tools costs exactly what the tools add less.
	if without := tc.Count("gpt-4o", msgs, nil, "", true); without.Tokens != want-44 {
		t.Errorf("without tools: %d, want %d", without.Tokens, want-44)
	}
}

// TestChatCountsNonTextParts: audio and files are estimated (Exact false), by the
// documented conservative rules; a pretty-printed schema costs what the compact one does.
func TestChatCountsNonTextParts(t *testing.T) {
	t.Parallel()
	tc := NewCounter(DefaultConfig())
	user := func(parts ...*mantlev1.ContentPart) []Message { return []Message{{Role: "user", Parts: parts}} }
	base := tc.Count("gpt-4o", user(), nil, "", true).Tokens // 3 + "user" 1 + reply 3
	audio := base64.StdEncoding.EncodeToString(make([]byte, 8000))
	tests := []struct {
		name  string
		msgs  []Message
		tools []*mantlev1.Tool
		add   int64
		exact bool
	}{
		// 8000 bytes at 4000 a second, 32 tokens a second.
		{"audio", user(&mantlev1.ContentPart{Part: &mantlev1.ContentPart_InputAudio{InputAudio: &mantlev1.AudioPart{Data: audio, Format: "wav"}}}), nil, 64, false},
		// 400 bytes, one token per 4; "report.pdf" 2.
		{"inline file", user(&mantlev1.ContentPart{Part: &mantlev1.ContentPart_File{File: &mantlev1.FilePart{Filename: "report.pdf", FileData: base64.StdEncoding.EncodeToString(make([]byte, 400))}}}), nil, 100 + 2, false},
		{"file by id", user(&mantlev1.ContentPart{Part: &mantlev1.ContentPart_File{File: &mantlev1.FilePart{FileId: "file-abc"}}}), nil, 4096, false},
		{"refusal part", user(&mantlev1.ContentPart{Part: &mantlev1.ContentPart_Refusal{Refusal: "weather in Paris?"}}), nil, 4, true},
		{"pretty and compact parameters cost the same", user(), []*mantlev1.Tool{{Name: "get_weather", Description: "Weather of a city", Parameters: `{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`}}, 12 + 7 + 2 + 4 + 19, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := tc.Count("gpt-4o", tt.msgs, tt.tools, "", true)
			if got.Tokens != base+tt.add || got.Exact != tt.exact {
				t.Errorf("count = %+v, want %d + %d (exact %t)", got, base, tt.add, tt.exact)
			}
		})
	}
}

// TestEstimatedFamiliesCountTools: a family without a vocabulary estimates the tools'
// text like any other and adds the same framing.
func TestEstimatedFamiliesCountTools(t *testing.T) {
	t.Parallel()
	tc := NewCounter(DefaultConfig())
	msgs := []Message{{Role: "user", Content: "hi"}}
	without := tc.Count("llama-3", msgs, nil, "", true)
	with := tc.Count("llama-3", msgs, []*mantlev1.Tool{weatherTool}, "", true)
	fam := familyLlama
	want := 12 + 7 + estimateText(fam, "get_weather") + estimateText(fam, "Weather of a city") +
		estimateText(fam, `{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`)
	if with.Tokens-without.Tokens != want || with.Exact {
		t.Errorf("tools add %d (count %+v), want %d, estimated", with.Tokens-without.Tokens, with, want)
	}
}
