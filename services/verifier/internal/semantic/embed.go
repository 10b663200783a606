package semantic

import (
	"context"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/mantle-mesh/mantle/pkg/textsim"
	"golang.org/x/text/unicode/norm"
)

// Embedder turns text into a vector. Vectors from one Embedder are comparable with Cosine.
type Embedder interface {
	Embed(ctx context.Context, text string) ([]float32, error)
}

// Lexical embeds text by hashing its features into Dim buckets: lower-cased Latin words and
// digit runs, and for Han, Hiragana and Katakana text every pair of adjacent characters
// (Chinese does not space its words; bigrams approximate them) plus, at half weight, every
// character. The vector is L2-normalised. The hash (FNV-1a) is fixed, so vectors are
// comparable across processes and runs; two features sharing a bucket blur the similarity
// a little, which more buckets make rarer.
type Lexical struct {
	dim int
}

// NewLexical returns a Lexical embedder with dim buckets (512 when dim <= 0).
func NewLexical(dim int) *Lexical {
	if dim <= 0 {
		dim = 512
	}
	return &Lexical{dim: dim}
}

// Embed implements Embedder.
func (l *Lexical) Embed(_ context.Context, text string) ([]float32, error) {
	return l.embedInto(nil, text), nil
}

// embedInto is Embed written over dst, which is reused when it has room: the Scorer
// embeds two or more texts per answer and keeps none of them (History copies).
func (l *Lexical) embedInto(dst []float32, text string) []float32 {
	var v []float32
	if cap(dst) >= l.dim {
		v = dst[:l.dim]
		clear(v)
	} else {
		v = make([]float32, l.dim)
	}
	forEachFeature(norm.NFKC.String(text), func(hash uint64, weight float32) {
		v[hash%uint64(l.dim)] += weight
	})
	textsim.Normalize(v) // text without letters or digits stays the zero vector
	return v
}

// intoEmbedder is an Embedder that can write into a caller's vector (Lexical).
type intoEmbedder interface {
	embedInto(dst []float32, text string) []float32
}

// FNV-1a's 64-bit parameters.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// fnvRune continues the FNV-1a hash h with r's UTF-8 bytes.
func fnvRune(h uint64, r rune) uint64 {
	var b [utf8.UTFMax]byte
	for _, c := range b[:utf8.EncodeRune(b[:], r)] {
		h ^= uint64(c)
		h *= fnvPrime
	}
	return h
}

// forEachFeature calls f with the FNV-1a hash of every feature of s (the hash of the
// feature's UTF-8 text) and its weight (see Lexical). Each feature is hashed as its
// runes are read, so none is built as a string: the verifier embeds every answer.
func forEachFeature(s string, f func(hash uint64, weight float32)) {
	word, inWord := uint64(fnvOffset), false
	flush := func() {
		if inWord {
			f(word, 1)
			word, inWord = fnvOffset, false
		}
	}
	var prev rune = -1 // previous CJK character, -1 when the previous rune was not CJK
	for _, r := range s {
		switch {
		case textsim.IsCJK(r):
			flush()
			f(fnvRune(fnvOffset, r), 0.5)
			if prev >= 0 {
				f(fnvRune(fnvRune(fnvOffset, prev), r), 1)
			}
			prev = r
			continue
		case unicode.IsLetter(r) || unicode.IsDigit(r):
			word, inWord = fnvRune(word, unicode.ToLower(r)), true
		default:
			flush()
		}
		prev = -1
	}
	flush()
}

// Cosine returns the cosine similarity of a and b, 0 when either is zero or their lengths
// differ, clamped to [0, 1] (negative similarity means unrelated for our purposes).
func Cosine(a, b []float32) float64 {
	return min(1, max(0, textsim.Cosine(a, b)))
}

// NormalizeQuestion is the key under which answers to "the same question" are compared:
// NFKC (full and half width alike), lower case, letters and digits only.
func NormalizeQuestion(s string) string {
	s = norm.NFKC.String(s)
	var b strings.Builder
	b.Grow(len(s)) // lower case seldom needs more: one allocation instead of one per doubling
	for _, r := range s {
		if unicode.IsLetter(r) || unicode.IsDigit(r) {
			b.WriteRune(unicode.ToLower(r))
		}
	}
	return b.String()
}
