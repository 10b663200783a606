package mesh_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/mantle-mesh/mantle/pkg/anthropicapi"
)

// postMessages sends body to /v1/messages as the Anthropic SDK does (x-api-key and
// anthropic-version); a refusal's field is read from its message ("invalid <field>: ...").
func postMessages(t *testing.T, base, body string) compatResult {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/messages", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("x-api-key", compatKey)
	req.Header.Set("anthropic-version", "2023-06-01")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	out := compatResult{status: resp.StatusCode, body: b}
	var e anthropicapi.Error
	if resp.StatusCode != http.StatusOK && json.Unmarshal(b, &e) == nil {
		if m := invalidField.FindStringSubmatch(e.Error.Message); m != nil {
			out.param = strings.TrimPrefix(m[1], "request.")
		}
	}
	return out
}

var invalidField = regexp.MustCompile(`^invalid ([^:]+):`)

const question = `{"role":"user","content":"weather in Paris?"}`

// messagesCases are the Messages API fields, sent through /v1/messages to the OpenAI-type
// recording upstream: forwarded (what the upstream must receive) or refused (the field
// the error names), as in compatCases.
var messagesCases = []compatCase{
	{field: "model", body: `"messages":[` + question + `]`, forwarded: map[string]string{"model": `"gpt"`, "messages": `[` + question + `]`}},
	{field: "messages", body: `"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},` + question + `]`,
		forwarded: map[string]string{"messages": `[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},` + question + `]`}},
	{field: "messages[].content (text blocks)", body: `"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]`,
		forwarded: map[string]string{"messages": `[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]`}},
	{field: "messages[].content (image base64)", body: `"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},{"type":"text","text":"what is this?"}]}]`,
		forwarded: map[string]string{"messages": `[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}},{"type":"text","text":"what is this?"}]}]`}},
	{field: "messages[].content (image url)", body: `"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"https://example.com/a.png"}}]}]`,
		forwarded: map[string]string{"messages": `[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]}]`}},
	{field: "messages[].content (document)", body: `"messages":[{"role":"user","content":[{"type":"document","title":"a.pdf","source":{"type":"base64","media_type":"application/pdf","data":"JVBERg=="}}]}]`,
		forwarded: map[string]string{"messages": `[{"role":"user","content":[{"type":"file","file":{"filename":"a.pdf","file_data":"data:application/pdf;base64,JVBERg=="}}]}]`}},
	{field: "messages[].content (tool_use, tool_result)", body: `"tools":[{"name":"get_weather","input_schema":{"type":"object"}}],"messages":[` + question + `,{"role":"assistant","content":[{"type":"text","text":"let me look"},{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"sunny"}]}]`,
		forwarded: map[string]string{"messages": `[` + question + `,{"role":"assistant","content":[{"type":"text","text":"let me look"}],"tool_calls":[{"id":"toolu_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"toolu_1","content":"sunny"}]`}},
	{field: "messages[].content (tool_result blocks)", body: `"tools":[{"name":"get_weather","input_schema":{"type":"object"}}],"messages":[` + question + `,{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"sunny"}]},{"type":"text","text":"thanks"}]}]`,
		forwarded: map[string]string{"messages": `[` + question + `,{"role":"assistant","content":null,"tool_calls":[{"id":"toolu_1","type":"function","function":{"name":"get_weather","arguments":"{}"}}]},{"role":"tool","tool_call_id":"toolu_1","content":[{"type":"text","text":"sunny"}]},{"role":"user","content":[{"type":"text","text":"thanks"}]}]`}},
	{field: "messages[].content (tool_result is_error)", body: `"tools":[{"name":"get_weather","input_schema":{"type":"object"}}],"messages":[` + question + `,{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"timeout","is_error":true}]}]`,
		refused: "messages[].content[].is_error"},
	{field: "system", body: `"system":"be brief","messages":[` + question + `]`,
		forwarded: map[string]string{"messages": `[{"role":"system","content":"be brief"},` + question + `]`}},
	{field: "system (text blocks)", body: `"system":[{"type":"text","text":"be brief"}],"messages":[` + question + `]`,
		forwarded: map[string]string{"messages": `[{"role":"system","content":[{"type":"text","text":"be brief"}]},` + question + `]`}},
	{field: "max_tokens", body: ``, forwarded: map[string]string{"max_tokens": `2048`}},
	{field: "stop_sequences", body: `"stop_sequences":["END","STOP"]`, forwarded: map[string]string{"stop": `["END","STOP"]`}},
	{field: "temperature", body: `"temperature":0.3`, forwarded: map[string]string{"temperature": `0.3`}},
	{field: "top_p", body: `"top_p":0.9`, forwarded: map[string]string{"top_p": `0.9`}},
	{field: "top_k", body: `"top_k":40`, refused: "top_k"},
	{field: "tools", body: `"tools":[{"name":"get_weather","description":"Weather of a city","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}]`,
		forwarded: map[string]string{"tools": `[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]`}},
	{field: "tool_choice (auto)", body: `"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"auto"}`, forwarded: map[string]string{"tool_choice": `"auto"`}},
	{field: "tool_choice (any)", body: `"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"any"}`, forwarded: map[string]string{"tool_choice": `"required"`}},
	{field: "tool_choice (tool)", body: `"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"f"}`,
		forwarded: map[string]string{"tool_choice": `{"type":"function","function":{"name":"f"}}`}},
	{field: "tool_choice (none)", body: `"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"none"}`, forwarded: map[string]string{"tool_choice": `"none"`}},
	{field: "tool_choice.disable_parallel_tool_use", body: `"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"auto","disable_parallel_tool_use":true}`,
		forwarded: map[string]string{"parallel_tool_calls": `false`}},
	{field: "metadata.user_id", body: `"metadata":{"user_id":"u-1"}`, forwarded: map[string]string{"user": `"u-1"`}},
	{field: "thinking", body: `"thinking":{"type":"enabled","budget_tokens":1024}`, refused: "thinking"},
	{field: "stream", body: `"stream":true`, forwarded: map[string]string{"stream": `true`}},
	{field: "container", body: `"container":"c-1"`, refused: "container"},
	{field: "mcp_servers", body: `"mcp_servers":[]`, refused: "mcp_servers"},
	{field: "context_management", body: `"context_management":{}`, refused: "context_management"},
	{field: "service_tier", body: `"service_tier":"auto"`, refused: "service_tier"},
	{field: "cache_control", body: `"messages":[{"role":"user","content":[{"type":"text","text":"x","cache_control":{"type":"ephemeral"}}]}]`, refused: "messages[0].content[0].cache_control"},
	{field: "thinking blocks", body: `"messages":[` + question + `,{"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"}]}]`, refused: "messages[1].content[0].type"},
	{field: "server tools", body: `"tools":[{"type":"web_search_20250305","name":"web_search"}]`, refused: "tools[0].type"},
	{field: "unknown top-level field", body: `"frequency_penalty":1`, refused: "frequency_penalty"},
	{field: "unknown block field", body: `"messages":[{"role":"user","content":[{"type":"text","text":"x","lang":"en"}]}]`, refused: "messages[0].content[0].lang"},
	{field: "unknown block type", body: `"messages":[{"role":"user","content":[{"type":"video","source":{}}]}]`, refused: "messages[0].content[0].type"},
}

