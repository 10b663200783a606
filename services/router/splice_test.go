package router

import (
	"errors"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// FuzzSplice: a restart that repeats the text the caller has (in any pieces) is spliced, and
// the caller's text plus what was passed on is the restarted answer, up to whitespace; a
// restart that does not begin with the caller's text is refused. Never a panic.
func FuzzSplice(f *testing.F) {
	f.Add("Hello from the fallback", 6, 3)
	f.Add("  spaced \n\t text  ", 9, 1)
	f.Add("你好，世界。再见", 4, 2)
	f.Add("short", 5, 10)
	f.Add("", 0, 1)
	f.Fuzz(func(t *testing.T, answer string, cut, size int) {
		if !utf8.ValidString(answer) || size <= 0 || cut < 0 || cut > len(answer) || !utf8.ValidString(answer[:cut]) {
			t.Skip()
		}
		sent := answer[:cut]
		var got strings.Builder
		s := newSplicer(sent, func(d Delta) error { got.WriteString(d.Content); return nil })
		for _, piece := range pieces(answer, size) {
			if err := s.sink(Delta{Content: piece}); err != nil {
				t.Fatalf("the restart repeats the caller's text, but was refused: %v", err)
			}
		}
		if !s.spliced {
			// Only possible when the caller's text ends in whitespace the answer lacks.
			if normalize(sent) != normalize(answer)+" " {
				t.Fatalf("the whole answer was repeated but not spliced: sent %q answer %q", sent, answer)
			}
			return
		}
		if a, b := normalize(sent+string(s.rest)), normalize(answer); a != b && a != b+" " {
			t.Fatalf("caller text %q + passed on %q = %q, want %q", sent, s.rest, a, b)
		}
		if got.String() != string(s.rest) {
			t.Fatalf("passed on %q, recorded %q", got.String(), s.rest)
		}

		other := newSplicer(sent, func(Delta) error { return nil })
		wrong := "x" + answer // begins with another letter than the caller's text
		if strings.HasPrefix(normalize(sent), "x") {
			wrong = "y" + answer
		}
		err := other.sink(Delta{Content: wrong})
		if normalize(sent) != "" && !errors.Is(err, errRestartDiverged) {
			t.Fatalf("a restart that begins differently was not refused: %v", err)
		}
	})
}

// pieces cuts s into pieces of about size bytes on rune boundaries.
func pieces(s string, size int) []string {
	var out []string
	for len(s) > 0 {
		n := min(size, len(s))
		for n < len(s) && !utf8.RuneStart(s[n]) {
			n++
		}
		out = append(out, s[:n])
		s = s[n:]
	}
	return out
}

// normalize collapses whitespace the way the splicer compares texts: leading whitespace
// dropped, every run of it one space (a trailing one kept).
func normalize(s string) string {
	var b strings.Builder
	space := true
	for _, r := range s {
		if unicode.IsSpace(r) {
			if !space {
				b.WriteByte(' ')
			}
			space = true
			continue
		}
		b.WriteRune(r)
		space = false
	}
	return b.String()
}
