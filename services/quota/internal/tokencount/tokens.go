package tokencount

import (
	"math"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/tiktoken-go/tokenizer"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/textsim"
)

// Message is one chat turn, as far as token counting is concerned: everything in it that
// the model reads (collectPrompt says how each part is counted).
type Message struct {
	Role    string
	Content string
	Name    string
	// Parts is the content as typed parts: text, images, audio, files.
	Parts []*mantlev1.ContentPart
	// ToolCalls are an assistant turn's calls; ToolCallID is the call a tool turn answers.
	ToolCalls  []*mantlev1.ToolCall
	ToolCallID string
	Refusal    string
}

// family describes how one model family turns text into tokens: exactly, with an
// OpenAI BPE vocabulary (embedded in the binary by tiktoken-go, so nothing is
// downloaded at run time), or by a calibrated estimate.
type family struct {
	name string
	// encoding is the BPE vocabulary; empty for estimated families.
	encoding tokenizer.Encoding
	// latin scales the estimate of text outside CJK scripts (see estimateText).
	latin float64
	// cjk is the tokens per Han, kana or Hangul character. This is where vocabularies
	// differ most (one Chinese legal text is 128 tokens for GPT-4 and 156
	// for a domestic model): vocabularies trained on Chinese pack a character into well
	// under a token, older ones need one or more.
	cjk float64
	// Chat framing: tokens per message (role included), per name, and the reply's
	// priming. OpenAI documents 3 + role + content per message, 1 per name, 3 per reply;
	// ChatML-style templates (<|im_start|>role\n…<|im_end|>\n) cost about 5 per message.
	perMessage, perName, reply int64
	// anthropicImages: images cost by Anthropic's rule rather than OpenAI's.
	anthropicImages bool
}

// Families. The CJK rates of estimated families come from vendors' documentation
// (DeepSeek: about 0.6 tokens per Chinese character; Qwen: about 1.4-1.8 characters per
// token) and from comparing tokenizers on Chinese text: cl100k_base spends about 1.1
// tokens per character on the legal text in tokens_test.go, o200k_base about 0.6, and
// Claude's tokenizer more than cl100k. The latin factor of estimates is 1 except where a
// tokenizer is known to split English finer than cl100k (Claude). Whatever is off, the
// correction learned from reported usage (corrections) pulls back.
var (
	familyO200k    = family{name: "o200k_base", encoding: tokenizer.O200kBase, perMessage: 3, perName: 1, reply: 3}
	familyCL100k   = family{name: "cl100k_base", encoding: tokenizer.Cl100kBase, perMessage: 3, perName: 1, reply: 3}
	familyClaude   = family{name: "estimate/claude", latin: 1.15, cjk: 1.3, perMessage: 5, perName: 1, reply: 3, anthropicImages: true}
	familyDeepSeek = family{name: "estimate/deepseek", latin: 1, cjk: 0.6, perMessage: 5, perName: 1, reply: 3}
	familyZH       = family{name: "estimate/zh-optimized", latin: 1, cjk: 0.7, perMessage: 5, perName: 1, reply: 3}
	familyLlama    = family{name: "estimate/llama", latin: 1, cjk: 1.0, perMessage: 5, perName: 1, reply: 4}
	familyGemini   = family{name: "estimate/gemini", latin: 1, cjk: 0.9, perMessage: 4, perName: 1, reply: 3}
	familyGeneric  = family{name: "estimate/generic", latin: 1, cjk: 1.0, perMessage: 4, perName: 1, reply: 3}
)

// familyPrefixes maps model-name prefixes to families; the first match wins, and
// anything unmatched uses familyGeneric.
var familyPrefixes = []struct {
	prefix string
	fam    family
}{
	{"gpt-4o", familyO200k}, {"gpt-4.1", familyO200k}, {"gpt-4.5", familyO200k}, {"gpt-5", familyO200k},
	{"chatgpt-4o", familyO200k}, {"gpt-oss", familyO200k},
	{"o1", familyO200k}, {"o3", familyO200k}, {"o4", familyO200k},
	{"gpt-4", familyCL100k}, {"gpt-3.5", familyCL100k}, {"gpt-35", familyCL100k},
	{"text-embedding-3", familyCL100k}, {"text-embedding-ada-002", familyCL100k},
	{"claude", familyClaude},
	{"deepseek", familyDeepSeek},
	{"qwen", familyZH}, {"qwq", familyZH}, {"glm", familyZH}, {"chatglm", familyZH},
	{"yi-", familyZH}, {"baichuan", familyZH}, {"moonshot", familyZH}, {"kimi", familyZH},
	{"ernie", familyZH}, {"hunyuan", familyZH}, {"doubao", familyZH}, {"minimax", familyZH},
	{"abab", familyZH}, {"spark", familyZH}, {"step-", familyZH},
	{"llama", familyLlama}, {"meta-llama", familyLlama}, {"mistral", familyLlama}, {"mixtral", familyLlama},
	{"gemini", familyGemini}, {"gemma", familyGemini},
}

