package router

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	cachev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/cache/v1"
	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/pkg/formatcheck"
	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

var weatherTool = &mantlev1.Tool{Type: "function", Name: "get_weather",
	Parameters: `{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`}

func toolReply(args string) result {
	return result{res: provider.Response{FinishReason: "tool_calls", Usage: provider.Usage{InputTokens: 10, OutputTokens: 5},
		ToolCalls: []provider.ToolCall{{ID: "call_1", Type: "function", Name: "get_weather", Arguments: args}}}}
}

func toolRequest() *routerv1.Request {
	req := ask("chat")
	req.Tools = []*mantlev1.Tool{weatherTool}
	req.ToolChoice = "required"
	return req
}

// The verifier is sent what it needs to check tool calls (the answer's calls, the tools,
// tool_choice), and quota the tools, whose definitions are prompt tokens.
func TestToolRequestReachesVerifierAndQuota(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var sent []*verifierv1.VerifyRequest
	h := newHarness(t, testConfig(), &harness{
		providers: map[string]*fakeProvider{"a": newFakeProvider(toolReply(`{"city":"Paris"}`))},
		verifier: &fakeVerifier{verdict: func(in *verifierv1.VerifyRequest) (*verifierv1.VerifyResponse, error) {
			mu.Lock()
			defer mu.Unlock()
			sent = append(sent, proto.CloneOf(in))
			return pass(in), nil
		}},
	})
	req := toolRequest()
	if _, err := h.router.Complete(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != 1 {
		t.Fatalf("%d verify requests, want 1", len(sent))
	}
	got := sent[0]
	want := &verifierv1.VerifyRequest{
		Tools: req.Tools, ToolChoice: "required",
		ToolCalls: []*mantlev1.ToolCall{{Id: "call_1", Type: "function", Name: "get_weather", Arguments: `{"city":"Paris"}`}},
	}
	if diff := cmp.Diff(want, got, protocmp.Transform(), protocmp.IgnoreFields(&verifierv1.VerifyRequest{},
		"quality", "messages", "content", "finish_reason", "model", "session_id", "response_format")); diff != "" {
		t.Errorf("verify request (-want +got):\n%s", diff)
	}
	reserves := h.quota.reserveRequests()
	if len(reserves) != 1 || !cmp.Equal(req.Tools, reserves[0].GetTools(), protocmp.Transform()) {
		t.Errorf("reserve requests %v, want one carrying the tools", reserves)
	}
}

// With the verifier off, the router's own L1 check fails a tool call with bad arguments
// over to the next candidate, like malformed JSON.
func TestToolCallCheckedLocally(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(), &harness{providers: map[string]*fakeProvider{
		"a": newFakeProvider(toolReply(`{"city":42}`)),
		"b": newFakeProvider(toolReply(`{"city":"Paris"}`)),
	}})
	checker, err := formatcheck.New(formatcheck.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	h.router.deps.Checker, h.router.deps.Verifier = checker, nil
	resp, err := h.router.Complete(context.Background(), toolRequest())
	if err != nil {
		t.Fatal(err)
	}
	if calls := resp.GetMessage().GetToolCalls(); resp.GetModel() != "b" || len(calls) != 1 || calls[0].GetArguments() != `{"city":"Paris"}` {
		t.Errorf("answered by %s with %v, want b's call", resp.GetModel(), calls)
	}
	if diff := cmp.Diff([]string{"a:malformed_output", "b:none"}, attemptsOf(resp.GetQuality())); diff != "" {
		t.Errorf("attempts (-want +got):\n%s", diff)
	}
	if msg := resp.GetQuality().GetAttempts()[0].GetErrorMessage(); !strings.HasSuffix(msg, "verification failed: tool_call_schema (at tool_calls[0]:get_weather#/city)") {
		t.Errorf("first attempt's error %q, want the failing call named", msg)
	}
}

// A tool whose parameters schema the checker cannot use is refused before any model is
// asked, naming the field, like a response_format schema.
func TestToolSchemaRefusedUpFront(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(), nil)
	req := ask("chat")
	req.Tools = []*mantlev1.Tool{weatherTool, {Type: "function", Name: "bad", Parameters: `{"type":"object","properties":{"x":{"$ref":"https://example.com/s.json"}}}`}}
	_, err := h.router.Complete(context.Background(), req)
	if fields := rpc.BadRequestFields(toStatus(err)); !cmp.Equal(fields, []string{"request.tools[1].function.parameters"}) {
		t.Errorf("err = %v (fields %v), want a refusal of request.tools[1].function.parameters", err, fields)
	}
	if n := len(h.providers["a"].requests()); n != 0 {
		t.Errorf("%d provider calls, want none", n)
	}
}

// A cached tool-call answer is verified again for the request that would get it: a call
// of a tool this request does not offer is not served, and a model answers instead.
func TestCachedToolCallReverified(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(), &harness{
		providers: map[string]*fakeProvider{"a": newFakeProvider(toolReply(`{"city":"Paris"}`))},
		cache: &fakeCache{coalesced: time.Millisecond, hit: &cachev1.Entry{Id: "e1", SourceModel: "a", FinishReason: "tool_calls",
			ToolCalls: []*mantlev1.ToolCall{{Id: "call_old", Type: "function", Name: "rm_rf", Arguments: `{}`}}}},
	})
	h.cache.clock = h.clock
	checker, err := formatcheck.New(formatcheck.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	h.router.deps.Checker, h.router.deps.Verifier = checker, nil
	resp, err := h.router.Complete(context.Background(), toolRequest())
	if err != nil {
		t.Fatal(err)
	}
	calls := resp.GetMessage().GetToolCalls()
	if resp.GetQuality().GetCacheHit() || len(calls) != 1 || calls[0].GetName() != "get_weather" {
		t.Errorf("cache hit %t, calls %v; want the model's get_weather call, not the cached rm_rf", resp.GetQuality().GetCacheHit(), calls)
	}
	if n := len(h.providers["a"].requests()); n != 1 {
		t.Errorf("%d provider calls, want 1", n)
	}
}
