package formatcheck

import (
	"bytes"
	"math"
	"unicode"
	"unicode/utf8"

	"github.com/mantle-mesh/mantle/pkg/textsim"
	"golang.org/x/text/width"
)

// Where a refusal phrase counts. Lengths are in bytes of the match key (see
// appendMatchKey), so a CJK character weighs three ASCII letters, which is roughly how much
// more each carries.
const (
	// refusalOpeningBytes: a phrase that starts this early (about a dozen English words or
	// twenty Chinese characters) opens the answer, whatever follows. "As an AI language
	// model, ..." followed by three paragraphs is still the pollution the seeds describe.
	refusalOpeningBytes = 64
	// refusalShortAnswerBytes: an answer this short (a few English sentences or about
	// eighty Chinese characters) is a refusal if a phrase appears anywhere in it. In a
	// longer answer a phrase past the opening is quoted or incidental ("if the customer
	// writes 'I'm sorry, but I can't pay'..."), and the answer is real.
	refusalShortAnswerBytes = 256
)

// DefaultRefusalPhrases returns the built-in refusal phrases, English and Chinese. Each
// call returns a new slice.
func DefaultRefusalPhrases() []string {
	return []string{
		"I'm sorry, but I can't",
		"I'm sorry, but I cannot",
		"I am sorry, but I cannot",
		"I'm sorry, I can't",
		"Sorry, but I can't",
		"I cannot help with",
		"I can't help with",
		"I cannot assist with",
		"I can't assist with",
		"I'm unable to help with",
		"I am unable to help with",
		"I'm not able to help with",
		"I cannot comply with",
		"I can't comply with",
		"As an AI language model",
		"As a language model",
		"我无法",
		"抱歉，我不能",
		"抱歉，我无法",
		"很抱歉，我不能",
		"很抱歉，我无法",
		"对不起，我不能",
		"对不起，我无法",
		"我不能帮助",
		"我不能协助",
		"作为一个AI",
		"作为一个人工智能",
		"作为AI语言模型",
		"作为一个语言模型",
	}
}

type refusalPhrase struct {
	text string // as configured, for the finding's message
	key  []byte // match key
}

// refusalMatcher finds configured refusal phrases in the opening of an answer or anywhere
// in a short answer.
type refusalMatcher struct {
	phrases []refusalPhrase
	// scanLimit is how much of an answer's key is needed to decide: enough to know whether
	// the answer is short, and to hold any phrase starting within the opening.
	scanLimit int
}

func newRefusalMatcher(phrases []string) refusalMatcher {
	m := refusalMatcher{scanLimit: refusalShortAnswerBytes}
	for _, text := range phrases {
		key, _ := appendMatchKey(nil, text, math.MaxInt)
		if len(key) == 0 {
			continue // Config.Validate rejects these; skipping keeps New total anyway
		}
		m.phrases = append(m.phrases, refusalPhrase{text: text, key: key})
		m.scanLimit = max(m.scanLimit, refusalOpeningBytes+len(key))
	}
	return m
}

// match returns the first configured phrase that makes content a refusal.
func (m refusalMatcher) match(content string) (string, bool) {
	if len(m.phrases) == 0 {
		return "", false
	}
	var buf [512]byte // stack space for the usual scan limit; append grows it if needed
	key, more := appendMatchKey(buf[:0], content, m.scanLimit)
	short := !more && len(key) <= refusalShortAnswerBytes
	for _, p := range m.phrases {
		if i := indexWord(key, p.key); i >= 0 && (short || i <= refusalOpeningBytes) {
			return p.text, true
		}
	}
	return "", false
}

// indexWord returns the first index of phrase in key where it starts and ends on a word
// boundary, or -1. Without the boundaries "As a language model" would match "This app has a
// language model". CJK text has no spaces, so a CJK character is its own boundary.
func indexWord(key, phrase []byte) int {
	for from := 0; from+len(phrase) <= len(key); {
		i := bytes.Index(key[from:], phrase)
		if i < 0 {
			return -1
		}
		i += from
		first, _ := utf8.DecodeRune(phrase)
		last, _ := utf8.DecodeLastRune(phrase)
		before, _ := utf8.DecodeLastRune(key[:i])
		after, _ := utf8.DecodeRune(key[i+len(phrase):])
		if isBoundary(before, first) && isBoundary(last, after) {
			return i
		}
		_, size := utf8.DecodeRune(key[i:])
		from = i + size
	}
	return -1
}

// isBoundary reports whether a word may end between a and b, two adjacent runes of a match
// key. utf8.RuneError stands for the start or end of the key.
func isBoundary(a, b rune) bool {
	return a == utf8.RuneError || b == utf8.RuneError || a == ' ' || b == ' ' || textsim.IsCJK(a) || textsim.IsCJK(b)
}

// appendMatchKey appends the match key of s to dst: its letters and digits, lower-case, with
// full-width forms folded to their usual width, and one space wherever punctuation or
// spacing separated two words. CJK characters get no separator, since Chinese and Japanese
// do not space words. So "I’m sorry but I can’t" and "I'm sorry, but I can't" share the key
// "i m sorry but i can t", and "抱歉, 我不能" and "抱歉，我不能" share "抱歉我不能". It stops
// once dst holds more than limit bytes and reports whether it stopped early.
func appendMatchKey(dst []byte, s string, limit int) ([]byte, bool) {
	prev := utf8.RuneError // last rune appended; RuneError before the first
	gap := false
	for _, r := range s {
		if r < utf8.RuneSelf {
			switch {
			case 'A' <= r && r <= 'Z':
				r += 'a' - 'A'
			case 'a' <= r && r <= 'z', '0' <= r && r <= '9':
			default:
				gap = true
				continue
			}
		} else {
			if folded := width.LookupRune(r).Folded(); folded != 0 {
				r = folded
			}
			r = unicode.ToLower(r)
			if !unicode.IsLetter(r) && !unicode.IsDigit(r) {
				gap = true // also drops utf8.RuneError from invalid bytes
				continue
			}
		}
		if gap && prev != utf8.RuneError && !textsim.IsCJK(prev) && !textsim.IsCJK(r) {
			dst = append(dst, ' ')
		}
		gap = false
		dst = utf8.AppendRune(dst, r)
		prev = r
		if len(dst) > limit {
			return dst, true
		}
	}
	return dst, false
}
