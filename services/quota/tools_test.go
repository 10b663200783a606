package quota

import (
	"context"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	quotav1 "github.com/mantle-mesh/mantle/pkg/api/mantle/quota/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/services/quota/internal/tokencount"
)

const weatherParamsPretty = `{
  "type": "object",
  "properties": {"city": {"type": "string"}},
  "required": ["city"]
}`

var weatherTool = &mantlev1.Tool{Type: "function", Name: "get_weather", Description: "Weather of a city", Parameters: weatherParamsPretty}

// A tenant whose prompt is mostly tool definitions or tool results is charged for them,
// through the quota module as production builds it, on Redis: the definitions are in
// the reservation, and tool results beyond the tenant's TPM are refused as too large.
func TestReserveChargesToolsThroughRedis(t *testing.T) {
	t.Parallel()
	c := newTestRedisClient(t)
	w := newWiring(t, redisAddrForTest(t), testPrefix(t, c))
	client := w.replicas[0].client
	msgs := []*mantlev1.ChatMessage{{Role: "user", Content: "weather in Paris?"}}
	reserve := func(msgs []*mantlev1.ChatMessage, tools []*mantlev1.Tool) (*quotav1.ReserveResponse, error) {
		return client.Reserve(context.Background(), &quotav1.ReserveRequest{
			Quality: &mantlev1.QualityContext{RequestId: "tools", Tenant: "acme"},
			Model:   "gpt-4o", MaxOutputTokens: 1, Messages: msgs, Tools: tools,
		})
	}
	plain, err := reserve(msgs, nil)
	if err != nil {
		t.Fatal(err)
	}
	// 1500 words of description: 1500 tokens in o200k_base, whatever the messages say.
	bulky := &mantlev1.Tool{Type: "function", Name: "get_weather", Description: strings.Repeat(" weather", 1500), Parameters: weatherParamsPretty}
	withTools, err := reserve(msgs, []*mantlev1.Tool{bulky})
	if err != nil {
		t.Fatal(err)
	}
	want := tokencount.NewCounter(tokencount.Config(DefaultConfig().Tokens)).Count("gpt-4o", messagesFromProto(msgs), []*mantlev1.Tool{bulky}, "", true).Tokens
	if got := withTools.GetInputTokens(); got != want || got < plain.GetInputTokens()+1500 {
		t.Errorf("input tokens with a 12 KB tool: %d, want %d (and at least %d + 1500)", got, want, plain.GetInputTokens())
	}
	if spent := plain.GetLimits().GetRemainingTokens() - withTools.GetLimits().GetRemainingTokens(); spent != withTools.GetReservedTokens() {
		t.Errorf("the tenant's TPM went down by %d, want the %d reserved", spent, withTools.GetReservedTokens())
	}

	// 40 KB of tool result: more than the tenant's 6000 tokens a minute.
	results := append(slices.Clip(msgs), // a new array: msgs stays as it was
		&mantlev1.ChatMessage{Role: "assistant", ToolCalls: []*mantlev1.ToolCall{{Id: "call_1", Type: "function", Name: "get_weather", Arguments: `{"city":"Paris"}`}}},
		&mantlev1.ChatMessage{Role: "tool", ToolCallId: "call_1", Content: strings.Repeat("sunny and warm ", 2700)},
	)
	_, err = reserve(results, []*mantlev1.Tool{weatherTool})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("40 KB of tool results: %v, want FAILED_PRECONDITION (larger than the tenant's TPM)", err)
	}
}
