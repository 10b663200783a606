package formatcheck

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const weatherParams = `{"type":"object","properties":{"city":{"type":"string"},"unit":{"enum":["c","f"]}},"required":["city"],"additionalProperties":false}`

var weatherTools = []Tool{
	{Name: "get_weather", Parameters: weatherParams},
	{Name: "now"}, // no parameters schema: any JSON object
}

func TestCheckToolCalls(t *testing.T) {
	t.Parallel()
	c := newTestChecker(t, DefaultConfig())
	call := func(name, args string) ToolCall { return ToolCall{Name: name, Arguments: args} }
	tests := []struct {
		name   string
		answer Answer
		want   []wantFinding
		class  string
	}{
		{
			name:   "valid call",
			answer: Answer{ToolCalls: []ToolCall{call("get_weather", `{"city":"Paris","unit":"c"}`)}, Tools: weatherTools},
		},
		{
			name:   "tool without schema takes any object",
			answer: Answer{ToolCalls: []ToolCall{call("now", `{"anything":[1,2]}`)}, Tools: weatherTools},
		},
		{
			name:   "parallel valid calls with a preamble",
			answer: Answer{Content: "Let me check.", ToolCalls: []ToolCall{call("get_weather", `{"city":"Paris"}`), call("now", `{}`)}, Tools: weatherTools, Format: Format{Type: FormatJSONObject}},
		},
		{
			name:   "arguments not JSON",
			answer: Answer{ToolCalls: []ToolCall{call("get_weather", `{"city":"Par`)}, Tools: weatherTools},
			want:   []wantFinding{{CodeToolCallArguments, "tool_calls[0]:get_weather", true}},
			class:  "ERROR_CLASS_MALFORMED_OUTPUT",
		},
		{
			name:   "empty arguments are not JSON",
			answer: Answer{ToolCalls: []ToolCall{call("now", ``)}, Tools: weatherTools},
			want:   []wantFinding{{CodeToolCallArguments, "tool_calls[0]:now", true}},
			class:  "ERROR_CLASS_MALFORMED_OUTPUT",
		},
		{
			name:   "arguments not an object",
			answer: Answer{ToolCalls: []ToolCall{call("now", `["a"]`)}, Tools: weatherTools},
			want:   []wantFinding{{CodeToolCallArguments, "tool_calls[0]:now", true}},
			class:  "ERROR_CLASS_MALFORMED_OUTPUT",
		},
		{
			name:   "arguments invalid UTF-8",
			answer: Answer{ToolCalls: []ToolCall{call("now", "{\"a\":\"\xff\"}")}, Tools: weatherTools},
			want:   []wantFinding{{CodeToolCallArguments, "tool_calls[0]:now", true}},
			class:  "ERROR_CLASS_MALFORMED_OUTPUT",
		},
		{
			name:   "schema: wrong type and unknown enum value, second call",
			answer: Answer{ToolCalls: []ToolCall{call("now", `{}`), call("get_weather", `{"city":7,"unit":"k"}`)}, Tools: weatherTools},
			want: []wantFinding{
				{CodeToolCallSchema, "tool_calls[1]:get_weather#/city", true},
				{CodeToolCallSchema, "tool_calls[1]:get_weather#/unit", true},
			},
			class: "ERROR_CLASS_MALFORMED_OUTPUT",
		},
		{
			name:   "schema: missing required property is at the arguments' top",
			answer: Answer{ToolCalls: []ToolCall{call("get_weather", `{"unit":"c"}`)}, Tools: weatherTools},
			want:   []wantFinding{{CodeToolCallSchema, "tool_calls[0]:get_weather", true}},
			class:  "ERROR_CLASS_MALFORMED_OUTPUT",
		},
		{
			name:   "tool not offered",
			answer: Answer{ToolCalls: []ToolCall{call("delete_everything", `{}`)}, Tools: weatherTools},
			want:   []wantFinding{{CodeToolCallUnknown, "tool_calls[0]:delete_everything", true}},
			class:  "ERROR_CLASS_MALFORMED_OUTPUT",
		},
		{
			name:   "no tools offered at all",
			answer: Answer{ToolCalls: []ToolCall{call("get_weather", `{"city":"Paris"}`)}},
			want:   []wantFinding{{CodeToolCallUnknown, "tool_calls[0]:get_weather", true}},
			class:  "ERROR_CLASS_MALFORMED_OUTPUT",
		},
		{
			name:   "tool_choice none forbids calls",
			answer: Answer{ToolCalls: []ToolCall{call("get_weather", `{"city":"Paris"}`)}, Tools: weatherTools, ToolChoice: ToolChoice{Mode: "none"}},
			want:   []wantFinding{{CodeToolChoice, "tool_calls[0]:get_weather", true}},
			class:  "ERROR_CLASS_MALFORMED_OUTPUT",
		},
		{
			name:   "tool_choice names another function",
			answer: Answer{ToolCalls: []ToolCall{call("now", `{}`)}, Tools: weatherTools, ToolChoice: ToolChoiceOf("", "get_weather")},
			want:   []wantFinding{{CodeToolChoice, "tool_calls[0]:now", true}},
			class:  "ERROR_CLASS_MALFORMED_OUTPUT",
		},
		{
			name:   "tool_choice function, called",
			answer: Answer{ToolCalls: []ToolCall{call("get_weather", `{"city":"Paris"}`)}, Tools: weatherTools, ToolChoice: ToolChoiceOf("function", "get_weather")},
		},
		{
			name:   "tool_choice required, text answer",
			answer: Answer{Content: "It is sunny.", FinishReason: "stop", Tools: weatherTools, ToolChoice: ToolChoice{Mode: "required"}},
			want:   []wantFinding{{CodeToolChoice, "", true}},
			class:  "ERROR_CLASS_MALFORMED_OUTPUT",
		},
		{
			name:   "tool_choice auto, text answer",
			answer: Answer{Content: "It is sunny.", FinishReason: "stop", Tools: weatherTools, ToolChoice: ToolChoice{Mode: "auto"}},
		},
		{
			name:   "only tool calls: not empty, no refusal check",
			answer: Answer{Content: "", FinishReason: "tool_calls", ToolCalls: []ToolCall{call("now", `{}`)}, Tools: weatherTools},
		},
		{
			name:   "a preamble that reads like a refusal is no refusal when the model calls a tool",
			answer: Answer{Content: "I'm sorry, I can't answer that without looking it up.", ToolCalls: []ToolCall{call("now", `{}`)}, Tools: weatherTools},
		},
		{
			name:   "truncated tool call: truncation first",
			answer: Answer{FinishReason: "length", ToolCalls: []ToolCall{call("get_weather", `{"city":"Pa`)}, Tools: weatherTools},
			want: []wantFinding{
				{CodeTruncated, "", true},
				{CodeToolCallArguments, "tool_calls[0]:get_weather", true},
			},
			class: "ERROR_CLASS_TRUNCATED",
		},
		{
			name:   "empty answer without calls is still empty",
			answer: Answer{Content: " ", Tools: weatherTools},
			want:   []wantFinding{{CodeEmpty, "", true}},
			class:  "ERROR_CLASS_MALFORMED_OUTPUT",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			res := c.Check(tt.answer)
			if diff := cmp.Diff(tt.want, findingKeys(res.Findings)); diff != "" {
				t.Errorf("findings (-want +got):\n%s\nmessages: %q", diff, messages(res.Findings))
			}
			wantClass := tt.class
			if wantClass == "" {
				wantClass = "ERROR_CLASS_NONE"
			}
			if res.Class.String() != wantClass || res.Passed != (tt.class == "") {
				t.Errorf("passed=%t class=%s, want class %s", res.Passed, res.Class, wantClass)
			}
		})
	}
}

