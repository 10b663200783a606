package formatcheck

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/jsonfield"
)

// jsonCheck is the outcome of the JSON checks.
type jsonCheck struct {
	findings []Finding
	// content is the answer to deliver: the fence's contents when the answer was fenced.
	content string
	// parsed is true when the answer (after unwrapping) is valid JSON; value is its decoding
	// (objects as map[string]any, numbers as float64), shared with the schema and the
	// caller (Result.Value).
	parsed bool
	value  any
	// top reads the top-level members of an object answer; nil for other JSON.
	top topLevel
}

// checkJSON checks an answer to a JSON request: it unwraps a markdown fence, parses, and
// checks the top-level shape, the schema, the required fields and the model's own
// confidence against the threshold for this answer. The whole document is decoded only when
// something needs it (a schema, or the caller: Answer.KeepValue, passed as needValue);
// otherwise only the top level is, which is several times cheaper on large answers.
func (c *Checker) checkJSON(content string, format Format, confidence float64, needValue bool) jsonCheck {
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
		res.findings = append(res.findings, blocking(CodeJSONParse, "", malformed,
			"the code fence is empty"))
		return res
	}
	var top topLevel
	needValue = needValue || format.Type == FormatJSONSchema
	var err error
	switch {
	case needValue:
		if err = json.Unmarshal([]byte(body), &res.value); err == nil {
			if object, ok := res.value.(map[string]any); ok {
				top = valueFields(object)
			}
		}
	case body[0] == '{':
		// Object members stay raw: one validating pass, then a walk of the top level
		// that builds no nested values (json.Unmarshal into json.RawMessage members
		// scanned every member twice more). Invalid JSON goes to json.Unmarshal for its
		// error, which says where.
		if b := []byte(body); jsonfield.Valid(b) {
			object, _ := jsonfield.ObjectOfValid(b, "") // an object: it opens with {
			top = rawFields(object)
		} else {
			var object map[string]json.RawMessage
			err = json.Unmarshal(b, &object)
		}
	default:
		var discard any
		err = json.Unmarshal([]byte(body), &discard)
	}
	if err != nil {
		res.findings = append(res.findings, blocking(CodeJSONParse, "", malformed,
			fmt.Sprintf("the answer is not valid JSON: %v", err)))
		return res
	}
	res.parsed, res.top = true, top

	if format.Type == FormatJSONSchema {
		// Usually a cache hit: callers compile the schema when they validate the request
		// (CompileSchema). One that does not compile is a bad request, not a bad answer.
		if schema, err := c.schemas.get(context.Background(), format.JSONSchema); err == nil {
			res.findings = append(res.findings, schemaFindings(schema, res.value, c.cfg.MaxSchemaFindings)...)
		}
	}
	if top == nil {
		kind := jsonKind(body[0])
		if format.Type == FormatJSONObject {
			res.findings = append(res.findings, blocking(CodeJSONType, "", malformed,
				fmt.Sprintf("the answer is a JSON %s; TYPE_JSON_OBJECT needs an object", kind)))
		}
		// A schema may allow an array or a scalar, but then no field can be present.
		for _, field := range format.RequiredFields {
			res.findings = append(res.findings, blocking(CodeRequiredField, field, malformed,
				fmt.Sprintf("required field %q is missing: the answer is a JSON %s, not an object", field, kind)))
		}
		return res
	}

	for _, field := range format.RequiredFields {
		present, empty, shown := top.field(field)
		switch {
		case !present:
			res.findings = append(res.findings, blocking(CodeRequiredField, field, malformed,
				fmt.Sprintf("required field %q is missing", field)))
		case empty:
			res.findings = append(res.findings, blocking(CodeRequiredField, field, malformed,
				fmt.Sprintf("required field %q is empty (%s)", field, shown)))
		}
	}
	// The model's own confidence; non-numeric values are left to the verifier's rules.
	if c, ok := top.number("confidence"); ok && c < confidence {
		res.findings = append(res.findings, blocking(CodeLowConfidence, "confidence", mantlev1.ErrorClass_ERROR_CLASS_VERIFICATION_FAILED,
			fmt.Sprintf("confidence %v is below the threshold %v", c, confidence)))
	}
	return res
}

// topLevel reads the top-level members of a JSON object, decoded or raw.
type topLevel interface {
	// field reports whether name is present, whether its value is empty, and the value as
	// JSON for a message.
	field(name string) (present, empty bool, shown string)
	number(name string) (float64, bool)
	// strings returns the non-empty string values (nested ones too when decoded).
	strings() []string
}

type valueFields map[string]any

func (o valueFields) field(name string) (bool, bool, string) {
	v, ok := o[name]
	if !ok {
		return false, false, ""
	}
	if !isEmptyValue(v) {
		return true, false, "" // shown only in the message about an empty value
	}
	return true, true, compactJSON(v)
}

func (o valueFields) number(name string) (float64, bool) {
	f, ok := o[name].(float64)
	return f, ok
}

func (o valueFields) strings() []string {
	var out []string
	collectStrings(map[string]any(o), &out)
	return out
}

type rawFields map[string]json.RawMessage

func (o rawFields) strings() []string {
	var out []string
	for _, raw := range o {
		var s string
		if len(raw) > 0 && raw[0] == '"' && json.Unmarshal(raw, &s) == nil {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
	}
	return out
}

func (o rawFields) field(name string) (bool, bool, string) {
	raw, ok := o[name]
	if !ok {
		return false, false, ""
	}
	return true, isEmptyJSON(raw), string(raw) // a view of the input: free
}

func (o rawFields) number(name string) (float64, bool) {
	raw := o[name]
	if len(raw) == 0 || (raw[0] != '-' && (raw[0] < '0' || raw[0] > '9')) {
		return 0, false
	}
	var f float64
	return f, json.Unmarshal(raw, &f) == nil
}

// isEmptyJSON is isEmptyValue for a raw value.
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

// collectStrings appends the non-empty string values in v, at any depth.
func collectStrings(v any, out *[]string) {
	switch v := v.(type) {
	case string:
		if s := strings.TrimSpace(v); s != "" {
			*out = append(*out, s)
		}
	case []any:
		for _, x := range v {
			collectStrings(x, out)
		}
	case map[string]any:
		for _, x := range v {
			collectStrings(x, out)
		}
	}
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
