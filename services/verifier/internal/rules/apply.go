package rules

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
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
	// JSON edits work on a tree decoded lazily, only along the edited paths, and written
	// back once after every action.
	var doc *jsonNode
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
				doc = &jsonNode{raw: json.RawMessage(out.Text)}
			}
			detail, ok := applyToField(doc, r.Action, c)
			if !ok {
				skip(detail)
				continue
			}
			applied.Detail = detail
		}
		out.Applied = append(out.Applied, applied)
	}
	if doc != nil && doc.dirty {
		var buf bytes.Buffer
		buf.Grow(len(out.Text) + 64)
		doc.encode(&buf)
		out.Text = buf.String()
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

// applyToField edits the value at c.path inside the document tree.
func applyToField(doc *jsonNode, a Action, c *compiled) (string, bool) {
	var detail string
	edit := func(old json.RawMessage, present bool) (json.RawMessage, bool) {
		var v any
		switch a.Type {
		case ActionMask:
			if !present {
				detail = fmt.Sprintf("field %s is not in the answer", a.Field)
				return nil, false
			}
			if c.pattern == nil {
				v, detail = maskValue(a), "field masked"
				break
			}
			var s string
			if json.Unmarshal(old, &s) != nil {
				detail = fmt.Sprintf("field %s is not a string; a pattern mask does not apply", a.Field)
				return nil, false
			}
			n := len(c.pattern.FindAllStringIndex(s, -1))
			if n == 0 {
				detail = "pattern did not match"
				return nil, false
			}
			v, detail = c.pattern.ReplaceAllLiteralString(s, maskValue(a)), fmt.Sprintf("%d matches masked", n)
		case ActionReplace:
			if !present {
				detail = fmt.Sprintf("field %s is not in the answer", a.Field)
				return nil, false
			}
			v, detail = a.Value, "field replaced"
		case ActionNotice:
			// A notice field may be new: that is how a notice reaches a JSON answer.
			v, detail = a.Notice, "notice written"
		}
		raw, err := marshal(v)
		return raw, err == nil
	}
	found, err := doc.set(c.path, edit)
	switch {
	case err != nil:
		return "the answer could not be re-read as JSON: " + err.Error(), false
	case !found:
		if detail == "" {
			detail = fmt.Sprintf("field %s is not in the answer", a.Field)
		}
		return detail, false
	}
	return detail, true
}

func maskValue(a Action) string {
	if a.Value != "" {
		return a.Value
	}
	return DefaultMask
}

// jsonNode is a JSON value decoded only as far as edits need: an untouched value stays raw
// and is written back byte for byte (numbers exactly as the model wrote them); an object or
// array on an edited path is expanded into raw members.
type jsonNode struct {
	raw   json.RawMessage
	obj   map[string]*jsonNode
	arr   []*jsonNode
	dirty bool // this value or one inside it changed
}

// expand decodes one level of an object or array; false for other values.
func (n *jsonNode) expand() (bool, error) {
	if n.obj != nil || n.arr != nil {
		return true, nil
	}
	raw := bytes.TrimSpace(n.raw)
	if len(raw) == 0 {
		return false, nil
	}
	switch raw[0] {
	case '{':
		var members map[string]json.RawMessage
		if err := json.Unmarshal(raw, &members); err != nil {
			return false, err
		}
		n.obj = make(map[string]*jsonNode, len(members))
		for k, v := range members {
			n.obj[k] = &jsonNode{raw: v}
		}
		return true, nil
	case '[':
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return false, err
		}
		n.arr = make([]*jsonNode, len(items))
		for i, v := range items {
			n.arr[i] = &jsonNode{raw: v}
		}
		return true, nil
	}
	return false, nil
}

// set replaces the value at path with what edit returns for the current one. It reports
// false when the path does not lead into the document or edit declines.
func (n *jsonNode) set(path []pathSegment, edit func(old json.RawMessage, present bool) (json.RawMessage, bool)) (bool, error) {
	ok, err := n.expand()
	if !ok || err != nil {
		return false, err
	}
	seg := string(path[0])
	var child *jsonNode
	index := -1
	if n.obj != nil {
		child = n.obj[seg]
	} else if i, err := strconv.Atoi(seg); err == nil && i >= 0 && i < len(n.arr) {
		child, index = n.arr[i], i
	} else {
		return false, nil
	}
	if len(path) > 1 {
		if child == nil {
			return false, nil
		}
		found, err := child.set(path[1:], edit)
		if found {
			n.dirty = true
		}
		return found, err
	}
	var old json.RawMessage
	if child != nil {
		if child.dirty {
			var buf bytes.Buffer
			child.encode(&buf)
			old = buf.Bytes()
		} else {
			old = child.raw
		}
	}
	raw, ok := edit(old, child != nil)
	if !ok {
		return false, nil
	}
	replacement := &jsonNode{raw: raw}
	if index >= 0 {
		n.arr[index] = replacement
	} else {
		n.obj[seg] = replacement
	}
	n.dirty = true
	return true, nil
}

// encode writes the value: raw when untouched, otherwise its members (object keys sorted).
func (n *jsonNode) encode(buf *bytes.Buffer) {
	switch {
	case !n.dirty:
		buf.Write(bytes.TrimSpace(n.raw))
	case n.obj != nil:
		keys := make([]string, 0, len(n.obj))
		for k := range n.obj {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		buf.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				buf.WriteByte(',')
			}
			key, _ := marshal(k)
			buf.Write(key)
			buf.WriteByte(':')
			n.obj[k].encode(buf)
		}
		buf.WriteByte('}')
	default:
		buf.WriteByte('[')
		for i, item := range n.arr {
			if i > 0 {
				buf.WriteByte(',')
			}
			item.encode(buf)
		}
		buf.WriteByte(']')
	}
}

// marshal writes v as compact JSON without escaping <, > and & (answers are not HTML).
func marshal(v any) (json.RawMessage, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
