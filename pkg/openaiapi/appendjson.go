package openaiapi

import (
	"strconv"

	"github.com/mantle-mesh/mantle/pkg/jsonwrite"
)

// AppendJSON appends c as json.Marshal writes it, byte for byte, without reflection: the
// front door writes one per answer and one per streamed chunk. ok is false, with b as it
// was, for a completion that carries logprobs, whose raw JSON json.Marshal compacts and
// escapes; the caller marshals that one (FuzzAppendJSON holds the rest to json.Marshal).
func (c *ChatCompletion) AppendJSON(b []byte) (_ []byte, ok bool) {
	for i := range c.Choices {
		if len(c.Choices[i].Logprobs) > 0 {
			return b, false
		}
	}
	b = append(b, `{"id":`...)
	b = jsonwrite.String(b, c.ID)
	b = append(b, `,"object":`...)
	b = jsonwrite.String(b, c.Object)
	b = append(b, `,"created":`...)
	b = strconv.AppendInt(b, c.Created, 10)
	b = append(b, `,"model":`...)
	b = jsonwrite.String(b, c.Model)
	b = append(b, `,"choices":`...)
	if c.Choices == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range c.Choices {
			if i > 0 {
				b = append(b, ',')
			}
			b = c.Choices[i].appendJSON(b)
		}
		b = append(b, ']')
	}
	if u := c.Usage; u != nil {
		b = append(b, `,"usage":{"prompt_tokens":`...)
		b = strconv.AppendInt(b, u.PromptTokens, 10)
		b = append(b, `,"completion_tokens":`...)
		b = strconv.AppendInt(b, u.CompletionTokens, 10)
		b = append(b, `,"total_tokens":`...)
		b = strconv.AppendInt(b, u.TotalTokens, 10)
		b = append(b, '}')
	}
	return append(b, '}'), true
}

// appendJSON appends a choice without logprobs.
func (ch *Choice) appendJSON(b []byte) []byte {
	b = append(b, `{"index":`...)
	b = strconv.AppendInt(b, int64(ch.Index), 10)
	if ch.Message != nil {
		b = append(b, `,"message":`...)
		b = ch.Message.appendJSON(b)
	}
	if ch.Delta != nil {
		b = append(b, `,"delta":`...)
		b = ch.Delta.appendJSON(b)
	}
	b = append(b, `,"finish_reason":`...)
	if ch.FinishReason == nil {
		b = append(b, "null"...)
	} else {
		b = jsonwrite.String(b, *ch.FinishReason)
	}
	return append(b, '}')
}

// appendJSON appends a message or delta, leaving out its empty members as json.Marshal
// does with omitempty.
func (m *Message) appendJSON(b []byte) []byte {
	b = append(b, '{')
	first := true
	key := func(k string) {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, k...)
	}
	if m.Role != "" {
		key(`"role":`)
		b = jsonwrite.String(b, m.Role)
	}
	if m.Content != nil {
		key(`"content":`)
		b = jsonwrite.String(b, *m.Content)
	}
	if len(m.ToolCalls) > 0 {
		key(`"tool_calls":[`)
		for i := range m.ToolCalls {
			if i > 0 {
				b = append(b, ',')
			}
			b = m.ToolCalls[i].appendJSON(b)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

func (t *ToolCall) appendJSON(b []byte) []byte {
	b = append(b, '{')
	if t.Index != nil {
		b = append(b, `"index":`...)
		b = strconv.AppendInt(b, int64(*t.Index), 10)
		b = append(b, ',')
	}
	if t.ID != "" {
		b = append(b, `"id":`...)
		b = jsonwrite.String(b, t.ID)
		b = append(b, ',')
	}
	if t.Type != "" {
		b = append(b, `"type":`...)
		b = jsonwrite.String(b, t.Type)
		b = append(b, ',')
	}
	b = append(b, `"function":{`...)
	if t.Function.Name != "" {
		b = append(b, `"name":`...)
		b = jsonwrite.String(b, t.Function.Name)
		b = append(b, ',')
	}
	b = append(b, `"arguments":`...)
	b = jsonwrite.String(b, t.Function.Arguments)
	return append(b, "}}"...)
}
