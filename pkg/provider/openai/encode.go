package openai

import (
	"encoding/json"
	"math"
	"slices"
	"strconv"

	"github.com/mantle-mesh/mantle/pkg/jsonwrite"
)

// appendBody appends b as json.Marshal renders it (type plain chatRequest: fields in
// declaration order, empty ones left out, strings HTML-escaped), writing the scalar fields
// and the messages' common fields directly. Every request passes through here, and
// json.Marshal's reflection over some thirty fields, with a marshaller call and a
// validation pass for each message's content, was most of what encoding a request cost.
// Values with a shape of their own (tools, tool_choice, response_format, maps, content
// parts, tool calls) go through json.Marshal, as before. ok is false where json.Marshal
// reports an error (a float that is NaN or infinite): the caller then asks it, so that the
// error is json.Marshal's. TestAppendBodyMatchesMarshal holds the bytes to json.Marshal's.
func appendBody(out []byte, b chatRequest) (_ []byte, ok bool) {
	out = slices.Grow(out, 256+len(b.Model)+messagesSize(b.Messages))
	w := objectWriter{b: out, ok: true}
	w.b = append(w.b, '{')
	w.str("model", b.Model, false)
	w.name("messages")
	if b.Messages == nil {
		w.b = append(w.b, "null"...)
	} else {
		w.b = append(w.b, '[')
		for i, m := range b.Messages {
			if i > 0 {
				w.b = append(w.b, ',')
			}
			w.message(m)
		}
		w.b = append(w.b, ']')
	}
	w.int("max_tokens", int64(b.MaxTokens))
	w.int("max_completion_tokens", int64(b.MaxCompletionTokens))
	w.float("temperature", b.Temperature)
	w.float("top_p", b.TopP)
	optInt(&w, "n", b.N)
	if len(b.Stop) > 0 {
		w.name("stop")
		w.strings(b.Stop)
	}
	optInt(&w, "seed", b.Seed)
	w.float("presence_penalty", b.PresencePenalty)
	w.float("frequency_penalty", b.FrequencyPenalty)
	if len(b.LogitBias) > 0 {
		w.marshal("logit_bias", b.LogitBias)
	}
	w.bool("logprobs", b.Logprobs)
	optInt(&w, "top_logprobs", b.TopLogprobs)
	if len(b.Tools) > 0 {
		w.marshal("tools", b.Tools)
	}
	if b.ToolChoice != nil {
		w.marshal("tool_choice", b.ToolChoice)
	}
	w.bool("parallel_tool_calls", b.ParallelToolCalls)
	w.str("reasoning_effort", b.ReasoningEffort, true)
	w.str("service_tier", b.ServiceTier, true)
	if len(b.Metadata) > 0 {
		w.marshal("metadata", b.Metadata)
	}
	if len(b.Modalities) > 0 {
		w.name("modalities")
		w.strings(b.Modalities)
	}
	w.bool("store", b.Store)
	w.str("user", b.User, true)
	if b.ResponseFormat != nil {
		w.marshal("response_format", b.ResponseFormat)
	}
	if b.Stream {
		w.name("stream")
		w.b = append(w.b, "true"...)
	}
	if b.StreamOptions != nil {
		w.name("stream_options")
		w.b = append(w.b, `{"include_usage":`...)
		w.b = strconv.AppendBool(w.b, b.StreamOptions.IncludeUsage)
		w.b = append(w.b, '}')
	}
	w.b = append(w.b, '}')
	return w.b, w.ok
}

// messagesSize is about how long the messages are in JSON, so that the body is allocated
// once.
func messagesSize(ms []chatMessage) int {
	n := 0
	for _, m := range ms {
		n += 48 + len(m.Role) + len(m.Content.text) + len(m.Name)
	}
	return n
}

func (w *objectWriter) message(m chatMessage) {
	w.b = append(w.b, '{')
	w.str("role", m.Role, false)
	w.name("content")
	switch {
	case m.Content.parts != nil:
		parts := make([]contentPart, len(m.Content.parts))
		for i, p := range m.Content.parts {
			parts[i] = partJSON(p)
		}
		w.value(parts)
	case m.Content.null:
		w.b = append(w.b, "null"...)
	default:
		w.b = jsonwrite.String(w.b, m.Content.text)
	}
	w.str("name", m.Name, true)
	if len(m.ToolCalls) > 0 {
		w.marshal("tool_calls", m.ToolCalls)
	}
	w.str("tool_call_id", m.ToolCallID, true)
	w.str("refusal", m.Refusal, true)
	if m.Prefix {
		w.name("prefix")
		w.b = append(w.b, "true"...)
	}
	w.b = append(w.b, '}')
}

// objectWriter appends the members of one JSON object at a time; ok turns false for good
// at the first value json.Marshal would refuse.
type objectWriter struct {
	b  []byte
	ok bool
}

// name starts a member: a comma unless it is the object's first (no value ends in '{').
func (w *objectWriter) name(n string) {
	if w.b[len(w.b)-1] != '{' {
		w.b = append(w.b, ',')
	}
	w.b = append(w.b, '"')
	w.b = append(w.b, n...)
	w.b = append(w.b, '"', ':')
}

func (w *objectWriter) str(n, v string, omitEmpty bool) {
	if omitEmpty && v == "" {
		return
	}
	w.name(n)
	w.b = jsonwrite.String(w.b, v)
}

func (w *objectWriter) strings(vs []string) {
	w.b = append(w.b, '[')
	for i, v := range vs {
		if i > 0 {
			w.b = append(w.b, ',')
		}
		w.b = jsonwrite.String(w.b, v)
	}
	w.b = append(w.b, ']')
}

func (w *objectWriter) int(n string, v int64) {
	if v == 0 {
		return
	}
	w.name(n)
	w.b = strconv.AppendInt(w.b, v, 10)
}

// optInt writes an integer that was set, zero included.
func optInt[T int | int64](w *objectWriter, n string, v *T) {
	if v == nil {
		return
	}
	w.name(n)
	w.b = strconv.AppendInt(w.b, int64(*v), 10)
}

func (w *objectWriter) bool(n string, v *bool) {
	if v == nil {
		return
	}
	w.name(n)
	w.b = strconv.AppendBool(w.b, *v)
}

// float writes v as encoding/json writes a float64; NaN and the infinities, which it
// refuses, turn ok false.
func (w *objectWriter) float(n string, v *float64) {
	if v == nil {
		return
	}
	f := *v
	if math.IsNaN(f) || math.IsInf(f, 0) {
		w.ok = false
		return
	}
	w.name(n)
	w.b = jsonwrite.Float(w.b, f)
}

// marshal writes a member whose value json.Marshal renders.
func (w *objectWriter) marshal(n string, v any) {
	w.name(n)
	w.value(v)
}

func (w *objectWriter) value(v any) {
	raw, err := json.Marshal(v)
	if err != nil {
		w.ok = false
		return
	}
	w.b = append(w.b, raw...)
}