// familyFor picks model's family. A provider prefix such as "openai/" is ignored.
func familyFor(model string) family {
	name := NormalizeModel(model)
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	for _, f := range familyPrefixes {
		if strings.HasPrefix(name, f.prefix) {
			return f.fam
		}
	}
	return familyGeneric
}

// NormalizeModel is model as counting and corrections key it.
func NormalizeModel(model string) string { return strings.ToLower(strings.TrimSpace(model)) }

// Counter counts tokens per family and learns corrections from reported usage.
// It is safe for concurrent use.
type Counter struct {
	maxExactBytes int
	codecs        map[tokenizer.Encoding]*lazyCodec
	corrections   *corrections
}

// lazyCodec loads a BPE vocabulary on first use: o200k_base takes about 50 ms and tens
// of megabytes, which a replica that never sees an OpenAI model should not pay.
type lazyCodec struct {
	once  sync.Once
	enc   tokenizer.Encoding
	codec tokenizer.Codec
	err   error
}

func (l *lazyCodec) get() (tokenizer.Codec, error) {
	l.once.Do(func() { l.codec, l.err = tokenizer.Get(l.enc) })
	return l.codec, l.err
}

// NewCounter returns a Counter configured by cfg.
func NewCounter(cfg Config) *Counter {
	return &Counter{
		maxExactBytes: cfg.ExactMaxBytes,
		codecs: map[tokenizer.Encoding]*lazyCodec{
			tokenizer.O200kBase:  {enc: tokenizer.O200kBase},
			tokenizer.Cl100kBase: {enc: tokenizer.Cl100kBase},
		},
		corrections: newCorrections(cfg),
	}
}

// Config configures token counting (quota's TokensConfig says what each field does).
type Config struct {
	ExactMaxBytes        int
	LearnCorrection      bool
	CorrectionMinSamples int
}

// DefaultConfig counts prompts up to 16 KiB exactly and learns corrections after five
// reports.
func DefaultConfig() Config {
	return Config{ExactMaxBytes: 16 << 10, LearnCorrection: true, CorrectionMinSamples: 5}
}

// Learn records that model's prompt, estimated at estimated input tokens, was actual, and
// returns the model's correction factor when it changed (see corrections).
func (t *Counter) Learn(model string, estimated, actual int64) (float64, bool) {
	return t.corrections.learn(model, estimated, actual)
}

// FamilyName names model's tokenizer family (o200k_base, estimate/claude, ...).
func FamilyName(model string) string { return familyFor(model).name }

// Count is the result of counting.
type Count struct {
	// Tokens is the count, with any learned correction applied.
	Tokens    int64
	Tokenizer string
	// Exact is true when the text was counted with the model's vocabulary and every other
	// part (images) by the provider's rule, with nothing estimated.
	Exact bool
	// Correction is the factor applied; 1 when none.
	Correction float64
	// Raw is the count before correction.
	Raw int64
}

// Estimated reports whether the text was estimated, not tokenized: the correction learned
// from reported usage is for such counts.
func (c Count) Estimated() bool { return strings.HasPrefix(c.Tokenizer, "estimate/") }

// Count counts a chat prompt, its messages and the tools it offers (when chat), or plain
// text, for model.
func (t *Counter) Count(model string, msgs []Message, tools []*mantlev1.Tool, text string, chat bool) Count {
	fam := familyFor(model)
	p := prompt{texts: []string{text}, exact: true}
	if chat {
		p = collectPrompt(fam, msgs, tools)
	}
	if fam.encoding != "" && p.bytes() <= t.maxExactBytes {
		if codec, err := t.codecs[fam.encoding].get(); err == nil {
			if n, ok := p.count(exactText(codec), true); ok {
				return Count{Tokens: n, Raw: n, Tokenizer: fam.name, Exact: p.exact, Correction: 1}
			}
		}
		// Unreachable with the embedded vocabularies; an estimate is still an answer.
	}
	est := fam
	if fam.encoding != "" {
		// Too long to count exactly: estimate like the vocabulary would.
		est.latin, est.cjk = 1, 1.1
		if fam.encoding == tokenizer.O200kBase {
			est.cjk = 0.7
		}
	}
	raw, _ := p.count(func(s string) (int64, bool) { return estimateText(est, s), true }, false)
	factor := t.corrections.factor(model)
	name := est.name
	if fam.encoding != "" {
		name = "estimate/" + fam.name
	}
	return Count{Tokens: int64(math.Ceil(float64(raw) * factor)), Raw: raw, Tokenizer: name, Correction: factor}
}

