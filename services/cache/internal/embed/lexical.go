package embed

import (
	"context"
	"math"
	"slices"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"

	"github.com/mantle-mesh/mantle/pkg/textsim"
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

// ComputesInPlace reports that Embed only computes, in the calling goroutine, without
// waiting on anything; its context cannot cut it short.
func (*Lexical) ComputesInPlace() bool { return true }

// Dense reports that the embedder's vectors are sparse.
func (*Lexical) Dense() bool { return false }

// Embed returns the sparse unit vector of text: hashed features weighted by the
// logarithm of their count (a word said twice is not twice as important) times a static
// weight. Text with no letters or digits has no vector (vector.ErrZero).
func (*Lexical) Embed(_ context.Context, text string) (vector.Vector, error) {
	return lexicalVector(text)
}

// fnv-1a, 32 bits: the feature hash, computed over the bytes of a feature's spelling
// (a type prefix, NUL, then the text) without building the string.
const (
	fnvOffset = 2166136261
	fnvPrime  = 16777619
)

type fnvHash uint32

func newHash(kind byte) fnvHash {
	h := fnvHash(fnvOffset)
	return h.byte(kind).byte(0)
}

func (h fnvHash) byte(b byte) fnvHash { return (h ^ fnvHash(b)) * fnvPrime }

func (h fnvHash) string(s string) fnvHash {
	for i := 0; i < len(s); i++ {
		h = h.byte(s[i])
	}
	return h
}

func (h fnvHash) rune(r rune) fnvHash {
	var buf [utf8.UTFMax]byte
	n := utf8.EncodeRune(buf[:], r)
	for _, b := range buf[:n] {
		h = h.byte(b)
	}
	return h
}

func (h fnvHash) index() uint32 { return uint32(h) % lexicalBuckets }

// features collects hashed features with their static weights; the same feature may
// appear several times (its count is its term frequency). Each is recorded as its index
// and the order it came in, packed in one integer, so that sorting the integers groups a
// feature's occurrences with the first one first, without a comparison function.
type features struct {
	keys    []uint64  // index<<orderBits | order
	weights []float32 // static weight, by order
}

// orderBits holds the order of a feature below its index, which has 24 bits
// (lexicalBuckets): room for the features of any question that fits in memory.
const orderBits = 40

// The indices fit above the order: this does not compile if lexicalBuckets outgrows them.
const _ = uint(1<<(64-orderBits) - lexicalBuckets)

func (f *features) add(h fnvHash, w float64) {
	f.keys = append(f.keys, uint64(h.index())<<orderBits|uint64(len(f.weights)))
	f.weights = append(f.weights, float32(w))
}

// vector returns one coordinate per index weighted by the logarithm of its count (a word
// said twice is not twice as important) times its static weight, as a unit vector. A
// trigram's static weight depends on the length of its word; the first occurrence's
// counts.
func (f *features) vector() (vector.Vector, error) {
	slices.Sort(f.keys)
	n := 0
	for i := 0; i < len(f.keys); n++ {
		j := i + 1
		for j < len(f.keys) && f.keys[j]>>orderBits == f.keys[i]>>orderBits {
			j++
		}
		i = j
	}
	indices := make([]uint32, 0, n)
	values := make([]float32, 0, n)
	for i := 0; i < len(f.keys); {
		j := i + 1
		for j < len(f.keys) && f.keys[j]>>orderBits == f.keys[i]>>orderBits {
			j++
		}
		first := f.weights[f.keys[i]&(1<<orderBits-1)]
		indices = append(indices, uint32(f.keys[i]>>orderBits))
		values = append(values, float32(float64(first)*countWeight(j-i)))
		i = j
	}
	return vector.NewSortedSparse(indices, values)
}

// countWeight is 1 + ln(count), the factor of a feature said count times.
func countWeight(count int) float64 {
	if count < len(countWeights) {
		return countWeights[count]
	}
	return 1 + math.Log(float64(count))
}

// countWeights are the common counts' factors, computed by the same expression.
var countWeights = func() (w [16]float64) {
	for c := range w {
		w[c] = 1 + math.Log(float64(c))
	}
	return w
}()

// scratch holds the feature buffers between embeddings.
var scratch = sync.Pool{New: func() any { return new(features) }}

// maxPooled bounds the buffers kept for reuse; a huge question's are left to the collector.
const maxPooled = 1 << 14

func lexicalVector(text string) (vector.Vector, error) {
	f := scratch.Get().(*features)
	defer func() {
		if cap(f.keys) <= maxPooled {
			f.keys, f.weights = f.keys[:0], f.weights[:0]
			scratch.Put(f)
		}
	}()
	lexicalFeatures(text, f)
	return f.vector()
}

// lexicalFeatures adds text's features to f.
func lexicalFeatures(text string, f *features) {
	text = strings.ToLower(norm.NFKC.String(text))
	if strings.ContainsRune(text, '’') {
		text = strings.ReplaceAll(text, "’", "'")
	}
	if n := 4 * utf8.RuneCountInString(text); cap(f.keys) < n {
		f.keys = make([]uint64, 0, n)
		f.weights = make([]float32, 0, n)
	}

	// Han: pairs are formed over the content characters, skipping function characters
	// between them, so that a particle does not break a word pair: 退货流程 and 退货的流程
	// share 货流.
	var prevHan rune
	addHan := func(r rune) {
		if stopHan[r] {
			f.add(newHash('u').rune(r), weightHanUnigram*weightStop)
			return
		}
		f.add(newHash('u').rune(r), weightHanUnigram)
		if prevHan != 0 {
			f.add(newHash('b').rune(prevHan).rune(r), weightHanBigram)
		}
		prevHan = r
	}
	// Words: pairs skip function words too.
	prevWord := ""
	addWord := func(word string) {
		if stopWords[word] {
			f.add(newHash('w').string(word), weightWord*weightStop)
			return
		}
		f.add(newHash('w').string(word), weightWord)
		if prevWord != "" {
			f.add(newHash('p').string(prevWord).byte(' ').string(word), weightWordPair)
		}
		prevWord = word
		addTrigrams(f, word)
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
}

// addTrigrams adds the character trigrams of "<word>"; together they weigh
// weightTrigramMass (in L2 norm), however long the word.
func addTrigrams(f *features, word string) {
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
		f.add(newHash('c').rune(rs[j]).rune(rs[j+1]).rune(rs[j+2]), per)
	}
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
