package formatcheck

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// ToolCall is one tool call of an answer, as far as the checks are concerned.
type ToolCall struct {
	// Name is the function the model called.
	Name string
	// Arguments is the JSON text the model wrote, unparsed.
	Arguments string
}

// Tool is a function the request offered.
type Tool struct {
	Name string
	// Parameters is the JSON Schema of the arguments as the caller wrote it; "" when none
	// was given (the arguments must still be a JSON object).
	Parameters string
}

// ToolChoice is what the request said about calling tools.
type ToolChoice struct {
	// Mode is auto (or ""), none, required or function.
	Mode string
	// Function is the only function the answer may call, with Mode function.
	Function string
}

// ToolCallsFromProto converts an answer's tool calls.
func ToolCallsFromProto(calls []*mantlev1.ToolCall) []ToolCall {
	if len(calls) == 0 {
		return nil
	}
	out := make([]ToolCall, len(calls))
	for i, c := range calls {
		out[i] = ToolCall{Name: c.GetName(), Arguments: c.GetArguments()}
	}
	return out
}

// ToolsFromProto converts a request's tools.
func ToolsFromProto(tools []*mantlev1.Tool) []Tool {
	if len(tools) == 0 {
		return nil
	}
	out := make([]Tool, len(tools))
	for i, t := range tools {
		out[i] = Tool{Name: t.GetName(), Parameters: t.GetParameters()}
	}
	return out
}

// ToolChoiceOf reads a request's tool_choice: a function name alone means mode function.
func ToolChoiceOf(mode, function string) ToolChoice {
	if function != "" {
		mode = "function"
	}
	return ToolChoice{Mode: mode, Function: function}
}

// requiresCall reports whether the answer must call a tool.
func (tc ToolChoice) requiresCall() bool { return tc.Mode == "required" || tc.Mode == "function" }

// ToolCallPath is the Path of a finding about tool call i of the answer, calling name,
// at pointer (an RFC 6901 JSON pointer into its arguments, "" for the whole call):
// "tool_calls[0]:get_weather#/unit". The name is cut to 64 bytes: it comes from the model.
func ToolCallPath(i int, name, pointer string) string {
	p := "tool_calls[" + strconv.Itoa(i) + "]:" + abbreviate(name, 64)
	if pointer != "" {
		p += "#" + pointer
	}
	return p
}

// checkToolCalls checks every tool call of a against the tools the request offered and
// its tool_choice, and an answer without calls against a tool_choice that demands one.
// A bad call is a malformed answer, like JSON that does not parse: another model may
// call the tool correctly.
func (c *Checker) checkToolCalls(a Answer) []Finding {
	var findings []Finding
	if len(a.ToolCalls) == 0 {
		if a.ToolChoice.requiresCall() {
			want := "a tool call"
			if a.ToolChoice.Mode == "function" {
				want = "a call of " + strconv.Quote(abbreviate(a.ToolChoice.Function, 64))
			}
			findings = append(findings, blocking(CodeToolChoice, "", malformed,
				fmt.Sprintf("tool_choice %s asks for %s; the answer has none", a.ToolChoice.Mode, want)))
		}
		return findings
	}
	offered := make(map[string]Tool, len(a.Tools))
	for _, t := range a.Tools {
		if _, dup := offered[t.Name]; !dup {
			offered[t.Name] = t
		}
	}
	for i, call := range a.ToolCalls {
		path := ToolCallPath(i, call.Name, "")
		prefix := fmt.Sprintf("tool call %d (%q): ", i, abbreviate(call.Name, 64))
		switch {
		case a.ToolChoice.Mode == "none":
			findings = append(findings, blocking(CodeToolChoice, path, malformed,
				prefix+"tool_choice none forbids tool calls"))
			continue
		case a.ToolChoice.Mode == "function" && call.Name != a.ToolChoice.Function:
			findings = append(findings, blocking(CodeToolChoice, path, malformed,
				prefix+fmt.Sprintf("tool_choice names %q; no other function may be called", abbreviate(a.ToolChoice.Function, 64))))
			continue
		}
		tool, ok := offered[call.Name]
		if !ok {
			findings = append(findings, blocking(CodeToolCallUnknown, path, malformed,
				prefix+"the request offered no tool of this name"))
			continue
		}
		findings = append(findings, c.checkArguments(i, call, tool, prefix)...)
	}
	return findings
}

// checkArguments checks one call's arguments: a JSON object, valid against the tool's
// parameters schema when it has one that compiles (the router and the verifier refuse a
// request whose schema does not, before any model is asked).
func (c *Checker) checkArguments(i int, call ToolCall, tool Tool, prefix string) []Finding {
	path := ToolCallPath(i, call.Name, "")
	if !utf8.ValidString(call.Arguments) {
		return []Finding{blocking(CodeToolCallArguments, path, malformed, prefix+"the arguments are not valid UTF-8")}
	}
	var value any
	if err := json.Unmarshal([]byte(call.Arguments), &value); err != nil {
		return []Finding{blocking(CodeToolCallArguments, path, malformed,
			prefix+fmt.Sprintf("the arguments are not valid JSON: %v", err))}
	}
	if _, ok := value.(map[string]any); !ok {
		return []Finding{blocking(CodeToolCallArguments, path, malformed,
			prefix+fmt.Sprintf("the arguments must be a JSON object, got %s", jsonKind(strings.TrimSpace(call.Arguments)[0])))}
	}
	if strings.TrimSpace(tool.Parameters) == "" {
		return nil
	}
	schema, err := c.schemas.get(context.Background(), tool.Parameters)
	if err != nil {
		return nil
	}
	var findings []Finding
	for _, f := range schemaFindings(schema, value, c.cfg.MaxSchemaFindings) {
		f.Code = CodeToolCallSchema
		if f.Path != "" {
			f.Path = ToolCallPath(i, call.Name, f.Path)
		} else {
			f.Path = path
		}
		f.Message = prefix + strings.Replace(f.Message, "the top level", "the arguments", 1)
		findings = append(findings, f)
	}
	return findings
}
