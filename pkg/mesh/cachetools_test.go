package mesh_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/router"
)

// TestCacheScopesToolsAndSampling sends tool-calling requests through the whole mesh to
// the recording upstream (which answers a request offering one tool with one call of it):
// an answer with tool calls is not cached unless the route says cache.tool_calls, and when
// it is, only an identical request (same tools, same sampling fields) gets it back.
func TestCacheScopesToolsAndSampling(t *testing.T) {
	up := &meshtest.RecordingUpstream{}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	t.Setenv("MANTLE_CACHETOOLS_UPSTREAM_KEY", "sk-upstream")
	cfg := mesh.Default()
	cfg.Auth.Tenants = []rpc.TenantKey{{ID: "compat", KeySHA256: rpc.HashKey(compatKey)}}
	cfg.Router.DefaultBudget = 10 * time.Second
	cfg.Router.Providers = []router.ProviderConfig{{Name: "up", Type: router.ProviderOpenAI, BaseURL: srv.URL + "/v1",
		Timeout: 5 * time.Second, Keys: []router.KeyConfig{{ID: "k1", Env: "MANTLE_CACHETOOLS_UPSTREAM_KEY"}}}}
	cfg.Router.Models = []router.ModelConfig{{Name: "gpt", Provider: "up"}}
	cfg.Router.Routes = []router.RouteConfig{
		{Name: "agent", Candidates: []string{"gpt"}},
		{Name: "agent-cached", Candidates: []string{"gpt"}, Cache: router.RouteCacheConfig{ToolCalls: true}},
	}
	m := meshtest.Start(t, cfg, meshtest.All)
	base := "http://" + m.HTTPAddr

	const tool = `{"type":"function","function":{"name":"convert_temperature","parameters":{"type":"object","properties":{"celsius":{"type":"string"}}}}}`
	const toolWithUnit = `{"type":"function","function":{"name":"convert_temperature","parameters":{"type":"object","properties":{"celsius":{"type":"string"},"unit":{"type":"string"}}}}}`
	body := func(route, offered, extra string) string {
		return `{"model":"` + route + `","temperature":0,"messages":[{"role":"user","content":"Convert 20 degrees Celsius to Fahrenheit, please."}],"tools":[` + offered + `]` + extra + `}`
	}
	send := func(b string) (calls int, cached string) {
		t.Helper()
		before := up.Count()
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+compatKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			Choices []struct {
				Message struct {
					ToolCalls []struct {
						ID       string `json:"id"`
						Function struct{ Name, Arguments string }
					} `json:"tool_calls"`
				} `json:"message"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Choices) != 1 {
			t.Fatalf("answer: %v %+v", err, out)
		}
		c := out.Choices[0]
		// A cached answer is the stored one, tool calls and all.
		if c.FinishReason != "tool_calls" || len(c.Message.ToolCalls) != 1 || c.Message.ToolCalls[0].Function.Arguments != `{"city":"Paris"}` ||
			c.Message.ToolCalls[0].Function.Name != "convert_temperature" || c.Message.ToolCalls[0].ID != "call_a" {
			t.Fatalf("answer %+v, want the upstream's tool call", c)
		}
		return up.Count() - before, resp.Header.Get("X-Mantle-Cache")
	}

	t.Run("tool calls are not cached by default", func(t *testing.T) {
		for i := range 2 {
			if calls, _ := send(body("agent", tool, "")); calls != 1 {
				t.Fatalf("request %d made %d upstream calls, want 1 (a tool-call answer is not replayed)", i, calls)
			}
		}
	})
	t.Run("tool calls are cached with cache.tool_calls", func(t *testing.T) {
		if calls, _ := send(body("agent-cached", tool, "")); calls != 1 {
			t.Fatalf("first request made %d calls", calls)
		}
		if calls, cached := send(body("agent-cached", tool, "")); calls != 0 {
			t.Fatalf("identical request made %d upstream calls (cache header %q), want a cache hit", calls, cached)
		}
		// Every field that changes the answer is part of the scope.
		for name, b := range map[string]string{
			"another tool schema": body("agent-cached", toolWithUnit, ""),
			"tool_choice":         body("agent-cached", tool, `,"tool_choice":"required"`),
			"parallel_tool_calls": body("agent-cached", tool, `,"parallel_tool_calls":false`),
			"seed":                body("agent-cached", tool, `,"seed":7`),
			"top_p":               body("agent-cached", tool, `,"top_p":0.5`),
			"stop":                body("agent-cached", tool, `,"stop":["x"]`),
		} {
			if calls, _ := send(b); calls != 1 {
				t.Errorf("%s: %d upstream calls, want 1 (another request's answer was served)", name, calls)
			}
		}
	})
}
