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
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Key is a SHA-256 that names a scope (a partition) or one cached answer within it.
type Key [sha256.Size]byte

func (k Key) String() string { return hex.EncodeToString(k[:]) }

// keyVersion is the first field of every partition. Changing what goes into a key, or how
// text is normalised, must change it, so entries written under the old rules stop matching
// instead of matching the wrong prompts. (v2: the embedder namespace, model family and
// context fingerprint joined the scope, and the key became partition + message.)
const keyVersion = "mantle.cache.key/v2"

// keys are the names of one prompt in the cache.
type keys struct {
	// Partition names everything that must be equal before two prompts are compared at
	// all; it is the filter of every vector search.
	Partition Key
	// Exact names the prompt: the partition and the normalised last user message.
	Exact Key
	// Question is the last user message folded (NFKC, spaces) but with its case and
	// punctuation: what the embedder and the near-miss check read.
	Question string
	// Normalized is the last user message as the exact key sees it.
	Normalized string
}

// deriveKeys names tenant's prompt p under the embedder namespace. p must have passed
// validatePrompt.
//
// Each part of the partition is there for a reason:
//   - tenant: answers never cross tenants; one tenant's cached answer may quote its
//     private data. It comes first so no other field can make two tenants collide.
//   - scenario: the same words mean different jobs in different scenarios (a support bot
//     and an extraction pipeline), and policies and invalidation are per scenario.
//   - embedder namespace: vectors of two embedders (or two versions of one) do not compare;
//     after a change of embedder the cache starts cold instead of matching wrongly.
//   - model family: the caller chose a model (or a family that may share answers, when it
//     says so); another model's answer is not what it asked for.
//   - temperature bucket: a low temperature asks for the stable answer, a high one for
//     variety. Rounding to 0.1 keeps float noise (0.30000000000000004) from splitting
//     entries. Unset is its own bucket: it means the provider's default (often 1.0), not 0.
//   - max_tokens: a smaller limit gets a shorter or truncated answer.
//   - response format (type, schema, required fields): a prose answer cannot serve a JSON
//     request, nor JSON of another shape. Required fields are a set, so they are sorted.
//   - context: the system prompt and earlier turns (with their roles and names), and the
//     caller's fingerprint of tools and other parameters, change the answer to the same
//     last question. They are hashed exactly, not normalised: they usually come from the
//     application's code, and instructions that differ only in case or punctuation may
//     still ask for different things.
//
// The exact key adds the normalised last user message: the question itself, with the
// differences that do not change its meaning (full/half width, case, spacing, surrounding
// punctuation) removed.
func deriveKeys(tenant, namespace string, p Prompt) keys {
	question := foldText(p.Messages[len(p.Messages)-1].Content)
	normalized := trimText(question)
	history := contextHash(p.Messages[:len(p.Messages)-1], p.ContextFingerprint)
	family := p.ModelFamily
	if family == "" {
		family = p.Model
	}

	// Every field is length-prefixed, so no choice of values can shift bytes from one
	// field into the next and collide with another scope. The buffers start on the stack;
	// a long schema or question moves them to the heap.
	var buf [keyBuffer]byte
	b := buf[:0]
	b = appendField(b, keyVersion)
	b = appendField(b, tenant)
	b = appendField(b, p.Scenario)
	b = appendField(b, namespace)
	b = appendField(b, family)
	b = appendField(b, temperatureField(p.Temperature))
	var num [20]byte
	b = appendField(b, strconv.AppendInt(num[:0], int64(p.MaxTokens), 10))
	b = appendField(b, string(p.ResponseFormat.typeOrText()))
	b = appendField(b, p.ResponseFormat.JSONSchema)
	required := p.ResponseFormat.RequiredFields
	if !slices.IsSorted(required) {
		required = slices.Sorted(slices.Values(required))
	}
	b = binary.AppendUvarint(b, uint64(len(required)))
	for _, f := range required {
		b = appendField(b, f)
	}
	b = appendField(b, history[:])
	partition := sha256.Sum256(b)

	var ebuf [keyBuffer]byte
	e := append(ebuf[:0], partition[:]...)
	e = appendField(e, normalized)
	return keys{Partition: partition, Exact: sha256.Sum256(e), Question: question, Normalized: normalized}
}

// keyBuffer is the size of the stack buffers keys are hashed from: a scope without a
// response schema, or a question of a couple of hundred bytes, fits.
const keyBuffer = 256

// contextHash hashes the turns before the last user message and the caller's fingerprint:
// what the question is asked in the context of. The vector search compares last messages
// only, so everything else must be equal, which this hash (part of the partition) ensures.
func contextHash(turns []Message, fingerprint string) [sha256.Size]byte {
	size := 8 + len(fingerprint) + binary.MaxVarintLen64
	for _, m := range turns {
		size += len(m.Role) + len(m.Name) + len(m.Content) + 3*binary.MaxVarintLen64
	}
	var buf [keyBuffer]byte
	b := buf[:0]
	if size > len(buf) {
		b = make([]byte, 0, size)
	}
	b = binary.AppendUvarint(b, uint64(len(turns)))
	for _, m := range turns {
		b = appendField(b, m.Role)
		b = appendField(b, m.Name)
		b = appendField(b, m.Content)
	}
	b = appendField(b, fingerprint)
	return sha256.Sum256(b)
}

func appendField[S string | []byte](b []byte, s S) []byte {
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
func normalizeText(s string) string { return trimText(foldText(s)) }

// foldText applies NFKC and collapses white space, keeping case and punctuation: the form
// in which questions are embedded and compared for near misses (which need "iPhone" and
// quotes).
func foldText(s string) string {
	s = norm.NFKC.String(s)
	if isFolded(s) {
		return s // most questions: no copy
	}
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
	return b.String()
}

// isFolded reports whether foldText's loop would give s back unchanged: no space at either
// end, white space only as single ASCII spaces, and valid UTF-8 (the loop writes each
// invalid byte as U+FFFD).
func isFolded(s string) bool {
	afterSpace := true // a space at the start is dropped
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			switch {
			case c == ' ':
				if afterSpace {
					return false
				}
				afterSpace = true
			case unicode.IsSpace(rune(c)):
				return false
			default:
				afterSpace = false
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && n == 1) || unicode.IsSpace(r) {
			return false
		}
		afterSpace = false
		i += n
	}
	return !afterSpace || s == "" // a space at the end is dropped
}

// trimText lower-cases folded text and removes punctuation and space at either end.
func trimText(folded string) string {
	return strings.TrimFunc(strings.ToLower(folded), func(r rune) bool { return unicode.IsPunct(r) || r == ' ' })
}
