package quota

import (
	"math"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Message is one chat turn, as far as token counting is concerned.
type Message struct {
	Role    string
	Content string
	Name    string
}

// Chat framing overhead, as OpenAI documents it for its chat models: every message is
// wrapped in a few special tokens plus its role, and the reply is primed with three
// more. Other families frame messages similarly.
const (
	tokensPerMessage = 4 // <|start|>, role, <|message|>, <|end|>
	tokensPerName    = 1 // a name replaces or follows the role
	tokensPerReply   = 3 // <|start|>assistant<|message|>
)

// estimator approximates a BPE tokenizer without its vocabulary. Reservations are
// settled with real usage, so an estimate only has to be close; where unsure it errs
// high, which delays a request slightly rather than overspending the quota.
//
// Outside CJK scripts it takes the larger of two rules of thumb: about one token per 4
// bytes of text (whitespace included; a non-ASCII letter is 2-3 bytes, so Cyrillic or
// accented text costs more per character, as it does in real vocabularies), and at
// least one token per word and per punctuation mark or symbol (which dominates in code
// and JSON). Each CJK character (Han, kana, Hangul) costs cjkTokens, and that is where
// families differ most: vocabularies trained on Chinese pack a character into well
// under a token, older ones need one or more.
type estimator struct {
	name      string
	cjkTokens float64
}

// Estimators by model family. Counting is not exact yet: every name says "estimate".
var (
	cl100kLike = estimator{name: "estimate/cl100k-like", cjkTokens: 1.0}
	o200kLike  = estimator{name: "estimate/o200k-like", cjkTokens: 0.8}
	zhLike     = estimator{name: "estimate/zh-optimized", cjkTokens: 0.7}
)

// familyPrefixes maps model-name prefixes to estimators; the first match wins, and
// anything unmatched (including Claude and older GPT models) uses cl100kLike.
var familyPrefixes = []struct {
	prefix string
	est    estimator
}{
	{"gpt-4o", o200kLike}, {"gpt-4.1", o200kLike}, {"gpt-5", o200kLike},
	{"o1", o200kLike}, {"o3", o200kLike}, {"o4", o200kLike},
	{"qwen", zhLike}, {"deepseek", zhLike}, {"glm", zhLike}, {"chatglm", zhLike},
	{"yi-", zhLike}, {"baichuan", zhLike}, {"moonshot", zhLike}, {"kimi", zhLike},
	{"ernie", zhLike}, {"hunyuan", zhLike}, {"doubao", zhLike}, {"minimax", zhLike},
}

// estimatorFor picks the estimator of model's family. A provider prefix such as
// "openai/" is ignored.
func estimatorFor(model string) estimator {
	name := strings.ToLower(model)
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	for _, f := range familyPrefixes {
		if strings.HasPrefix(name, f.prefix) {
			return f.est
		}
	}
	return cl100kLike
}

// countText estimates the tokens of plain text.
func (e estimator) countText(s string) int64 {
	var (
		cjk    int64 // CJK characters, priced per family
		bytes  int64 // UTF-8 bytes of everything else
		pieces int64 // words, punctuation marks and symbols: each at least one token
		inWord bool
	)
	for _, r := range s {
		switch {
		case isCJK(r):
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
	return max((bytes+3)/4, pieces) + int64(math.Ceil(float64(cjk)*e.cjkTokens))
}

// countMessages estimates the tokens of a chat prompt, framing included.
func (e estimator) countMessages(msgs []Message) int64 {
	total := int64(tokensPerReply)
	for _, m := range msgs {
		total += tokensPerMessage + e.countText(m.Content)
		if m.Name != "" {
			total += tokensPerName + e.countText(m.Name)
		}
	}
	return total
}

func isCJK(r rune) bool {
	return unicode.In(r, unicode.Han, unicode.Hiragana, unicode.Katakana, unicode.Hangul)
}
