package textsim

import (
	"math"
	"testing"
	"unicode"
)

func TestIsCJK(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		r    rune
		want bool
	}{
		{'中', true}, {'の', true}, {'カ', true}, {'한', true}, {'ᄀ', true}, // Han, kana, Hangul syllable and jamo
		{'a', false}, {'É', false}, {'я', false}, {'ก', false}, {'。', false}, {'１', false}, {' ', false},
	} {
		if got := IsCJK(tt.r); got != tt.want {
			t.Errorf("IsCJK(%q) = %t, want %t", tt.r, got, tt.want)
		}
	}
}

// The fast path (nothing below U+1100) must agree with the script tables.
func TestIsCJKFastPath(t *testing.T) {
	t.Parallel()
	for r := rune(0); r < 0x1100; r++ {
		if unicode.In(r, unicode.Han, unicode.Hiragana, unicode.Katakana, unicode.Hangul) {
			t.Fatalf("%U is in the tables but below the fast path's bound", r)
		}
	}
}

func TestNormalize(t *testing.T) {
	t.Parallel()
	v := []float32{3, 4}
	if !Normalize(v) || v[0] != 0.6 || v[1] != 0.8 {
		t.Errorf("Normalize(3, 4) = %v", v)
	}
	for _, v := range [][]float32{nil, {0, 0}, {float32(math.NaN()), 1}, {float32(math.Inf(1))}} {
		before := append([]float32(nil), v...)
		if Normalize(v) {
			t.Errorf("Normalize(%v) reported a direction", before)
		}
	}
}

func TestCosine(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		a, b []float32
		want float64
	}{
		{"same", []float32{1, 2}, []float32{2, 4}, 1},
		{"orthogonal", []float32{1, 0}, []float32{0, 3}, 0},
		{"opposite", []float32{1, 0}, []float32{-1, 0}, -1},
		{"zero", []float32{0, 0}, []float32{1, 0}, 0},
		{"lengths differ", []float32{1}, []float32{1, 0}, 0},
	} {
		if got := Cosine(tt.a, tt.b); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("%s: Cosine = %v, want %v", tt.name, got, tt.want)
		}
	}
}
