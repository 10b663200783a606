package cache

import (
	"math"
	"math/bits"
	"regexp"
	"regexp/syntax"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Prefilters for the prompt scans. Every user turn is searched for dozens of markers, the
// classifier's trigger words and the personal patterns, and most of them are absent from
// most turns. One pass over a turn records which bytes it holds, how many of each ASCII
// byte, and which pairs of adjacent bytes: a word with a byte pair the turn lacks cannot
// be in it, and a pattern every match of which holds ten digits cannot match a turn with
// five. The filters only rule out; whatever they let through is searched as before, so the
// decisions are the same as without them.

// pairBits is the size of the byte-pair set. Pairs are hashed into it; a collision only
// lets a word through to the real search.
const pairBits = 4096

// textStats is what one pass over a text records. It lives on the caller's stack.
type textStats struct {
	ascii [utf8.RuneSelf]uint32 // occurrences of each ASCII byte
	high  [2]uint64             // bytes 0x80-0xFF present
	pairs [pairBits / 64]uint64 // hashed adjacent byte pairs present
}

// pairBit hashes the pair a, b into [0, pairBits).
func pairBit(a, b byte) uint32 {
	return (uint32(a)<<8 | uint32(b)) * 0x9E3779B1 >> (32 - 12)
}

// reset records text, forgetting what was recorded before.
func (s *textStats) reset(text string) {
	*s = textStats{}
	var prev byte
	for i := 0; i < len(text); i++ {
		c := text[i]
		if c < utf8.RuneSelf {
			s.ascii[c]++
		} else {
			s.high[(c-utf8.RuneSelf)>>6] |= 1 << (c & 63)
		}
		if i > 0 {
			h := pairBit(prev, c)
			s.pairs[h>>6] |= 1 << (h & 63)
		}
		prev = c
	}
}

// needle is a word prepared for the prefilter: up to needlePairs of its byte pairs,
// hashed, spread from its start to its end.
type needle struct {
	word  string
	pairs [needlePairs]uint16
	n     uint8
}

const needlePairs = 4

func newNeedle(word string) needle {
	nd := needle{word: word}
	if len(word) < 2 {
		return nd
	}
	pairs := len(word) - 1 // pair i is word[i], word[i+1]
	nd.n = uint8(min(pairs, needlePairs))
	for j := range int(nd.n) {
		i := j * (pairs - 1) / max(int(nd.n)-1, 1)
		nd.pairs[j] = uint16(pairBit(word[i], word[i+1]))
	}
	return nd
}

func newNeedles(words []string) []needle {
	out := make([]needle, 0, len(words))
	for _, w := range words {
		out = append(out, newNeedle(w))
	}
	return out
}

// mayContain reports whether the text may contain nd's word: false only when it cannot.
// A nil s knows nothing and always says it may.
func (s *textStats) mayContain(nd *needle) bool {
	if s == nil {
		return true
	}
	switch len(nd.word) {
	case 0:
		return true
	case 1:
		return s.has(nd.word[0])
	}
	for _, h := range nd.pairs[:nd.n] {
		if s.pairs[h>>6]&(1<<(h&63)) == 0 {
			return false
		}
	}
	return true
}

func (s *textStats) has(c byte) bool {
	if c < utf8.RuneSelf {
		return s.ascii[c] > 0
	}
	return s.high[(c-utf8.RuneSelf)>>6]&(1<<(c&63)) != 0
}

// asciiSet is a set of ASCII characters, bit c standing for c.
type asciiSet [2]uint64

func (a *asciiSet) add(c rune)       { a[c>>6] |= 1 << (c & 63) }
func (a asciiSet) holds(c rune) bool { return c >= 0 && c < utf8.RuneSelf && a[c>>6]&(1<<(c&63)) != 0 }
func (a asciiSet) size() int         { return bits.OnesCount64(a[0]) + bits.OnesCount64(a[1]) }

// count returns how many characters of a the text holds.
func (s *textStats) count(a asciiSet) int {
	n := 0
	for w, m := range a {
		for ; m != 0; m &= m - 1 {
			n += int(s.ascii[w*64+bits.TrailingZeros64(m)])
		}
	}
	return n
}

// holdsMatched reports whether every rune an instruction for r matches is in a: r itself
// and, when the regular expression folds case, every rune of r's case orbit (k also
// matches K and the Kelvin sign).
func (a asciiSet) holdsMatched(r rune, fold bool) bool {
	if !a.holds(r) {
		return false
	}
	if fold {
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			if !a.holds(f) {
				return false
			}
		}
	}
	return true
}

