package anthropic

import (
	"bytes"
	"testing"

	"github.com/mantle-mesh/mantle/pkg/provider"
)

// FuzzParse: any answer body is an answer or a classified *provider.Error, never a panic.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		`{"id":"m","type":"message","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":1}}`,
		`{"choices":[]}`, `{"content":null}`, `{"error":{"message":"bad","type":"invalid_request_error"}}`, `[]`, ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		res, perr := parseMessage(body)
		if perr != nil && res.Content != "" {
			t.Fatalf("an error (%v) with content %q", perr, res.Content)
		}
	})
}

// FuzzStream: any event stream folds through the decoder into content, an end, or a
// classified error, never a panic.
func FuzzStream(f *testing.F) {
	for _, seed := range []string{
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5}}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"A\"}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":1}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
		"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
		"data: {\"choices\":",
		"data: \n\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, stream []byte) {
		er := provider.NewEventReader(bytes.NewReader(stream))
		d := &decoder{}
		for {
			ev, err := er.Next()
			if err != nil {
				break
			}
			_, done, perr := d.Apply(ev)
			if perr != nil || done {
				break
			}
		}
		_, _ = d.Last()
		_ = d.Stopped()
	})
}
