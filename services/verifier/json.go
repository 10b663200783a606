package verifier

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// jsonCheck is the outcome of the JSON checks.
type jsonCheck struct {
	findings []Finding
	// content is the answer to deliver: the fence's contents when the answer was fenced.
	content string
	// parsed is true when the answer (after unwrapping) is valid JSON.
	parsed bool
}

// checkJSON checks an answer to a JSON request: it unwraps a markdown fence, parses, and
// checks the top-level shape, the required fields and the model's own confidence.
func (v *Verifier) checkJSON(content string, format Format) jsonCheck {
	res := jsonCheck{content: content}
	body := content
	if inner, ok := unwrapFence(content); ok {
		res.findings = append(res.findings, warning(CodeMarkdownFence, "",
			"the JSON was wrapped in a markdown code fence; the fence was removed"))
		res.content = inner
		body = inner
	}
	body = strings.TrimSpace(body)
	if body == "" {
		res.findings = append(res.findings, blocking(CodeJSONParse, "", ClassMalformedOutput,
			"the code fence is empty"))
		return res
	}

	// Only the top level matters to L1, so object members stay raw: decoding into
	// json.RawMessage still validates the whole document but builds no nested values.
	var object map[string]json.RawMessage
	if body[0] == '{' {
		if err := json.Unmarshal([]byte(body), &object); err != nil {
			res.findings = append(res.findings, blocking(CodeJSONParse, "", ClassMalformedOutput,
				fmt.Sprintf("the answer is not valid JSON: %v", err)))
			return res
		}
	} else if !json.Valid([]byte(body)) {
		res.findings = append(res.findings, blocking(CodeJSONParse, "", ClassMalformedOutput,
			fmt.Sprintf("the answer is not valid JSON: %v", syntaxError(body))))
		return res
	}
	res.parsed = true

	if object == nil {
		kind := jsonKind(body[0])
		if format.Type == FormatJSONObject {
			res.findings = append(res.findings, blocking(CodeJSONType, "", ClassMalformedOutput,
				fmt.Sprintf("the answer is a JSON %s; TYPE_JSON_OBJECT needs an object", kind)))
		}
		// A schema may allow an array or a scalar, but then no field can be present.
		for _, field := range format.RequiredFields {
			res.findings = append(res.findings, blocking(CodeRequiredField, field, ClassMalformedOutput,
				fmt.Sprintf("required field %q is missing: the answer is a JSON %s, not an object", field, kind)))
		}
		return res
	}

	for _, field := range format.RequiredFields {
		raw, ok := object[field]
		switch {
		case !ok:
			res.findings = append(res.findings, blocking(CodeRequiredField, field, ClassMalformedOutput,
				fmt.Sprintf("required field %q is missing", field)))
		case isEmptyJSON(raw):
			res.findings = append(res.findings, blocking(CodeRequiredField, field, ClassMalformedOutput,
				fmt.Sprintf("required field %q is empty (%s)", field, raw)))
		}
	}
	if f, ok := v.checkConfidence(object); ok {
		res.findings = append(res.findings, f)
	}
	return res
}

// checkConfidence fails an answer whose own top-level "confidence" number is below the
// threshold: the model is telling us not to trust it. Non-numeric values are left to L2.
func (v *Verifier) checkConfidence(object map[string]json.RawMessage) (Finding, bool) {
	raw, ok := object["confidence"]
	if !ok || len(raw) == 0 || (raw[0] != '-' && (raw[0] < '0' || raw[0] > '9')) {
		return Finding{}, false
	}
	var confidence float64
	if err := json.Unmarshal(raw, &confidence); err != nil || confidence >= v.cfg.ConfidenceThreshold {
		return Finding{}, false
	}
	return blocking(CodeLowConfidence, "confidence", ClassVerificationFailed,
		fmt.Sprintf("confidence %v is below the threshold %v", confidence, v.cfg.ConfidenceThreshold)), true
}

// isEmptyJSON reports whether a value carries nothing: null, an empty or blank string, an
// empty array or an empty object. Zero and false are values, not absences.
func isEmptyJSON(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return true
	}
	switch raw[0] {
	case 'n':
		return true // null: the only valid JSON starting with n
	case '"':
		var s string
		return json.Unmarshal(raw, &s) == nil && strings.TrimSpace(s) == ""
	case '[', '{':
		return len(bytes.TrimSpace(raw[1:len(raw)-1])) == 0
	}
	return false
}

// unwrapFence returns the contents of an answer that is exactly one markdown code fence,
// such as "```json\n{...}\n```". Any info string (json, JSON, javascript, none) is allowed:
// parsing decides whether the contents are JSON. Prose around the fence, or a second fence,
// is not unwrapped; such an answer fails to parse.
func unwrapFence(s string) (string, bool) {
	const fence = "```"
	s = strings.TrimSpace(s)
	if len(s) < 2*len(fence) || !strings.HasPrefix(s, fence) || !strings.HasSuffix(s, fence) {
		return "", false
	}
	body := s[len(fence) : len(s)-len(fence)]
	if newline := strings.IndexByte(body, '\n'); newline >= 0 && isInfoString(body[:newline]) {
		body = body[newline+1:]
	}
	if strings.Contains(body, fence) {
		return "", false
	}
	return strings.TrimSpace(body), true
}

// isInfoString reports whether the first line of a fence is a language tag rather than the
// first line of the JSON itself ("```{" is JSON starting right after the fence).
func isInfoString(line string) bool {
	line = strings.TrimSpace(line)
	for _, r := range line {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '+' || r == '_') {
			return false
		}
	}
	return true
}

func jsonKind(first byte) string {
	switch first {
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

// syntaxError explains why body is not JSON. It runs only on the failure path, so the
// second pass over the input costs nothing on valid answers.
func syntaxError(body string) error {
	var discard any
	if err := json.Unmarshal([]byte(body), &discard); err != nil {
		return err
	}
	return fmt.Errorf("invalid JSON")
}
