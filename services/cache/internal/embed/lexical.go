package embed

import (
	"context"
	"hash/fnv"
	"math"
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"

	"github.com/mantle-mesh/mantle/services/cache/internal/vector"
)

// LexicalNamespace names the lexical embedder's vector space. Any change to the features,
// weights or hashing below must change it: vectors from two versions do not compare, and
// the namespace is what keeps them apart (in the cache's scope, and as the Qdrant
// collection).
const LexicalNamespace = "lexical-v1"

// lexicalBuckets is the size of the hashed feature space. Feature hashing needs no
// vocabulary; with 2^24 buckets two features of one question practically never collide,
// and because vectors are stored sparse the size costs nothing.
const lexicalBuckets = 1 << 24

// Feature weights. A Chinese word is usually two characters, so character bigrams carry
// most of the meaning and single characters back them up; Latin-script text gets whole
// words, ordered word pairs, and character trigrams that let "reset" meet "resetting".
const (
	weightHanUnigram  = 0.5
	weightHanBigram   = 1.0
	weightWord        = 1.0
	weightWordPair    = 0.6
	weightTrigramMass = 0.6 // the trigrams of one word share this much weight (in L2 norm)
	// Function words and characters (the, my, 的, 吗) and question words (how, 怎么) say
	// little about what is asked; they keep this fraction of their weight. This static list
	// stands in for the inverse document frequency a corpus would give.
	weightStop = 0.25
)

// Lexical is the built-in offline embedder: no model, no network, a few microseconds per
// question. It compares the characters and words two questions share (see the package
// documentation for what that can and cannot match). It is safe for concurrent use.
type Lexical struct{}

// NewLexical returns the lexical embedder.
func NewLexical() *Lexical { return &Lexical{} }

// Namespace implements the cache's Embedder.
func (*Lexical) Namespace() string { return LexicalNamespace }

// Dense reports that the embedder's vectors are sparse.
func (*Lexical) Dense() bool { return false }

// Embed returns the sparse unit vector of text: hashed features weighted by the
// logarithm of their count (a word said twice is not twice as important) times a static
// weight. Text with no letters or digits has no vector (vector.ErrZero).
func (*Lexical) Embed(_ context.Context, text string) (vector.Vector, error) {
	return vector.NewSparse(lexicalFeatures(text))
}

type featureAcc struct {
	weight float64
	count  int
}

func lexicalFeatures(text string) []vector.Feature {
	text = strings.ToLower(norm.NFKC.String(text))
	acc := make(map[string]*featureAcc, 64)
	add := func(f string, w float64) {
		a := acc[f]
		if a == nil {
			a = &featureAcc{weight: w}
			acc[f] = a
		}
		a.count++
	}

	var han []rune
	var words []string
	flushHan := func() {
		// Pairs are formed over the content characters, skipping function characters
		// between them, so that a particle does not break a word pair: 退货流程 and
		// 退货的流程 share 货流.
		var prev rune
		for _, r := range han {
			if stopHan[r] {
				add("u\x00"+string(r), weightHanUnigram*weightStop)
				continue
			}
			add("u\x00"+string(r), weightHanUnigram)
			if prev != 0 {
				add("b\x00"+string([]rune{prev, r}), weightHanBigram)
			}
			prev = r
		}
		han = han[:0]
	}
	flushWords := func() {
		prev := "" // the previous content word: pairs skip function words
		for _, word := range words {
			if stopWords[word] {
				add("w\x00"+word, weightWord*weightStop)
				continue
			}
			add("w\x00"+word, weightWord)
			if prev != "" {
				add("p\x00"+prev+" "+word, weightWordPair)
			}
			prev = word
			rs := []rune("<" + word + ">")
			if n := len(rs) - 2; n >= 2 {
				per := weightTrigramMass / math.Sqrt(float64(n))
				for j := 0; j+3 <= len(rs); j++ {
					add("c\x00"+string(rs[j:j+3]), per)
				}
			}
		}
		words = words[:0]
	}

	rs := []rune(text)
	for i := 0; i < len(rs); {
		r := rs[i]
		switch {
		case isHan(r):
			if len(words) > 0 {
				flushWords()
			}
			han = append(han, r)
			i++
		case unicode.IsLetter(r) || unicode.IsDigit(r):
			if len(han) > 0 {
				flushHan()
			}
			j := i + 1
			for j < len(rs) {
				c := rs[j]
				if (unicode.IsLetter(c) || unicode.IsDigit(c) || unicode.IsMark(c)) && !isHan(c) {
					j++
					continue
				}
				// An inner apostrophe belongs to the word: don't, it's.
				if (c == '\'' || c == '’') && j+1 < len(rs) && unicode.IsLetter(rs[j+1]) && !isHan(rs[j+1]) {
					j += 2
					continue
				}
				break
			}
			words = append(words, strings.ReplaceAll(string(rs[i:j]), "’", "'"))
			i = j
		default:
			// Spaces and hyphens separate the words of one sequence (word pairs span
			// them); other punctuation ends the sequence.
			if len(han) > 0 {
				flushHan()
			}
			if !(r == '-' || unicode.IsSpace(r)) && len(words) > 0 {
				flushWords()
			}
			i++
		}
	}
	flushHan()
	flushWords()

	features := make([]vector.Feature, 0, len(acc))
	for f, a := range acc {
		features = append(features, vector.Feature{
			Index:  hashFeature(f),
			Weight: float32(a.weight * (1 + math.Log(float64(a.count)))),
		})
	}
	return features
}

func hashFeature(f string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(f)) // a hash.Hash never fails to write
	return h.Sum32() % lexicalBuckets
}

// isHan reports whether r belongs to a script written without spaces, where characters
// and their pairs stand in for words.
func isHan(r rune) bool {
	return unicode.In(r, unicode.Han, unicode.Hiragana, unicode.Katakana, unicode.Hangul)
}

// stopHan are function characters (and 请问, please-may-I-ask). Characters that also start
// common content words (会员, 有效, 个人) are left out.
var stopHan = runeSet("的了吗呢吧啊呀么是我你他她它们这那在和与及就都也还请问怎如何样什啥哪些")

var stopWords = wordSet(`a an the is are was were be been being am do does did i me my mine you your we
our us it its to of in on at for with by from and or can could would should will shall may might
please hi hello there this that these those have has had any some about as so just also if then
than into onto how what whats what's why when where which who whom way get got let let's there's
it's i'm`)

func runeSet(s string) map[rune]bool {
	m := map[rune]bool{}
	for _, r := range s {
		m[r] = true
	}
	return m
}

func wordSet(s string) map[string]bool {
	m := map[string]bool{}
	for _, w := range strings.Fields(s) {
		m[w] = true
	}
	return m
}
