package formatcheck

import (
	"errors"
	"strings"
	"testing"
)

// FuzzCompileSchema: any schema document is compiled or refused with a SchemaError, within
// the limits, and an answer checked under one that compiled never panics.
func FuzzCompileSchema(f *testing.F) {
	for _, seed := range []string{
		`{"type":"object","properties":{"id":{"type":"string"}},"required":["id"]}`,
		`{"$defs":{"n":{"type":"object","properties":{"next":{"$ref":"#/$defs/n"}}}},"$ref":"#/$defs/n"}`,
		`{"anyOf":[{"type":"string","pattern":"^a+$"},{"type":"number","minimum":0}]}`,
		`{"type":"array","items":{"$ref":"#"},"maxItems":3}`,
		`{"$ref":"#/$defs/a~1b","$defs":{"a/b":{"enum":[1,"x",null]}}}`,
		`true`, `false`, `"notaschema"`, `{`, `{"$anchor":"x"}`,
		strings.Repeat(`{"items":`, 40) + `{}` + strings.Repeat(`}`, 40),
		refChain(12),
	} {
		f.Add(seed, `{"id":"x","next":{"id":"y"}}`)
	}
	cfg := DefaultConfig()
	cfg.MaxSchemaNodes = 300 // small limits keep each input cheap, as the defaults keep requests
	c, err := New(cfg)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, schema, answer string) {
		if err := c.CompileSchema(t.Context(), schema); err != nil {
			if _, ok := errors.AsType[*SchemaError](err); !ok {
				t.Fatalf("CompileSchema error %T %v, want a *SchemaError", err, err)
			}
			return
		}
		res := c.Check(Answer{Content: answer, Format: Format{Type: FormatJSONSchema, JSONSchema: schema}})
		if res.Passed == anyBlockingFinding(res.Findings) {
			t.Fatalf("Passed %v with findings %v", res.Passed, res.Findings)
		}
	})
}

// FuzzCheck: any answer, in any of the formats, is checked without a panic, and the
// verdict agrees with the findings.
func FuzzCheck(f *testing.F) {
	for _, seed := range []string{
		"A breaker stops calls to a failing service.",
		"```json\n{\"answer\": \"yes\", \"confidence\": 0.9}\n```",
		`{"answer": "yes", "confidence": 0.1}`,
		"I'm sorry, but I can't help with that.",
		"抱歉，我不能回答。抱歉，我不能回答。抱歉，我不能回答。抱歉，我不能回答。",
		"<div>hi</div> ```unclosed",
		"\xff\xfe bad bytes", "", "[1,2,3]",
	} {
		f.Add(seed, "stop", uint8(1), true)
	}
	c, err := New(DefaultConfig())
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, content, finish string, format uint8, degraded bool) {
		a := Answer{Content: content, FinishReason: finish, Degraded: degraded, KeepValue: format%2 == 0,
			Format: Format{Type: FormatType(format % 2), RequiredFields: []string{"answer"}}}
		res := c.Check(a)
		if res.Passed == anyBlockingFinding(res.Findings) {
			t.Fatalf("Passed %v with findings %v", res.Passed, res.Findings)
		}
	})
}

func anyBlockingFinding(findings []Finding) bool {
	for _, f := range findings {
		if f.Blocking {
			return true
		}
	}
	return false
}

// FuzzToolCalls: any tool call (name, arguments) against any tool schema and tool_choice
// is checked without a panic; the verdict agrees with the findings, and every tool finding
// names the call it is about.
func FuzzToolCalls(f *testing.F) {
	const params = `{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`
	for _, seed := range [][4]string{
		{"get_weather", `{"city":"Paris"}`, params, ""},
		{"get_weather", `{"city":42}`, params, "required"},
		{"get_weather", `{"city":`, params, "auto"},
		{"other", `{}`, "", "none"},
		{"get_weather", `[]`, `{"$ref":"#/$defs/x","$defs":{"x":{"type":"object"}}}`, "function"},
		{"", "\xff", `{`, "sometimes"},
	} {
		f.Add(seed[0], seed[1], seed[2], seed[3])
	}
	cfg := DefaultConfig()
	cfg.MaxSchemaNodes = 300
	c, err := New(cfg)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, name, args, schema, choice string) {
		res := c.Check(Answer{
			FinishReason: "tool_calls",
			ToolCalls:    []ToolCall{{Name: name, Arguments: args}, {Name: "get_weather", Arguments: args}},
			Tools:        []Tool{{Name: "get_weather", Parameters: schema}},
			ToolChoice:   ToolChoiceOf(choice, "get_weather"),
		})
		if res.Passed == anyBlockingFinding(res.Findings) {
			t.Fatalf("Passed %v with findings %v", res.Passed, res.Findings)
		}
		for _, fd := range res.Findings {
			if strings.HasPrefix(fd.Code, "tool_") && !strings.HasPrefix(fd.Path, "tool_calls[") {
				t.Fatalf("finding %+v does not name its call", fd)
			}
		}
	})
}
