package router

import (
	"testing"

	"github.com/mantle-mesh/mantle/pkg/openaiapi"
)

// BenchmarkWithQuality measures the front door's response body: a completion with the
// QualityContext of a real answer.
func BenchmarkWithQuality(b *testing.B) {
	qc := realAnswerQuality(b)
	hello := "hello"
	resp := openaiapi.ChatCompletion{ID: "chatcmpl-1", Object: "chat.completion", Choices: []openaiapi.Choice{{Message: &openaiapi.Message{Role: "assistant", Content: &hello}}}, Usage: &openaiapi.Usage{}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := withQuality(resp, qc); err != nil {
			b.Fatal(err)
		}
	}
}
