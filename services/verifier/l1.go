package verifier

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// l1Result is what L1 found and what it leaves for L2.
type l1Result struct {
	findings []Finding
	// content is the answer to deliver: unwrapped from a markdown fence when it was one.
	content string
	// parsed is the decoded JSON answer when the request asked for JSON and it parsed.
	parsed any
	isJSON bool
	// top reads the top-level members of a JSON object answer; nil otherwise.
	top topLevel
}

// checkL1 runs the format checks and returns their findings, in the order the package doc
// explains. confidence is the threshold for this answer (lower for degraded answers);
// needValue asks for the whole JSON document decoded (L2 rules will read it).
func (v *Verifier) checkL1(a Answer, confidence float64, needValue bool) l1Result {
	var findings []Finding
	if f, ok := checkTruncated(a.FinishReason); ok {
		findings = append(findings, f)
	}
	findings = appendEncodingFindings(findings, a.Content)
	if strings.TrimSpace(a.Content) == "" {
		// Nothing else can be said about an empty answer; json_parse would only repeat it.
		return l1Result{findings: append(findings, blocking(CodeEmpty, "", ClassMalformedOutput, "the answer is empty")), content: a.Content}
	}

	res := l1Result{content: a.Content}
	var jsonResult jsonCheck
	if a.Format.Type.wantsJSON() {
		jsonResult = v.checkJSON(a.Content, a.Format, confidence, needValue)
		res.content, res.parsed, res.isJSON, res.top = jsonResult.content, jsonResult.value, jsonResult.parsed, jsonResult.top
	}
	// A refusal to a JSON request arrives as prose, so it is looked for only when the answer
	// did not parse. Apologetic text inside a well-formed JSON value is a business matter
	// for L2 rules, not a format failure.
	if !jsonResult.parsed {
		if phrase, ok := v.refusals.match(a.Content); ok {
			findings = append(findings, blocking(CodeRefusal, "", ClassRefusal,
				fmt.Sprintf("the answer is a refusal (%q)", phrase)))
		}
	}
	if f, ok := checkRepetition(a.Content, v.cfg.RepetitionThreshold); ok {
		findings = append(findings, f)
	}
	if tag, ok := findHTMLTag(res.content); ok {
		findings = append(findings, warning(CodeHTML, "",
			fmt.Sprintf("the answer contains HTML markup (%q)", abbreviate(tag, 40))))
	}
	if !a.Format.Type.wantsJSON() && unclosedFence(a.Content) {
		findings = append(findings, warning(CodeMarkdown, "", "the answer opens a markdown code fence it never closes"))
	}
	res.findings = append(findings, jsonResult.findings...)
	return res
}

func blocking(code, path string, class FailureClass, msg string) Finding {
	return Finding{Layer: LayerL1, Code: code, Path: path, Message: msg, Blocking: true, Class: class}
}

func warning(code, path, msg string) Finding {
	return Finding{Layer: LayerL1, Code: code, Path: path, Message: msg}
}

// checkTruncated flags an answer the model stopped at its token limit. OpenAI says
// "length"; Anthropic's stop_reason says "max_tokens", and adapters may pass it through.
func checkTruncated(finishReason string) (Finding, bool) {
	switch strings.ToLower(strings.TrimSpace(finishReason)) {
	case "length", "max_tokens":
		return blocking(CodeTruncated, "", ClassTruncated,
			fmt.Sprintf("the model stopped at its token limit (finish_reason %q)", finishReason)), true
	}
	return Finding{}, false
}

// appendEncodingFindings flags bytes that are not text, replacement characters left by an
// earlier lossy decode, and mojibake: UTF-8 that was decoded as Windows-1252/Latin-1 (or
// GBK) somewhere on the way and re-encoded, which no reader can use.
func appendEncodingFindings(findings []Finding, s string) []Finding {
	if !utf8.ValidString(s) {
		findings = append(findings, blocking(CodeEncoding, "", ClassMalformedOutput,
			fmt.Sprintf("the answer is not valid UTF-8 (first bad byte at offset %d)", firstInvalidUTF8(s))))
	}
	// Search for the encoded character itself: strings.ContainsRune(s, utf8.RuneError)
	// would also match the invalid bytes reported above.
	if strings.Contains(s, "\uFFFD") {
		findings = append(findings, blocking(CodeEncoding, "", ClassMalformedOutput,
			"the answer contains U+FFFD replacement characters: it was decoded lossily"))
	}
	if marker, ok := findMojibake(s); ok {
		findings = append(findings, blocking(CodeEncoding, "", ClassMalformedOutput,
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
