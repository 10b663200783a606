package openai

import (
	"bytes"
	"testing"

	"github.com/mantle-mesh/mantle/pkg/provider"
)

// FuzzParse: any answer body is an answer or a classified *provider.Error, never a panic.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		`{"id":"x","choices":[{"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`,
		`{"choices":[]}`, `{"content":null}`, `{"error":{"message":"bad","type":"invalid_request_error"}}`, `[]`, ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		res, perr := parseCompletion(body)
		if perr != nil && res.Content != "" {
			t.Fatalf("an error (%v) with content %q", perr, res.Content)
		}
	})
}

// FuzzStream: any event stream folds through the decoder into content, an end, or a
// classified error, never a panic.
func FuzzStream(f *testing.F) {
	for _, seed := range []string{
		"data: {\"choices\":[{\"delta\":{\"content\":\"A\"}}]}\n\ndata: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n",
		"data: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}\n\n",
		"data: {\"choices\":[{\"delta\":{\"refusal\":\"no\"},\"finish_reason\":\"content_filter\"}]}\n\n",
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
