package rules

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Applied is one action that changed the verdict or the answer.
type Applied struct {
	RuleID string
	Action ActionType
	// Path is the JSON field the action changed, when any.
	Path   string
	Detail string
}

// Outcome is what the matched rules did to one answer.
type Outcome struct {
	// Text is the answer to deliver: the input with mask, replace and notice actions applied.
	Text string
	// Applied lists the actions in rule order.
	Applied []Applied
	// BlockedBy and DegradedBy name the first block and degrade rule; empty when none.
	BlockedBy  string
	DegradedBy string
	// ReviewBy names the review rules.
	ReviewBy []string
	// Notices are the end-user notices of every matched rule, in order.
	Notices []string
	// Skipped lists matched rules whose action had nothing to act on (a field the answer
	// lacks, a JSON field on a text answer), with the reason.
	Skipped []Applied
}

// RuleIDs returns the ids of the rules whose actions were applied, in order, once each.
func (o Outcome) RuleIDs() []string {
	var ids []string
	for _, a := range o.Applied {
		if len(ids) == 0 || ids[len(ids)-1] != a.RuleID {
			ids = append(ids, a.RuleID)
		}
	}
	return ids
}

// Apply carries out the actions of matches on the answer in in. isJSON says whether the
// answer is a JSON document (in.Output is its parse); JSON edits re-encode the document,
// so a rewritten answer has its object keys sorted.
func Apply(in *Input, matches []Match, isJSON bool) Outcome {
	out := Outcome{Text: in.Text}
	var doc any // decoded lazily, with numbers kept exact, on the first JSON edit
	docChanged := false
	for _, m := range matches {
		r, c := m.Rule, m.c
		if r.Action.Notice != "" {
			out.Notices = append(out.Notices, r.Action.Notice)
		}
		applied := Applied{RuleID: r.ID, Action: r.Action.Type, Path: r.Action.Field}
		skip := func(reason string) {
			applied.Detail = reason
			out.Skipped = append(out.Skipped, applied)
		}
		switch r.Action.Type {
		case ActionBlock:
			if out.BlockedBy == "" {
				out.BlockedBy = r.ID
			}
			applied.Detail = "answer blocked"
		case ActionDegrade:
			if out.DegradedBy == "" {
				out.DegradedBy = r.ID
			}
			applied.Detail = "degraded answer requested"
		case ActionReview:
			out.ReviewBy = append(out.ReviewBy, r.ID)
			applied.Detail = "sent to human review"
		case ActionMask, ActionReplace, ActionNotice:
			if c.path == nil {
				detail, ok := applyToText(&out.Text, r.Action, c, isJSON)
				if !ok {
					skip(detail)
					continue
				}
				applied.Detail = detail
				break
			}
			if !isJSON {
				skip("the answer is text, not JSON; field actions do not apply")
				continue
			}
			if doc == nil {
				var err error
				if doc, err = decodeExact(out.Text); err != nil {
					skip("the answer could not be re-read as JSON: " + err.Error())
					continue
				}
			}
			detail, ok := applyToField(&doc, r.Action, c)
			if !ok {
				skip(detail)
				continue
			}
			docChanged = true
			applied.Detail = detail
		}
		out.Applied = append(out.Applied, applied)
	}
	if docChanged {
		if text, err := encode(doc); err == nil {
			out.Text = text
		}
	}
	return out
}

func applyToText(text *string, a Action, c *compiled, isJSON bool) (string, bool) {
	switch a.Type {
	case ActionMask:
		mask := maskValue(a)
		if c.pattern == nil {
			if isJSON {
				mask = strconv.Quote(mask) // the answer stays a JSON document
			}
			*text = mask
			return "whole answer masked", true
		}
		n := len(c.pattern.FindAllStringIndex(*text, -1))
		if n == 0 {
			return "pattern did not match", false
		}
		*text = c.pattern.ReplaceAllLiteralString(*text, mask)
		return fmt.Sprintf("%d matches masked", n), true
	case ActionReplace:
		// For a JSON answer the operator's value is the whole replacement document.
		*text = a.Value
		return "whole answer replaced", true
	case ActionNotice:
		if isJSON {
			return "a notice without a field cannot be appended to a JSON answer; it is only shown as a user notice", false
		}
		*text = strings.TrimRight(*text, " \t\r\n") + "\n\n" + a.Notice
		return "notice appended", true
	}
	return "", false
}

