package router

import (
	"os"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/openaiapi"
)

// BenchmarkWithQuality measures the front door's response body: a completion with the
// QualityContext of a real answer (testdata/quality.json: 8 audit steps, one attempt).
func BenchmarkWithQuality(b *testing.B) {
	raw, err := os.ReadFile("testdata/quality.json")
	if err != nil {
		b.Fatal(err)
	}
	qc := new(mantlev1.QualityContext)
	if err := protojson.Unmarshal(raw, qc); err != nil {
		b.Fatal(err)
	}
	hello := "hello"
	resp := openaiapi.ChatCompletion{ID: "chatcmpl-1", Object: "chat.completion", Choices: []openaiapi.Choice{{Message: &openaiapi.Message{Role: "assistant", Content: &hello}}}, Usage: &openaiapi.Usage{}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := withQuality(resp, qc); err != nil {
			b.Fatal(err)
		}
	}
}
