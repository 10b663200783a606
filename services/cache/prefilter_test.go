package cache

import (
	"regexp"
	"regexp/syntax"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// The prefilters may only rule out what cannot match: these tests hold them to the plain
// search on arbitrary texts and expressions.

// textAlphabet is the material of random texts: what the default patterns and the
// classifier read (digits, @, +, -, dots, spaces), case pairs and their non-ASCII case
// partners (the Kelvin sign folds to k, the long s to s), other scripts, an apostrophe
// the classifier rewrites, and broken UTF-8.
var textAlphabet = []string{
	"a", "b", "k", "K", "s", "S", "my", "how", "now", "@", ".", "-", "+", " ", "  ", "_", "0", "1", "4", "9", "123", "2024",
	"é", "日", "的", "我的", "\u212a", "ſ", "’", "'", "\n", "\t", "\xff", "\xe6\x97", "１", "ｋ",
}

func drawText(t *rapid.T, label string) string {
	return strings.Join(rapid.SliceOfN(rapid.SampledFrom(textAlphabet), 0, 30).Draw(t, label), "")
}

func TestNeedleMayContain(t *testing.T) {
	t.Parallel()
	tests := []struct {
		text, word string
		want       bool
	}{
		{"", "", true},
		{"abc", "", true},
		{"abc", "b", true},
		{"abc", "d", false},
		{"abc", "bc", true},
		{"abc", "cb", false},
		{"today's weather", "weather", true},
		{"whether", "weather", false},
		{"我的订单", "订单", true},
		{"我的订", "订单", false},
		{"\xff", "\xff", true},
		{"\xfe", "\xff", false},
	}
	for _, tt := range tests {
		var s textStats
		s.reset(tt.text)
		nd := newNeedle(tt.word)
		if got := s.mayContain(&nd); got != tt.want {
			t.Errorf("mayContain(%q in %q) = %v, want %v", tt.word, tt.text, got, tt.want)
		}
		if !(*textStats)(nil).mayContain(&nd) {
			t.Errorf("nil stats rule out %q", tt.word)
		}
	}
	rapid.Check(t, func(t *rapid.T) {
		text := drawText(t, "text")
		word := drawText(t, "word")
		if rapid.Bool().Draw(t, "inside") && len(text) > 0 {
			i := rapid.IntRange(0, len(text)).Draw(t, "i")
			j := rapid.IntRange(i, len(text)).Draw(t, "j")
			word = text[i:j]
		}
		var s textStats
		s.reset(text)
		nd := newNeedle(word)
		if strings.Contains(text, word) && !s.mayContain(&nd) {
			t.Fatalf("mayContain(%q in %q) = false, but it is there", word, text)
		}
	})
}

// TestDefaultPatternNeeds pins what the prefilter derives from the default patterns: it
// is what lets most questions skip all four.
func TestDefaultPatternNeeds(t *testing.T) {
	t.Parallel()
	digits := func(n int) string { return strings.Repeat("7", n) }
	tests := []struct {
		pattern        string
		ruledOut, kept []string
	}{
		{`[\w.+-]+@[\w-]+(\.[\w-]+)+`, []string{"no at sign.here", "a@b", "@.", "x@"}, []string{"jane.doe@example.com", "a@b.c"}},
		{`\+\d[\d -]{7,}\d`, []string{"+1 415", "call 415 555 0100", "1 + 2 = 3 4 5 6 7 8 9 0"}, []string{"+1 415 555 0100", "+861381234567"}},
		{`\b\d{3}[ -]\d{3,4}[ -]\d{4}\b`, []string{"415-555-010", "2024-01-01", "415 555 010"}, []string{"415-555-0100", "call 415 555 0100 now"}},
		{`\d{10,}`, []string{digits(9), "1234 5678", "benchmark request 123456: how long"}, []string{digits(10), "card 6222021234567890123"}},
	}
	for _, tt := range tests {
		f := compileFiltered(tt.pattern)
		for _, text := range tt.ruledOut {
			var s textStats
			s.reset(text)
			if f.mayMatch(text, &s) {
				t.Errorf("%s: %q passes the prefilter, want ruled out", tt.pattern, text)
			}
		}
		for _, text := range tt.kept {
			var s textStats
			s.reset(text)
			if !f.mayMatch(text, &s) || !f.matchString(text, &s) {
				t.Errorf("%s: %q does not match", tt.pattern, text)
			}
		}
	}
}

func TestWordNeeds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		expr string
		want [][]string
	}{
		{`abc`, [][]string{{"abc"}}},
		{`\bfx rate\b`, [][]string{{"fx rate"}}},
		{`(?:fx|forex) rates?`, [][]string{{"fx rates", "fx rate", "forex rates", "forex rate"}}},
		{`my (?:\w+ ){0,2}?(?:card|bill)\b`, [][]string{{"my "}, {"card", "bill"}}},
		{`a+b`, [][]string{{"a"}, {"b"}}},
		{`a*b`, [][]string{{"b"}}},
		{`(?:ab)?`, nil},
		{`(?:ab|.c)`, [][]string{{"ab", "c"}}},
		{`(?:ab|.*)`, nil},
		{`(?i)abc`, nil},
		{`.`, nil},
		{`[^a]x`, [][]string{{"x"}}},
		{`x{0}`, nil},
		{`(?:x|y){2}z`, [][]string{{"x", "y"}, {"z"}}},
	}
	for _, tt := range tests {
		tree := mustParse(t, tt.expr)
		got := wordNeeds(tree)
		if !slices.EqualFunc(got, tt.want, slices.Equal) {
			t.Errorf("wordNeeds(%s) = %q, want %q", tt.expr, got, tt.want)
		}
	}
}

