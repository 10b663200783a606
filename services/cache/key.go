package cache

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// Key identifies one cached answer: a SHA-256 over everything that decides whether two
// requests may share an answer. Two prompts get the same key exactly when the cache may
// answer one with the other's answer.
type Key [sha256.Size]byte

func (k Key) String() string { return hex.EncodeToString(k[:]) }

// keyVersion is the first field of every key. Changing what goes into a key, or how text
// is normalised, must change it, so entries written under the old rules stop matching
// instead of matching the wrong prompts.
const keyVersion = "mantle.cache.key/v1"

// deriveKey returns the key of tenant's prompt, and the normalised last user message it
// was built from. p must have passed validatePrompt.
//
// Each part is in the key for a reason:
//   - tenant: answers never cross tenants; one tenant's cached answer may quote its
//     private data. It comes first so no other field can make two tenants collide.
//   - scenario: the same words mean different jobs in different scenarios (a support bot
//     and an extraction pipeline), and policies and invalidation are per scenario.
//   - model: the caller chose a model; another model's answer is not what it asked for.
//   - temperature bucket: a low temperature asks for the stable answer, a high one for
//     variety. Rounding to 0.1 keeps float noise (0.30000000000000004) from splitting
//     entries. Unset is its own bucket: it means the provider's default (often 1.0), not 0.
//   - max_tokens: a smaller limit gets a shorter or truncated answer.
//   - response format (type, schema, required fields): a prose answer cannot serve a JSON
//     request, nor JSON of another shape. Required fields are a set, so they are sorted.
//   - context hash: the system prompt and earlier turns (with their roles and names)
//     change the answer to the same last question. They are hashed exactly, not
//     normalised: they usually come from the application's code, and instructions that
//     differ only in case or punctuation may still ask for different things.
//   - the normalised last user message: the question itself, with differences that do not
//     change its meaning (full/half width, case, spacing, surrounding punctuation) removed.
func deriveKey(tenant string, p Prompt) (Key, string) {
	last := normalizeText(p.Messages[len(p.Messages)-1].Content)
	history := contextHash(p.Messages[:len(p.Messages)-1])

	// Every field is length-prefixed, so no choice of values can shift bytes from one
	// field into the next and collide with another scope.
	b := make([]byte, 0, 128+len(p.ResponseFormat.JSONSchema)+len(last))
	b = appendField(b, keyVersion)
	b = appendField(b, tenant)
	b = appendField(b, p.Scenario)
	b = appendField(b, p.Model)
	b = appendField(b, temperatureField(p.Temperature))
	b = appendField(b, strconv.FormatInt(int64(p.MaxTokens), 10))
	b = appendField(b, string(p.ResponseFormat.typeOrText()))
	b = appendField(b, p.ResponseFormat.JSONSchema)
	required := slices.Sorted(slices.Values(p.ResponseFormat.RequiredFields))
	b = binary.AppendUvarint(b, uint64(len(required)))
	for _, f := range required {
		b = appendField(b, f)
	}
	b = appendField(b, string(history[:]))
	b = appendField(b, last)
	return sha256.Sum256(b), last
}

// contextHash hashes the turns before the last user message: what the question is asked in
// the context of. A later vector backend searches on the last message only and uses this
// hash as a filter, which is why it is a hash of its own.
func contextHash(turns []Message) [sha256.Size]byte {
	size := 8
	for _, m := range turns {
		size += len(m.Role) + len(m.Name) + len(m.Content) + 3*binary.MaxVarintLen64
	}
	b := make([]byte, 0, size)
	b = binary.AppendUvarint(b, uint64(len(turns)))
	for _, m := range turns {
		b = appendField(b, m.Role)
		b = appendField(b, m.Name)
		b = appendField(b, m.Content)
	}
	return sha256.Sum256(b)
}

func appendField(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// temperatureBucket rounds a temperature to one decimal, as an integer number of tenths.
func temperatureBucket(t float64) int64 { return int64(math.Round(t * 10)) }

func temperatureField(t *float64) string {
	if t == nil {
		return "unset"
	}
	return strconv.FormatInt(temperatureBucket(*t), 10)
}

// normalizeText removes the differences between two spellings of a question that do not
// change what it asks:
//   - NFKC folds compatibility forms: full-width ＡＢＣ１２３ becomes ABC123, half-width
//     ｶﾅ becomes カナ, full-width ？！， become ?!, and the ideographic space a space;
//   - lower case;
//   - runs of white space become one space;
//   - punctuation (any Unicode punctuation, so also 。？！，、) and space at either end are
//     removed. Punctuation inside the text stays: "1,000" is not "1 000".
func normalizeText(s string) string {
	s = strings.ToLower(norm.NFKC.String(s))
	var b strings.Builder
	b.Grow(len(s))
	pendingSpace := false
	for _, r := range s {
		if unicode.IsSpace(r) {
			pendingSpace = b.Len() > 0
			continue
		}
		if pendingSpace {
			b.WriteByte(' ')
			pendingSpace = false
		}
		b.WriteRune(r)
	}
	return strings.TrimFunc(b.String(), func(r rune) bool { return unicode.IsPunct(r) || r == ' ' })
}