// TestMessagesCompatibilityTable: every documented Messages API field, and unknown ones,
// through /v1/messages of a whole mesh to a recording OpenAI-type upstream: forwarded as
// the chat completions field that means the same, or refused naming it. Each is sent to an
// Anthropic-only route too: carried (one call to the Anthropic-type upstream), its
// candidate skipped (400, no call), or refused at the door. The outcomes are checked
// against docs/compatibility.md.
func TestMessagesCompatibilityTable(t *testing.T) {
	up, antUp, base := startCompat(t)
	outcomes, antOutcomes := map[string]string{}, map[string]string{}
	for i, tc := range messagesCases {
		// 2048 leaves room for a thinking budget, which Anthropic wants below max_tokens.
		body := `{"model":"chat","max_tokens":2048,` + tc.body + `}`
		if !strings.Contains(tc.body, `"messages"`) {
			sep := ","
			if tc.body == "" {
				sep = ""
			}
			body = fmt.Sprintf(`{"model":"chat","max_tokens":2048,"messages":[{"role":"user","content":"weather in Paris? (messages row %d)"}]%s%s}`, i, sep, tc.body)
		}
		antBefore := antUp.Count()
		antRes := postMessages(t, base, strings.Replace(body, `"model":"chat"`, `"model":"anthropic-only"`, 1))
		switch {
		case antRes.status == http.StatusOK && antUp.Count() == antBefore+1:
			antOutcomes[tc.field] = "carried"
		case antRes.status == http.StatusBadRequest && antUp.Count() == antBefore && strings.Contains(string(antRes.body), "no model of route"):
			antOutcomes[tc.field] = "skipped"
		case antRes.status == http.StatusBadRequest && antUp.Count() == antBefore:
			// refused at the door: no entry
		default:
			t.Errorf("%s (Anthropic): HTTP %d after %d upstream calls (%s)", tc.field, antRes.status, antUp.Count()-antBefore, antRes.body)
		}
		before := up.Count()
		res := postMessages(t, base, body)
		switch {
		case tc.refused != "":
			outcomes[tc.field] = "refused"
			if res.status != http.StatusBadRequest || res.param != tc.refused {
				t.Errorf("%s: got HTTP %d naming %q (%s), want 400 naming %q", tc.field, res.status, res.param, res.body, tc.refused)
			}
			if up.Count() != before {
				t.Errorf("%s: refused, yet the upstream was called", tc.field)
			}
		default:
			outcomes[tc.field] = "forwarded"
			if res.status != http.StatusOK || up.Count() != before+1 {
				t.Errorf("%s: got HTTP %d (%s) after %d upstream calls, want it forwarded in one", tc.field, res.status, res.body, up.Count()-before)
				continue
			}
			got := up.Last(t)
			for member, want := range tc.forwarded {
				if !jsonEqual(got[member], []byte(want)) {
					t.Errorf("%s: the upstream received %s = %s, want %s", tc.field, member, got[member], want)
				}
			}
		}
	}
	for _, f := range append(slices.Clone(anthropicapi.Forwarded), keys(anthropicapi.Refused)...) {
		found := false
		for field := range outcomes {
			if field == f || strings.HasPrefix(field, f+" ") || strings.HasPrefix(field, f+".") || strings.HasPrefix(field, f+"[") {
				found = true
			}
		}
		if !found {
			t.Errorf("field %s has no row in messagesCases", f)
		}
	}
	checkCompatibilityDoc(t, "`POST /v1/messages`: field by field", outcomes, antOutcomes)
}

