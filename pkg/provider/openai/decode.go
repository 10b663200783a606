package openai

import (
	"encoding/json"
	"strings"

	"github.com/mantle-mesh/mantle/pkg/jsonfield"
)

// decodeCompletion decodes body into cr as json.Unmarshal would, without its reflection
// and its allocations per field, for the answers servers send: it returns false, and the
// caller asks json.Unmarshal, for anything whose outcome it does not reproduce exactly:
// a body that is not valid JSON (json.Unmarshal's error says where), a member of the wrong
// type, a key given twice (json.Unmarshal merges them) or that is a known one in another
// case or spelling (json.Unmarshal matches keys without regard to case), and a string
// json.Unmarshal would change (invalid UTF-8, a lone surrogate).
func decodeCompletion(body []byte, cr *chatResponse) bool {
	if !json.Valid(body) {
		return false
	}
	obj, ok := jsonfield.OpenObject(body)
	if !ok {
		return false
	}
	var seen uint8
	for {
		k, v, more := obj.Next()
		if !more {
			return true
		}
		key, ok := plainKey(k)
		if !ok {
			return false
		}
		var bit uint8
		switch key {
		case "model":
			bit = 1
			ok = decodeString(v, &cr.Model)
		case "choices":
			bit = 2
			ok = decodeChoices(v, cr)
		case "usage":
			bit = 4
			ok = decodeUsage(v, cr)
		default:
			ok = !foldsTo(key, "model", "choices", "usage")
		}
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
	}
}

func decodeChoices(v []byte, cr *chatResponse) bool {
	if isNull(v) {
		cr.Choices = nil
		return true
	}
	arr, ok := jsonfield.OpenArray(v)
	if !ok {
		return false
	}
	for {
		e, more := arr.Next()
		if !more {
			return true
		}
		var c choice
		if !decodeChoice(e, &c) {
			return false
		}
		cr.Choices = append(cr.Choices, c)
	}
}

func decodeChoice(v []byte, c *choice) bool {
	obj, ok := jsonfield.OpenObject(v)
	if !ok {
		return false
	}
	var seen uint8
	for {
		k, v, more := obj.Next()
		if !more {
			return true
		}
		key, ok := plainKey(k)
		if !ok {
			return false
		}
		var bit uint8
		switch key {
		case "message":
			bit = 1
			ok = decodeMessage(v, c)
		case "finish_reason":
			bit = 2
			ok = decodeString(v, &c.FinishReason)
		case "logprobs":
			bit = 4
			// json.RawMessage keeps a copy of the value's bytes, null included.
			c.Logprobs = append(json.RawMessage(nil), v...)
		default:
			ok = !foldsTo(key, "message", "finish_reason", "logprobs")
		}
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
	}
}

func decodeMessage(v []byte, c *choice) bool {
	if isNull(v) {
		return true
	}
	obj, ok := jsonfield.OpenObject(v)
	if !ok {
		return false
	}
	m := &c.Message
	var seen uint8
	for {
		k, v, more := obj.Next()
		if !more {
			return true
		}
		key, ok := plainKey(k)
		if !ok {
			return false
		}
		var bit uint8
		switch key {
		case "content":
			bit = 1
			ok = decodeString(v, &m.Content)
		case "refusal":
			bit = 2
			ok = decodeString(v, &m.Refusal)
		case "tool_calls":
			bit = 4
			ok = decodeToolCalls(v, &m.ToolCalls)
		default:
			ok = !foldsTo(key, "content", "refusal", "tool_calls")
		}
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
	}
}

func decodeToolCalls(v []byte, into *[]toolCall) bool {
	if isNull(v) {
		*into = nil
		return true
	}
	arr, ok := jsonfield.OpenArray(v)
	if !ok {
		return false
	}
	for {
		e, more := arr.Next()
		if !more {
			return true
		}
		var tc toolCall
		if !decodeToolCall(e, &tc) {
			return false
		}
		*into = append(*into, tc)
	}
}

