package verifier

import (
	"encoding/json"
	"fmt"
	"strings"
)

// jsonCheck is the outcome of the JSON checks.
type jsonCheck struct {
	findings []Finding
	// content is the answer to deliver: the fence's contents when the answer was fenced.
	content string
	// parsed is true when the answer (after unwrapping) is valid JSON; value is its decoding
	// (objects as map[string]any, numbers as float64), shared with the schema and L2.
	parsed bool
	value  any
}

// checkJSON checks an answer to a JSON request: it unwraps a markdown fence, parses, and
// checks the top-level shape, the schema, the required fields and the model's own
// confidence against the threshold for this answer.
func (v *Verifier) checkJSON(content string, format Format, confidence float64) jsonCheck {
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
	if err := json.Unmarshal([]byte(body), &res.value); err != nil {
		res.findings = append(res.findings, blocking(CodeJSONParse, "", ClassMalformedOutput,
			fmt.Sprintf("the answer is not valid JSON: %v", err)))
		return res
	}
	res.parsed = true

	if format.Type == FormatJSONSchema {
		// validate() compiled the schema already; this is a cache hit.
		if schema, err := v.schemas.get(format.JSONSchema); err == nil {
			res.findings = append(res.findings, schemaFindings(schema, res.value, v.cfg.MaxSchemaFindings)...)
		}
	}
	object, isObject := res.value.(map[string]any)
	if !isObject {
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
		value, ok := object[field]
		switch {
		case !ok:
			res.findings = append(res.findings, blocking(CodeRequiredField, field, ClassMalformedOutput,
				fmt.Sprintf("required field %q is missing", field)))
		case isEmptyValue(value):
			res.findings = append(res.findings, blocking(CodeRequiredField, field, ClassMalformedOutput,
				fmt.Sprintf("required field %q is empty (%s)", field, compactJSON(value))))
		}
	}
	if c, ok := object["confidence"].(float64); ok && c < confidence {
		res.findings = append(res.findings, blocking(CodeLowConfidence, "confidence", ClassVerificationFailed,
			fmt.Sprintf("confidence %v is below the threshold %v", c, confidence)))
	}
	return res
}

// isEmptyValue reports whether a decoded value carries nothing: null, an empty or blank
// string, an empty array or an empty object. Zero and false are values, not absences.
func isEmptyValue(v any) bool {
	switch v := v.(type) {
	case nil:
		return true
	case string:
		return strings.TrimSpace(v) == ""
	case []any:
		return len(v) == 0
	case map[string]any:
		return len(v) == 0
	}
	return false
}

func compactJSON(v any) string {
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(raw)
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
