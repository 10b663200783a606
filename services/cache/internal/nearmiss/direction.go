package nearmiss

import (
	"fmt"
	"slices"
	"strings"
	"unicode"

	"github.com/mantle-mesh/mantle/pkg/textsim"
)

// Directions and roles: "from my savings to my checking" and "from my checking to my
// savings" share every word; USD→CNY and CNY→USD every symbol; 苹果比香蕉贵吗 and
// 香蕉比苹果贵吗 every character. What differs is which thing is the source and which the
// target, so a question's directed pairs are compared, and so is the order of its units.

// pair is a direction from a to b, canonical (units by their code), with the spelling
// that was read, to look for in the other question.
type pair struct {
	a, b   string
	sa, sb string
}

func (p pair) String() string { return p.a + "→" + p.b }

// determiners are skipped when looking for the thing after "from" or "to".
var determiners = map[string]bool{
	"my": true, "your": true, "our": true, "their": true, "his": true, "her": true, "its": true,
	"the": true, "a": true, "an": true, "this": true, "that": true, "these": true, "those": true,
	"some": true, "all": true, "one": true,
}

var towards = map[string]bool{"to": true, "into": true, "onto": true, "toward": true, "towards": true}

// englishPairs reads "from A to B", "to B from A", "A to B" between two units, and
// "than B" (a comparison's standard) from the words of a question, in order.
func englishPairs(words []string) []pair {
	var out []pair
	content := func(from, limit int) (int, string) {
		for k := from; k < len(words) && k < limit; k++ {
			if !determiners[words[k]] && !towards[words[k]] && words[k] != "from" {
				return k, words[k]
			}
		}
		return -1, ""
	}
	for i, w := range words {
		switch {
		case w == "from":
			_, a := content(i+1, i+4)
			if a == "" {
				continue
			}
			for j := i + 1; j < len(words) && j <= i+6; j++ {
				if towards[words[j]] {
					if _, b := content(j+1, j+4); b != "" {
						out = append(out, newPair(a, b))
					}
					break
				}
			}
			// "to B from A"
			for j := i - 1; j >= 0 && j >= i-4; j-- {
				if towards[words[j]] {
					if _, b := content(j+1, i); b != "" {
						out = append(out, newPair(a, b))
					}
					break
				}
			}
		case (towards[w] || w == "in") && i > 0 && i+1 < len(words):
			ua, okA := unitWords[words[i-1]]
			_, b := content(i+1, i+3)
			ub, okB := unitWords[b]
			if okA && okB && ua != ub {
				out = append(out, pair{a: ua, b: ub, sa: words[i-1], sb: b})
			}
		case w == "than":
			if _, b := content(i+1, i+4); b != "" {
				out = append(out, pair{a: "than", b: b, sa: "than", sb: b})
			}
		}
	}
	return out
}

func newPair(a, b string) pair {
	p := pair{a: a, b: b, sa: a, sb: b}
	if u, ok := unitWords[a]; ok {
		p.a = u
	}
	if u, ok := unitWords[b]; ok {
		p.b = u
	}
	return p
}

// Chinese markers of a direction. 到, 至 and 往 are everywhere (收到, 到账, 以往), so they
// count only after 从; the others say a direction on their own.
var (
	notFrom      = runesOf([]string{"从来", "从不", "从没", "从事", "从而", "自从", "服从", "从前", "从容", "从小", "从头", "从未", "从此", "从中", "随从"})
	afterFrom    = runesOf([]string{"转到", "转入", "转至", "转给", "转去", "转往", "转成", "转为", "换成", "换为", "改成", "改为", "变成", "变为", "调到", "搬到", "寄到", "发到", "飞往", "开往", "到", "至", "往", "去"})
	directional  = runesOf([]string{"兑换成", "换算成", "兑换", "兑成", "换多少", "兑多少", "等于多少", "折合", "转到", "转入", "转至", "转给", "换成", "兑"})
	notCompare   = runesOf([]string{"比较", "比如", "比特", "比赛", "对比", "相比", "比例", "比率", "无比", "评比", "比分", "比方", "好比", "比起", "类比", "攀比", "比重", "比对", "比拼"})
	leadingOwner = runesOf([]string{"我的", "你的", "您的", "他的", "她的", "我", "你", "您"})
	trailingVerb = runesOf([]string{"转账", "转钱", "汇款", "转", "汇", "寄", "发", "飞", "开", "调", "搬", "换", "改", "变", "走", "把", "钱"})
)