func decodeToolCall(v []byte, tc *toolCall) bool {
	obj, ok := jsonfield.OpenObject(v)
	if !ok {
		return false
	}
	var seen uint8
	for {
		k, v, more := obj.Next()
		if !more {
			return true
		}
		key, ok := plainKey(k)
		if !ok {
			return false
		}
		var bit uint8
		switch key {
		case "index":
			// Read only for its type: an index that is not an int is json.Unmarshal's error.
			bit = 1
			if !isNull(v) {
				var n int64
				ok = decodeInt(v, &n)
				i := int(n)
				tc.Index = &i
			}
		case "id":
			bit = 2
			ok = decodeString(v, &tc.ID)
		case "type":
			bit = 4
			ok = decodeString(v, &tc.Type)
		case "function":
			bit = 8
			ok = decodeFunction(v, tc)
		default:
			ok = !foldsTo(key, "index", "id", "type", "function")
		}
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
	}
}

func decodeFunction(v []byte, tc *toolCall) bool {
	if isNull(v) {
		return true
	}
	obj, ok := jsonfield.OpenObject(v)
	if !ok {
		return false
	}
	var seen uint8
	for {
		k, v, more := obj.Next()
		if !more {
			return true
		}
		key, ok := plainKey(k)
		if !ok {
			return false
		}
		var bit uint8
		switch key {
		case "name":
			bit = 1
			ok = decodeString(v, &tc.Function.Name)
		case "arguments":
			bit = 2
			ok = decodeString(v, &tc.Function.Arguments)
		default:
			ok = !foldsTo(key, "name", "arguments")
		}
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
	}
}

func decodeUsage(v []byte, cr *chatResponse) bool {
	if isNull(v) {
		cr.Usage = nil
		return true
	}
	obj, ok := jsonfield.OpenObject(v)
	if !ok {
		return false
	}
	u := &usage{}
	cr.Usage = u
	var seen uint8
	for {
		k, v, more := obj.Next()
		if !more {
			return true
		}
		key, ok := plainKey(k)
		if !ok {
			return false
		}
		var bit uint8
		switch key {
		case "prompt_tokens":
			bit = 1
			ok = isNull(v) || decodeInt(v, &u.PromptTokens)
		case "completion_tokens":
			bit = 2
			ok = isNull(v) || decodeInt(v, &u.CompletionTokens)
		default:
			ok = !foldsTo(key, "prompt_tokens", "completion_tokens")
		}
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
	}
}

// plainKey is the key k as written when it is plain ASCII without escapes; ok is false
// for any other, whose match json.Unmarshal decides (an escape or a non-ASCII letter such
// as the Kelvin sign can match a field's name).
func plainKey(k []byte) (string, bool) {
	if len(k) < 2 {
		return "", false
	}
	in := k[1 : len(k)-1]
	for _, c := range in {
		if c == '\\' || c >= 0x80 {
			return "", false
		}
	}
	return string(in), true
}

// foldsTo reports whether key is one of names but for case, which json.Unmarshal would
// decode into that field.
func foldsTo(key string, names ...string) bool {
	for _, n := range names {
		if strings.EqualFold(key, n) {
			return true
		}
	}
	return false
}

// decodeString decodes a string member: null leaves into as it is, as json.Unmarshal does.
func decodeString(v []byte, into *string) bool {
	if isNull(v) {
		return true
	}
	s, ok := jsonfield.Unquote(v)
	if ok {
		*into = s
	}
	return ok
}

// decodeInt decodes an integer of at most 18 digits (any int64 a server counts with); a
// fraction or an exponent, which json.Unmarshal refuses for an integer, returns false.
func decodeInt(v []byte, into *int64) bool {
	digits := v
	neg := len(v) > 0 && v[0] == '-'
	if neg {
		digits = v[1:]
	}
	if len(digits) == 0 || len(digits) > 18 {
		return false
	}
	var n int64
	for _, c := range digits {
		if c < '0' || c > '9' {
			return false
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	*into = n
	return true
}

func isNull(v []byte) bool { return string(v) == "null" }
