package formatcheck

import "testing"

func TestDefaultRefusalPhrases(t *testing.T) {
	t.Parallel()
	a := DefaultRefusalPhrases()
	a[0] = "changed"
	if b := DefaultRefusalPhrases(); b[0] == "changed" {
		t.Error("DefaultRefusalPhrases returned a shared slice; a caller's edit leaked into the defaults")
	}
	// Every default must be able to match an answer that is exactly that phrase.
	c := newTestChecker(t, DefaultConfig())
	for _, phrase := range DefaultRefusalPhrases() {
		if got := c.Check(Answer{Content: phrase + "."}); got.Class != refusal {
			t.Errorf("Check(%q) = class %v; want refusal", phrase, got.Class)
		}
	}
}

func TestAppendMatchKey(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"I'm sorry, but I can't", "i m sorry but i can t"},
		{"I’M   SORRY —\tbut i can’t!", "i m sorry but i can t"},
		{"抱歉，我不能", "抱歉我不能"},
		{"抱歉, 我 不能", "抱歉我不能"},
		{"作为一个 ＡＩ，", "作为一个ai"},
		{"Ｉ ｃａｎｎｏｔ", "i cannot"},
		// Korean attaches particles to its words: Hangul is keyed like Han, without spaces.
		{"도와드릴 수 없습니다.", "도와드릴수없습니다"},
		{"caf\xe9!", "caf"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			if got, _ := appendMatchKey(nil, tt.in, 1<<20); string(got) != tt.want {
				t.Errorf("appendMatchKey(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestIndexWord(t *testing.T) {
	t.Parallel()
	tests := []struct {
		key, phrase string
		want        int
	}{
		{"as a language model i", "as a language model", 0},
		{"this app has a language model", "as a language model", -1},
		{"has a language model and as a language model", "as a language model", 25},
		{"i can t help without it", "i can t help with", -1},
		{"好的我无法确认", "我无法", 6},
		{"ok我无法", "我无法", 2},
		{"好的as an ai language model", "as an ai language model", 6},
		{"죄송하지만도와드릴수없습니다", "도와드릴수없습니다", 15},
	}
	for _, tt := range tests {
		t.Run(tt.key+"/"+tt.phrase, func(t *testing.T) {
			t.Parallel()
			if got := indexWord([]byte(tt.key), []byte(tt.phrase)); got != tt.want {
				t.Errorf("indexWord(%q, %q) = %d, want %d", tt.key, tt.phrase, got, tt.want)
			}
		})
	}
}
