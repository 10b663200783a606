package nearmiss

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/mantle-mesh/mantle/pkg/textsim"
	"golang.org/x/text/unicode/norm"
)

// Reason names the detail that differs. The empty Reason means the candidate may be used.
type Reason string

// Reasons, as reported in LookupResponse.rejected.reason and the rejections metric.
const (
	Number   Reason = "number"
	Date     Reason = "date"
	Negation Reason = "negation"
	Quote    Reason = "quote"
	Entity   Reason = "entity"
	// Operator: another arithmetic operator or expression (200 / 15 and 200 * 15).
	Operator Reason = "operator"
	// Unit: another currency or unit ($500 and €500, 5 km and 5 miles).
	Unit Reason = "unit"
	// Opposite: opposite words (minimum and maximum, 儿童 and 成人, 退货 and 换货).
	Opposite Reason = "opposite"
	// Direction: the same things in the other direction or role (from savings to checking
	// and back, USD→CNY and CNY→USD, A比B and B比A).
	Direction Reason = "direction"
	// Emoji: other emoji, or emoji of the other polarity (👍 and 👎).
	Emoji Reason = "emoji"
)

// Reasons lists every Reason, for metrics' initial series.
var Reasons = []Reason{Number, Date, Negation, Quote, Entity, Operator, Unit, Opposite, Direction, Emoji}

// Signature is the part of a question that must agree exactly between two questions for one
// answer to serve both.
type Signature struct {
	// Numbers are canonical numeric values (Arabic, Chinese and English number words), sorted.
	Numbers []string
	// Dates are calendar words: months, weekdays, relative days (today, 明天, 下周 ...) and
	// numbers with a date unit (3月, 5号), sorted.
	Dates []string
	// Negations counts negating words (not, never, n't, 不, 没, 未, 非 ...). A-not-A questions
	// (能不能, 是不是) and words that only contain a negating character (非常, 未来) do not count.
	Negations int
	// Quotes are the contents of quoted strings, sorted.
	Quotes []string
	// Entities are words that name things (iPhone, AWS, Netflix, a Latin word inside Chinese
	// text), lower-cased and sorted.
	Entities []string
	// Operators are arithmetic operators (+ - * / = < > ...; 加 减 乘 除 and plus, minus
	// next to a number), canonical, sorted.
	Operators []string
	// Formulas are arithmetic expressions as written, spaces removed (200/15), sorted.
	Formulas []string
	// Units are currencies and units ($, €, usd, 美元, %, km, 公斤, 3天's day), canonical,
	// sorted.
	Units []string
	// Emoji are emoji of known polarity (emoji:+ for 👍, emoji:- for 👎) and other
	// pictographs as themselves, sorted.
	Emoji []string
	// Pairs are directions: from A to B, A→B, A兑B, A比B.
	Pairs []pair
	// words are the lower-cased Latin-script words, to check that an entity of the other
	// question also occurs here.
	words map[string]bool
	// unitOrder is Units in the order written; text is the folded, lower-cased question.
	unitOrder []string
	text      string
	opposites oppositeCounts
}

// Compare returns why candidate may not serve query, and a detail for operators, or ""
// when they agree. Both are questions as the user wrote them (NFKC folding is applied here).
func Compare(query, candidate string) (Reason, string) {
	return CompareSignatures(Extract(query), Extract(candidate))
}