// need says that every match of a pattern holds at least min characters of set.
type need struct {
	set asciiSet
	min int
}

// maxNeeds bounds the needs kept per expression: the few narrowest sets rule out most
// texts.
const maxNeeds = 4

// filteredRegexp is a regular expression with what every match of it holds, derived from
// its syntax tree: at least so many characters of some sets (countNeeds), and a word of
// each of some lists (wordNeeds). A text that lacks one is not searched.
type filteredRegexp struct {
	re     *regexp.Regexp
	counts []need
	words  [][]needle
}

// compileFiltered compiles expr, which must be valid (validated, or compiled in).
func compileFiltered(expr string) filteredRegexp {
	f := filteredRegexp{re: regexp.MustCompile(expr)}
	// regexp.Compile parses with these flags; the tree is the language it matches.
	if tree, err := syntax.Parse(expr, syntax.Perl); err == nil {
		f.counts = countNeeds(tree)
		// A list with a one-byte word (an ASCII character) is left to the counts, which
		// check it faster. Of the others, those whose shortest word is longest rule out
		// the most texts.
		lists := slices.DeleteFunc(wordNeeds(tree), func(words []string) bool { return shortest(words) < 2 })
		slices.SortStableFunc(lists, func(a, b []string) int { return shortest(b) - shortest(a) })
		for _, words := range lists[:min(len(lists), maxNeeds)] {
			f.words = append(f.words, newNeedles(words))
		}
	}
	return f
}

// matchString reports whether the expression matches text. stats, when not nil, are
// text's: a text they rule out is not searched.
func (f *filteredRegexp) matchString(text string, stats *textStats) bool {
	if stats != nil && !f.mayMatch(text, stats) {
		return false
	}
	return f.re.MatchString(text)
}

