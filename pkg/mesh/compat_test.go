package mesh_test

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/pkg/openaiapi"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/router"
)

const compatKey = "sk-compat-test"

// startCompat runs the whole mesh with an OpenAI-type provider and an Anthropic-type one,
// each a recording upstream. Route "chat" is the OpenAI model; route "anthropic-first" tries
// the Anthropic model first; route "anthropic-only" has no other.
func startCompat(t *testing.T) (*meshtest.RecordingUpstream, *meshtest.AnthropicRecordingUpstream, string) {
	t.Helper()
	up := &meshtest.RecordingUpstream{}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	antUp := &meshtest.AnthropicRecordingUpstream{}
	ant := httptest.NewServer(antUp)
	t.Cleanup(ant.Close)
	t.Setenv("MANTLE_COMPAT_UPSTREAM_KEY", "sk-upstream")
	keys := []router.KeyConfig{{ID: "k1", Env: "MANTLE_COMPAT_UPSTREAM_KEY"}}
	cfg := mesh.Default()
	cfg.Auth.Tenants = []rpc.TenantKey{{ID: "compat", KeySHA256: rpc.HashKey(compatKey)}}
	cfg.Router.DefaultBudget = 10 * time.Second
	cfg.Router.Providers = []router.ProviderConfig{
		{Name: "up", Type: router.ProviderOpenAI, BaseURL: srv.URL + "/v1", Timeout: 5 * time.Second, Keys: keys},
		{Name: "ant", Type: router.ProviderAnthropic, BaseURL: ant.URL, Timeout: 5 * time.Second, Keys: keys},
	}
	cfg.Router.Models = []router.ModelConfig{{Name: "gpt", Provider: "up"}, {Name: "claude", Provider: "ant"}}
	cfg.Router.Routes = []router.RouteConfig{
		{Name: "chat", Candidates: []string{"gpt"}},
		{Name: "anthropic-first", Candidates: []string{"claude", "gpt"}},
		{Name: "anthropic-only", Candidates: []string{"claude"}},
	}
	m := meshtest.Start(t, cfg, meshtest.All)
	return up, antUp, "http://" + m.HTTPAddr
}

type compatResult struct {
	status int
	body   []byte
	param  string
}

func postChat(t *testing.T, base string, body string, header map[string]string) compatResult {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+compatKey)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	out := compatResult{status: resp.StatusCode, body: b}
	var e struct {
		Error struct {
			Param *string `json:"param"`
		} `json:"error"`
	}
	if resp.StatusCode != http.StatusOK && json.Unmarshal(b, &e) == nil && e.Error.Param != nil {
		out.param = *e.Error.Param
	}
	return out
}

// jsonEqual compares two JSON texts by meaning.
func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

const userMsg = `{"role":"user","content":"weather in Paris?"}`

// compatCase is one field sent through the front door. Exactly one of forwarded (the JSON
// the upstream must receive under field) and refused (the error's param) is set. A
// forwarded field is sent again on a route whose only candidate is Anthropic-type, and
// exactly one of ant (carried by the Anthropic adapter) and skipped (the field its
// Unsupported names, which the 400 then names) is set.
type compatCase struct {
	field string // the documented field, as docs/compatibility.md names it
	body  string // members added to {"model":"chat"}; messages default to one user turn
	// forwarded: upstream member name -> the JSON it must hold.
	forwarded map[string]string
	refused   string
	// ant: Anthropic upstream member name -> the JSON it must hold ("" for absent).
	ant map[string]string
	// antBody replaces body for the Anthropic route, where the row's own body holds a
	// variant the adapter does not carry (a tool turn without tools, a file_id).
	antBody string
	skipped string
}