// applyToField edits the value at c.path inside *doc.
func applyToField(doc *any, a Action, c *compiled) (string, bool) {
	parent, last, ok := walk(doc, c.path)
	if !ok {
		return fmt.Sprintf("field %s is not in the answer", a.Field), false
	}
	get, set := accessors(parent, last)
	cur, present := get()
	switch a.Type {
	case ActionMask:
		if !present {
			return fmt.Sprintf("field %s is not in the answer", a.Field), false
		}
		if c.pattern == nil {
			set(maskValue(a))
			return "field masked", true
		}
		s, isString := cur.(string)
		if !isString {
			return fmt.Sprintf("field %s is not a string; a pattern mask does not apply", a.Field), false
		}
		n := len(c.pattern.FindAllStringIndex(s, -1))
		if n == 0 {
			return "pattern did not match", false
		}
		set(c.pattern.ReplaceAllLiteralString(s, maskValue(a)))
		return fmt.Sprintf("%d matches masked", n), true
	case ActionReplace:
		if !present {
			return fmt.Sprintf("field %s is not in the answer", a.Field), false
		}
		set(a.Value)
		return "field replaced", true
	case ActionNotice:
		// A notice field may be new: that is how a notice reaches a JSON answer.
		if !set(a.Notice) {
			return fmt.Sprintf("field %s cannot be set", a.Field), false
		}
		return "notice written", true
	}
	return "", false
}

func maskValue(a Action) string {
	if a.Value != "" {
		return a.Value
	}
	return DefaultMask
}

// walk follows path up to its last segment and returns the container that holds (or would
// hold) the last segment.
func walk(doc *any, path []pathSegment) (any, pathSegment, bool) {
	cur := *doc
	for _, seg := range path[:len(path)-1] {
		switch v := cur.(type) {
		case map[string]any:
			next, ok := v[string(seg)]
			if !ok {
				return nil, "", false
			}
			cur = next
		case []any:
			i, err := strconv.Atoi(string(seg))
			if err != nil || i < 0 || i >= len(v) {
				return nil, "", false
			}
			cur = v[i]
		default:
			return nil, "", false
		}
	}
	switch cur.(type) {
	case map[string]any, []any:
		return cur, path[len(path)-1], true
	}
	return nil, "", false
}

// accessors returns a getter and a setter for seg inside container. The setter reports
// whether it could set (array indexes must exist).
func accessors(container any, seg pathSegment) (func() (any, bool), func(any) bool) {
	switch v := container.(type) {
	case map[string]any:
		return func() (any, bool) { x, ok := v[string(seg)]; return x, ok },
			func(x any) bool { v[string(seg)] = x; return true }
	case []any:
		i, err := strconv.Atoi(string(seg))
		inRange := err == nil && i >= 0 && i < len(v)
		return func() (any, bool) {
				if !inRange {
					return nil, false
				}
				return v[i], true
			}, func(x any) bool {
				if !inRange {
					return false
				}
				v[i] = x
				return true
			}
	}
	return func() (any, bool) { return nil, false }, func(any) bool { return false }
}

// decodeExact parses a JSON answer keeping numbers as written, so that re-encoding after an
// edit does not round large integers through float64.
func decodeExact(text string) (any, error) {
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, err
	}
	return doc, nil
}

// encode writes doc as compact JSON without escaping <, > and & (answers are not HTML) and
// without the encoder's trailing newline.
func encode(doc any) (string, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(doc); err != nil {
		return "", err
	}
	return strings.TrimSuffix(buf.String(), "\n"), nil
}