// chineseDirectionRunes are the runes every Chinese direction word contains one of.
const chineseDirectionRunes = "从比兑换转等折"

// stopRunes end the thing named on either side of a direction word.
const stopRunes = "的要需吗怎多了可能是呢吧啊么几该会还更最很太去有没用在和跟与及或"

// comparative runes end the thing after 比: 苹果比香蕉贵.
const comparativeRunes = "贵便宜好快慢高低大小强差长短早晚重轻新老多少热冷远近"

// chinesePairs reads 从A到B, A兑B, A换成B, A转到B and A比B.
func chinesePairs(rs []rune) []pair {
	var out []pair
	for i := 0; i < len(rs); i++ {
		switch {
		case rs[i] == '从' && !inAnyWord(rs, i, notFrom):
			for j := i + 1; j < len(rs) && j <= i+12; j++ {
				w := matchAny(rs, j, afterFrom)
				if w == nil {
					continue
				}
				a := trimSegment(rs[i+1 : j])
				b := forward(rs, j+len(w), stopRunes)
				if a != "" && b != "" {
					out = append(out, chinesePair(a, b))
				}
				i = j + len(w) - 1
				break
			}
		case rs[i] == '比' && !inAnyWord(rs, i, notCompare):
			a := backward(rs, i)
			b := forward(rs, i+1, stopRunes+comparativeRunes)
			if a != "" && b != "" {
				out = append(out, chinesePair(a, b))
			}
		default:
			if w := matchAny(rs, i, directional); w != nil && !precededByFrom(rs, i) {
				a := backward(rs, i)
				b := forward(rs, i+len(w), stopRunes)
				if a != "" && b != "" {
					out = append(out, chinesePair(a, b))
				}
				i += len(w) - 1
			}
		}
	}
	return out
}

// precededByFrom reports a 从 shortly before i, whose pair the 从 case has already read.
func precededByFrom(rs []rune, i int) bool {
	for k := i - 1; k >= 0 && k >= i-12; k-- {
		if rs[k] == '从' && !inAnyWord(rs, k, notFrom) {
			return true
		}
	}
	return false
}

func chinesePair(a, b string) pair {
	p := pair{a: a, b: b, sa: a, sb: b}
	if u := unitIn(a); u != "" {
		p.a = u
	}
	if u := unitIn(b); u != "" {
		p.b = u
	}
	return p
}

// unitIn returns the unit a short segment names (美元, usd, 人民币), or "".
func unitIn(seg string) string {
	if u, ok := unitWords[seg]; ok {
		return u
	}
	for _, w := range chineseUnitWords {
		if !w.afterNumber && strings.Contains(seg, w.word) {
			return w.unit
		}
	}
	return ""
}

// forward returns the thing named from index i on: a run of Latin letters and digits, or
// up to four Chinese characters before a stop rune.
func forward(rs []rune, i int, stops string) string {
	for i < len(rs) && unicode.IsSpace(rs[i]) {
		i++
	}
	if i < len(rs) && !textsim.IsCJK(rs[i]) {
		return latinRun(rs, i, 1)
	}
	for _, w := range leadingOwner {
		if runesAt(rs, i, w) {
			i += len(w)
			break
		}
	}
	j := i
	for j < len(rs) && j < i+4 && textsim.IsCJK(rs[j]) && !strings.ContainsRune(stops, rs[j]) {
		j++
	}
	return string(rs[i:j])
}

