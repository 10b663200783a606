package nearmiss

import (
	"slices"
	"strings"
	"unicode"
)

// Signs, operators, currencies, units and emoji: the single characters and short words
// that a lexical similarity never sees (the embedder drops symbols) and that change the
// answer: $500 and €500, 200 / 15 and 200 * 15, -5 and 5, 👍 and 👎.

// operatorRunes are the mathematical operators, with their canonical spelling.
var operatorRunes = map[rune]string{
	'+': "+", '-': "-", '−': "-", '–': "-", '*': "*", '×': "*", '✕': "*", '/': "/", '÷': "/",
	'=': "=", '<': "<", '>': ">", '≤': "<=", '≥': ">=", '≠': "!=", '^': "^", '±': "±", '≈': "≈",
}

// arrows are written directions: A→B is not B→A.
var arrows = []string{"->", "=>", "→", "⇒", "➡", "⟶", "➔", "<-", "←", "⇐", "⬅"}

var arrowRunes = runesOf(arrows)

// arrowStarts are the first runes of the arrows, to skip every other rune at once.
const arrowStarts = "-=<→⇒➡⟶➔←⇐⬅"

// arrowBackward marks arrows that point from right to left.
var arrowBackward = map[string]bool{"<-": true, "←": true, "⇐": true, "⬅": true}

// operatorWords are operators spelt out; they count only next to a number ("10 minus 3",
// "2加3"), since "plus" and "times" are also ordinary words ("Premium Plus", "how many
// times").
var operatorWords = map[string]string{
	"plus": "+", "minus": "-", "times": "*", "multiplied": "*", "divided": "/",
	"equals": "=",
}

// chineseOperators are 加 减 乘 除 between two numbers (2加3, 十除以五).
var chineseOperators = map[rune]string{'加': "+", '减': "-", '乘': "*", '除': "/"}

// currencySymbols name a currency by a symbol. ¥ is both the yen and the yuan, so it is
// its own unit and agrees with neither spelt-out name: a rejection, never a false hit.
var currencySymbols = map[rune]string{
	'$': "usd", '€': "eur", '£': "gbp", '¥': "¥", '₹': "inr", '₩': "krw", '₽': "rub", '₿': "btc",
	'¢': "cent", '₺': "try", '₫': "vnd", '฿': "thb", '₱': "php", '₦': "ngn", '₴': "uah",
	'%': "%", '‰': "‰", '°': "deg",
}

// unitWords are currency and unit words that mean a unit wherever they stand.
var unitWords = map[string]string{
	"usd": "usd", "dollar": "usd", "dollars": "usd", "bucks": "usd", "eur": "eur", "euro": "eur",
	"euros": "eur", "gbp": "gbp", "sterling": "gbp", "quid": "gbp", "pound": "pound", "pounds": "pound",
	"lb": "pound", "lbs": "pound", "cny": "cny", "rmb": "cny", "yuan": "cny", "renminbi": "cny",
	"jpy": "jpy", "yen": "jpy", "hkd": "hkd", "krw": "krw", "inr": "inr", "rupee": "inr",
	"rupees": "inr", "rub": "rub", "ruble": "rub", "rubles": "rub", "rouble": "rub", "roubles": "rub",
	"cad": "cad", "aud": "aud", "chf": "chf", "franc": "chf", "francs": "chf", "sgd": "sgd",
	"btc": "btc", "bitcoin": "btc", "bitcoins": "btc", "eth": "eth", "ether": "eth", "ethereum": "eth",
	"usdt": "usdt", "cent": "cent", "cents": "cent", "percent": "%", "pct": "%", "percentage": "%",
	"km": "km", "kilometer": "km", "kilometers": "km", "kilometre": "km", "kilometres": "km",
	"mile": "mile", "miles": "mile", "meter": "m", "meters": "m", "metre": "m", "metres": "m",
	"cm": "cm", "centimeter": "cm", "centimeters": "cm", "centimetre": "cm", "centimetres": "cm",
	"mm": "mm", "millimeter": "mm", "millimeters": "mm", "inch": "inch", "inches": "inch",
	"foot": "ft", "feet": "ft", "ft": "ft", "yard": "yd", "yards": "yd",
	"kg": "kg", "kilo": "kg", "kilos": "kg", "kilogram": "kg", "kilograms": "kg",
	"gram": "g", "grams": "g", "gramme": "g", "grammes": "g", "mg": "mg", "milligram": "mg",
	"milligrams": "mg", "mcg": "mcg", "µg": "mcg", "μg": "mcg", "microgram": "mcg", "micrograms": "mcg",
	"oz": "oz", "ounce": "oz", "ounces": "oz", "ton": "ton", "tons": "ton", "tonne": "ton", "tonnes": "ton",
	"ml": "ml", "milliliter": "ml", "milliliters": "ml", "millilitre": "ml", "millilitres": "ml",
	"liter": "l", "liters": "l", "litre": "l", "litres": "l", "gallon": "gal", "gallons": "gal",
	"celsius": "c", "centigrade": "c", "fahrenheit": "f", "kelvin": "kelvin",
	"kb": "kb", "mb": "mb", "gb": "gb", "tb": "tb", "kbps": "kbps", "mbps": "mbps", "gbps": "gbps",
	"mph": "mph", "kph": "kph", "kmh": "kph", "kwh": "kwh", "watt": "w", "watts": "w",
	"calorie": "kcal", "calories": "kcal", "kcal": "kcal",
}

