package semantic

import (
	"context"
	"hash/fnv"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/mantle-mesh/mantle/pkg/textsim"
	"golang.org/x/text/unicode/norm"
	"pgregory.net/rapid"
)

// referenceEmbed is Lexical.Embed as first written: every feature built as a string and
// hashed with hash/fnv. Vectors must not change (the hash is part of what makes them
// comparable across processes), so the streaming forEachFeature is held to it.
func referenceEmbed(dim int, text string) []float32 {
	v := make([]float32, dim)
	add := func(feature string, weight float32) {
		h := fnv.New64a()
		h.Write([]byte(feature))
		v[h.Sum64()%uint64(dim)] += weight
	}
	var word strings.Builder
	flush := func() {
		if word.Len() > 0 {
			add(word.String(), 1)
			word.Reset()
		}
	}
	var prev rune = -1
	for _, r := range norm.NFKC.String(text) {
		switch {
		case textsim.IsCJK(r):
			flush()
			add(string(r), 0.5)
			if prev >= 0 {
				add(string([]rune{prev, r}), 1)
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
	textsim.Normalize(v)
	return v
}

func TestLexicalMatchesReference(t *testing.T) {
	t.Parallel()
	e := NewLexical(0)
	check := func(t interface{ Fatalf(string, ...any) }, text string) {
		got, err := e.Embed(context.Background(), text)
		if err != nil {
			t.Fatalf("Embed(%q): %v", text, err)
		}
		if want := referenceEmbed(e.dim, text); !slices.Equal(got, want) {
			t.Fatalf("Embed(%q) differs from the reference", text)
		}
	}
	for _, text := range []string{
		"", "Hello, World! 42 times", "ÄRGER über Öl", "退货流程需要几天？请在七天内申请",
		"mixed 中文 and English 混合", "カタカナとひらがな", "한국어 문장입니다", "ﬁne ligature", "bad \xff\xfe utf8 中\xff文",
	} {
		check(t, text)
	}
	rapid.Check(t, func(t *rapid.T) {
		check(t, rapid.String().Draw(t, "text"))
	})
}

func BenchmarkLexicalEmbed(b *testing.B) {
	e := NewLexical(0)
	text := "Your parcel to Lisbon usually takes three to five working days. 包裹通常需要三到五个工作日。"
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.Embed(context.Background(), text); err != nil {
			b.Fatal(err)
		}
	}
}