// backward returns the thing named just before index i: a Latin run, or up to four
// Chinese characters after a stop rune.
func backward(rs []rune, i int) string {
	j := i
	for j > 0 && unicode.IsSpace(rs[j-1]) {
		j--
	}
	if j > 0 && !textsim.IsCJK(rs[j-1]) {
		return latinRun(rs, j-1, -1)
	}
	k := j
	for k > 0 && k > j-4 && textsim.IsCJK(rs[k-1]) && !strings.ContainsRune(stopRunes, rs[k-1]) {
		k--
	}
	return trimSegment(rs[k:j])
}

// latinRun returns the run of letters and digits at i, read forward (dir 1) or backward.
func latinRun(rs []rune, i, dir int) string {
	isWord := func(r rune) bool { return (unicode.IsLetter(r) || unicode.IsDigit(r)) && !textsim.IsCJK(r) }
	if !isWord(rs[i]) {
		return ""
	}
	j := i
	for j+dir >= 0 && j+dir < len(rs) && isWord(rs[j+dir]) {
		j += dir
	}
	lo, hi := min(i, j), max(i, j)
	return strings.ToLower(string(rs[lo : hi+1]))
}

// trimSegment drops owners before and verbs after the thing named: 我的储蓄账户转 is
// 储蓄账户.
func trimSegment(seg []rune) string {
	for {
		changed := false
		for _, w := range leadingOwner {
			if len(seg) > len(w) && runesAt(seg, 0, w) {
				seg, changed = seg[len(w):], true
				break
			}
		}
		for _, w := range trailingVerb {
			if len(seg) > len(w) && runesAt(seg, len(seg)-len(w), w) {
				seg, changed = seg[:len(seg)-len(w)], true
				break
			}
		}
		if !changed {
			break
		}
	}
	return strings.TrimFunc(string(seg), func(r rune) bool { return unicode.IsSpace(r) || unicode.IsPunct(r) })
}

// matchAny returns the first word of ws at index i.
func matchAny(rs []rune, i int, ws [][]rune) []rune {
	for _, w := range ws {
		if runesAt(rs, i, w) {
			return w
		}
	}
	return nil
}

// inAnyWord reports whether the rune at i is part of one of ws.
func inAnyWord(rs []rune, i int, ws [][]rune) bool {
	for _, w := range ws {
		for k, c := range w {
			if c == rs[i] && runesAt(rs, i-k, w) {
				return true
			}
		}
	}
	return false
}

// compareDirections rejects directed pairs that disagree. When both questions name
// directions they must name the same ones; when only one does, the other may still say
// the same two things in the opposite order ("move checking to savings").
func compareDirections(q, c Signature) string {
	qp, cp := pairStrings(q.Pairs), pairStrings(c.Pairs)
	if len(qp) > 0 && len(cp) > 0 {
		if !slices.Equal(qp, cp) {
			return fmt.Sprintf("directions %v vs %v", qp, cp)
		}
		return ""
	}
	for _, side := range []struct {
		pairs []pair
		other string
	}{{q.Pairs, c.text}, {c.Pairs, q.text}} {
		for _, p := range side.pairs {
			ia, ib := strings.Index(side.other, p.sa), strings.Index(side.other, p.sb)
			if p.sa != p.sb && ia >= 0 && ib >= 0 && ib < ia {
				return fmt.Sprintf("%s reversed", p)
			}
		}
	}
	// The same units in another order: USD→CNY against CNY→USD written without a
	// direction word ("美元对人民币汇率", "人民币对美元汇率").
	if slices.Equal(sortedCopy(q.unitOrder), sortedCopy(c.unitOrder)) && !slices.Equal(q.unitOrder, c.unitOrder) {
		return fmt.Sprintf("units in order %v vs %v", q.unitOrder, c.unitOrder)
	}
	return ""
}

func pairStrings(ps []pair) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	slices.Sort(out)
	return out
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}