// exactText counts a text with a BPE vocabulary. With the chat framing collectPrompt
// adds, a chat prompt's count is OpenAI's documented formula for its chat models.
func exactText(codec tokenizer.Codec) func(string) (int64, bool) {
	return func(s string) (int64, bool) {
		c, err := codec.Count(s)
		return int64(c), err == nil
	}
}

// estimateText approximates a BPE tokenizer without its vocabulary. Reservations are
// settled with real usage, so an estimate only has to be close; where unsure it errs
// high, which delays a request slightly rather than overspending the quota.
//
// Outside CJK scripts it takes the larger of two rules of thumb, scaled by the family's
// latin factor: about one token per 4 bytes of text (whitespace included; a non-ASCII
// letter is 2-3 bytes, so Cyrillic or accented text costs more per character, as it does
// in real vocabularies), and at least one token per word and per punctuation mark or
// symbol (which dominates in code and JSON). Against cl100k_base this lands within about
// +40% on English prose and code (tokens_test.go measures it). Each CJK character costs
// the family's cjk rate.
func estimateText(f family, s string) int64 {
	var (
		cjk    int64 // CJK characters, priced per family
		bytes  int64 // UTF-8 bytes of everything else
		pieces int64 // words, punctuation marks and symbols: each at least one token
		inWord bool
	)
	for _, r := range s {
		switch {
		case textsim.IsCJK(r):
			cjk++
			inWord = false
			continue
		case unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			if !inWord {
				pieces++
				inWord = true
			}
		case unicode.IsSpace(r):
			inWord = false
		default: // punctuation (CJK punctuation too), symbols, emoji
			pieces++
			inWord = false
		}
		bytes += int64(utf8.RuneLen(r))
	}
	latin := float64(max((bytes+3)/4, pieces)) * f.latin
	return int64(math.Ceil(latin)) + int64(math.Ceil(float64(cjk)*f.cjk))
}

// corrections learns, per model, how far estimates are from the input tokens providers
// report, and scales later estimates by it. Exact counts are never corrected: they
// differ from reports only by what the prompt does not show (tools, images).
//
// The factor is an exponentially weighted mean of actual/estimate (weight 0.1 for the
// newest report), applied once a model has CorrectionMinSamples reports, bounded to
// [0.5, 2] so that a few absurd reports cannot halve or multiply quotas. It is learned
// per replica and starts at 1 after a restart.
type corrections struct {
	enabled    bool
	minSamples int
	mu         sync.Mutex
	models     map[string]*correction
}

type correction struct {
	factor  float64
	samples int
}

const (
	correctionWeight  = 0.1
	minCorrection     = 0.5
	maxCorrection     = 2.0
	maxCorrectedModel = 1024 // bounds memory against arbitrary model names
	// minCorrectionSample: below this many tokens the fixed framing dominates and the
	// ratio says little about the text.
	minCorrectionSample = 16
)

func newCorrections(cfg Config) *corrections {
	return &corrections{enabled: cfg.LearnCorrection, minSamples: cfg.CorrectionMinSamples, models: make(map[string]*correction)}
}

// factor returns the correction for model's estimates.
func (c *corrections) factor(model string) float64 {
	if !c.enabled {
		return 1
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if k, ok := c.models[NormalizeModel(model)]; ok && k.samples >= c.minSamples {
		return k.factor
	}
	return 1
}

// learn records that an estimate of estimated input tokens was actual.
func (c *corrections) learn(model string, estimated, actual int64) (float64, bool) {
	if !c.enabled || estimated < minCorrectionSample || actual <= 0 {
		return 0, false
	}
	ratio := min(max(float64(actual)/float64(estimated), minCorrection/2), maxCorrection*2)
	key := NormalizeModel(model)
	c.mu.Lock()
	defer c.mu.Unlock()
	k, ok := c.models[key]
	if !ok {
		if len(c.models) >= maxCorrectedModel {
			return 0, false
		}
		k = &correction{factor: ratio}
		c.models[key] = k
	} else {
		k.factor += correctionWeight * (ratio - k.factor)
	}
	k.samples++
	k.factor = min(max(k.factor, minCorrection), maxCorrection)
	return k.factor, true
}
