package anthropic

import (
	"testing"

	"github.com/mantle-mesh/mantle/pkg/provider/internal/httpcall"
	"github.com/mantle-mesh/mantle/pkg/provider/internal/providertest"
)

func FuzzParse(f *testing.F) {
	providertest.FuzzAnswerParser(f, []string{"{\"id\":\"m\",\"type\":\"message\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"}],\"stop_reason\":\"end_turn\",\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}", `{"choices":[]}`, `{"content":null}`}, parseMessage)
}

func FuzzStream(f *testing.F) {
	providertest.FuzzStreamDecoder(f, []string{
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5}}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"A\"}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":1}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
		"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
	}, func() httpcall.Decoder { return &decoder{} })
}