// CompareSignatures is Compare on extracted signatures.
func CompareSignatures(q, c Signature) (Reason, string) {
	switch {
	case !slices.Equal(q.Numbers, c.Numbers):
		return Number, fmt.Sprintf("numbers %v vs %v", q.Numbers, c.Numbers)
	case !slices.Equal(q.Operators, c.Operators):
		return Operator, fmt.Sprintf("operators %q vs %q", q.Operators, c.Operators)
	case !slices.Equal(q.Formulas, c.Formulas):
		return Operator, fmt.Sprintf("expressions %q vs %q", q.Formulas, c.Formulas)
	case !slices.Equal(q.Units, c.Units):
		return Unit, fmt.Sprintf("units %v vs %v", q.Units, c.Units)
	case !slices.Equal(q.Dates, c.Dates):
		return Date, fmt.Sprintf("dates %v vs %v", q.Dates, c.Dates)
	case q.Negations != c.Negations:
		return Negation, fmt.Sprintf("%d negations vs %d", q.Negations, c.Negations)
	case !slices.Equal(q.Emoji, c.Emoji):
		return Emoji, fmt.Sprintf("emoji %q vs %q", q.Emoji, c.Emoji)
	case !slices.Equal(q.Quotes, c.Quotes):
		return Quote, fmt.Sprintf("quoted %q vs %q", q.Quotes, c.Quotes)
	}
	if d := compareOpposites(q.opposites, c.opposites); d != "" {
		return Opposite, d
	}
	if d := compareDirections(q, c); d != "" {
		return Direction, d
	}
	// An entity must occur in both questions as a word; where it was recognised (by its
	// capital letters) does not matter, so "iphone" still matches "iPhone".
	for _, pair := range []struct {
		entities []string
		other    map[string]bool
	}{{q.Entities, c.words}, {c.Entities, q.words}} {
		for _, e := range pair.entities {
			if !pair.other[e] {
				return Entity, fmt.Sprintf("%q is not in both", e)
			}
		}
	}
	return "", ""
}

// Extract returns the signature of a question.
func Extract(text string) Signature {
	text = norm.NFKC.String(text)
	runes := []rune(text)
	sig := Signature{words: map[string]bool{}, text: strings.ToLower(text)}
	sig.Quotes = quotes(runes)
	sig.Negations = chineseNegations(runes)
	symbols := scanSymbols(runes)
	sig.Operators, sig.Formulas, sig.Emoji = symbols.operators, symbols.formulas, symbols.emoji
	units := symbols.units // positioned below, with the unit words
	var seq []string       // words and numbers in order, lower-cased

	numbers := map[string]int{}
	dates := map[string]int{}
	entities := map[string]bool{}
	cjk := 0
	latin := 0
	for _, r := range runes {
		switch {
		case textsim.IsCJK(r):
			cjk++
		case unicode.IsLetter(r):
			latin++
		}
	}
	mostlyCJK := cjk > latin

	toks := tokenize(runes)
	for i, t := range toks {
		switch t.kind {
		case tokDigits:
			n := canonicalNumber(t.text)
			numbers[n]++
			seq = append(seq, n)
			if i+1 < len(toks) && toks[i+1].kind == tokCJK {
				if unit := firstRune(toks[i+1].text); strings.ContainsRune("年月日号点时", unit) {
					dates[n+string(unit)]++
				}
			}
		case tokWord:
			lower := strings.ToLower(t.text)
			sig.words[lower] = true
			seq = append(seq, lower)
			if u, ok := unitWords[lower]; ok {
				units = append(units, positioned{t.start, u})
			} else if u, ok := unitWordsAfterNumber[lower]; ok && numberAt(toks, i-1) {
				units = append(units, positioned{t.start, u})
			}
			if op, ok := operatorWords[lower]; ok && (numberAt(toks, i-1) || numberAt(toks, i+1) || lower == "divided" || lower == "multiplied") {
				sig.Operators = append(sig.Operators, op)
			}
			for _, part := range strings.FieldsFunc(lower, func(r rune) bool { return r == '\'' || r == '-' }) {
				sig.words[part] = true
			}
			if englishNegation(lower) {
				sig.Negations++
			}
			if n, ok := englishNumbers[lower]; ok {
				numbers[n]++
			}
			if d, ok := englishDates[lower]; ok {
				dates[d]++
			}
			// am and pm only after a time: "3 pm", not "how am I billed".
			if (lower == "am" || lower == "pm") && i > 0 && toks[i-1].kind == tokDigits {
				dates[canonicalNumber(toks[i-1].text)+lower]++
			}
			if (lower == "next" || lower == "last" || lower == "this") && i+1 < len(toks) {
				if unit := strings.ToLower(toks[i+1].text); relativeUnits[unit] {
					dates[lower+" "+unit]++
				}
			}
			if isEntity(t.text, t.sentenceStart, mostlyCJK) {
				entities[lower] = true
			}
		case tokCJK:
			for _, n := range chineseNumbers(t.text) {
				numbers[n]++
			}
			afterDigits := i > 0 && toks[i-1].kind == tokDigits && toks[i-1].end >= t.start-1
			units = append(units, unitsInChinese(runes, t.start, t.end, afterDigits)...)
			sig.Operators = append(sig.Operators, chineseOperatorsIn(runes, t.start, t.end)...)
			sig.opposites.countChinese(runes[t.start:t.end])
			for _, d := range chineseDates(t.text) {
				dates[d]++
			}
		}
	}
	sig.Numbers = multiset(numbers)
	sig.Dates = multiset(dates)
	sig.Entities = slices.Sorted(maps.Keys(entities))
	sig.opposites.countEnglish(seq)
	sig.Pairs = englishPairs(seq)
	if strings.ContainsAny(sig.text, chineseDirectionRunes) {
		sig.Pairs = append(sig.Pairs, chinesePairs([]rune(sig.text))...)
	}
	for at, a := range symbols.arrowAt {
		sig.Pairs = append(sig.Pairs, arrowPair(runes, toks, at, a))
	}
	slices.SortStableFunc(units, func(a, b positioned) int { return a.at - b.at })
	for _, u := range units {
		sig.unitOrder = append(sig.unitOrder, u.unit)
	}
	sig.Units = sortedCopy(sig.unitOrder)
	slices.Sort(sig.Operators)
	slices.Sort(sig.Formulas)
	slices.Sort(sig.Emoji)
	return sig
}

