package openaiapi

import (
	"encoding/json"
	"testing"
)

// FuzzAppendJSON holds AppendJSON to json.Marshal's bytes for completions and chunks
// of every shape the front door writes: text, an empty answer, tool calls and their
// streamed pieces, usage or none, a finish reason or null, and strings that need
// escaping (HTML, control characters, invalid UTF-8, U+2028).
func FuzzAppendJSON(f *testing.F) {
	f.Add("req_1", "gpt-4o", int64(1733480000), "Parcels take <3> days & more.\n", "stop", "call_1", "get_weather", `{"city":"Paris"}`, uint8(0))
	f.Add("", "", int64(-1), "", "", "", "", "", uint8(0xff))
	f.Add("r\u2028", "m\xff", int64(0), "\x00\x1f\"\\", "length", "c", "f", "\u2029", uint8(0x55))
	f.Fuzz(func(t *testing.T, id, model string, created int64, content, finish, callID, name, args string, shape uint8) {
		c := completion(id, model, created, content, finish, callID, name, args, shape)
		want, err := json.Marshal(&c)
		if err != nil {
			t.Fatalf("json.Marshal: %v", err)
		}
		got, ok := c.AppendJSON([]byte("prefix"))
		if !ok || string(got) != "prefix"+string(want) {
			t.Fatalf("AppendJSON = %q, %t\njson.Marshal = %q", got, ok, want)
		}
	})
}

// completion builds a completion or chunk whose optional parts shape's bits choose.
func completion(id, model string, created int64, content, finish, callID, name, args string, shape uint8) ChatCompletion {
	c := ChatCompletion{ID: id, Object: "chat.completion", Created: created, Model: model}
	if shape&1 != 0 {
		c.Usage = NewUsage(created, int64(len(content)))
	}
	if shape&2 != 0 {
		if shape&4 != 0 {
			c.Choices = []Choice{} // a usage chunk's: []
		}
		return c // otherwise null
	}
	msg := &Message{}
	if shape&4 != 0 {
		msg.Role = "assistant"
	}
	if shape&8 != 0 {
		msg.Content = &content
	}
	if shape&16 != 0 {
		index := int(shape >> 5)
		call := ToolCall{ID: callID, Type: "function", Function: FunctionCall{Name: name, Arguments: args}}
		if shape&32 != 0 {
			call.Index = &index
		}
		msg.ToolCalls = []ToolCall{call, {Function: FunctionCall{Arguments: args}}}
	}
	ch := Choice{Index: int(shape >> 6), Message: msg}
	if shape&64 != 0 {
		c.Object = "chat.completion.chunk"
		ch.Message, ch.Delta = nil, msg
	}
	if shape&128 != 0 {
		ch.FinishReason = &finish
	}
	c.Choices = []Choice{ch, {Index: 1}}
	return c
}

func TestAppendJSONLeavesLogprobsToJSONMarshal(t *testing.T) {
	c := ChatCompletion{Choices: []Choice{{Logprobs: json.RawMessage(`{"content": [ ]}`)}}}
	if b, ok := c.AppendJSON([]byte("x")); ok || string(b) != "x" {
		t.Errorf("AppendJSON with logprobs = %q, %t; want b unchanged and false", b, ok)
	}
}

// BenchmarkAppendJSON compares AppendJSON with json.Marshal on an answer.
//
//	go test -run '^$' -bench BenchmarkAppendJSON ./pkg/openaiapi/
func BenchmarkAppendJSON(b *testing.B) {
	content, finish := "Parcels to Lisbon usually take three to five working days with standard post, and one to two days with an express courier.", "stop"
	c := ChatCompletion{ID: "chatcmpl-req_3f9a0c1b2d4e5f60718293a4", Object: "chat.completion", Created: 1733480000, Model: "gpt-4o-mini",
		Choices: []Choice{{Message: &Message{Role: "assistant", Content: &content}, FinishReason: &finish}}, Usage: NewUsage(19, 37)}
	b.Run("AppendJSON", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 1024)
		for b.Loop() {
			buf, _ = c.AppendJSON(buf[:0])
		}
	})
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(&c); err != nil {
				b.Fatal(err)
			}
		}
	})
}
