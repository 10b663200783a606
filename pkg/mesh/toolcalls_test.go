package mesh_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/router"
)

// toolUpstream is an OpenAI-type provider whose every answer is one call of get_weather
// with the given arguments.
func toolUpstream(t *testing.T, args string, calls *atomic.Int64) string {
	t.Helper()
	quoted, _ := json.Marshal(args)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		var req struct {
			Stream bool `json:"stream"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		if req.Stream {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, `data: {"id":"u1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":`+string(quoted)+`}}]},"finish_reason":null}]}`+"\n\n")
			fmt.Fprint(w, `data: {"id":"u1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`+"\n\ndata: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"u1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[`+
			`{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":`+string(quoted)+`}}]},"finish_reason":"tool_calls"}],`+
			`"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}`)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/v1"
}

// TestToolCallArgumentsFailOver: the primary model calls the tool with arguments that do
// not validate against the tool's schema; the verifier's L1 fails the answer like
// malformed JSON, the router fails over, and the caller gets the fallback's good call.
// When every model calls it badly the caller gets a clear error (or, with a template on
// the route's ladder, the template), never the bad call.
func TestToolCallArgumentsFailOver(t *testing.T) {
	var badCalls, goodCalls, worseCalls atomic.Int64
	bad := toolUpstream(t, `{"city":42}`, &badCalls)
	good := toolUpstream(t, `{"city":"Paris"}`, &goodCalls)
	worse := toolUpstream(t, `{"city":"Par`, &worseCalls)

	t.Setenv("MANTLE_TOOLS_UPSTREAM_KEY", "sk-upstream")
	keys := []router.KeyConfig{{ID: "k1", Env: "MANTLE_TOOLS_UPSTREAM_KEY"}}
	cfg := mesh.Default()
	cfg.Auth.Tenants = []rpc.TenantKey{{ID: "compat", KeySHA256: rpc.HashKey(compatKey)}}
	cfg.Router.DefaultBudget = 10 * time.Second
	cfg.Router.Providers = []router.ProviderConfig{
		{Name: "bad", Type: router.ProviderOpenAI, BaseURL: bad, Timeout: 5 * time.Second, Keys: keys},
		{Name: "good", Type: router.ProviderOpenAI, BaseURL: good, Timeout: 5 * time.Second, Keys: keys},
		{Name: "worse", Type: router.ProviderOpenAI, BaseURL: worse, Timeout: 5 * time.Second, Keys: keys},
	}
	cfg.Router.Models = []router.ModelConfig{
		{Name: "bad-model", Provider: "bad"}, {Name: "good-model", Provider: "good"}, {Name: "worse-model", Provider: "worse"},
	}
	const template = "We will get back to you."
	cfg.Router.Routes = []router.RouteConfig{
		{Name: "tools", Candidates: []string{"bad-model", "good-model"}},
		{Name: "tools-all-bad", Candidates: []string{"bad-model", "worse-model"}},
		{Name: "tools-all-bad-template", Candidates: []string{"bad-model", "worse-model"}, Ladder: router.LadderConfig{Template: template}},
	}
	m := meshtest.Start(t, cfg, meshtest.All)
	base := "http://" + m.HTTPAddr

	body := func(route string) string {
		return `{"model":"` + route + `","messages":[{"role":"user","content":"weather in Paris?"}],"tools":[{"type":"function","function":{"name":"get_weather",` +
			`"parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]}`
	}
	type answer struct {
		Model   string `json:"model"`
		Choices []struct {
			Message struct {
				Content   *string `json:"content"`
				ToolCalls []struct {
					Function struct {
						Name      string `json:"name"`
						Arguments string `json:"arguments"`
					} `json:"function"`
				} `json:"tool_calls"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	decode := func(t *testing.T, res compatResult) answer {
		t.Helper()
		var a answer
		if err := json.Unmarshal(res.body, &a); err != nil || len(a.Choices) != 1 {
			t.Fatalf("answer %s: %v", res.body, err)
		}
		return a
	}

	t.Run("fallback's good call reaches the caller", func(t *testing.T) {
		res := postChat(t, base, body("tools"), nil)
		if res.status != http.StatusOK {
			t.Fatalf("HTTP %d: %s", res.status, res.body)
		}
		a := decode(t, res)
		calls := a.Choices[0].Message.ToolCalls
		if a.Model != "good-model" || len(calls) != 1 || calls[0].Function.Arguments != `{"city":"Paris"}` || a.Choices[0].FinishReason != "tool_calls" {
			t.Errorf("answer = %s, want good-model's call with {\"city\":\"Paris\"}", res.body)
		}
		if badCalls.Load() == 0 || goodCalls.Load() == 0 {
			t.Errorf("upstream calls: bad %d, good %d; want both asked", badCalls.Load(), goodCalls.Load())
		}
	})

	t.Run("every call bad: a clear error", func(t *testing.T) {
		res := postChat(t, base, body("tools-all-bad"), nil)
		if res.status == http.StatusOK {
			t.Fatalf("HTTP 200 with %s; want an error, not a bad tool call", res.body)
		}
		if strings.Contains(string(res.body), `\"city\":42`) || strings.Contains(string(res.body), "tool_calls\"") {
			t.Errorf("the error carries a bad call: %s", res.body)
		}
		if !strings.Contains(string(res.body), "tool_call_schema (at tool_calls[0]:get_weather#/city)") {
			t.Errorf("HTTP %d %s: the error does not say a tool call failed the check", res.status, res.body)
		}
		if worseCalls.Load() == 0 {
			t.Error("the second candidate was never asked")
		}
	})

	// A streamed answer that is only tool calls is held back until it is whole and checked
	// (docs/verification.md): a bad call never reaches the caller, the fallback's good one
	// streams, and when every call is bad the caller gets an error, not a bad call.
	t.Run("streamed: the bad call is held back and the fallback's good call streams", func(t *testing.T) {
		res := postChat(t, base, strings.TrimSuffix(body("tools"), "}")+`,"stream":true}`, nil)
		if res.status != http.StatusOK {
			t.Fatalf("HTTP %d: %s", res.status, res.body)
		}
		stream := string(res.body)
		if strings.Contains(stream, `\"city\":42`) || !strings.Contains(stream, `Paris`) || !strings.Contains(stream, `"model":"good-model"`) || strings.Contains(stream, `"model":"bad-model","choices"`) {
			t.Errorf("stream %s: want only good-model's call", stream)
		}
		if !strings.Contains(stream, `"finish_reason":"tool_calls"`) || !strings.Contains(stream, "data: [DONE]") {
			t.Errorf("stream %s: want it ended with tool_calls and [DONE]", stream)
		}
	})
	t.Run("streamed, every call bad: an error before anything is sent", func(t *testing.T) {
		res := postChat(t, base, strings.TrimSuffix(body("tools-all-bad"), "}")+`,"stream":true}`, nil)
		if res.status == http.StatusOK && !strings.Contains(string(res.body), "tool_call_schema") {
			t.Fatalf("HTTP %d %s: want an error naming the failed check", res.status, res.body)
		}
		if strings.Contains(string(res.body), `"tool_calls":[`) {
			t.Errorf("a bad call reached the caller: %s", res.body)
		}
	})

	t.Run("every call bad: the route's template", func(t *testing.T) {
		res := postChat(t, base, body("tools-all-bad-template"), nil)
		if res.status != http.StatusOK {
			t.Fatalf("HTTP %d: %s", res.status, res.body)
		}
		a := decode(t, res)
		if c := a.Choices[0].Message.Content; c == nil || *c != template || len(a.Choices[0].Message.ToolCalls) != 0 {
			t.Errorf("answer = %s, want the template and no tool call", res.body)
		}
	})
}
