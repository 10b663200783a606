// Package textsim holds what the services that compare or count text must agree on:
// which characters stand for words by themselves (IsCJK), and the unit-length scaling and
// cosine similarity of vectors.
//
// The text folds that come before a comparison stay with their users: each serves one
// purpose (the cache's key is stored, the verifier's question key groups answers, the
// refusal check's match key skips punctuation) and changing one changes what it matches.
package textsim

import (
	"math"
	"unicode"
)

// IsCJK reports whether r is a Han character, kana or Hangul. Chinese and Japanese do not
// space their words, and Korean attaches its particles to them (오늘은 is 오늘 and 은), so in
// all three one character, or a pair of them, stands in for a word: a match may start or
// end at any such character, word features are character pairs, and a tokenizer counts
// them one by one.
func IsCJK(r rune) bool {
	return r >= 0x1100 && unicode.In(r, unicode.Han, unicode.Hiragana, unicode.Katakana, unicode.Hangul)
}

// Normalize scales v in place to unit length (L2) and reports whether it could: a vector
// that is zero, or whose length is not finite, has no direction and is left as it is.
func Normalize(v []float32) bool {
	var sum float64
	for _, x := range v {
		sum += float64(x) * float64(x)
	}
	if sum == 0 || math.IsNaN(sum) || math.IsInf(sum, 0) {
		return false
	}
	inv := 1 / math.Sqrt(sum)
	for i, x := range v {
		v[i] = float32(float64(x) * inv)
	}
	return true
}

// Cosine returns the cosine similarity of a and b, in [-1, 1]; 0 when either is zero or
// their lengths differ (vectors of two spaces do not compare).
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
	return dot / math.Sqrt(na*nb)
}
