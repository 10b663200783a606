package openai

import (
	"bytes"
	"encoding/json"

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
	if !jsonfield.Valid(body) {
		return false
	}
	return members(body, []string{"model", "choices", "usage"}, func(key string, v []byte) bool {
		switch key {
		case "model":
			return decodeString(v, &cr.Model)
		case "choices":
			return decodeChoices(v, cr)
		default:
			return decodeUsage(v, &cr.Usage)
		}
	})
}

// decodeStreamChunk is decodeCompletion for one streamed event's data: true when it read
// the chunk as json.Unmarshal would, false for json.Unmarshal to read it.
func decodeStreamChunk(body []byte, sc *streamChunk) bool {
	if !jsonfield.Valid(body) {
		return false
	}
	return members(body, []string{"choices", "usage", "error"}, func(key string, v []byte) bool {
		switch key {
		case "choices":
			return elements(v, &sc.Choices, decodeStreamChoice)
		case "usage":
			return decodeUsage(v, &sc.Usage)
		default:
			sc.Error = append(json.RawMessage(nil), v...)
			return true
		}
	})
}

func decodeStreamChoice(v []byte, c *streamChoice) bool {
	return decodeChoiceMembers(v, "delta", &c.Delta, &c.FinishReason, &c.Logprobs)
}

// members decodes the object v a member at a time: member is called with each key of
// names (at most 16) and its value. It returns false, for json.Unmarshal to decide, when
// v is not an object, a key is not plain (plainKey), a key of names comes twice, another
// key matches one of names but for case, or member returns false. Other keys are skipped,
// as json.Unmarshal skips them.
func members(v []byte, names []string, member func(key string, v []byte) bool) bool {
	obj, ok := jsonfield.OpenObject(v)
	if !ok {
		return false
	}
	var seen uint16
	for {
		k, v, more := obj.Next()
		if !more {
			return true
		}
		key, ok := plainKey(k)
		if !ok {
			return false
		}
		// names[i] is handed on: the key is not copied to the heap.
		i := jsonfield.NameIndex(k, names)
		if i < 0 {
			if foldsTo(key, names) {
				return false
			}
			continue
		}
		if seen&(1<<i) != 0 || !member(names[i], v) {
			return false
		}
		seen |= 1 << i
	}
}

func decodeChoices(v []byte, cr *chatResponse) bool {
	return elements(v, &cr.Choices, decodeChoice)
}

// elements decodes the list v (null: nil, as json.Unmarshal makes it) into into, an
// element at a time with decode; false, for json.Unmarshal to decide, when v is not a
// list or decode returns false.
func elements[T any](v []byte, into *[]T, decode func([]byte, *T) bool) bool {
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
		// Decoded in its place in the list: a value of its own would escape to the heap
		// through decode.
		var zero T
		*into = append(*into, zero)
		if !decode(e, &(*into)[len(*into)-1]) {
			return false
		}
	}
}

func decodeChoice(v []byte, c *choice) bool {
	return decodeChoiceMembers(v, "message", &c.Message, &c.FinishReason, &c.Logprobs)
}

// decodeChoiceMembers decodes a choice, an answer's or a streamed chunk's: its message under
// body ("message" or "delta"), its finish reason and its log probabilities.
func decodeChoiceMembers(v []byte, body string, m *messageBody, finish *string, logprobs *json.RawMessage) bool {
	return members(v, []string{body, "finish_reason", "logprobs"}, func(key string, v []byte) bool {
		switch key {
		case body:
			return decodeMessage(v, m)
		case "finish_reason":
			return decodeString(v, finish)
		default:
			// json.RawMessage keeps a copy of the value's bytes, null included.
			*logprobs = append(json.RawMessage(nil), v...)
			return true
		}
	})
}

// decodeMessage decodes an answer's message, or a streamed chunk's delta: the same members.
func decodeMessage(v []byte, m *messageBody) bool {
	if isNull(v) {
		return true
	}
	return members(v, []string{"content", "refusal", "tool_calls"}, func(key string, v []byte) bool {
		switch key {
		case "content":
			return decodeString(v, &m.Content)
		case "refusal":
			return decodeString(v, &m.Refusal)
		default:
			return decodeToolCalls(v, &m.ToolCalls)
		}
	})
}

func decodeToolCalls(v []byte, into *[]toolCall) bool {
	return elements(v, into, decodeToolCall)
}

func decodeToolCall(v []byte, tc *toolCall) bool {
	return members(v, []string{"index", "id", "type", "function"}, func(key string, v []byte) bool {
		switch key {
		case "index":
			// Read only for its type: an index that is not an int is json.Unmarshal's error.
			if isNull(v) {
				return true
			}
			var n int64
			if !decodeInt(v, &n) {
				return false
			}
			i := int(n)
			tc.Index = &i
			return true
		case "id":
			return decodeString(v, &tc.ID)
		case "type":
			return decodeString(v, &tc.Type)
		default:
			return decodeFunction(v, tc)
		}
	})
}

func decodeFunction(v []byte, tc *toolCall) bool {
	if isNull(v) {
		return true
	}
	return members(v, []string{"name", "arguments"}, func(key string, v []byte) bool {
		if key == "name" {
			return decodeString(v, &tc.Function.Name)
		}
		return decodeString(v, &tc.Function.Arguments)
	})
}

func decodeUsage(v []byte, into **usage) bool {
	if isNull(v) {
		*into = nil
		return true
	}
	u := &usage{}
	*into = u
	return members(v, []string{"prompt_tokens", "completion_tokens"}, func(key string, v []byte) bool {
		if key == "prompt_tokens" {
			return isNull(v) || decodeInt(v, &u.PromptTokens)
		}
		return isNull(v) || decodeInt(v, &u.CompletionTokens)
	})
}

// plainKey is the key k as written, without its quotes, when it is plain ASCII without
// escapes; ok is false for any other, whose match json.Unmarshal decides (an escape or a
// non-ASCII letter such as the Kelvin sign can match a field's name).
func plainKey(k []byte) ([]byte, bool) {
	if len(k) < 2 {
		return nil, false
	}
	in := k[1 : len(k)-1]
	for _, c := range in {
		if c == '\\' || c >= 0x80 {
			return nil, false
		}
	}
	return in, true
}

// foldsTo reports whether key is one of names but for case, which json.Unmarshal would
// decode into that field.
func foldsTo(key []byte, names []string) bool {
	for _, n := range names {
		if bytes.EqualFold(key, []byte(n)) {
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
	n, ok := jsonfield.Int(v, 18)
	if ok {
		*into = n
	}
	return ok
}

func isNull(v []byte) bool { return string(v) == "null" }