// unitWordsAfterNumber are unit words that are units only right after a number: "5 m",
// "3 days", "10 min" (min is also minimum, day is also "what day is it").
var unitWordsAfterNumber = map[string]string{
	"m": "m", "g": "g", "l": "l", "t": "ton", "c": "c", "f": "f", "k": "k",
	"s": "sec", "sec": "sec", "secs": "sec", "second": "sec", "seconds": "sec",
	"min": "min", "mins": "min", "minute": "min", "minutes": "min",
	"h": "hour", "hr": "hour", "hrs": "hour", "hour": "hour", "hours": "hour",
	"day": "day", "days": "day", "week": "week", "weeks": "week", "wk": "week", "wks": "week",
	"month": "month", "months": "month", "mo": "month", "year": "year", "years": "year",
	"yr": "year", "yrs": "year", "degree": "deg", "degrees": "deg", "x": "x",
	"cup": "cup", "cups": "cup", "tablet": "tablet", "tablets": "tablet", "pill": "tablet",
	"pills": "tablet", "dose": "dose", "doses": "dose",
}

// chineseUnits are Chinese currency and unit words. A word of one character (米 rice or
// metre, 度 degree or extent, 升 litre or rise) counts only right after a number.
var chineseUnitWords = []struct {
	word, unit  string
	afterNumber bool
}{
	{"人民币", "cny", false}, {"美元", "usd", false}, {"美金", "usd", false}, {"欧元", "eur", false},
	{"英镑", "gbp", false}, {"日元", "jpy", false}, {"日币", "jpy", false}, {"港币", "hkd", false},
	{"港元", "hkd", false}, {"韩元", "krw", false}, {"卢比", "inr", false}, {"卢布", "rub", false},
	{"比特币", "btc", false}, {"以太坊", "eth", false}, {"泰铢", "thb", false}, {"新台币", "twd", false},
	{"澳元", "aud", false}, {"加元", "cad", false}, {"瑞郎", "chf", false}, {"美分", "cent", false},
	{"百分之", "%", false}, {"个百分点", "%", false}, {"公里", "km", false}, {"千米", "km", false},
	{"英里", "mile", false}, {"厘米", "cm", false}, {"公分", "cm", false}, {"毫米", "mm", false},
	{"英寸", "inch", false}, {"英尺", "ft", false}, {"公斤", "kg", false}, {"千克", "kg", false},
	{"毫克", "mg", false}, {"微克", "mcg", false}, {"盎司", "oz", false}, {"毫升", "ml", false},
	{"加仑", "gal", false}, {"摄氏度", "c", false}, {"摄氏", "c", false}, {"华氏度", "f", false},
	{"华氏", "f", false}, {"千瓦时", "kwh", false}, {"卡路里", "kcal", false}, {"千卡", "kcal", false},
	{"小时", "hour", true}, {"钟头", "hour", true}, {"分钟", "min", true}, {"秒钟", "sec", true},
	{"个月", "month", true}, {"星期", "week", true}, {"礼拜", "week", true},
	{"块钱", "cny", true}, {"元", "cny", true}, {"块", "cny", true}, {"米", "m", true},
	{"克", "g", true}, {"斤", "jin", true}, {"升", "l", true}, {"度", "deg", true}, {"吨", "ton", true},
	{"天", "day", true}, {"周", "week", true}, {"秒", "sec", true}, {"寸", "cun", true},
	{"尺", "chi", true}, {"片", "tablet", true}, {"粒", "tablet", true}, {"杯", "cup", true},
}