// TestMessagesThroughTheMesh: the Anthropic shapes of a whole mesh's answers: text, tool
// calls (unary, and streamed from the upstream's interleaved pieces as one block at a
// time), and errors.
func TestMessagesThroughTheMesh(t *testing.T) {
	_, _, base := startCompat(t)
	const tools = `"tools":[{"name":"get_weather","input_schema":{"type":"object"}},{"name":"get_time","input_schema":{"type":"object"}}]`
	want := `[{"type":"tool_use","id":"call_a","name":"get_weather","input":{"city":"Paris"}},{"type":"tool_use","id":"call_b","name":"get_time","input":{"tz":"CET"}}]`

	res := postMessages(t, base, `{"model":"chat","max_tokens":50,"messages":[`+question+`]}`)
	var msg anthropicapi.Message
	if err := json.Unmarshal(res.body, &msg); err != nil || res.status != http.StatusOK {
		t.Fatalf("text: HTTP %d %s (%v)", res.status, res.body, err)
	}
	if msg.Type != "message" || msg.Role != "assistant" || msg.Model != "gpt" || len(msg.Content) != 1 || *msg.Content[0].Text != "ok" ||
		*msg.StopReason != "end_turn" || msg.Usage != (anthropicapi.Usage{InputTokens: 5, OutputTokens: 3}) || !strings.HasPrefix(msg.ID, "msg_") {
		t.Errorf("text answer %s", res.body)
	}

	res = postMessages(t, base, `{"model":"chat","max_tokens":50,"messages":[`+question+`],`+tools+`}`)
	var unary struct {
		Content    json.RawMessage `json:"content"`
		StopReason string          `json:"stop_reason"`
	}
	if err := json.Unmarshal(res.body, &unary); err != nil || res.status != http.StatusOK {
		t.Fatalf("tools: HTTP %d %s (%v)", res.status, res.body, err)
	}
	if !jsonEqual(unary.Content, []byte(want)) || unary.StopReason != "tool_use" {
		t.Errorf("tools answer %s, want content %s and stop_reason tool_use", res.body, want)
	}

	res = postMessages(t, base, `{"model":"chat","max_tokens":50,"stream":true,"messages":[`+question+`],`+tools+`}`)
	if res.status != http.StatusOK {
		t.Fatalf("stream: HTTP %d %s", res.status, res.body)
	}
	// Rebuild the message from its events, as an SDK does.
	var names []string
	var blocks []map[string]any
	var partial []string
	stop := ""
	for _, ev := range strings.Split(strings.TrimSpace(string(res.body)), "\n\n") {
		lines := strings.SplitN(ev, "\n", 2)
		name := strings.TrimPrefix(lines[0], "event: ")
		names = append(names, name)
		var data map[string]any
		if err := json.Unmarshal([]byte(strings.TrimPrefix(lines[1], "data: ")), &data); err != nil {
			t.Fatalf("event %q: %v", ev, err)
		}
		switch name {
		case "content_block_start":
			if int(data["index"].(float64)) != len(blocks) {
				t.Errorf("block %v started out of order", data["index"])
			}
			blocks = append(blocks, data["content_block"].(map[string]any))
			partial = append(partial, "")
		case "content_block_delta":
			i := int(data["index"].(float64))
			if i != len(blocks)-1 {
				t.Errorf("delta to block %d while block %d is open", i, len(blocks)-1)
			}
			partial[i] += data["delta"].(map[string]any)["partial_json"].(string)
		case "message_delta":
			stop = data["delta"].(map[string]any)["stop_reason"].(string)
		}
	}
	for i, b := range blocks {
		var in any
		if err := json.Unmarshal([]byte(partial[i]), &in); err != nil {
			t.Fatalf("block %d input %q: %v", i, partial[i], err)
		}
		b["input"] = in
	}
	got, _ := json.Marshal(blocks)
	if !jsonEqual(got, []byte(want)) || stop != "tool_use" {
		t.Errorf("streamed blocks %s stop %q, want %s tool_use", got, stop, want)
	}
	if names[0] != "message_start" || names[len(names)-2] != "message_delta" || names[len(names)-1] != "message_stop" {
		t.Errorf("event order %v", names)
	}

	res = postMessages(t, base, `{"model":"nope","max_tokens":50,"messages":[`+question+`]}`)
	var e anthropicapi.Error
	if err := json.Unmarshal(res.body, &e); err != nil || res.status != http.StatusNotFound || e.Type != "error" || e.Error.Type != "not_found_error" {
		t.Errorf("unknown model: HTTP %d %s, want 404 not_found_error", res.status, res.body)
	}
}
