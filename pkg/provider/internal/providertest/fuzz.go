package providertest

import (
	"bytes"
	"testing"

	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/pkg/provider/internal/httpcall"
)

// FuzzAnswerParser fuzzes an adapter's parser of a whole answer body: any body is an
// answer or a classified *provider.Error, never a panic, and never both.
func FuzzAnswerParser(f *testing.F, seeds []string, parse func([]byte) (provider.Response, *provider.Error)) {
	for _, seed := range append(seeds, `[]`, ``, `{"error":{"message":"bad","type":"invalid_request_error"}}`) {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		res, perr := parse(body)
		if perr != nil && res.Content != "" {
			t.Fatalf("an error (%v) with content %q", perr, res.Content)
		}
	})
}

// FuzzStreamDecoder fuzzes an adapter's stream decoder: any event stream folds through a
// fresh decoder into content, an end or a classified error, never a panic.
func FuzzStreamDecoder(f *testing.F, seeds []string, newDecoder func() httpcall.Decoder) {
	for _, seed := range append(seeds, "data: {\"choices\":", "data: \n\n") {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, stream []byte) {
		er := provider.NewEventReader(bytes.NewReader(stream))
		d := newDecoder()
		for {
			ev, err := er.Next()
			if err != nil {
				break
			}
			if _, done, perr := d.Apply(ev); perr != nil || done {
				break
			}
		}
		_, _ = d.Last()
		_ = d.Stopped()
	})
}
