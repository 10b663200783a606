package router

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/mantle-mesh/mantle/pkg/provider"
)

// TestDeltaChunks: one deltaChunks renders each delta of a stream as OpenAI's chunk, in
// turn, nothing of one delta left in the next (the chunk, message and choice are reused).
func TestDeltaChunks(t *testing.T) {
	t.Parallel()
	var s deltaChunks
	for _, tt := range []struct {
		name string
		d    Delta
		want string
	}{
		{"text", Delta{Content: "Hel", Model: "m"},
			`{"id":"chatcmpl-r","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}`},
		{"tool calls", Delta{Model: "m", ToolCalls: []provider.ToolCallDelta{
			{Index: 0, ID: "call_1", Type: "function", Name: "f", Arguments: `{"a":`},
			{Index: 1, Arguments: "1}"},
		}},
			`{"id":"chatcmpl-r","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\":"}},{"index":1,"function":{"arguments":"1}"}}]},"finish_reason":null}]}`},
		{"text and tool calls", Delta{Content: "x", Model: "m", ToolCalls: []provider.ToolCallDelta{{Index: 2, Arguments: "{}"}}},
			`{"id":"chatcmpl-r","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"x","tool_calls":[{"index":2,"function":{"arguments":"{}"}}]},"finish_reason":null}]}`},
		{"empty text after tool calls", Delta{Model: "m2"},
			`{"id":"chatcmpl-r","object":"chat.completion.chunk","created":7,"model":"m2","choices":[{"index":0,"delta":{"content":""},"finish_reason":null}]}`},
		{"logprobs", Delta{Content: "y", Model: "m", Logprobs: []byte(`{"content":[]}`)},
			`{"id":"chatcmpl-r","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"y"},"finish_reason":null,"logprobs":{"content":[]}}]}`},
		{"text after logprobs", Delta{Content: "z", Model: "m"},
			`{"id":"chatcmpl-r","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"z"},"finish_reason":null}]}`},
	} {
		c := s.of("chatcmpl-r", 7, tt.d)
		got, err := json.Marshal(c)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if string(got) != tt.want {
			t.Errorf("%s:\n got %s\nwant %s", tt.name, got, tt.want)
		}
		// The writer's own encoder, where it takes the chunk, writes the same.
		if b, ok := c.AppendJSON(nil); ok && !bytes.Equal(b, got) {
			t.Errorf("%s: AppendJSON\n got %s\nwant %s", tt.name, b, got)
		}
	}
}
