package nearmiss

import (
	"testing"
	"unicode/utf8"
)

// FuzzCompare feeds the tokenizer and every extractor arbitrary questions, which come
// from outside: none may panic, a question always agrees with itself, and the check is
// symmetric.
func FuzzCompare(f *testing.F) {
	for _, seed := range [][2]string{
		{"What is -5 squared?", "What is 5 squared?"},
		{"What is 200 / 15?", "what is (200*15)-3 => x"},
		{"Can I withdraw $500 at the airport?", "可以取500美元吗"},
		{"👍🏽 or 👎?", "✅❌"},
		{"from my savings to my checking", "to checking from savings"},
		{"从储蓄账户转到支票账户要多久", "美元兑人民币→港币"},
		{"苹果比香蕉贵吗", "比较一下"},
		{"零下二十度", "负3加5"},
		{"maximum dose for children", "成人最小剂量"},
		{"-", "从"},
		{"→→", "比比比"},
		{"1,000.5 - -2", "\"quoted\" 《书》"},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		if !utf8.ValidString(a) || !utf8.ValidString(b) {
			return
		}
		if r, d := Compare(a, a); r != "" {
			t.Fatalf("Compare(%q, itself) = %s (%s); want agreement", a, r, d)
		}
		ab, _ := Compare(a, b)
		ba, _ := Compare(b, a)
		if (ab == "") != (ba == "") {
			t.Fatalf("Compare(%q, %q) = %q but the other way %q", a, b, ab, ba)
		}
	})
}