var compatCases = []compatCase{
	{field: "model", body: `"messages":[` + userMsg + `]`, forwarded: map[string]string{"messages": `[` + userMsg + `]`},
		ant: map[string]string{"model": `"claude"`, "messages": `[` + userMsg + `]`, "max_tokens": `1024`}},
	{field: "messages", body: `"messages":[{"role":"system","content":"be brief"},{"role":"developer","content":"d"},` + userMsg + `]`,
		forwarded: map[string]string{"messages": `[{"role":"system","content":"be brief"},{"role":"developer","content":"d"},` + userMsg + `]`},
		ant:       map[string]string{"system": `"be brief\n\nd"`, "messages": `[` + userMsg + `]`}},
	{field: "messages[].name", body: `"messages":[{"role":"user","content":"hi","name":"ann"}]`,
		forwarded: map[string]string{"messages": `[{"role":"user","content":"hi","name":"ann"}]`},
		skipped:   "messages[].name"},
	{field: "messages[].content (image_url part)", body: `"messages":[{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo=","detail":"high"}}]}]`,
		forwarded: map[string]string{"messages": `[{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo=","detail":"high"}}]}]`},
		ant:       map[string]string{"messages": `[{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}}]}]`}},
	{field: "messages[].content (input_audio part)", body: `"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"UklGRg==","format":"wav"}}]}]`,
		forwarded: map[string]string{"messages": `[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"UklGRg==","format":"wav"}}]}]`},
		skipped:   "messages[].content (input_audio part)"},
	{field: "messages[].content (file part)", body: `"messages":[{"role":"user","content":[{"type":"file","file":{"file_id":"file-1"}},{"type":"file","file":{"filename":"a.pdf","file_data":"JVBERg=="}}]}]`,
		forwarded: map[string]string{"messages": `[{"role":"user","content":[{"type":"file","file":{"file_id":"file-1"}},{"type":"file","file":{"filename":"a.pdf","file_data":"JVBERg=="}}]}]`},
		antBody:   `"messages":[{"role":"user","content":[{"type":"file","file":{"filename":"a.pdf","file_data":"JVBERg=="}}]}]`,
		ant:       map[string]string{"messages": `[{"role":"user","content":[{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBERg=="},"title":"a.pdf"}]}]`}},
	{field: "messages[].tool_calls", body: `"messages":[` + userMsg + `,{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"call_1","content":"sunny"}]`,
		forwarded: map[string]string{"messages": `[` + userMsg + `,{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"call_1","content":"sunny"}]`},
		antBody:   `"tools":[{"type":"function","function":{"name":"get_weather"}}],"messages":[` + userMsg + `,{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"call_1","content":"sunny"}]`,
		ant:       map[string]string{"messages": `[` + userMsg + `,{"role":"assistant","content":[{"type":"tool_use","id":"call_1","name":"get_weather","input":{"city":"Paris"}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"call_1","content":"sunny"}]}]`}},
	{field: "messages[].refusal", body: `"messages":[` + userMsg + `,{"role":"assistant","content":null,"refusal":"no"},{"role":"user","content":"please"}]`,
		forwarded: map[string]string{"messages": `[` + userMsg + `,{"role":"assistant","content":null,"refusal":"no"},{"role":"user","content":"please"}]`},
		ant:       map[string]string{"messages": `[` + userMsg + `,{"role":"assistant","content":[{"type":"text","text":"no"}]},{"role":"user","content":"please"}]`}},
	{field: "max_tokens", body: `"max_tokens":50`, forwarded: map[string]string{"max_tokens": `50`},
		ant: map[string]string{"max_tokens": `50`}},
	{field: "max_completion_tokens", body: `"max_completion_tokens":60`, forwarded: map[string]string{"max_completion_tokens": `60`},
		ant: map[string]string{"max_tokens": `60`, "max_completion_tokens": ``}},
	{field: "temperature", body: `"temperature":0.3`, forwarded: map[string]string{"temperature": `0.3`},
		ant: map[string]string{"temperature": `0.3`}},
	{field: "top_p", body: `"top_p":0.9`, forwarded: map[string]string{"top_p": `0.9`},
		ant: map[string]string{"top_p": `0.9`}},
	{field: "n", body: `"n":1`, forwarded: map[string]string{"n": `1`},
		ant: map[string]string{"n": ``}},
	{field: "n > 1", body: `"n":2`, refused: "n"},
	{field: "stop", body: `"stop":["END","STOP"]`, forwarded: map[string]string{"stop": `["END","STOP"]`},
		ant: map[string]string{"stop_sequences": `["END","STOP"]`, "stop": ``}},
	{field: "stop (string)", body: `"stop":"END"`, forwarded: map[string]string{"stop": `["END"]`},
		ant: map[string]string{"stop_sequences": `["END"]`}},
	{field: "seed", body: `"seed":42`, forwarded: map[string]string{"seed": `42`},
		skipped: "seed"},
	{field: "presence_penalty", body: `"presence_penalty":0.5`, forwarded: map[string]string{"presence_penalty": `0.5`},
		skipped: "presence_penalty"},
	{field: "frequency_penalty", body: `"frequency_penalty":-0.5`, forwarded: map[string]string{"frequency_penalty": `-0.5`},
		skipped: "frequency_penalty"},
	{field: "logit_bias", body: `"logit_bias":{"50256":-100,"15":5}`, forwarded: map[string]string{"logit_bias": `{"50256":-100,"15":5}`},
		skipped: "logit_bias"},
	{field: "logprobs", body: `"logprobs":true`, forwarded: map[string]string{"logprobs": `true`},
		skipped: "logprobs"},
	{field: "top_logprobs", body: `"logprobs":true,"top_logprobs":3`, forwarded: map[string]string{"top_logprobs": `3`},
		skipped: "logprobs"},
	{field: "tools", body: `"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]},"strict":true}}]`,
		forwarded: map[string]string{"tools": `[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]},"strict":true}}]`},
		ant:       map[string]string{"tools": `[{"name":"get_weather","description":"Weather of a city","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]},"strict":true}]`}},
	{field: "tool_choice", body: `"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required"`, forwarded: map[string]string{"tool_choice": `"required"`},
		ant: map[string]string{"tools": `[{"name":"f","input_schema":{"type":"object","properties":{}}}]`, "tool_choice": `{"type":"any"}`}},
	{field: "tool_choice (function)", body: `"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"f"}}`,
		forwarded: map[string]string{"tool_choice": `{"type":"function","function":{"name":"f"}}`},
		ant:       map[string]string{"tool_choice": `{"type":"tool","name":"f"}`}},
	{field: "parallel_tool_calls", body: `"tools":[{"type":"function","function":{"name":"f"}}],"parallel_tool_calls":false`, forwarded: map[string]string{"parallel_tool_calls": `false`},
		ant: map[string]string{"tool_choice": `{"type":"auto","disable_parallel_tool_use":true}`, "parallel_tool_calls": ``}},
	{field: "response_format", body: `"response_format":{"type":"json_schema","json_schema":{"name":"answer","description":"d","strict":true,"schema":{"type":"object"}}}`,
		forwarded: map[string]string{"response_format": `{"type":"json_schema","json_schema":{"name":"answer","description":"d","strict":true,"schema":{"type":"object"}}}`},
		ant:       map[string]string{"response_format": ``}},
	{field: "response_format (json_object)", body: `"response_format":{"type":"json_object"}`, forwarded: map[string]string{"response_format": `{"type":"json_object"}`},
		ant: map[string]string{"response_format": ``}},
	{field: "reasoning_effort", body: `"reasoning_effort":"low"`, forwarded: map[string]string{"reasoning_effort": `"low"`},
		ant: map[string]string{"thinking": `{"type":"enabled","budget_tokens":4096}`, "max_tokens": `5120`, "reasoning_effort": ``}},
	{field: "service_tier", body: `"service_tier":"flex"`, forwarded: map[string]string{"service_tier": `"flex"`},
		antBody: `"service_tier":"default"`, ant: map[string]string{"service_tier": `"standard_only"`}},
	{field: "metadata", body: `"metadata":{"app":"compat"}`, forwarded: map[string]string{"metadata": `{"app":"compat"}`},
		skipped: "metadata"},
	{field: "user", body: `"user":"u-1"`, forwarded: map[string]string{"user": `"u-1"`},
		ant: map[string]string{"metadata": `{"user_id":"u-1"}`, "user": ``}},
	{field: "modalities", body: `"modalities":["text"]`, forwarded: map[string]string{"modalities": `["text"]`},
		ant: map[string]string{"modalities": ``}},
	{field: "store", body: `"store":false`, forwarded: map[string]string{"store": `false`},
		ant: map[string]string{"store": ``}},
	{field: "stream", body: `"stream":false`, forwarded: map[string]string{"model": `"gpt"`},
		ant: map[string]string{"model": `"claude"`, "stream": ``}},
	{field: "stream_options", body: `"stream":true,"stream_options":{"include_usage":true}`, forwarded: map[string]string{"stream": `true`},
		ant: map[string]string{"stream": `true`, "stream_options": ``}},
	{field: "extra_body", body: `"extra_body":{"top_k":40,"chat_template_kwargs":{"thinking":true}}`, forwarded: map[string]string{"top_k": `40`, "chat_template_kwargs": `{"thinking":true}`},
		skipped: "extra_body"},
	// Documented fields mantle refuses, and fields nobody documented.
	{field: "functions", body: `"functions":[{"name":"f"}]`, refused: "functions"},
	{field: "function_call", body: `"function_call":"auto"`, refused: "function_call"},
	{field: "audio", body: `"audio":{"voice":"alloy","format":"wav"}`, refused: "audio"},
	{field: "prediction", body: `"prediction":{"type":"content","content":"x"}`, refused: "prediction"},
	{field: "web_search_options", body: `"web_search_options":{}`, refused: "web_search_options"},
	{field: "verbosity", body: `"verbosity":"low"`, refused: "verbosity"},
	{field: "prompt_cache_key", body: `"prompt_cache_key":"k"`, refused: "prompt_cache_key"},
	{field: "safety_identifier", body: `"safety_identifier":"s"`, refused: "safety_identifier"},
	{field: "unknown top-level field", body: `"top_k":40`, refused: "top_k"},
	{field: "unknown message field", body: `"messages":[{"role":"user","content":"x","mood":"sad"}]`, refused: "messages[0].mood"},
	{field: "unknown content part field", body: `"messages":[{"role":"user","content":[{"type":"text","text":"x","lang":"en"}]}]`, refused: "messages[0].content[0].lang"},
	{field: "unknown content part type", body: `"messages":[{"role":"user","content":[{"type":"video_url","video_url":{"url":"x"}}]}]`, refused: "messages[0].content[0].type"},
	{field: "unknown image_url field", body: `"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/y.png","size":3}}]}]`, refused: "messages[0].content[0].image_url.size"},
	{field: "unknown tool field", body: `"tools":[{"type":"function","function":{"name":"f","returns":"x"}}]`, refused: "tools[0].function.returns"},
	{field: "unknown tool call field", body: `"messages":[` + userMsg + `,{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"},"extra":1}]}]`, refused: "messages[1].tool_calls[0].extra"},
	{field: "unknown response_format field", body: `"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{},"format":"x"}}`, refused: "response_format.json_schema.format"},
	{field: "unknown stream_options field", body: `"stream":true,"stream_options":{"include_obfuscation":false}`, refused: "stream_options.include_obfuscation"},
	{field: "extra_body naming a modelled field", body: `"extra_body":{"model":"other"}`, refused: "extra_body.model"},
}

