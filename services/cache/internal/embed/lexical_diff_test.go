package embed

import (
	"cmp"
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
	"pgregory.net/rapid"

	"github.com/mantle-mesh/mantle/pkg/textsim"
	"github.com/mantle-mesh/mantle/services/cache/internal/vector"
)

// The lexical embedder's vectors must not change within LexicalNamespace: stored entries
// were embedded by earlier builds. The reference below is the embedder as it was first
// written (a stable sort of the features, then vector.NewSparse); the tests hold the
// embedder to it bit for bit.

func referenceEmbed(text string) (vector.Vector, error) {
	return vector.NewSparse(refLexicalFeatures(text))
}

// sameVector reports whether a and b have the same coordinates, bit for bit.
func sameVector(a, b vector.Vector) bool {
	return slices.Equal(a.Indices, b.Indices) && slices.EqualFunc(a.Values, b.Values, func(x, y float32) bool {
		return math.Float32bits(x) == math.Float32bits(y)
	})
}

func checkSameAsReference(t interface {
	Helper()
	Fatalf(string, ...any)
}, text string) {
	t.Helper()
	got, gotErr := NewLexical().Embed(context.Background(), text)
	want, wantErr := referenceEmbed(text)
	if !errors.Is(gotErr, wantErr) || (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("Embed(%q) error = %v, reference %v", text, gotErr, wantErr)
	}
	if !sameVector(got, want) {
		t.Fatalf("Embed(%q) = %v, reference %v", text, got, want)
	}
}

func TestLexicalMatchesReference(t *testing.T) {
	t.Parallel()
	texts := []string{
		"", " ", "?!", "a", "日", "How do I reset my password?", "how how how how how how how how how how how how how how how how how how",
		"the the the the", "x x x x x x x x x x x x x x x x x x x x x", "它们在这里吗", "请问退货的流程是什么？", "华为手机 A123怎么退货",
		"iPhone 15 Pro Max 退货", "ＦＵＬＬ ｗｉｄｔｈ １２３", "don’t can’t won't", "résumé café naïve", "привет мир как дела",
		"カタカナとひらがな", "x1 y2 z3 a-b-c", "\xff\xfe invalid \xc3", string([]byte{0xff, 'a', 0xc3, ' ', 'b'}),
		strings.Repeat("supercalifragilisticexpialidocious", 4), strings.Repeat("word ", 3000), strings.Repeat("退货", 2000),
		"Benchmark request 123456: how long does a parcel to Lisbon take?",
	}
	for _, text := range texts {
		checkSameAsReference(t, text)
	}
}

// TestCountWeights holds the table of common counts to the expression it stands for.
func TestCountWeights(t *testing.T) {
	t.Parallel()
	for c := 1; c < 40; c++ {
		if got, want := countWeight(c), 1+math.Log(float64(c)); math.Float64bits(got) != math.Float64bits(want) {
			t.Errorf("countWeight(%d) = %v, want %v", c, got, want)
		}
	}
}

// lexicalPieces are the material of random texts: words that repeat (counts above one,
// shared trigrams), stop words, Han characters and function characters, apostrophes,
// separators, widths, cases, marks and broken UTF-8.
var lexicalPieces = []string{
	"reset", "resetting", "password", "the", "my", "how", "usually", "shipping", "a", "I", "don't", "it’s", "x",
	"Ａ", "ＡＢＣ", "１２３", "123", "4", "é", "e\u0301", "ß", "İ", "Σ", "ﬁ", "K",
	"退", "货", "的", "了", "吗", "手机", "华为", "怎么", "请问", "カ", "ｶ", "한", "국",
	" ", "  ", "\t", "\n", "-", "'", "’", ",", ".", "?", "。", "？", "!", ":", "/",
	"\xff", "\xc3", "\u200b", "\u3000", "\U0001F600",
}

func TestLexicalMatchesReferenceProperty(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		pieces := rapid.SliceOfN(rapid.OneOf(rapid.SampledFrom(lexicalPieces), rapid.String()), 0, 40).Draw(t, "pieces")
		checkSameAsReference(t, strings.Join(pieces, ""))
	})
}

func FuzzLexicalMatchesReference(f *testing.F) {
	for _, p := range lexicalPieces {
		f.Add(p + " " + p + "s reset " + p)
	}
	f.Fuzz(func(t *testing.T, text string) {
		checkSameAsReference(t, text)
	})
}

