package formatcheck

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

const (
	// maxRepetitionPeriod is the longest cycle of sentences the detector recognises: a loop
	// is often "A. A. A." but also "A. B. A. B. A. B.".
	maxRepetitionPeriod = 3
	// minSegmentAlnum is how many letters or digits a sentence needs to count. Shorter ones
	// ("}", "---", "OK", blank lines) repeat legitimately in code, tables and lists, and
	// are left out so they neither trigger nor interrupt a run.
	minSegmentAlnum = 4
)

// checkRepetition is a crude decoding-loop detector: it splits the answer into lines and
// sentences and fails it when the same sentence, or the same cycle of up to
// maxRepetitionPeriod sentences, occurs threshold times in a row. Repeats that are not
// consecutive (a refrain in a list) are allowed. Loops inside one sentence ("the the the",
// "哈哈哈哈") are not caught; the verifier's L3 is the place for finer detectors.
func checkRepetition(content string, threshold int) (Finding, bool) {
	segments := Sentences(content)
	for period := 1; period <= maxRepetitionPeriod; period++ {
		run := 0 // consecutive segments equal to the one period before
		for i := period; i < len(segments); i++ {
			if segments[i] != segments[i-period] {
				run = 0
				continue
			}
			run++
			if times := run/period + 1; times >= threshold {
				msg := fmt.Sprintf("the sentence %q repeats %d times in a row", abbreviate(segments[i], 60), times)
				if period > 1 {
					msg = fmt.Sprintf("a cycle of %d sentences starting with %q repeats %d times in a row",
						period, abbreviate(segments[i-period+1], 60), times)
				}
				return blocking(CodeRepetition, "", malformed, msg), true
			}
		}
	}
	return Finding{}, false
}

// Sentences splits s at line breaks and sentence ends (". ", "! ", "? " and the CJK
// 。！？；), trims each piece and keeps those with at least minSegmentAlnum letters or
// digits: the units the repetition check compares (the verifier's risk score counts
// repeats among them too). The pieces are substrings of s, so only the slice is allocated.
func Sentences(s string) []string {
	segments := make([]string, 0, 32)
	start := 0
	for i := 0; i < len(s); {
		r, size := rune(s[i]), 1
		if r >= utf8.RuneSelf {
			r, size = utf8.DecodeRuneInString(s[i:])
		}
		end := false
		switch r {
		case '\n', '。', '！', '？', '；':
			end = true
		case '.', '!', '?':
			// Only before whitespace or the end, so "3.14" and "example.com" stay whole.
			end = i+size == len(s) || s[i+size] == ' ' || s[i+size] == '\n' || s[i+size] == '\t' || s[i+size] == '\r'
		}
		if end {
			segments = appendSentence(segments, s[start:i])
			start = i + size
		}
		i += size
	}
	return appendSentence(segments, s[start:])
}

func appendSentence(segments []string, sentence string) []string {
	sentence = strings.TrimSpace(sentence)
	alnum := 0
	for _, r := range sentence {
		if unicode.IsLetter(r) || unicode.IsDigit(r) {
			if alnum++; alnum >= minSegmentAlnum {
				return append(segments, sentence)
			}
		}
	}
	return segments
}

// abbreviate shortens s to at most n runes for a message.
func abbreviate(s string, n int) string {
	for i := range s {
		if n == 0 {
			return s[:i] + "…"
		}
		n--
	}
	return s
}
