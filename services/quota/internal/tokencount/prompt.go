package tokencount

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"image"
	_ "image/gif"  // registered for image.DecodeConfig: GIF headers
	_ "image/jpeg" // JPEG headers
	_ "image/png"  // PNG headers
	"io"
	"math"
	"slices"
	"strings"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// A prompt is every token a request puts before the model, and every byte a tenant sends
// is charged: text and names, tool definitions, the calls and results of earlier turns,
// images, audio and files. What is not text is charged by the provider's published rule
// where there is one, else by a conservative estimate that Settle replaces with the usage
// the provider reports.
const (
	// Tool definitions (OpenAI's cookbook, "How to count tokens with tiktoken", counting
	// for tools): 7 tokens of framing per function and 12 for the set. The definition's
	// name, description and parameters (compact JSON, which costs more than the
	// TypeScript-like form the model sees) are counted as text.
	perToolTokens  = 7
	toolsEndTokens = 12
	// Each earlier tool call costs 3 tokens of framing besides its id, name and arguments.
	perToolCallTokens = 3

	// OpenAI's image rule: detail low is 85 tokens; high and auto scale the image to fit
	// 2048x2048, then so that its shortest side is at most 768, and add 170 per 512-px
	// tile.
	imageBaseTokens = 85
	imageTileTokens = 170
	// imageUnknownTokens is charged for an image whose size is not known (by URL, or a
	// format whose header is not read): the most any image can cost at high detail,
	// 2048x768 after scaling, 8 tiles.
	imageUnknownTokens = imageBaseTokens + 8*imageTileTokens // 1445
	// Anthropic's rule: width x height / 750, the image scaled down to at most about
	// 1.15 megapixels, so at most about 1600 tokens, which is also charged for an image
	// whose size is not known.
	anthropicImagePixelsPerToken = 750
	anthropicImageMaxTokens      = 1600
	// maxImageHeaderBytes bounds what is decoded to find an image's dimensions: headers are
	// at the start of PNG and GIF; a JPEG whose frame header comes later is charged as
	// unknown.
	maxImageHeaderBytes = 64 << 10

	// Audio has no rule a request can apply before the provider decodes it. The estimate
	// assumes 32 kbit/s (4000 bytes a second: WAV is never denser, common MP3s are), so
	// the duration errs long, and 32 tokens a second (Gemini's published rate, above
	// OpenAI's).
	audioBytesPerSecond = 4000
	audioTokensPerSec   = 32
	// An inline file is charged a token per 4 bytes (like text, and far above a PDF's
	// text density); a file by id, whose size quota cannot see, a flat amount: a few pages
	// of text and images.
	fileBytesPerToken = 4
	fileByIDTokens    = 4096
)

// prompt is a prompt taken apart for counting: the texts a tokenizer counts, and the
// tokens that are not text (chat and tool framing, images, audio, files).
type prompt struct {
	texts []string
	// roles are the messages' roles: tokens of their own in OpenAI's formula (counted with
	// a vocabulary), part of the per-message framing in the estimates.
	roles []string
	fixed int64
	// exact is false when a part was estimated (audio, files, images of unknown size).
	exact bool
}

// collectPrompt is the one place that knows which parts of a chat request are tokens:
// Reserve's estimate and CountTokens both count through it, with any tokenizer.
func collectPrompt(fam family, msgs []Message, tools []*mantlev1.Tool) prompt {
	p := prompt{fixed: fam.reply, exact: true}
	for _, m := range msgs {
		p.fixed += fam.perMessage
		p.roles = append(p.roles, m.Role)
		p.add(m.Content, m.Refusal, m.ToolCallID)
		if m.Name != "" {
			p.fixed += fam.perName
			p.add(m.Name)
		}
		for _, part := range m.Parts {
			p.addPart(fam, part)
		}
		for _, tc := range m.ToolCalls {
			p.fixed += perToolCallTokens
			p.add(tc.GetId(), tc.GetName(), tc.GetArguments())
		}
	}
	if len(tools) > 0 {
		p.fixed += toolsEndTokens
	}
	for _, t := range tools {
		p.fixed += perToolTokens
		p.add(t.GetName(), t.GetDescription(), compactJSON(t.GetParameters()))
	}
	return p
}

func (p *prompt) add(texts ...string) {
	for _, s := range texts {
		if s != "" {
			p.texts = append(p.texts, s)
		}
	}
}