// emojiPolarity gives emoji that approve or disapprove a polarity; other emoji and
// pictographs count as themselves.
var emojiPolarity = map[rune]string{}

func init() {
	for _, r := range "👍👌✅✔☑🆗😀😃😄😁😊🙂😍🥰😘☺🤩😆❤💕💖💗💯👏🎉🥳⬆🔼📈➕🟢⭐🌟💚🙌👆😇" {
		emojiPolarity[r] = "emoji:+"
	}
	for _, r := range "👎❌✖❎😞😢😭😡😠🙁☹😟😔💔⬇🔽📉➖🔴🚫⛔🤬😤😩😫🤮🤢👿💩😒😣😖🙅👇⚠" {
		emojiPolarity[r] = "emoji:-"
	}
}

// isEmojiModifier reports runes that only change how an emoji looks: skin tones, the
// variation selectors and the zero-width joiner.
func isEmojiModifier(r rune) bool {
	return (r >= 0x1F3FB && r <= 0x1F3FF) || r == 0xFE0F || r == 0xFE0E || r == 0x200D
}

// symbolsOf collects what the rune stream says outside words: operators, formulas (a
// number and an operator written together, in order), currency and unit symbols, emoji and
// arrows. It also returns the rune ranges consumed by arrows, so they are not read as
// operators.
type symbolScan struct {
	operators []string
	formulas  []string
	units     []positioned
	emoji     []string
	// arrowAt marks the rune index of each arrow with the arrow's text.
	arrowAt map[int]string
}

func scanSymbols(rs []rune) symbolScan {
	var s symbolScan
	s.arrowAt = map[int]string{}
	skip := make([]bool, len(rs))
	for i := 0; i < len(rs); i++ {
		if !strings.ContainsRune(arrowStarts, rs[i]) {
			continue
		}
		for k, ar := range arrowRunes {
			if runesAt(rs, i, ar) {
				s.arrowAt[i] = arrows[k]
				for k := range ar {
					skip[i+k] = true
				}
				break
			}
		}
	}
	digits := false
	for i, r := range rs {
		// Letters, digits and spaces are the words' business; most runes stop here.
		if skip[i] || unicode.IsLetter(r) || unicode.IsSpace(r) {
			continue
		}
		if unicode.IsDigit(r) {
			digits = true
			continue
		}
		if u, ok := currencySymbols[r]; ok {
			// °C and °F are one unit.
			if r == '°' && i+1 < len(rs) && (rs[i+1] == 'C' || rs[i+1] == 'c' || rs[i+1] == 'F' || rs[i+1] == 'f') {
				u = strings.ToLower(string(rs[i+1]))
			}
			s.units = append(s.units, positioned{i, u})
			continue
		}
		if op, ok := operatorRunes[r]; ok {
			if isOperatorUse(rs, i) {
				s.operators = append(s.operators, op)
			}
			continue
		}
		if isEmojiModifier(r) {
			continue
		}
		if p, ok := emojiPolarity[r]; ok {
			s.emoji = append(s.emoji, p)
			continue
		}
		if unicode.Is(unicode.So, r) {
			s.emoji = append(s.emoji, string(r))
		}
	}
	if digits {
		s.formulas = formulas(rs, skip)
	}
	return s
}