func multiset(m map[string]int) []string {
	var out []string
	for k, n := range m {
		for range n {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

type tokKind int

const (
	tokWord   tokKind = iota // letters, possibly with digits, apostrophes and hyphens inside
	tokDigits                // a number: digits with inner separators (1,000  1.5  2024-05-01 is three)
	tokCJK                   // a run of Han, kana or Hangul
)

type token struct {
	kind tokKind
	text string
	// sentenceStart: the first word of the text or of a sentence, where a capital letter says
	// nothing about the word being a name.
	sentenceStart bool
	// start and end are the token's rune offsets in the text.
	start, end int
}

// tokenize splits text into words, numbers and CJK runs; everything else separates them.
func tokenize(rs []rune) []token {
	var toks []token
	sentenceStart := true
	for i := 0; i < len(rs); {
		r := rs[i]
		switch {
		case unicode.IsDigit(r):
			j := i + 1
			for j < len(rs) {
				if unicode.IsDigit(rs[j]) {
					j++
					continue
				}
				// A separator between digits belongs to the number: 1,000 and 1.5.
				if (rs[j] == ',' || rs[j] == '.') && j+1 < len(rs) && unicode.IsDigit(rs[j+1]) {
					j += 2
					continue
				}
				break
			}
			text := string(rs[i:j])
			if negativeBefore(rs, i) {
				text = "-" + text
			}
			toks = append(toks, token{kind: tokDigits, text: text, start: i, end: j})
			i = j
			sentenceStart = false
		case textsim.IsCJK(r):
			j := i + 1
			for j < len(rs) && textsim.IsCJK(rs[j]) {
				j++
			}
			toks = append(toks, token{kind: tokCJK, text: string(rs[i:j]), start: i, end: j})
			i = j
			sentenceStart = false
		case unicode.IsLetter(r):
			j := i + 1
			for j < len(rs) {
				c := rs[j]
				if (unicode.IsLetter(c) && !textsim.IsCJK(c)) || unicode.IsDigit(c) || unicode.IsMark(c) {
					j++
					continue
				}
				// Inner apostrophes and hyphens: don't, e-mail, wi-fi.
				if (c == '\'' || c == '’' || c == '-') && j+1 < len(rs) && unicode.IsLetter(rs[j+1]) && !textsim.IsCJK(rs[j+1]) {
					j += 2
					continue
				}
				break
			}
			word := strings.ReplaceAll(string(rs[i:j]), "’", "'")
			toks = append(toks, token{kind: tokWord, text: word, sentenceStart: sentenceStart, start: i, end: j})
			// Digits inside a word are numbers too: iPhone15 and "iphone 15" agree.
			for _, run := range strings.FieldsFunc(word, func(r rune) bool { return !unicode.IsDigit(r) }) {
				toks = append(toks, token{kind: tokDigits, text: run, start: j, end: j})
			}
			i = j
			sentenceStart = false
		default:
			if strings.ContainsRune(".!?。！？\n", r) {
				sentenceStart = true
			}
			i++
		}
	}
	return toks
}

func firstRune(s string) rune {
	for _, r := range s {
		return r
	}
	return 0
}

// canonicalNumber writes a number the same way however it was typed: without thousands
// separators or leading zeros, and without trailing zeros after a decimal point. Anything
// with several dots (a version, 1.2.3) is kept as written.
func canonicalNumber(s string) string {
	if rest, ok := strings.CutPrefix(s, "-"); ok {
		if n := canonicalNumber(rest); n != "0" {
			return "-" + n
		}
		return "0"
	}
	groups := strings.Split(s, ",")
	thousands := len(groups) > 1
	for i, g := range groups[1:] {
		digits, _, _ := strings.Cut(g, ".")
		if len(digits) != 3 || (i < len(groups)-2 && strings.Contains(g, ".")) {
			thousands = false
		}
	}
	if thousands {
		s = strings.Join(groups, "")
	}
	if strings.Count(s, ".") > 1 || strings.Contains(s, ",") {
		return s
	}
	intPart, frac, _ := strings.Cut(s, ".")
	intPart = strings.TrimLeft(intPart, "0")
	if intPart == "" {
		intPart = "0"
	}
	if frac = strings.TrimRight(frac, "0"); frac != "" {
		return intPart + "." + frac
	}
	return intPart
}

var englishNumbers = map[string]string{
	"zero": "0", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7",
	"eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12", "thirteen": "13",
	"fourteen": "14", "fifteen": "15", "sixteen": "16", "seventeen": "17", "eighteen": "18",
	"nineteen": "19", "twenty": "20", "thirty": "30", "forty": "40", "fifty": "50", "sixty": "60",
	"seventy": "70", "eighty": "80", "ninety": "90", "hundred": "100", "thousand": "1000",
	"million": "1000000", "billion": "1000000000", "half": "0.5", "twice": "x2", "double": "x2",
	"triple": "x3", "first": "#1", "third": "#3", "fourth": "#4", "fifth": "#5",
	"once": "1x",
	// "one" and "second" are left out: "which one", "a second".
}

var englishDates = map[string]string{
	"today": "today", "tonight": "tonight", "tomorrow": "tomorrow", "yesterday": "yesterday",
	"weekend": "weekend", "weekday": "weekday", "weekdays": "weekday", "morning": "morning",
	"afternoon": "afternoon", "evening": "evening", "midnight": "midnight", "noon": "noon",
	"january": "jan", "jan": "jan", "february": "feb", "feb": "feb", "march": "mar",
	"april": "apr", "apr": "apr", "june": "jun", "jun": "jun", "july": "jul", "jul": "jul",
	"august": "aug", "aug": "aug", "september": "sep", "sep": "sep", "sept": "sep",
	"october": "oct", "oct": "oct", "november": "nov", "nov": "nov", "december": "dec", "dec": "dec",
	// "may" is left out: it is far more often the verb.
	"monday": "mon", "tuesday": "tue", "wednesday": "wed", "thursday": "thu", "friday": "fri",
	"saturday": "sat", "sunday": "sun",
	"daily": "daily", "weekly": "weekly", "monthly": "monthly", "yearly": "yearly", "annual": "yearly",
	"annually": "yearly", "quarterly": "quarterly",
}

var relativeUnits = map[string]bool{
	"week": true, "month": true, "year": true, "quarter": true, "night": true,
}

var englishNegationWords = map[string]bool{
	"not": true, "no": true, "never": true, "none": true, "nothing": true, "nobody": true,
	"nowhere": true, "neither": true, "nor": true, "cannot": true, "without": true,
	"unable": true, "dont": true, "cant": true, "wont": true, "doesnt": true, "didnt": true,
	"isnt": true, "arent": true, "wasnt": true, "werent": true, "couldnt": true,
	"shouldnt": true, "wouldnt": true, "havent": true, "hasnt": true, "hadnt": true,
}

func englishNegation(w string) bool {
	return englishNegationWords[w] || strings.HasSuffix(w, "n't")
}

// isEntity reports whether a Latin-script word names something: a capital letter after its
// first letter (iPhone, AWS, OpenAI), a capital first letter away from a sentence start
// (Netflix), or any Latin word inside Chinese text (退 iphone 怎么办).
func isEntity(word string, sentenceStart, mostlyCJK bool) bool {
	if mostlyCJK {
		return true
	}
	rs := []rune(word)
	for _, r := range rs[1:] {
		if unicode.IsUpper(r) {
			return true
		}
	}
	if unicode.IsUpper(rs[0]) && !sentenceStart {
		return word != "I" && !strings.HasPrefix(word, "I'")
	}
	return false
}

// quotes returns the contents of quoted strings, lower-cased. A quote around the whole text
// is not a quote inside the question and is ignored.
func quotes(rs []rune) []string {
	pairs := map[rune]rune{'"': '"', '“': '”', '‘': '’', '「': '」', '『': '』', '《': '》', '【': '】', '`': '`', '\'': '\''}
	var out []string
	for i := 0; i < len(rs); i++ {
		closing, ok := pairs[rs[i]]
		if !ok {
			continue
		}
		// An apostrophe opens a quote only at a word boundary, so "don't" is not one.
		if rs[i] == '\'' && i > 0 && (unicode.IsLetter(rs[i-1]) || unicode.IsDigit(rs[i-1])) {
			continue
		}
		j := i + 1
		for j < len(rs) && rs[j] != closing {
			j++
		}
		if j == len(rs) {
			continue // unbalanced: not a quote
		}
		if rs[i] == '\'' && j+1 < len(rs) && (unicode.IsLetter(rs[j+1]) || unicode.IsDigit(rs[j+1])) {
			continue
		}
		content := strings.ToLower(strings.TrimSpace(string(rs[i+1 : j])))
		whole := strings.TrimFunc(string(rs[:i]), isSpaceOrPunct) == "" &&
			strings.TrimFunc(string(rs[j+1:]), isSpaceOrPunct) == ""
		if content != "" && !whole {
			out = append(out, content)
		}
		i = j
	}
	slices.Sort(out)
	return out
}

func isSpaceOrPunct(r rune) bool { return unicode.IsSpace(r) || unicode.IsPunct(r) }

// chineseNegations counts 不 没 非 未 无 勿 莫 否 used as negations.
func chineseNegations(rs []rune) int {
	n := 0
	for i, r := range rs {
		if !strings.ContainsRune("不没非未无勿莫否", r) {
			continue
		}
		// A-not-A questions ask, they do not negate: 能不能, 是不是, 有没有, 可不可以.
		if (r == '不' || r == '没') && i > 0 && i+1 < len(rs) && rs[i-1] == rs[i+1] {
			continue
		}
		if notNegation(rs, i) {
			continue
		}
		n++
	}
	return n
}

// lexicalised lists words that contain a negating character without negating anything.
var lexicalised = []string{
	"不过", "不错", "不断", "不仅", "不管", "不久", "不少", "不但", "不如", "不然", "要不", "差不多",
	"不同", "不一样", // "what is different": a comparison, not a negation
	"非常", "非洲", "除非", "未来", "无论", "无线", "无人机", "是否", "能否", "可否", "与否", "否则",
	"莫名", "没关系",
}

var lexicalisedRunes = runesOf(lexicalised)

func notNegation(rs []rune, i int) bool {
	for _, wr := range lexicalisedRunes {
		for k, c := range wr {
			if c == rs[i] && runesAt(rs, i-k, wr) {
				return true
			}
		}
	}
	return false
}

// runesOf converts word lists once, so matching does not allocate.
func runesOf(words []string) [][]rune {
	out := make([][]rune, len(words))
	for i, w := range words {
		out[i] = []rune(w)
	}
	return out
}

// runesAt reports whether w occurs in rs at index i.
func runesAt(rs []rune, i int, w []rune) bool {
	return i >= 0 && i+len(w) <= len(rs) && slices.Equal(rs[i:i+len(w)], w)
}

var chineseDigits = map[rune]int{
	'零': 0, '〇': 0, '一': 1, '二': 2, '两': 2, '三': 3, '四': 4, '五': 5, '六': 6, '七': 7, '八': 8, '九': 9,
}

var chineseUnits = map[rune]int{'十': 10, '百': 100, '千': 1000, '万': 10_000, '亿': 100_000_000}

// notNumbers are words built from numeral characters that do not count anything.
var notNumbers = []string{
	"一下", "一起", "一样", "一直", "一般", "一些", "一点", "一定", "一切", "一旦", "一边", "一致",
	"一会", "统一", "唯一", "万一", "千万", "十分", "一向", "一律", "一再", "一同", "之一", "百分之百",
	"三思", "一贯", "万分", "零下", "百分之",
	// 一 before a measure word is usually the article "a": 写一封邮件, 申请一个账号.
	"一个", "一种", "一份", "一封", "一张", "一位", "一件", "一本", "一条", "一篇", "一段", "一句",
}

var notNumberRunes = runesOf(notNumbers)

// chineseNumbers returns the values of numeral runs in a CJK run (三个, 十五, 两千五百),
// skipping words that only look like numbers (一下, 十分).
func chineseNumbers(s string) []string {
	rs := []rune(s)
	skip := make([]bool, len(rs))
	for _, wr := range notNumberRunes {
		for i := range rs {
			if rs[i] == wr[0] && runesAt(rs, i, wr) {
				for k := range wr {
					skip[i+k] = true
				}
			}
		}
	}
	// Weekdays (周一, 星期三, 礼拜五) are dates, not counts.
	for i := 1; i < len(rs); i++ {
		if _, d := chineseDigits[rs[i]]; d && strings.ContainsRune("周期拜", rs[i-1]) {
			skip[i] = true
		}
	}
	var out []string
	for i := 0; i < len(rs); {
		_, d := chineseDigits[rs[i]]
		_, u := chineseUnits[rs[i]]
		if skip[i] || !(d || u) {
			i++
			continue
		}
		j := i
		for j < len(rs) && !skip[j] {
			_, d := chineseDigits[rs[j]]
			_, u := chineseUnits[rs[j]]
			if !d && !u {
				break
			}
			j++
		}
		v := strconv.FormatInt(chineseValue(rs[i:j]), 10)
		if negativeBefore(rs, i) && v != "0" {
			v = "-" + v
		}
		out = append(out, v)
		i = j
	}
	return out
}

// chineseValue reads a numeral: 十五 15, 二十 20, 两千五百 2500, 三万 30000, 一二三 123.
func chineseValue(rs []rune) int64 {
	hasUnit := false
	for _, r := range rs {
		if _, ok := chineseUnits[r]; ok {
			hasUnit = true
		}
	}
	if !hasUnit { // digit by digit: 一二三, 二〇二四
		var v int64
		for _, r := range rs {
			v = v*10 + int64(chineseDigits[r])
		}
		return v
	}
	var total, section, digit int64
	for _, r := range rs {
		if d, ok := chineseDigits[r]; ok {
			digit = int64(d)
			continue
		}
		unit := int64(chineseUnits[r])
		switch {
		case unit >= 10_000:
			total += (section + digit) * unit
			section, digit = 0, 0
		default:
			if digit == 0 {
				digit = 1 // 十五: an implied one
			}
			section += digit * unit
			digit = 0
		}
	}
	return total + section + digit
}

var chineseDateWords = []string{
	"今天", "今日", "明天", "明日", "昨天", "昨日", "前天", "后天", "今年", "明年", "去年", "前年",
	"本周", "上周", "下周", "这周", "本月", "上月", "下月", "上个月", "下个月", "这个月", "周末",
	"早上", "上午", "中午", "下午", "晚上", "凌晨", "今晚", "明早", "春节", "元旦", "国庆", "中秋",
	"每天", "每周", "每月", "每年",
}

var (
	chineseDateRunes = runesOf(chineseDateWords)
	weekdayPrefixes  = runesOf([]string{"星期", "礼拜", "周"})
)

// chineseDates returns calendar words and weekdays (周一, 星期三, 礼拜天) in a CJK run.
func chineseDates(s string) []string {
	var out []string
	rs := []rune(s)
	for i := 0; i < len(rs); i++ {
		matched := false
		for k, wr := range chineseDateRunes {
			if runesAt(rs, i, wr) {
				out = append(out, chineseDateWords[k])
				i += len(wr) - 1
				matched = true
				break
			}
		}
		if matched {
			continue
		}
		for _, pr := range weekdayPrefixes {
			if i+len(pr) < len(rs) && runesAt(rs, i, pr) && strings.ContainsRune("一二三四五六日天", rs[i+len(pr)]) {
				day := rs[i+len(pr)]
				if day == '天' {
					day = '日'
				}
				out = append(out, "周"+string(day))
				i += len(pr)
				break
			}
		}
	}
	return out
}