// refFeatureList collects features with their static weights; the same feature may appear
// several times (its count is its term frequency).
type refFeatureList []vector.Feature

func (l *refFeatureList) add(h fnvHash, w float64) {
	*l = append(*l, vector.Feature{Index: h.index(), Weight: float32(w)})
}

// weighted turns the list into one feature per index weighted by the logarithm of its
// count (a word said twice is not twice as important) times its static weight. A trigram's
// static weight depends on the length of its word; the first occurrence's counts, which
// the stable sort keeps first.
func (l refFeatureList) weighted() []vector.Feature {
	slices.SortStableFunc(l, func(a, b vector.Feature) int { return cmp.Compare(a.Index, b.Index) })
	out := l[:0]
	for i := 0; i < len(l); {
		j := i + 1
		for j < len(l) && l[j].Index == l[i].Index {
			j++
		}
		out = append(out, vector.Feature{Index: l[i].Index, Weight: float32(float64(l[i].Weight) * (1 + math.Log(float64(j-i))))})
		i = j
	}
	return out
}

func refLexicalFeatures(text string) []vector.Feature {
	text = strings.ToLower(norm.NFKC.String(text))
	if strings.ContainsRune(text, '’') {
		text = strings.ReplaceAll(text, "’", "'")
	}
	features := make(refFeatureList, 0, 4*utf8.RuneCountInString(text))

	// Han: pairs are formed over the content characters, skipping function characters
	// between them, so that a particle does not break a word pair: 退货流程 and 退货的流程
	// share 货流.
	var prevHan rune
	addHan := func(r rune) {
		if stopHan[r] {
			features.add(newHash('u').rune(r), weightHanUnigram*weightStop)
			return
		}
		features.add(newHash('u').rune(r), weightHanUnigram)
		if prevHan != 0 {
			features.add(newHash('b').rune(prevHan).rune(r), weightHanBigram)
		}
		prevHan = r
	}
	// Words: pairs skip function words too.
	prevWord := ""
	addWord := func(word string) {
		if stopWords[word] {
			features.add(newHash('w').string(word), weightWord*weightStop)
			return
		}
		features.add(newHash('w').string(word), weightWord)
		if prevWord != "" {
			features.add(newHash('p').string(prevWord).byte(' ').string(word), weightWordPair)
		}
		prevWord = word
		refAddTrigrams(&features, word)
	}

	for i := 0; i < len(text); {
		r, size := utf8.DecodeRuneInString(text[i:])
		switch {
		case textsim.IsCJK(r):
			prevWord = ""
			addHan(r)
			i += size
		case unicode.IsLetter(r) || unicode.IsDigit(r):
			prevHan = 0
			j := i + size
			for j < len(text) {
				c, n := utf8.DecodeRuneInString(text[j:])
				if (unicode.IsLetter(c) || unicode.IsDigit(c) || unicode.IsMark(c)) && !textsim.IsCJK(c) {
					j += n
					continue
				}
				// An inner apostrophe belongs to the word: don't, it's.
				if c == '\'' && j+n < len(text) {
					if d, _ := utf8.DecodeRuneInString(text[j+n:]); unicode.IsLetter(d) && !textsim.IsCJK(d) {
						j += n
						continue
					}
				}
				break
			}
			addWord(text[i:j])
			i = j
		default:
			// Spaces and hyphens separate the words of one sequence (word pairs span
			// them); other punctuation ends the sequence.
			prevHan = 0
			if !(r == '-' || unicode.IsSpace(r)) {
				prevWord = ""
			}
			i += size
		}
	}
	return features.weighted()
}

// refAddTrigrams adds the character trigrams of "<word>"; together they weigh
// weightTrigramMass (in L2 norm), however long the word.
func refAddTrigrams(features *refFeatureList, word string) {
	var buf [64]rune
	rs := append(buf[:0], '<')
	for _, r := range word {
		rs = append(rs, r)
	}
	rs = append(rs, '>')
	n := len(rs) - 2
	if n < 2 {
		return
	}
	per := weightTrigramMass / math.Sqrt(float64(n))
	for j := 0; j+3 <= len(rs); j++ {
		features.add(newHash('c').rune(rs[j]).rune(rs[j+1]).rune(rs[j+2]), per)
	}
}
