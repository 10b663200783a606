package formatcheck

import (
	"fmt"
	"strings"
	"unicode/utf8"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// checkTruncated flags an answer the model stopped at its token limit. OpenAI says
// "length"; Anthropic's stop_reason says "max_tokens", and adapters may pass it through.
func checkTruncated(finishReason string) (Finding, bool) {
	switch strings.ToLower(strings.TrimSpace(finishReason)) {
	case "length", "max_tokens":
		return blocking(CodeTruncated, "", mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED,
			fmt.Sprintf("the model stopped at its token limit (finish_reason %q)", finishReason)), true
	}
	return Finding{}, false
}

// Misencoded reports whether s would get an encoding finding: invalid UTF-8, U+FFFD
// replacement characters or mojibake. The verifier uses it on the user's input, where
// garbled text is a risk signal rather than a failure.
func Misencoded(s string) bool {
	_, mojibake := findMojibake(s)
	return !utf8.ValidString(s) || strings.Contains(s, "\uFFFD") || mojibake
}

// appendEncodingFindings flags bytes that are not text, replacement characters left by an
// earlier lossy decode, and mojibake: UTF-8 that was decoded as Windows-1252/Latin-1 (or
// GBK) somewhere on the way and re-encoded, which no reader can use.
func appendEncodingFindings(findings []Finding, s string) []Finding {
	if !utf8.ValidString(s) {
		findings = append(findings, blocking(CodeEncoding, "", malformed,
			fmt.Sprintf("the answer is not valid UTF-8 (first bad byte at offset %d)", firstInvalidUTF8(s))))
	}
	// Search for the encoded character itself: strings.ContainsRune(s, utf8.RuneError)
	// would also match the invalid bytes reported above.
	if strings.Contains(s, "\uFFFD") {
		findings = append(findings, blocking(CodeEncoding, "", malformed,
			"the answer contains U+FFFD replacement characters: it was decoded lossily"))
	}
	if marker, ok := findMojibake(s); ok {
		findings = append(findings, blocking(CodeEncoding, "", malformed,
			fmt.Sprintf("the answer contains mojibake (%q): text decoded with the wrong charset", marker)))
	}
	return findings
}

func firstInvalidUTF8(s string) int {
	for i, r := range s {
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(s[i:]); size == 1 {
				return i
			}
		}
	}
	return -1
}

// findMojibake looks for byte sequences that correct text practically never contains. The
// Latin ones are UTF-8 for é, ’, “, –, … and a no-break space read as Windows-1252; 锟斤拷
// is U+FFFD read as GBK, and 烫烫烫/屯屯屯 are uninitialised memory (0xCC/0xCD) read as GBK.
// Legitimate Portuguese "NÃO" or "SÃO" is not flagged: Ã is followed there by a letter
// that UTF-8 never produces as a continuation byte read as Latin-1.
func findMojibake(s string) (string, bool) {
	for _, marker := range [...]string{
		"Ã©", "Ã¨", "Ã¡", "Ã\u00a0", "Ã¢", "Ã§", "Ã¤", "Ã¶", "Ã¼", "Ã±", "Ã³", "Ãº", "ÃŸ",
		"â€™", "â€˜", "â€œ", "â€\u009d", "â€“", "â€”", "â€¦", "â€¢",
		"Â\u00a0", "Â°", "Â©", "Â®", "ï»¿",
		"锟斤拷", "烫烫烫", "屯屯屯",
	} {
		if strings.Contains(s, marker) {
			return marker, true
		}
	}
	return "", false
}
