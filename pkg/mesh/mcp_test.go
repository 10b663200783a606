package mesh_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/services/agent"
	"github.com/mantle-mesh/mantle/services/router"
)

// keyTransport sends every request with a bearer key and the given headers, as an MCP
// client configured with an Authorization header does.
type keyTransport struct {
	key     string
	headers map[string]string
}

func (k keyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if k.key != "" {
		r.Header.Set("Authorization", "Bearer "+k.key)
	}
	for name, v := range k.headers {
		r.Header.Set(name, v)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// connectMCP connects go-sdk's MCP client to the router's /mcp with key.
func connectMCP(t *testing.T, ctx context.Context, httpAddr, key string, headers map[string]string) (*mcp.ClientSession, error) {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "mesh-test", Version: "1"}, nil)
	session, err := client.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint:             "http://" + httpAddr + router.MCPPath,
		HTTPClient:           &http.Client{Transport: keyTransport{key: key, headers: headers}},
		DisableStandaloneSSE: true,
		MaxRetries:           -1,
	}, nil)
	if err == nil {
		t.Cleanup(func() { _ = session.Close() })
	}
	return session, err
}

// resultText joins a tool result's text content.
func resultText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// TestMCPThroughTheHTTPDoor drives the tool gateway with go-sdk's MCP client over the
// router's /mcp, with a real agent behind it, in both deployment shapes.
func TestMCPThroughTheHTTPDoor(t *testing.T) {
	t.Parallel()
	for _, mode := range []meshtest.Mode{meshtest.All, meshtest.Split} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b := newToolBackend(t)
			m := meshtest.Start(t, toolsConfig(b), mode)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()

			s, err := connectMCP(t, ctx, m.HTTPAddr, acmeKey, nil)
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			list, err := s.ListTools(ctx, nil)
			if err != nil || len(list.Tools) != 2 {
				t.Fatalf("tools/list = %+v, %v", list, err)
			}
			lookup, order := list.Tools[0], list.Tools[1]
			schema, _ := json.Marshal(lookup.InputSchema)
			if lookup.Name != "lookup" || lookup.Description != "Looks a city up." || !strings.Contains(string(schema), `"required":["city"]`) ||
				!lookup.Annotations.ReadOnlyHint || lookup.Meta[router.MCPMetaKind] != "query" {
				t.Errorf("lookup listed as %+v (schema %s)", lookup, schema)
			}
			if order.Name != "order" || order.Meta[router.MCPMetaKind] != "action" || order.Annotations.ReadOnlyHint || !order.Annotations.IdempotentHint {
				t.Errorf("order listed as %+v", order)
			}

			res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "lookup", Arguments: map[string]any{"city": "Oslo"}})
			if err != nil || res.IsError || resultText(res) != `{"city":"Oslo"}` || res.Meta[router.MCPMetaStatus] != "ok" {
				t.Fatalf("call lookup = %+v (%q), %v", res, resultText(res), err)
			}
			if sc, _ := json.Marshal(res.StructuredContent); string(sc) != `{"city":"Oslo"}` {
				t.Errorf("structuredContent = %s", sc)
			}

			// Arguments that do not match the schema: a tool error naming the field, and the
			// backend never called.
			res, err = s.CallTool(ctx, &mcp.CallToolParams{Name: "lookup", Arguments: map[string]any{"city": 7}})
			if err != nil || !res.IsError || !strings.Contains(resultText(res), "arguments/city") || res.Meta[router.MCPMetaErrorReason] != "invalid_arguments" {
				t.Errorf("call with a number for city = %+v (%q), %v; want a tool error naming arguments/city", res, resultText(res), err)
			}
			if n := b.lookup.Load(); n != 1 {
				t.Errorf("lookup backend called %d times, want 1 (malformed calls never reach it)", n)
			}
			if _, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "nope"}); err == nil || !strings.Contains(err.Error(), "nope") {
				t.Errorf("unknown tool = %v, want a protocol error naming it", err)
			}
			if _, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "lookup", Arguments: map[string]any{"city": "Oslo"}, Meta: mcp.Meta{"mantle/colour": "red"}}); err == nil ||
				!strings.Contains(err.Error(), "mantle/colour") {
				t.Errorf("unknown mantle _meta key = %v, want a protocol error naming it", err)
			}

			// An action runs once per key, derived from the session and step: the client's
			// x-mantle-session and x-mantle-step headers are forwarded.
			stepped, err := connectMCP(t, ctx, m.HTTPAddr, acmeKey, map[string]string{router.HeaderSession: "sess-1", router.HeaderStep: "step-1"})
			if err != nil {
				t.Fatal(err)
			}
			for i, want := range []string{"ok", "replayed"} {
				res, err := stepped.CallTool(ctx, &mcp.CallToolParams{Name: "order", Arguments: map[string]any{"sku": "x"}})
				if err != nil || res.IsError || res.Meta[router.MCPMetaStatus] != want || !strings.Contains(resultText(res), `"order":"o-1"`) {
					t.Fatalf("order call %d = %+v (%q), %v; want %s with the first result", i, res, resultText(res), err, want)
				}
				if want == "replayed" && !strings.Contains(resultText(res), "did not run again") {
					t.Errorf("replayed result has no note for the model: %q", resultText(res))
				}
			}
			if n := b.orders.Load(); n != 1 {
				t.Errorf("order backend ran %d times for one step, want 1", n)
			}
			res, err = s.CallTool(ctx, &mcp.CallToolParams{Name: "order", Arguments: map[string]any{"sku": "x"}, Meta: mcp.Meta{router.MCPMetaIdempotencyKey: "k-9"}})
			if err != nil || res.IsError || res.Meta[router.MCPMetaIdempotencyKey] != "k-9" {
				t.Errorf("order with a key in _meta = %+v (%q), %v", res, resultText(res), err)
			}
			if n := b.orders.Load(); n != 2 {
				t.Errorf("order backend ran %d times for two keys, want 2", n)
			}
			res, err = s.CallTool(ctx, &mcp.CallToolParams{Name: "order", Arguments: map[string]any{"sku": "x"}})
			if err != nil || !res.IsError || !strings.Contains(resultText(res), "idempotency_key") {
				t.Errorf("order without key, session or step = %+v (%q), %v; want a tool error naming idempotency_key", res, resultText(res), err)
			}

			// No key, or a wrong one: refused as /v1/tools refuses them.
			for _, key := range []string{"", "sk-wrong"} {
				if _, err := connectMCP(t, ctx, m.HTTPAddr, key, nil); err == nil || !strings.Contains(err.Error(), "Unauthorized") {
					t.Errorf("connect with key %q = %v, want 401", key, err)
				}
			}
			code, body, _ := doHTTP(t, http.MethodPost, "http://"+m.HTTPAddr+router.MCPPath, "",
				`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream"})
			if code != http.StatusUnauthorized || !strings.Contains(string(body), "missing API key") {
				t.Errorf("tools/list without a key = %d %s, want 401 as /v1/tools answers", code, body)
			}
		})
	}
}

// TestMCPStaleResult: a query whose backend fails answers its last good result, and the
// MCP result says it is stale, to the model (a note) and to the client (_meta).
func TestMCPStaleResult(t *testing.T) {
	t.Parallel()
	var failing atomic.Bool
	b := newToolBackend(t)
	cfg := toolsConfig(b)
	cfg.Agent.Tools[0].Cache.MaxStaleness = time.Hour
	cfg.Agent.Tools[0].Retry.MaxRetries = 0
	cfg.Agent.Tools[0].Backend.URL = failingURL(t, &failing, b.srv.URL+"/lookup")
	m := meshtest.Start(t, cfg, meshtest.All)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := connectMCP(t, ctx, m.HTTPAddr, acmeKey, nil)
	if err != nil {
		t.Fatal(err)
	}
	args := map[string]any{"city": "Oslo"}
	if res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "lookup", Arguments: args}); err != nil || res.Meta[router.MCPMetaStatus] != "ok" {
		t.Fatalf("first call = %+v, %v", res, err)
	}
	failing.Store(true)
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "lookup", Arguments: args})
	if err != nil || res.IsError || res.Meta[router.MCPMetaStatus] != "stale" || !strings.Contains(resultText(res), `{"city":"Oslo"}`) ||
		!strings.Contains(resultText(res), "stale result") || res.Meta[router.MCPMetaNotice] == nil {
		t.Errorf("call with the backend down = %+v (%q), %v; want the stale result marked", res, resultText(res), err)
	}
}

// failingURL is a proxy to target that answers 503 while failing is set.
func failingURL(t *testing.T, failing *atomic.Bool, target string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if failing.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		resp, err := http.Post(target, "application/json", r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestMCPToolsOff: a router without an agent answers /mcp that tools are not served.
func TestMCPToolsOff(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Router.AgentAddress = router.Off
	m := meshtest.Start(t, cfg, meshtest.All)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := connectMCP(t, ctx, m.HTTPAddr, acmeKey, nil)
	if err == nil || !strings.Contains(err.Error(), "Not Found") {
		t.Errorf("connect with tools off = %v, want 404", err)
	}
	code, body, _ := doHTTP(t, http.MethodPost, "http://"+m.HTTPAddr+router.MCPPath, acmeKey, `{}`, nil)
	if code != http.StatusNotFound || !strings.Contains(string(body), "agent_address is off") {
		t.Errorf("POST /mcp with tools off = %d %s", code, body)
	}
}

// TestMCPBudget: a tools/call honours the caller's x-mantle-budget-ms. A backend slower
// than the budget ends in a tool error naming the budget, at the budget rather than at the
// tool's own timeout, and the backend's request is cancelled; a tool that answers within
// the budget is unaffected, and a budget that is not a number is refused by name.
func TestMCPBudget(t *testing.T) {
	t.Parallel()
	const budget = 400 * time.Millisecond
	started, cancelled, release := make(chan struct{}, 1), make(chan struct{}, 1), make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The server notices a closed connection only once the body has been read.
		_, _ = io.Copy(io.Discard, r.Body)
		signal(started)
		select {
		case <-r.Context().Done(): // the call was cancelled
			signal(cancelled)
		case <-release: // the test is over
		}
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(release) }) // runs first: a failed test does not hang in Close
	b := newToolBackend(t)
	cfg := toolsConfig(b)
	slowTool := cfg.Agent.Tools[0]
	slowTool.Name, slowTool.Backend.URL, slowTool.Timeout = "slow", slow.URL, time.Minute
	slowTool.Retry = agent.RetryConfig{MaxRetries: 0, Base: time.Second}
	cfg.Agent.Tools = append(cfg.Agent.Tools, slowTool)
	m := meshtest.Start(t, cfg, meshtest.All)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	s, err := connectMCP(t, ctx, m.HTTPAddr, acmeKey, map[string]string{router.HeaderBudget: fmt.Sprint(budget.Milliseconds())})
	if err != nil {
		t.Fatal(err)
	}
	args := map[string]any{"city": "Oslo"}
	if res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "lookup", Arguments: args}); err != nil || res.IsError || res.Meta[router.MCPMetaStatus] != "ok" {
		t.Fatalf("lookup within the budget = %+v (%q), %v", res, resultText(res), err)
	}

	start := time.Now()
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "slow", Arguments: args})
	took := time.Since(start)
	if err != nil || !res.IsError || res.Meta[router.MCPMetaErrorReason] != "deadline_exceeded" ||
		!strings.Contains(resultText(res), "within the call's budget of 400ms (the x-mantle-budget-ms header)") {
		t.Fatalf("slow call = %+v (%q), %v; want a tool error naming the 400ms budget", res, resultText(res), err)
	}
	// The tool's own timeout is a minute: an answer well before it came from the budget.
	if took < budget || took > budget+5*time.Second {
		t.Errorf("the slow call answered after %s, want at its %s budget", took, budget)
	}
	select {
	case <-started:
	default:
		t.Fatal("the slow backend was never called")
	}
	select {
	case <-cancelled:
	case <-ctx.Done():
		t.Fatal("the slow backend's request was not cancelled when the budget ran out")
	}

	code, body, _ := doHTTP(t, http.MethodPost, "http://"+m.HTTPAddr+router.MCPPath, acmeKey, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`,
		map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream", router.HeaderBudget: "soon"})
	if code != http.StatusBadRequest || !strings.Contains(string(body), router.HeaderBudget) {
		t.Errorf("POST /mcp with budget %q = %d %s, want 400 naming %s", "soon", code, body, router.HeaderBudget)
	}
}

// signal marks ch without blocking: a second mark is the first one.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