func TestToolCallFindingMessagesNameTheCall(t *testing.T) {
	t.Parallel()
	c := newTestChecker(t, DefaultConfig())
	res := c.Check(Answer{ToolCalls: []ToolCall{{Name: "get_weather", Arguments: `{"city":7}`}}, Tools: weatherTools})
	if len(res.Findings) != 1 {
		t.Fatalf("findings = %q", messages(res.Findings))
	}
	msg := res.Findings[0].Message
	for _, want := range []string{`tool call 0 ("get_weather")`, "/city"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
}

// A tool's schema is bounded like a response_format schema: one over the limits is not
// compiled (CompileSchema reports it, for the request to be refused), and Check then
// checks only that the arguments are a JSON object.
func TestToolSchemaBounds(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.MaxSchemaDepth = 3
	c := newTestChecker(t, cfg)
	deep := `{"type":"object","properties":{"a":{"type":"object","properties":{"b":{"type":"string"}}}}}`
	if err := c.CompileSchema(t.Context(), deep); err == nil {
		t.Fatal("CompileSchema accepted a schema over max_schema_depth")
	}
	res := c.Check(Answer{ToolCalls: []ToolCall{{Name: "f", Arguments: `{"a":{"b":1}}`}}, Tools: []Tool{{Name: "f", Parameters: deep}}})
	if !res.Passed {
		t.Errorf("findings = %q, want none (the schema was refused, not applied)", messages(res.Findings))
	}
}