// TestCompatibilityTable sends every documented chat completions field, and unknown ones,
// through the front door of a whole mesh to a recording OpenAI-type upstream: each is
// either received by the upstream as sent, or refused with a 400 naming it. There is no
// third outcome. Each forwarded field is then sent to a recording Anthropic-type upstream:
// it is received there in Anthropic's shape, or the Anthropic candidate is skipped and,
// with no other candidate, the request refused with a 400 naming it. The outcomes are
// checked against docs/compatibility.md.
func TestCompatibilityTable(t *testing.T) {
	up, antUp, base := startCompat(t)
	outcomes := map[string]string{}
	antOutcomes := map[string]string{}
	withBody := func(model string, i int, members string) string {
		if !strings.Contains(members, `"messages"`) {
			// A question of its own, so that no row is answered from the cache.
			return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"weather in Paris? (row %d)"}],%s}`, model, i, members)
		}
		return fmt.Sprintf(`{"model":%q,%s}`, model, members)
	}
	for i, tc := range compatCases {
		before := up.Count()
		res := postChat(t, base, withBody("chat", i, tc.body), nil)
		switch {
		case tc.refused != "":
			outcomes[tc.field] = "refused"
			if res.status != http.StatusBadRequest || res.param != tc.refused {
				t.Errorf("%s: got HTTP %d param %q (%s), want 400 naming %q", tc.field, res.status, res.param, res.body, tc.refused)
			}
			if up.Count() != before {
				t.Errorf("%s: refused, yet the upstream was called", tc.field)
			}
			continue
		default:
			outcomes[tc.field] = "forwarded"
			if res.status != http.StatusOK || up.Count() != before+1 {
				t.Errorf("%s: got HTTP %d (%s) after %d upstream calls, want it forwarded in one", tc.field, res.status, res.body, up.Count()-before)
				break
			}
			got := up.Last(t)
			for member, want := range tc.forwarded {
				if !jsonEqual(got[member], []byte(want)) {
					t.Errorf("%s: the upstream received %s = %s, want %s", tc.field, member, got[member], want)
				}
			}
		}

		if (tc.ant == nil) == (tc.skipped == "") {
			t.Errorf("%s: set exactly one of ant and skipped", tc.field)
			continue
		}
		members := tc.body
		if tc.antBody != "" {
			members = tc.antBody
		}
		before, antBefore := up.Count(), antUp.Count()
		res = postChat(t, base, withBody("anthropic-only", i, members), nil)
		if up.Count() != before {
			t.Errorf("%s: the OpenAI upstream was called on a route without it", tc.field)
		}
		if tc.skipped != "" {
			antOutcomes[tc.field] = "skipped"
			if res.status != http.StatusBadRequest || res.param != tc.skipped {
				t.Errorf("%s (Anthropic): got HTTP %d param %q (%s), want 400 naming %q", tc.field, res.status, res.param, res.body, tc.skipped)
			}
			if antUp.Count() != antBefore {
				t.Errorf("%s (Anthropic): skipped, yet the Anthropic upstream was called", tc.field)
			}
			continue
		}
		antOutcomes[tc.field] = "carried"
		if res.status != http.StatusOK || antUp.Count() != antBefore+1 {
			t.Errorf("%s (Anthropic): got HTTP %d (%s) after %d upstream calls, want it carried in one", tc.field, res.status, res.body, antUp.Count()-antBefore)
			continue
		}
		got := antUp.Last(t)
		for member, want := range tc.ant {
			switch {
			case want == "" && got[member] != nil:
				t.Errorf("%s (Anthropic): the upstream received %s = %s, want it absent", tc.field, member, got[member])
			case want != "" && !jsonEqual(got[member], []byte(want)):
				t.Errorf("%s (Anthropic): the upstream received %s = %s, want %s", tc.field, member, got[member], want)
			}
		}
	}
	// Every field the decoder knows has a row: a field added to it without a test here
	// fails this test.
	for _, f := range append(slices.Clone(openaiapi.Forwarded), keys(openaiapi.Refused)...) {
		if _, ok := outcomes[f]; !ok {
			t.Errorf("field %s has no row in compatCases", f)
		}
	}
	checkCompatibilityDoc(t, "`POST /v1/chat/completions`: field by field", outcomes, antOutcomes)
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// checkCompatibilityDoc reads the field table under the heading section of
// docs/compatibility.md: every row's OpenAI-upstream column must say what the table test
// saw (forwarded or refused), and every field the test covers must have a row. With
// antOutcomes, its Anthropic-upstream column must start with "candidate skipped" exactly
// when the Anthropic candidate was skipped, and be "—" exactly for fields refused at the
// front door.
func checkCompatibilityDoc(t *testing.T, section string, outcomes, antOutcomes map[string]string) {
	t.Helper()
	doc, err := os.ReadFile("../../docs/compatibility.md")
	if err != nil {
		t.Fatalf("read docs/compatibility.md: %v", err)
	}
	row := regexp.MustCompile("^\\| `([^`]+)` \\| ([a-z]+) \\|[^|]*\\| ([^|]*) \\|$")
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(doc))
	inTable := false
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			inTable = line == "## "+section
		}
		if !inTable || !strings.HasPrefix(line, "| `") {
			continue
		}
		m := row.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("docs/compatibility.md: row %q is not | `field` | outcome | notes | Anthropic |", line)
			continue
		}
		field, said, antSaid := m[1], m[2], m[3]
		seen[field] = true
		got, ok := outcomes[field]
		if !ok {
			t.Errorf("docs/compatibility.md lists %q, which the table test does not send", field)
			continue
		}
		if said != got {
			t.Errorf("docs/compatibility.md says %s is %s; the table test saw it %s", field, said, got)
		}
		if antOutcomes == nil {
			continue
		}
		antGot := antOutcomes[field] // "" when refused at the front door
		antDoc := "carried"
		switch {
		case antSaid == "—":
			antDoc = ""
		case strings.HasPrefix(antSaid, "candidate skipped"):
			antDoc = "skipped"
		}
		if antDoc != antGot {
			t.Errorf("docs/compatibility.md says of %s at an Anthropic upstream %q; the table test saw it %s", field, antSaid, cmp.Or(antGot, "refused at the front door"))
		}
	}
	for f := range outcomes {
		if !seen[f] {
			t.Errorf("docs/compatibility.md has no row for %q", f)
		}
	}
}