// isOperatorUse tells an operator from a hyphen or a slash between words: - and / count
// next to a digit or with spaces on both sides ("e-mail", "and/or", "A/B" do not); a minus
// glued to the number it negates is the number's sign, not an operator.
func isOperatorUse(rs []rune, i int) bool {
	r := rs[i]
	if r != '-' && r != '/' && r != '–' {
		return true
	}
	if isSignAt(rs, i) || isHyphen(rs, i) {
		return false
	}
	prev, next := neighbour(rs, i, -1), neighbour(rs, i, 1)
	if unicode.IsDigit(prev) || unicode.IsDigit(next) {
		return true
	}
	spacedBefore := i > 0 && unicode.IsSpace(rs[i-1])
	spacedAfter := i+1 < len(rs) && unicode.IsSpace(rs[i+1])
	return spacedBefore && spacedAfter && prev != 0 && next != 0
}

// isHyphen reports a hyphen that joins a word to what precedes it: 5-year, 24-hour.
func isHyphen(rs []rune, i int) bool {
	return (rs[i] == '-' || rs[i] == '–') && i+1 < len(rs) && unicode.IsLetter(rs[i+1])
}

// isSignAt reports a minus that is the sign of the number right after it: "-5", "(-20)",
// "is -3 < 0"; not "2-3" or "a-5".
func isSignAt(rs []rune, i int) bool {
	if rs[i] != '-' && rs[i] != '−' && rs[i] != '–' {
		return false
	}
	if i+1 >= len(rs) || !unicode.IsDigit(rs[i+1]) {
		return false
	}
	if i == 0 {
		return true
	}
	p := rs[i-1]
	return !(unicode.IsLetter(p) || unicode.IsDigit(p) || p == ')' || p == ']' || p == '.' || p == '_')
}

// neighbour returns the nearest non-space rune before (dir -1) or after (dir 1) index i,
// or 0.
func neighbour(rs []rune, i, dir int) rune {
	for j := i + dir; j >= 0 && j < len(rs); j += dir {
		if !unicode.IsSpace(rs[j]) {
			return rs[j]
		}
	}
	return 0
}

// formulas returns the arithmetic expressions in the text, spaces removed and operators
// canonical: "200 / 15" is "200/15", "2 × 3" is "2*3". Order inside an expression
// matters (10-3 is not 3-10), so they are compared as written.
func formulas(rs []rune, skip []bool) []string {
	var out []string
	for i := 0; i < len(rs); {
		if !unicode.IsDigit(rs[i]) && !(rs[i] == '(' || isSignAt(rs, i)) {
			i++
			continue
		}
		var b strings.Builder
		ops, digits := 0, 0
		j := i
		for ; j < len(rs); j++ {
			r := rs[j]
			switch {
			case skip[j]:
			case unicode.IsDigit(r):
				digits++
				b.WriteRune(r)
				continue
			case r == '.' || r == ',' || r == '(' || r == ')':
				b.WriteRune(r)
				continue
			case unicode.IsSpace(r):
				continue
			default:
				if op, ok := operatorRunes[r]; ok && !isHyphen(rs, j) {
					if !isSignAt(rs, j) {
						ops++
					}
					b.WriteString(op)
					continue
				}
			}
			break
		}
		if ops > 0 && digits > 0 {
			out = append(out, strings.Trim(b.String(), ".,"))
		}
		if j == i {
			j++
		}
		i = j
	}
	return out
}

// positioned is a unit and the rune offset it was written at, to keep units in order.
type positioned struct {
	at   int
	unit string
}

// negativeBefore reports a sign before the number at i: a minus glued to it (-5), or
// 负 or 零下 (负5, 零下二十度).
func negativeBefore(rs []rune, i int) bool {
	switch {
	case i > 0 && isSignAt(rs, i-1):
		return true
	case i > 0 && rs[i-1] == '负':
		return true
	case i > 1 && rs[i-2] == '零' && rs[i-1] == '下':
		return true
	}
	return false
}

