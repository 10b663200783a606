package cache

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	cachev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/cache/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// TestServerToolCallAnswers stores an answer that is only tool calls and finds it again,
// calls and all, with every backend; an answer finishing tool_calls without calls is not
// stored.
func TestServerToolCallAnswers(t *testing.T) {
	qi := startFakeQdrant(t).index
	calls := []*mantlev1.ToolCall{{Id: "call_a", Type: "function", Name: "convert", Arguments: `{"c":20}`}}
	for name, index := range map[string]Index{"embedded": NewEmbeddedIndex(10, 0), "qdrant": qi} {
		t.Run(name, func(t *testing.T) {
			client, _ := startCache(t, index)
			ctx := asTenant("acme")
			store := storeRequest("acme", protoPrompt("Convert 20 degrees to Fahrenheit"))
			store.Content, store.FinishReason, store.ToolCalls = "", "tool_calls", calls
			stored, err := client.Store(ctx, store)
			if err != nil || !stored.GetStored() {
				t.Fatalf("Store = %v, %v", stored, err)
			}
			resp, err := client.Lookup(ctx, &cachev1.LookupRequest{Quality: &mantlev1.QualityContext{Tenant: "acme"}, Prompt: protoPrompt("Convert 20 degrees to Fahrenheit")})
			if err != nil || !resp.GetHit() {
				t.Fatalf("Lookup = %v, %v", resp, err)
			}
			if got := resp.GetEntry().GetToolCalls(); len(got) != 1 || !proto.Equal(got[0], calls[0]) || resp.GetEntry().GetFinishReason() != "tool_calls" {
				t.Errorf("entry %v, want the tool calls back", resp.GetEntry())
			}
			empty := storeRequest("acme", protoPrompt("Convert 30 degrees to Fahrenheit"))
			empty.Content, empty.FinishReason = "", "tool_calls"
			if _, err := client.Store(ctx, empty); err == nil {
				t.Error("an answer with neither content nor tool calls was accepted")
			}
		})
	}
}

func TestServerRefusesMessagesBeyondText(t *testing.T) {
	client, _ := startCache(t, NewEmbeddedIndex(10, 0))
	for field, m := range map[string]*mantlev1.ChatMessage{
		"prompt.messages[0].parts":        {Role: "system", Parts: []*mantlev1.ContentPart{{Part: &mantlev1.ContentPart_Text{Text: "x"}}}},
		"prompt.messages[0].tool_calls":   {Role: "assistant", ToolCalls: []*mantlev1.ToolCall{{Id: "c"}}},
		"prompt.messages[0].tool_call_id": {Role: "tool", ToolCallId: "c", Content: "x"},
		"prompt.messages[0].refusal":      {Role: "assistant", Refusal: "no"},
	} {
		p := protoPrompt("hi")
		p.Messages[0] = m
		_, err := client.Lookup(asTenant("acme"), &cachev1.LookupRequest{Quality: &mantlev1.QualityContext{Tenant: "acme"}, Prompt: p})
		assertStatus(t, err, codes.InvalidArgument, rpc.ReasonInvalidRequest, []string{field})
	}
}