// TestToolCallsRoundTrip: an answer with parallel tool calls reaches the caller whole,
// unary and streamed; the stream carries the upstream's index-based pieces joined per call
// (an answer that is only tool calls is held until whole), and the router's reassembly of
// them is what an idempotent replay answers with.
func TestToolCallsRoundTrip(t *testing.T) {
	up, _, base := startCompat(t)
	const body = `{"model":"chat","messages":[` + userMsg + `],"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}},{"type":"function","function":{"name":"get_time"}}]`
	wantCalls := `[{"id":"call_a","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},{"id":"call_b","type":"function","function":{"name":"get_time","arguments":"{\"tz\":\"CET\"}"}}]`

	type choice struct {
		Message struct {
			Content   *string         `json:"content"`
			ToolCalls json.RawMessage `json:"tool_calls"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	}
	var unary struct{ Choices []choice }
	res := postChat(t, base, body+`}`, nil)
	if res.status != http.StatusOK {
		t.Fatalf("unary: HTTP %d: %s", res.status, res.body)
	}
	if err := json.Unmarshal(res.body, &unary); err != nil || len(unary.Choices) != 1 {
		t.Fatalf("unary answer %s: %v", res.body, err)
	}
	if c := unary.Choices[0]; c.FinishReason != "tool_calls" || !jsonEqual(c.Message.ToolCalls, []byte(wantCalls)) || c.Message.Content != nil {
		t.Errorf("unary answer: finish %q, tool_calls %s, content %v; want tool_calls, %s, no content", c.FinishReason, c.Message.ToolCalls, c.Message.Content, wantCalls)
	}

	res = postChat(t, base, body+`,"stream":true}`, map[string]string{"Idempotency-Key": "tools-stream-1"})
	if res.status != http.StatusOK {
		t.Fatalf("stream: HTTP %d: %s", res.status, res.body)
	}
	_, pieces, finish := streamedToolCalls(t, res.body)
	// Only tool calls: held until whole and checked, then sent joined, a piece per call.
	wantPieces := []string{
		`{"index":0,"id":"call_a","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}`,
		`{"index":1,"id":"call_b","type":"function","function":{"name":"get_time","arguments":"{\"tz\":\"CET\"}"}}`,
	}
	wantToolPieces(t, pieces, wantPieces)
	if finish != "tool_calls" {
		t.Errorf("stream finish_reason %q, want tool_calls", finish)
	}
	// The replay is the router's record of the streamed answer: its reassembly.
	calls := up.Count()
	res = postChat(t, base, body+`,"stream":false}`, map[string]string{"Idempotency-Key": "tools-stream-1"})
	if up.Count() != calls {
		t.Fatalf("the replay called the upstream: %s", res.body)
	}
	var replay struct{ Choices []choice }
	if err := json.Unmarshal(res.body, &replay); err != nil || len(replay.Choices) != 1 {
		t.Fatalf("replay %s: %v", res.body, err)
	}
	if !jsonEqual(replay.Choices[0].Message.ToolCalls, []byte(wantCalls)) {
		t.Errorf("replayed tool calls %s, want the reassembled %s", replay.Choices[0].Message.ToolCalls, wantCalls)
	}
}

