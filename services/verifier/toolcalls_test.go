package verifier

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
)

// TestServerVerifyToolCalls sends tool-calling answers through the gRPC server, as the
// router does: a bad call is an L1 failure of class malformed output (the router fails
// over on it like on JSON that does not parse), with the failing call and JSON pointer in
// the finding's path; an answer that is only tool calls is not empty.
func TestServerVerifyToolCalls(t *testing.T) {
	t.Parallel()
	client := startVerifier(t, DefaultConfig())
	tools := []*mantlev1.Tool{
		{Type: "function", Name: "get_weather", Parameters: `{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`},
		{Type: "function", Name: "now"},
	}
	call := func(name, args string) *mantlev1.ToolCall {
		return &mantlev1.ToolCall{Id: "call_1", Type: "function", Name: name, Arguments: args}
	}
	type finding struct{ Code, Path string }
	tests := []struct {
		name  string
		req   *verifierv1.VerifyRequest
		class mantlev1.ErrorClass
		want  []finding
	}{
		{
			name:  "only tool calls, valid",
			req:   &verifierv1.VerifyRequest{FinishReason: "tool_calls", ToolCalls: []*mantlev1.ToolCall{call("get_weather", `{"city":"Paris"}`)}, Tools: tools},
			class: mantlev1.ErrorClass_ERROR_CLASS_NONE,
		},
		{
			name:  "arguments not JSON",
			req:   &verifierv1.VerifyRequest{FinishReason: "tool_calls", ToolCalls: []*mantlev1.ToolCall{call("get_weather", `{"city":`)}, Tools: tools},
			class: mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
			want:  []finding{{CodeToolCallArguments, "tool_calls[0]:get_weather"}},
		},
		{
			name:  "arguments against the schema",
			req:   &verifierv1.VerifyRequest{FinishReason: "tool_calls", ToolCalls: []*mantlev1.ToolCall{call("now", `{}`), call("get_weather", `{"city":["Paris"]}`)}, Tools: tools},
			class: mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
			want:  []finding{{CodeToolCallSchema, "tool_calls[1]:get_weather#/city"}},
		},
		{
			name:  "a tool not offered",
			req:   &verifierv1.VerifyRequest{FinishReason: "tool_calls", ToolCalls: []*mantlev1.ToolCall{call("rm_rf", `{}`)}, Tools: tools},
			class: mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
			want:  []finding{{CodeToolCallUnknown, "tool_calls[0]:rm_rf"}},
		},
		{
			name:  "tool_choice none",
			req:   &verifierv1.VerifyRequest{FinishReason: "tool_calls", ToolCalls: []*mantlev1.ToolCall{call("now", `{}`)}, Tools: tools, ToolChoice: "none"},
			class: mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
			want:  []finding{{CodeToolChoice, "tool_calls[0]:now"}},
		},
		{
			name:  "tool_choice names another function",
			req:   &verifierv1.VerifyRequest{FinishReason: "tool_calls", ToolCalls: []*mantlev1.ToolCall{call("now", `{}`)}, Tools: tools, ToolChoice: "function", ToolChoiceFunction: "get_weather"},
			class: mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
			want:  []finding{{CodeToolChoice, "tool_calls[0]:now"}},
		},
		{
			name:  "tool_choice required, answered in text",
			req:   &verifierv1.VerifyRequest{Content: "It is sunny in Paris.", FinishReason: "stop", Tools: tools, ToolChoice: "required"},
			class: mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
			want:  []finding{{CodeToolChoice, ""}},
		},
		{
			name:  "no content and no calls is empty",
			req:   &verifierv1.VerifyRequest{FinishReason: "stop", Tools: tools},
			class: mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
			want:  []finding{{CodeEmpty, ""}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.req.Quality = &mantlev1.QualityContext{Tenant: "acme", RequestId: "req-tools"}
			resp, err := client.Verify(asTenant("acme"), tt.req)
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if resp.GetFailureClass() != tt.class || resp.GetPassed() != (tt.class == mantlev1.ErrorClass_ERROR_CLASS_NONE) {
				t.Errorf("passed=%t class=%v, want class %v; findings %v", resp.GetPassed(), resp.GetFailureClass(), tt.class, resp.GetFindings())
			}
			var got []finding
			for _, f := range resp.GetFindings() {
				if f.GetBlocking() {
					got = append(got, finding{f.GetCode(), f.GetPath()})
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("blocking findings (-want +got):\n%s", diff)
			}
			if tt.class == mantlev1.ErrorClass_ERROR_CLASS_NONE {
				return
			}
			if v := resp.GetQuality().GetVerification(); v.GetL1Passed() || len(v.GetL1Failures()) == 0 {
				t.Errorf("quality.verification = %v, want L1 failed with its codes", v)
			}
		})
	}
}