// drawRegexp draws a regular expression over the alphabet's characters: literals, classes,
// assertions, repetitions, alternations, groups and case folding.
func drawRegexp(t *rapid.T, depth int) string {
	leaves := []string{
		"a", "b", "k", "K", "s", "@", `\.`, ".", "-", `\+`, " ", "0", "9", "é", "日", "的", "my", "now", "\u212a", "ſ", "'",
		`\d`, `\D`, `\w`, `\W`, `\s`, `[ -]`, `[a-c]`, `[^a]`, `[\d -]`, `[0-9a]`, `[[:digit:]]`, `\pL`, `\p{Han}`, `[\w.+-]`,
		`\b`, `\B`, `^`, `$`, `\A`, `\z`, `(?:)`,
	}
	if depth == 0 || rapid.IntRange(0, 2).Draw(t, "leaf") == 0 {
		return rapid.SampledFrom(leaves).Draw(t, "literal")
	}
	a := drawRegexp(t, depth-1)
	switch rapid.IntRange(0, 5).Draw(t, "op") {
	case 0:
		return a + drawRegexp(t, depth-1)
	case 1:
		return "(?:" + a + "|" + drawRegexp(t, depth-1) + ")"
	case 2:
		return "(" + a + ")"
	case 3:
		op := rapid.SampledFrom([]string{"*", "+", "?", "{2}", "{0,3}", "{1,}", "{3,5}", "{0}", "*?", "+?", "{2,}?"}).Draw(t, "repeat")
		return "(?:" + a + ")" + op
	case 4:
		return "(?" + rapid.SampledFrom([]string{"i", "s", "m", "U", "i-s"}).Draw(t, "flags") + ":" + a + ")"
	default:
		return a + a
	}
}

func TestFilteredRegexpMatchesRegexp(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		expr := drawRegexp(t, 4)
		if _, err := regexp.Compile(expr); err != nil {
			t.Skip(err)
		}
		f := compileFiltered(expr)
		text := drawText(t, "text")
		if rapid.Bool().Draw(t, "matching") {
			// A text with a match in it, between random texts.
			text += rapid.StringMatching(expr).Draw(t, "match") + drawText(t, "after")
		}
		var s textStats
		s.reset(text)
		want := f.re.MatchString(text)
		if got := f.matchString(text, &s); got != want {
			t.Fatalf("%s on %q: filtered %v, regexp %v (counts %v, words %v)", expr, text, got, want, f.counts, f.words)
		}
	})
}

func FuzzFilteredRegexp(f *testing.F) {
	for _, p := range defaultPersonalPatterns {
		f.Add(p, "mail jane.doe@example.com or call +1 415 555 0100 or 415-555-0100, card 6222021234567890123")
	}
	f.Add(`(?i)k{2}`, "\u212a\u212a")
	f.Add(`\bmy (?:\w+ ){0,2}?(?:card|bill)\b`, "is my old card ok")
	f.Fuzz(func(t *testing.T, expr, text string) {
		if _, err := regexp.Compile(expr); err != nil {
			return
		}
		fr := compileFiltered(expr)
		var s textStats
		s.reset(text)
		if got, want := fr.matchString(text, &s), fr.re.MatchString(text); got != want {
			t.Fatalf("%s on %q: filtered %v, regexp %v", expr, text, got, want)
		}
	})
}

func mustParse(t *testing.T, expr string) *syntax.Regexp {
	t.Helper()
	tree, err := syntax.Parse(expr, syntax.Perl)
	if err != nil {
		t.Fatalf("parse %s: %v", expr, err)
	}
	return tree
}