// numberAt reports whether token i is a number, in digits or in words.
func numberAt(toks []token, i int) bool {
	if i < 0 || i >= len(toks) {
		return false
	}
	if toks[i].kind == tokDigits {
		return true
	}
	_, ok := englishNumbers[strings.ToLower(toks[i].text)]
	return ok && toks[i].kind == tokWord
}

func isNumeralRune(r rune) bool {
	_, d := chineseDigits[r]
	_, u := chineseUnits[r]
	return unicode.IsDigit(r) || d || u
}

// unitsInChinese returns the units in the Chinese run rs[start:end], longest word first. A
// one-character unit (元, 米, 天) counts only right after a number: after the digits
// before the run (afterDigits) or after a Chinese numeral, with an optional 个 between.
func unitsInChinese(rs []rune, start, end int, afterDigits bool) []positioned {
	var out []positioned
	for i := start; i < end; {
		matched := 0
		for _, w := range chineseUnitRunes {
			if !runesAt(rs[:end], i, w.runes) {
				continue
			}
			if w.afterNumber {
				k := i
				if k > start && rs[k-1] == '个' {
					k--
				}
				numbered := (k == start && afterDigits) || (k > start && isNumeralRune(rs[k-1]))
				if !numbered {
					continue
				}
			}
			out = append(out, positioned{i, w.unit})
			matched = len(w.runes)
			break
		}
		i += max(matched, 1)
	}
	return out
}

type chineseUnit struct {
	runes       []rune
	unit        string
	afterNumber bool
}

// chineseUnitRunes is chineseUnitWords longest first, so 摄氏度 wins over 度.
var chineseUnitRunes = func() []chineseUnit {
	out := make([]chineseUnit, 0, len(chineseUnitWords))
	for _, w := range chineseUnitWords {
		out = append(out, chineseUnit{[]rune(w.word), w.unit, w.afterNumber})
	}
	slices.SortStableFunc(out, func(a, b chineseUnit) int { return len(b.runes) - len(a.runes) })
	return out
}()

// chineseOperatorsIn returns 加 减 乘 除 written between two numbers (2加3, 十除以五).
func chineseOperatorsIn(rs []rune, start, end int) []string {
	var out []string
	for i := start; i < end; i++ {
		op, ok := chineseOperators[rs[i]]
		if !ok {
			continue
		}
		next := i + 1
		if next < len(rs) && strings.ContainsRune("上去以", rs[next]) {
			next++
		}
		prev := neighbour(rs, i, -1)
		var after rune
		if next < len(rs) {
			after = neighbour(rs, next-1, 1)
		}
		if isNumeralRune(prev) && isNumeralRune(after) {
			out = append(out, op)
		}
	}
	return out
}

// arrowPair reads the things on either side of an arrow at rune offset at.
func arrowPair(rs []rune, toks []token, at int, arrow string) pair {
	end := at + len([]rune(arrow))
	var a, b string
	for _, t := range toks {
		if t.end <= at && t.start < t.end {
			a = arrowSide(t, true)
		}
		if b == "" && t.start >= end && t.start < t.end {
			b = arrowSide(t, false)
		}
	}
	p := newPair(a, b)
	if u := unitIn(a); u != "" {
		p.a = u
	}
	if u := unitIn(b); u != "" {
		p.b = u
	}
	if arrowBackward[arrow] {
		p.a, p.b, p.sa, p.sb = p.b, p.a, p.sb, p.sa
	}
	return p
}

// arrowSide is the text of a token next to an arrow: a word, a number, or the end (last)
// or start of a Chinese run, up to four characters.
func arrowSide(t token, last bool) string {
	if t.kind != tokCJK {
		return strings.ToLower(t.text)
	}
	rs := []rune(t.text)
	if len(rs) <= 4 {
		return t.text
	}
	if last {
		return string(rs[len(rs)-4:])
	}
	return string(rs[:4])
}
