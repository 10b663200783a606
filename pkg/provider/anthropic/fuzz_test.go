package anthropic

import (
	"encoding/json"
	"testing"

	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/pkg/provider/internal/httpcall"
	"github.com/mantle-mesh/mantle/pkg/provider/internal/providertest"
)

func FuzzParse(f *testing.F) {
	providertest.FuzzAnswerParser(f, []string{
		"{\"id\":\"m\",\"type\":\"message\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"}],\"stop_reason\":\"end_turn\",\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}",
		`{"type":"message","content":[{"type":"thinking","thinking":"x"},{"type":"tool_use","id":"t","name":"f","input":{"a":[1,{"b":null}]}},{"type":"tool_use","id":"u","name":"g"}],"stop_reason":"tool_use"}`,
		`{"type":"message","content":[{"type":"tool_use","input":null},{"type":"tool_use","input":"x"}]}`,
		`{"choices":[]}`, `{"content":null}`,
	}, parseMessage)
}

func FuzzStream(f *testing.F) {
	providertest.FuzzStreamDecoder(f, []string{
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5}}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"A\"}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":1}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
		"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
		eventText(messageStart, toolStart(1), sse{"content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a\":"}}`},
			toolStart(2), sse{"content_block_stop", `{"type":"content_block_stop","index":2}`},
			sse{"content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"1}"}}`},
			sse{"content_block_stop", `{"type":"content_block_stop","index":1}`}, messageDelta("tool_use", 3), messageStop),
		eventText(sse{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}`},
			sse{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hm"}}`},
			sse{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{"}}`}),
	}, func() httpcall.Decoder { return &decoder{} })
}

// FuzzRequest maps requests holding arbitrary tool arguments, data URLs, stop sequences and
// files: the mapping never panics, and a request it accepts marshals to JSON whose tool
// inputs are objects.
func FuzzRequest(f *testing.F) {
	f.Add(`{"city":"Paris"}`, "data:image/png;base64,iVBORw0KGgo=", "JVBERg==", "a.pdf", "END", "low", 5000)
	f.Add(``, "https://x/y.png", "data:application/pdf;base64,JVBERi0x", "", "\n", "none", 0)
	f.Add(`[1]`, "data:;base64,", "data:,", "x", " ", "high", 1)
	f.Fuzz(func(t *testing.T, args, imageURL, fileData, filename, stop, effort string, maxTokens int) {
		req := provider.Request{
			Model: "m",
			Tools: []provider.Tool{{Type: "function", Name: "f"}},
			Messages: []provider.Message{
				{Role: "user", Parts: []provider.Part{
					{Type: provider.PartImage, ImageURL: imageURL},
					{Type: provider.PartFile, FileData: fileData, Filename: filename},
				}},
				{Role: "assistant", ToolCalls: []provider.ToolCall{{ID: "c", Name: "f", Arguments: args}}},
				{Role: "tool", ToolCallID: "c", Content: "ok"},
			},
			Stop:            []string{stop},
			ReasoningEffort: effort,
			MaxTokens:       maxTokens,
		}
		body, field := messagesBody(req, false)
		if field != "" {
			return
		}
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatalf("an accepted request does not marshal: %v", err)
		}
		var sent struct {
			Messages []struct {
				Content json.RawMessage `json:"content"`
			} `json:"messages"`
		}
		if err := json.Unmarshal(b, &sent); err != nil {
			t.Fatalf("the body is not JSON: %v", err)
		}
		var blocks []struct {
			Type  string          `json:"type"`
			Input json.RawMessage `json:"input"`
		}
		if err := json.Unmarshal(sent.Messages[1].Content, &blocks); err != nil || len(blocks) != 1 {
			t.Fatalf("assistant content %s: %v", sent.Messages[1].Content, err)
		}
		var obj map[string]json.RawMessage
		if json.Unmarshal(blocks[0].Input, &obj) != nil || obj == nil {
			t.Fatalf("tool input %s is not an object", blocks[0].Input)
		}
		if th := body.Thinking; th != nil && (th.BudgetTokens < minThinkingBudget || th.BudgetTokens >= body.MaxTokens) {
			t.Fatalf("budget %d with max_tokens %d", th.BudgetTokens, body.MaxTokens)
		}
	})
}