func (f *filteredRegexp) mayMatch(text string, stats *textStats) bool {
	for _, n := range f.counts {
		if stats.count(n.set) < n.min {
			return false
		}
	}
	for _, words := range f.words {
		found := false
		for i := range words {
			if w := &words[i]; stats.mayContain(w) && strings.Contains(text, w.word) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// countNeeds derives, from the syntax tree of an expression, sets of ASCII characters
// every match draws some of: the digits, each ASCII literal and each ASCII
// character class of the expression, and how many of each a match holds at least. A
// match is a substring of the text, so a text with fewer cannot match. ASCII characters
// are single bytes in UTF-8 and no other character's encoding contains them, so counting
// bytes counts them.
func countNeeds(tree *syntax.Regexp) []need {
	var digits asciiSet
	for c := '0'; c <= '9'; c++ {
		digits.add(c)
	}
	candidates := []asciiSet{digits}
	collectSets(tree, &candidates)
	var needs []need
	tried := 0
	for i, set := range candidates {
		if slices.Contains(candidates[:i], set) {
			continue
		}
		if tried++; tried > maxCandidates {
			break // a long expression: its first sets will do
		}
		if n := minCount(tree, set); n > 0 {
			needs = append(needs, need{set, n})
		}
	}
	// Narrow sets first: a text lacks an @ far more often than it lacks a letter.
	slices.SortStableFunc(needs, func(a, b need) int { return a.set.size() - b.set.size() })
	return needs[:min(len(needs), maxNeeds)]
}

// maxCandidates bounds the sets countNeeds tries, each a walk of the expression.
const maxCandidates = 64

// collectSets adds the ASCII literals and character classes of re to sets.
func collectSets(re *syntax.Regexp, sets *[]asciiSet) {
	switch re.Op {
	case syntax.OpLiteral:
		for _, r := range re.Rune {
			if r < utf8.RuneSelf {
				var a asciiSet
				a.add(r)
				*sets = append(*sets, a)
			}
		}
	case syntax.OpCharClass:
		var a asciiSet
		for i := 0; i+1 < len(re.Rune); i += 2 {
			if re.Rune[i+1] >= utf8.RuneSelf {
				return
			}
			for r := re.Rune[i]; r <= re.Rune[i+1]; r++ {
				a.add(r)
			}
		}
		if a.size() > 0 {
			*sets = append(*sets, a)
		}
	}
	for _, sub := range re.Sub {
		collectSets(sub, sets)
	}
}

// countCap keeps minCount's sums far from overflow; a count this high rules out as well
// as any higher one.
const countCap = 1 << 20

// minCount returns a lower bound of how many characters of set any string re matches
// holds. Whatever it cannot reason about counts 0, which is always a lower bound.
func minCount(re *syntax.Regexp, set asciiSet) int {
	fold := re.Flags&syntax.FoldCase != 0
	switch re.Op {
	case syntax.OpLiteral:
		n := 0
		for _, r := range re.Rune {
			if set.holdsMatched(r, fold) {
				n++
			}
		}
		return n
	case syntax.OpCharClass:
		if len(re.Rune) == 0 {
			return 0
		}
		for i := 0; i+1 < len(re.Rune); i += 2 {
			if re.Rune[i+1] >= utf8.RuneSelf {
				return 0
			}
			for r := re.Rune[i]; r <= re.Rune[i+1]; r++ {
				if !set.holdsMatched(r, fold) {
					return 0
				}
			}
		}
		return 1
	case syntax.OpCapture, syntax.OpPlus:
		return minCount(re.Sub[0], set)
	case syntax.OpRepeat:
		return min(countCap, max(re.Min, 0)*minCount(re.Sub[0], set))
	case syntax.OpConcat:
		n := 0
		for _, sub := range re.Sub {
			n = min(countCap, n+minCount(sub, set))
		}
		return n
	case syntax.OpAlternate:
		if len(re.Sub) == 0 {
			return 0
		}
		n := countCap
		for _, sub := range re.Sub {
			n = min(n, minCount(sub, set))
		}
		return n
	default:
		// Empty-width assertions, any character, star, quest, empty and no match.
		return 0
	}
}

// Bounds of wordNeeds' lists: the strings an expression part matches exactly are
// enumerated up to maxExact (alternatives multiply along a concatenation); a list of
// words a match holds one of is kept up to maxWords.
const (
	maxExact = 64
	maxWords = 64
)

// literals is what wordNeeds knows of the strings an expression part matches: exactly the
// strings exact (when isExact), or strings that hold a word of each list of all.
type literals struct {
	isExact bool
	exact   []string
	all     [][]string
}

func exactly(words ...string) literals { return literals{isExact: true, exact: words} }

// required returns lists of which every match holds a word: a list that holds the empty
// word rules nothing out and is left out.
func (l literals) required() [][]string {
	if !l.isExact {
		return l.all
	}
	if len(l.exact) == 0 || slices.Contains(l.exact, "") {
		return nil
	}
	return [][]string{l.exact}
}

// wordNeeds derives, from the syntax tree of an expression, lists of words every match
// holds one of (each list, one of its words): "\bmy (?:\w+ ){0,2}?(?:balance|order)\b"
// holds "my " and one of "balance" and "order". A match is a substring of the text, so a
// text without any word of a list cannot match.
func wordNeeds(tree *syntax.Regexp) [][]string {
	return wordInfo(tree).required()
}

func wordInfo(re *syntax.Regexp) literals {
	fold := re.Flags&syntax.FoldCase != 0
	switch re.Op {
	case syntax.OpLiteral:
		if fold {
			return literals{} // other cases match too; not enumerated
		}
		return exactly(string(re.Rune))
	case syntax.OpCharClass:
		if fold {
			return literals{}
		}
		var words []string
		for i := 0; i+1 < len(re.Rune); i += 2 {
			if int(re.Rune[i+1]-re.Rune[i])+len(words) >= maxExact {
				return literals{}
			}
			for r := re.Rune[i]; r <= re.Rune[i+1]; r++ {
				words = append(words, string(r))
			}
		}
		if len(words) == 0 {
			return literals{} // matches nothing
		}
		return exactly(words...)
	case syntax.OpEmptyMatch, syntax.OpBeginLine, syntax.OpEndLine, syntax.OpBeginText, syntax.OpEndText,
		syntax.OpWordBoundary, syntax.OpNoWordBoundary:
		return exactly("")
	case syntax.OpCapture:
		return wordInfo(re.Sub[0])
	case syntax.OpQuest:
		return optional(wordInfo(re.Sub[0]))
	case syntax.OpPlus:
		return literals{all: wordInfo(re.Sub[0]).required()} // x+ holds x
	case syntax.OpRepeat:
		switch {
		case re.Min == 1 && re.Max == 1:
			return wordInfo(re.Sub[0])
		case re.Min >= 1:
			return literals{all: wordInfo(re.Sub[0]).required()}
		case re.Max == 1:
			return optional(wordInfo(re.Sub[0]))
		}
		return literals{}
	case syntax.OpConcat:
		return concatInfo(re.Sub)
	case syntax.OpAlternate:
		return alternateInfo(re.Sub)
	default:
		// Any character, star, no match: nothing required.
		return literals{}
	}
}

// optional is x?: x's strings and the empty one.
func optional(x literals) literals {
	if x.isExact && len(x.exact) < maxExact {
		return exactly(append(slices.Clone(x.exact), "")...)
	}
	return literals{}
}

// concatInfo enumerates runs of exact parts (their strings, concatenated) while they stay
// few, and requires what each run and each other part requires.
func concatInfo(subs []*syntax.Regexp) literals {
	var all [][]string
	run := []string{""}
	exact := true // every part so far is in run
	for _, sub := range subs {
		x := wordInfo(sub)
		if x.isExact && len(run)*len(x.exact) <= maxExact {
			next := make([]string, 0, len(run)*len(x.exact))
			for _, a := range run {
				for _, b := range x.exact {
					next = append(next, a+b)
				}
			}
			run = next
			continue
		}
		exact = false
		all = append(all, exactly(run...).required()...)
		run = []string{""}
		if x.isExact {
			run = x.exact
			continue
		}
		all = append(all, x.all...)
	}
	if exact {
		return exactly(run...)
	}
	return literals{all: append(all, exactly(run...).required()...)}
}

// alternateInfo is the union of exact alternatives, or one list per alternative merged:
// a match of one alternative holds a word of the list chosen for it. An alternative that
// requires nothing makes the whole require nothing.
func alternateInfo(subs []*syntax.Regexp) literals {
	infos := make([]literals, len(subs))
	exact, total := true, 0
	for i, sub := range subs {
		infos[i] = wordInfo(sub)
		exact = exact && infos[i].isExact
		total += len(infos[i].exact)
	}
	if exact && total <= maxExact {
		var words []string
		for _, x := range infos {
			words = append(words, x.exact...)
		}
		return exactly(words...)
	}
	var merged []string
	for _, x := range infos {
		lists := x.required()
		if len(lists) == 0 {
			return literals{}
		}
		// The list whose shortest word is longest rules out the most texts.
		best := slices.MaxFunc(lists, func(a, b []string) int { return shortest(a) - shortest(b) })
		merged = append(merged, best...)
	}
	if len(merged) > maxWords {
		return literals{}
	}
	return literals{all: [][]string{merged}}
}

func shortest(words []string) int {
	n := math.MaxInt
	for _, w := range words {
		n = min(n, len(w))
	}
	return n
}