// TestLogprobsReachTheCaller: logprobs asked for come back as the upstream sent them.
func TestLogprobsReachTheCaller(t *testing.T) {
	_, _, base := startCompat(t)
	res := postChat(t, base, `{"model":"chat","messages":[`+userMsg+`],"logprobs":true}`, nil)
	var out struct {
		Choices []struct {
			Logprobs json.RawMessage `json:"logprobs"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(res.body, &out); err != nil || len(out.Choices) != 1 {
		t.Fatalf("answer %s: %v", res.body, err)
	}
	want := `{"content":[{"token":"ok","logprob":-0.1,"bytes":[111,107],"top_logprobs":[]}]}`
	if !jsonEqual(out.Choices[0].Logprobs, []byte(want)) {
		t.Errorf("logprobs %s, want %s", out.Choices[0].Logprobs, want)
	}
}

// TestFieldsSkipCandidatesThatCannotCarryThem: a request with seed skips the Anthropic
// candidate (Anthropic has no seed) and reaches the OpenAI one; with no other candidate it
// is refused naming the field, and the Anthropic upstream is never called.
func TestFieldsSkipCandidatesThatCannotCarryThem(t *testing.T) {
	up, antUp, base := startCompat(t)
	res := postChat(t, base, `{"model":"anthropic-first","messages":[`+userMsg+`],"seed":7}`, nil)
	if res.status != http.StatusOK {
		t.Fatalf("anthropic-first with seed: HTTP %d: %s", res.status, res.body)
	}
	if got := up.Last(t)["seed"]; string(got) != "7" {
		t.Errorf("the OpenAI upstream received seed %s, want 7", got)
	}
	res = postChat(t, base, `{"model":"anthropic-only","messages":[`+userMsg+`],"seed":7}`, nil)
	if res.status != http.StatusBadRequest || res.param != "seed" {
		t.Errorf("anthropic-only with seed: HTTP %d param %q (%s), want 400 naming seed", res.status, res.param, res.body)
	}
	if antUp.Count() != 0 {
		t.Errorf("the Anthropic upstream was called %d times for requests it cannot carry", antUp.Count())
	}
}

// TestAnthropicToolCallsRoundTrip: through an Anthropic-type candidate, a request with tools
// reaches Anthropic (it is no longer skipped), and its tool_use answer reaches the OpenAI
// caller as tool calls, unary and streamed: the stream's input_json_delta pieces arrive as
// index-based tool_calls, joined per call (held until whole), and thinking is not passed on.
func TestAnthropicToolCallsRoundTrip(t *testing.T) {
	up, antUp, base := startCompat(t)
	const body = `{"model":"anthropic-first","messages":[` + userMsg + `],"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}},{"type":"function","function":{"name":"get_time"}}]`
	wantCalls := `[{"id":"toolu_a","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},{"id":"toolu_b","type":"function","function":{"name":"get_time","arguments":"{\"tz\":\"CET\"}"}}]`

	res := postChat(t, base, body+`}`, nil)
	if res.status != http.StatusOK {
		t.Fatalf("unary: HTTP %d: %s", res.status, res.body)
	}
	if up.Count() != 0 || antUp.Count() != 1 {
		t.Fatalf("calls: OpenAI %d, Anthropic %d; want the Anthropic candidate only", up.Count(), antUp.Count())
	}
	if got := antUp.Last(t)["tools"]; !jsonEqual(got, []byte(`[{"name":"get_weather","input_schema":{"type":"object"}},{"name":"get_time","input_schema":{"type":"object","properties":{}}}]`)) {
		t.Errorf("Anthropic received tools %s", got)
	}
	var unary struct {
		Choices []struct {
			Message struct {
				Content   *string         `json:"content"`
				ToolCalls json.RawMessage `json:"tool_calls"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(res.body, &unary); err != nil || len(unary.Choices) != 1 {
		t.Fatalf("unary answer %s: %v", res.body, err)
	}
	if c := unary.Choices[0]; c.FinishReason != "tool_calls" || !jsonEqual(c.Message.ToolCalls, []byte(wantCalls)) || c.Message.Content != nil {
		t.Errorf("unary answer: finish %q, tool_calls %s, content %v; want tool_calls, %s, no content", c.FinishReason, c.Message.ToolCalls, c.Message.Content, wantCalls)
	}

	res = postChat(t, base, body+`,"stream":true}`, nil)
	if res.status != http.StatusOK {
		t.Fatalf("stream: HTTP %d: %s", res.status, res.body)
	}
	content, pieces, finish := streamedToolCalls(t, res.body)
	// Only tool calls: held until whole and checked, then sent joined, a piece per call.
	wantPieces := []string{
		`{"index":0,"id":"toolu_a","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}`,
		`{"index":1,"id":"toolu_b","type":"function","function":{"name":"get_time","arguments":"{\"tz\":\"CET\"}"}}`,
	}
	wantToolPieces(t, pieces, wantPieces)
	if finish != "tool_calls" || content != "" {
		t.Errorf("stream finish_reason %q, content %q; want tool_calls and no content (thinking is not passed on)", finish, content)
	}
	if got := antUp.Last(t)["stream"]; string(got) != "true" {
		t.Errorf("Anthropic received stream %s", got)
	}
}

// streamedToolCalls reads an OpenAI event stream: its text, its tool call pieces as sent,
// and the last finish reason.
func streamedToolCalls(t *testing.T, body []byte) (content string, pieces []string, finish string) {
	t.Helper()
	for _, line := range strings.Split(string(body), "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content   string            `json:"content"`
					ToolCalls []json.RawMessage `json:"tool_calls"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			t.Fatalf("chunk %s: %v", data, err)
		}
		for _, c := range chunk.Choices {
			content += c.Delta.Content
			for _, tc := range c.Delta.ToolCalls {
				pieces = append(pieces, string(tc))
			}
			if c.FinishReason != nil {
				finish = *c.FinishReason
			}
		}
	}
	return content, pieces, finish
}

// wantToolPieces compares streamed tool call pieces with want, piece by piece as JSON.
func wantToolPieces(t *testing.T, pieces, want []string) {
	t.Helper()
	if len(pieces) != len(want) {
		t.Fatalf("stream carried %d tool call pieces %v, want %d", len(pieces), pieces, len(want))
	}
	for i := range pieces {
		if !jsonEqual([]byte(pieces[i]), []byte(want[i])) {
			t.Errorf("piece %d = %s, want %s", i, pieces[i], want[i])
		}
	}
}
