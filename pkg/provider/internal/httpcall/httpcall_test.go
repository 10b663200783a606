package httpcall

import (
	"net/http"
	"reflect"
	"testing"
)

// TestSetHeaders: the request's headers are what http.Header.Set would make of the same
// calls in the same order: names canonical, a configured header (NewEndpoint's) replacing
// the adapter's own of the same name whatever its case (httpheader's test checks that the
// values, which share an array, stay apart).
func TestSetHeaders(t *testing.T) {
	tests := []struct {
		name   string
		stream bool
		own    []Header
		extra  map[string]string
		want   http.Header
	}{
		{name: "no headers of the adapter's", want: http.Header{
			"Content-Type": {"application/json"}, "Accept": {"application/json"}}},
		{name: "a stream", stream: true, want: http.Header{
			"Content-Type": {"application/json"}, "Accept": {"text/event-stream"}}},
		{name: "own and extra", own: []Header{{"Authorization", "Bearer k"}, {"Idempotency-Key", "i-1"}},
			extra: map[string]string{"openai-project": "p"}, want: http.Header{
				"Content-Type": {"application/json"}, "Accept": {"application/json"},
				"Authorization": {"Bearer k"}, "Idempotency-Key": {"i-1"}, "Openai-Project": {"p"}}},
		{name: "extra overrides own in any case", own: []Header{{"X-Api-Key", "mine"}},
			extra: map[string]string{"x-api-key": "gateway's", "accept": "*/*"}, want: http.Header{
				"Content-Type": {"application/json"}, "Accept": {"*/*"}, "X-Api-Key": {"gateway's"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			setHeaders(h, tt.stream, tt.own, NewEndpoint("http://upstream.test", nil, tt.extra, nil).Headers)
			if !reflect.DeepEqual(h, tt.want) {
				t.Fatalf("headers = %v, want %v", h, tt.want)
			}
		})
	}
}
