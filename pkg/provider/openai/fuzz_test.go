package openai

import (
	"testing"

	"github.com/mantle-mesh/mantle/pkg/provider/internal/httpcall"
	"github.com/mantle-mesh/mantle/pkg/provider/internal/providertest"
)

func FuzzParse(f *testing.F) {
	providertest.FuzzAnswerParser(f, []string{"{\"id\":\"x\",\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":\"hi\"},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4}}", `{"choices":[]}`, `{"content":null}`}, parseCompletion)
}

func FuzzStream(f *testing.F) {
	providertest.FuzzStreamDecoder(f, []string{
		"data: {\"choices\":[{\"delta\":{\"content\":\"A\"}}]}\n\ndata: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n",
		"data: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}\n\n",
		"data: {\"choices\":[{\"delta\":{\"refusal\":\"no\"},\"finish_reason\":\"content_filter\"}]}\n\n",
	}, func() httpcall.Decoder { return &decoder{} })
}
