package nearmiss

import (
	_ "embed"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/mantle-mesh/mantle/pkg/textsim"
)

// opposites.txt is the lexicon of opposites (see its header for the format).
//
//go:embed opposites.txt
var oppositesText string

// side names one side of one axis of the lexicon.
type side struct{ axis, side int }

type lexicon struct {
	// english maps a phrase's first word to the phrases starting with it, longest first.
	english map[string][]phrase
	// chinese maps a word's first rune to the words starting with it, longest first.
	chinese map[rune][]phrase
}

type phrase struct {
	words []string // English: the words; Chinese: one element, the word
	runes []rune   // Chinese only
	sides []side
}

var opposites = mustParseOpposites(oppositesText)

func mustParseOpposites(text string) lexicon {
	lx, err := parseOpposites(text)
	if err != nil {
		panic("nearmiss: opposites.txt: " + err.Error()) //nolint:forbidigo // compiled-in data; the tests parse it
	}
	return lx
}

// parseOpposites reads the lexicon. A word on two sides of one axis is an error: it would
// contradict itself.
func parseOpposites(text string) (lexicon, error) {
	en := map[string][]side{}
	zh := map[string][]side{}
	axis := 0
	for n, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		sides := strings.Split(line, "|")
		if len(sides) < 2 {
			return lexicon{}, fmt.Errorf("line %d: want at least two sides separated by |", n+1)
		}
		seen := map[string]int{}
		for si, s := range sides {
			for _, w := range strings.Split(s, ",") {
				w = strings.ToLower(strings.TrimSpace(w))
				if w == "" {
					return lexicon{}, fmt.Errorf("line %d: empty word", n+1)
				}
				forms := []string{w}
				target := en
				if textsim.IsCJK(firstRune(w)) {
					if len([]rune(w)) < 2 {
						return lexicon{}, fmt.Errorf("line %d: %q: Chinese words need two characters", n+1, w)
					}
					target = zh
				} else {
					forms = inflections(w)
				}
				for _, f := range forms {
					if prev, ok := seen[f]; ok && prev != si {
						if f == w {
							return lexicon{}, fmt.Errorf("line %d: %q is on two sides", n+1, w)
						}
						continue // an inflection that spells a word of the other side
					}
					seen[f] = si
					ref := side{axis, si}
					if !slices.Contains(target[f], ref) {
						target[f] = append(target[f], ref)
					}
				}
			}
		}
		axis++
	}
	lx := lexicon{english: map[string][]phrase{}, chinese: map[rune][]phrase{}}
	for w, sides := range en {
		words := strings.Fields(w)
		lx.english[words[0]] = append(lx.english[words[0]], phrase{words: words, sides: sides})
	}
	for w, sides := range zh {
		rs := []rune(w)
		lx.chinese[rs[0]] = append(lx.chinese[rs[0]], phrase{words: []string{w}, runes: rs, sides: sides})
	}
	for _, ps := range lx.english {
		slices.SortFunc(ps, func(a, b phrase) int { return len(b.words) - len(a.words) })
	}
	for _, ps := range lx.chinese {
		slices.SortFunc(ps, func(a, b phrase) int { return len(b.runes) - len(a.runes) })
	}
	return lx, nil
}

// inflections returns an English word with the regular endings it may carry. Short words
// (max, min, up, off) keep only their own spelling: "mining" is not a form of "min".
func inflections(w string) []string {
	if strings.Contains(w, " ") || len(w) < 4 {
		return []string{w}
	}
	out := []string{w, w + "s", w + "es"}
	switch {
	case strings.HasSuffix(w, "e"):
		out = append(out, w+"d", w[:len(w)-1]+"ing")
	case strings.HasSuffix(w, "y"):
		out = append(out, w[:len(w)-1]+"ies", w[:len(w)-1]+"ied", w+"ing", w+"ed")
	default:
		out = append(out, w+"ed", w+"ing")
	}
	return out
}

// oppositeCounts counts, per side of an axis, the lexicon words in a question; where
// phrases overlap the longest wins. first keeps the first word seen of each side, for
// the rejection's detail.
type oppositeCounts struct {
	n     map[side]int
	first map[side]string
}

func (o *oppositeCounts) add(p phrase, surface string) {
	if o.n == nil {
		o.n, o.first = map[side]int{}, map[side]string{}
	}
	for _, s := range p.sides {
		o.n[s]++
		if _, ok := o.first[s]; !ok {
			o.first[s] = surface
		}
	}
}

// countEnglish matches phrases over the lower-cased words of a question, in order.
func (o *oppositeCounts) countEnglish(words []string) {
	for i := 0; i < len(words); {
		matched := 0
		for _, p := range opposites.english[words[i]] {
			if i+len(p.words) <= len(words) && slices.Equal(words[i:i+len(p.words)], p.words) {
				o.add(p, strings.Join(p.words, " "))
				matched = len(p.words)
				break
			}
		}
		i += max(matched, 1)
	}
}

// countChinese matches words inside a run of Chinese text, longest first.
func (o *oppositeCounts) countChinese(rs []rune) {
	for i := 0; i < len(rs); {
		matched := 0
		for _, p := range opposites.chinese[rs[i]] {
			if runesAt(rs, i, p.runes) {
				o.add(p, p.words[0])
				matched = len(p.runes)
				break
			}
		}
		i += max(matched, 1)
	}
}

// compareOpposites reports a side one question uses more and another side of the same
// axis the other question uses more: "minimum" where the other says "maximum". A word
// only one of them has, with nothing opposed to it, is not a contradiction.
func compareOpposites(q, c oppositeCounts) string {
	axes := map[int]bool{}
	for s := range q.n {
		axes[s.axis] = true
	}
	for s := range c.n {
		axes[s.axis] = true
	}
	for _, axis := range slices.Sorted(maps.Keys(axes)) {
		for a := 0; ; a++ {
			sa := side{axis, a}
			if !opposites.hasSide(sa) {
				break
			}
			da := q.n[sa] - c.n[sa]
			if da <= 0 {
				continue
			}
			for b := 0; opposites.hasSide(side{axis, b}); b++ {
				sb := side{axis, b}
				if b != a && q.n[sb]-c.n[sb] < 0 {
					return fmt.Sprintf("%q vs %q", q.first[sa], c.first[sb])
				}
			}
		}
	}
	return ""
}

// sideCounts records how many sides each axis has.
var sideCounts = func() map[int]int {
	out := map[int]int{}
	record := func(ss []side) {
		for _, s := range ss {
			out[s.axis] = max(out[s.axis], s.side+1)
		}
	}
	for _, ps := range opposites.english {
		for _, p := range ps {
			record(p.sides)
		}
	}
	for _, ps := range opposites.chinese {
		for _, p := range ps {
			record(p.sides)
		}
	}
	return out
}()

func (lexicon) hasSide(s side) bool { return s.side < sideCounts[s.axis] }
