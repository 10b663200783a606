package semantic

import (
	"context"
	"math"
	"strings"
	"unicode"

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
	v := make([]float32, l.dim)
	forEachFeature(norm.NFKC.String(text), func(feature string, weight float32) {
		v[fnv1a(feature)%uint64(l.dim)] += weight
	})
	normalise(v)
	return v, nil
}

func fnv1a(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// forEachFeature calls f for every feature of s and its weight (see Lexical).
func forEachFeature(s string, f func(string, float32)) {
	var word strings.Builder
	flush := func() {
		if word.Len() > 0 {
			f(word.String(), 1)
			word.Reset()
		}
	}
	var prev rune = -1 // previous CJK character, -1 when the previous rune was not CJK
	for _, r := range s {
		switch {
		case isCJK(r):
			flush()
			f(string(r), 0.5)
			if prev >= 0 {
				f(string([]rune{prev, r}), 1)
			}
			prev = r
			continue
		case unicode.IsLetter(r) || unicode.IsDigit(r):
			word.WriteRune(unicode.ToLower(r))
		default:
			flush()
		}
		prev = -1
	}
	flush()
}

func isCJK(r rune) bool {
	return r >= 0x2E80 && (unicode.Is(unicode.Han, r) || unicode.Is(unicode.Hiragana, r) || unicode.Is(unicode.Katakana, r))
}

func normalise(v []float32) {
	var sum float64
	for _, x := range v {
		sum += float64(x) * float64(x)
	}
	if sum == 0 {
		return
	}
	inv := float32(1 / math.Sqrt(sum))
	for i := range v {
		v[i] *= inv
	}
}

// Cosine returns the cosine similarity of a and b, 0 when either is zero or their lengths
// differ, clamped to [0, 1] (negative similarity means unrelated for our purposes).
func Cosine(a, b []float32) float64 {
	if len(a) != len(b) {
		return 0
	}
	var dot, na, nb float64
	for i := range a {
		dot += float64(a[i]) * float64(b[i])
		na += float64(a[i]) * float64(a[i])
		nb += float64(b[i]) * float64(b[i])
	}
	if na == 0 || nb == 0 {
		return 0
	}
	return min(1, max(0, dot/math.Sqrt(na*nb)))
}

// NormalizeQuestion is the key under which answers to "the same question" are compared:
// NFKC (full and half width alike), lower case, letters and digits only.
func NormalizeQuestion(s string) string {
	var b strings.Builder
	for _, r := range norm.NFKC.String(s) {
		if unicode.IsLetter(r) || unicode.IsDigit(r) {
			b.WriteRune(unicode.ToLower(r))
		}
	}
	return b.String()
}