func (p *prompt) addPart(fam family, part *mantlev1.ContentPart) {
	switch v := part.GetPart().(type) {
	case *mantlev1.ContentPart_Text:
		p.add(v.Text)
	case *mantlev1.ContentPart_Refusal:
		p.add(v.Refusal)
	case *mantlev1.ContentPart_Image:
		n, known := imageTokens(fam, v.Image)
		p.fixed += n
		p.exact = p.exact && known
	case *mantlev1.ContentPart_InputAudio:
		p.fixed += ceilDiv(base64Len(v.InputAudio.GetData())*audioTokensPerSec, audioBytesPerSecond)
		p.exact = false
	case *mantlev1.ContentPart_File:
		f := v.File
		p.add(f.GetFilename())
		if f.GetFileData() != "" {
			p.fixed += ceilDiv(base64Len(f.GetFileData()), fileBytesPerToken)
		} else {
			p.fixed += fileByIDTokens
		}
		p.exact = false
	}
}

// bytes is the size of the prompt's text, which decides whether it is counted exactly.
func (p prompt) bytes() int {
	n := 0
	for _, s := range p.texts {
		n += len(s)
	}
	return n
}

// count adds up the prompt with text counting each text (and each role, withRoles); ok
// is false when text failed.
func (p prompt) count(text func(string) (int64, bool), withRoles bool) (int64, bool) {
	total := p.fixed
	texts := p.texts
	if withRoles {
		texts = append(slices.Clip(p.roles), texts...)
	}
	for _, s := range texts {
		n, ok := text(s)
		if !ok {
			return 0, false
		}
		total += n
	}
	return total, true
}

// compactJSON returns a tool's parameters without insignificant whitespace, so that a
// pretty-printed schema costs what the same schema costs compact; text that is not JSON
// is counted as it is.
func compactJSON(s string) string {
	if s == "" {
		return ""
	}
	var b bytes.Buffer
	b.Grow(len(s))
	if err := json.Compact(&b, []byte(s)); err != nil {
		return s
	}
	return b.String()
}

// imageTokens is what an image costs by the rule of fam's provider; known is false when
// its size could not be read and the maximum was charged.
func imageTokens(fam family, img *mantlev1.ImagePart) (tokens int64, known bool) {
	if !fam.anthropicImages && strings.EqualFold(img.GetDetail(), "low") {
		return imageBaseTokens, true
	}
	w, h, ok := imageSize(img)
	switch {
	case fam.anthropicImages && ok:
		return min(ceilDiv(int64(w)*int64(h), anthropicImagePixelsPerToken), anthropicImageMaxTokens), true
	case fam.anthropicImages:
		return anthropicImageMaxTokens, false
	case ok:
		return openAIImageTokens(w, h), true
	}
	return imageUnknownTokens, false
}

// openAIImageTokens applies OpenAI's high-detail rule to a w x h image.
func openAIImageTokens(w, h int) int64 {
	fw, fh := float64(w), float64(h)
	if longest := max(fw, fh); longest > 2048 {
		fw, fh = math.Floor(fw*2048/longest), math.Floor(fh*2048/longest)
	}
	if shortest := min(fw, fh); shortest > 768 {
		fw, fh = math.Floor(fw*768/shortest), math.Floor(fh*768/shortest)
	}
	tiles := int64(math.Ceil(fw/512)) * int64(math.Ceil(fh/512))
	return imageBaseTokens + imageTileTokens*tiles
}

// imageSize reads the dimensions of an inline image (bytes, or a base64 data: URL) from
// its header, reading at most maxImageHeaderBytes. PNG, JPEG and GIF are understood; a URL
// to fetch, another format or a header past the bound is unknown (ok false).
func imageSize(img *mantlev1.ImagePart) (w, h int, ok bool) {
	var r io.Reader
	switch url := img.GetUrl(); {
	case len(img.GetData()) > 0:
		r = bytes.NewReader(img.GetData())
	case strings.HasPrefix(url, "data:"):
		meta, payload, found := strings.Cut(url[len("data:"):], ",")
		if !found || !strings.HasSuffix(meta, ";base64") {
			return 0, 0, false
		}
		r = base64.NewDecoder(base64.StdEncoding, strings.NewReader(payload))
	default:
		return 0, 0, false
	}
	cfg, _, err := image.DecodeConfig(io.LimitReader(r, maxImageHeaderBytes))
	if err != nil || cfg.Width <= 0 || cfg.Height <= 0 {
		return 0, 0, false
	}
	return cfg.Width, cfg.Height, true
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// base64Len is how many bytes base64 text decodes to, without decoding it.
func base64Len(s string) int64 {
	return int64(base64.RawStdEncoding.DecodedLen(len(strings.TrimRight(s, "="))))
}
