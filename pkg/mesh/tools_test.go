package mesh_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/agent/v1"
	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/services/agent"
)

// toolBackend is a real HTTP tool backend that counts the calls of each path.
type toolBackend struct {
	srv    *httptest.Server
	orders atomic.Int64
	lookup atomic.Int64
}

func newToolBackend(t *testing.T) *toolBackend {
	t.Helper()
	b := &toolBackend{}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/order":
			n := b.orders.Add(1)
			_, _ = io.WriteString(w, `{"order":"o-`+string(rune('0'+n))+`","key":"`+r.Header.Get("Idempotency-Key")+`"}`)
		default:
			b.lookup.Add(1)
			_, _ = w.Write(body) // echoes the arguments
		}
	}))
	t.Cleanup(b.srv.Close)
	return b
}

// toolsConfig is testConfig with a query tool and an action tool on b.
func toolsConfig(b *toolBackend) mesh.Config {
	cfg := testConfig()
	cfg.Agent.Tools = []agent.ToolConfig{
		{
			Name: "lookup", Description: "Looks a city up.", Kind: agent.KindQuery,
			InputSchema: map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []any{"city"}},
			Backend:     agent.BackendConfig{Type: agent.BackendHTTP, URL: b.srv.URL + "/lookup"},
		},
		{
			Name: "order", Description: "Places an order.", Kind: agent.KindAction,
			Backend: agent.BackendConfig{Type: agent.BackendHTTP, URL: b.srv.URL + "/order"},
		},
	}
	return cfg
}

// TestToolsThroughTheHTTPDoor calls the tool gateway as an agent does, through the
// router's HTTP door with a tenant key, in both deployment shapes.
func TestToolsThroughTheHTTPDoor(t *testing.T) {
	t.Parallel()
	for _, mode := range []meshtest.Mode{meshtest.All, meshtest.Split} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b := newToolBackend(t)
			m := meshtest.Start(t, toolsConfig(b), mode)
			base := "http://" + m.HTTPAddr

			code, body, _ := doHTTP(t, http.MethodGet, base+"/v1/tools", acmeKey, "", nil)
			var list struct {
				Data []struct {
					Name, Kind  string
					InputSchema json.RawMessage `json:"input_schema"`
				}
			}
			if err := json.Unmarshal(body, &list); code != http.StatusOK || err != nil || len(list.Data) != 2 ||
				list.Data[0].Name != "lookup" || list.Data[1].Kind != "action" || !strings.Contains(string(list.Data[0].InputSchema), `"required":["city"]`) {
				t.Fatalf("GET /v1/tools = %d %s", code, body)
			}

			code, body, h := doHTTP(t, http.MethodPost, base+"/v1/tools/lookup/call", acmeKey, `{"arguments":{"city":"Oslo"}}`, nil)
			if code != http.StatusOK || h.Get("x-mantle-tool-status") != "ok" || !strings.Contains(string(body), `"result":{"city":"Oslo"}`) {
				t.Fatalf("call lookup = %d %v %s", code, h, body)
			}
			// Arguments as a string, as a model writes them.
			if code, body, _ := doHTTP(t, http.MethodPost, base+"/v1/tools/lookup/call", acmeKey, `{"arguments":"{\"city\":\"Rome\"}"}`, nil); code != http.StatusOK {
				t.Fatalf("call lookup with string arguments = %d %s", code, body)
			}

			code, body, _ = doHTTP(t, http.MethodPost, base+"/v1/tools/lookup/call", acmeKey, `{"arguments":{"town":"Oslo"}}`, nil)
			if code != http.StatusBadRequest || !strings.Contains(string(body), `"code":"invalid_arguments"`) || !strings.Contains(string(body), "invalid_request_error") {
				t.Errorf("malformed call = %d %s, want 400 invalid_request_error INVALID_ARGUMENTS", code, body)
			}
			if code, body, _ := doHTTP(t, http.MethodPost, base+"/v1/tools/lookup/call", acmeKey, `{"arguments":{},"extra":1}`, nil); code != http.StatusBadRequest || !strings.Contains(string(body), "extra") {
				t.Errorf("unknown body field = %d %s, want 400 naming it", code, body)
			}
			if code, _, _ := doHTTP(t, http.MethodPost, base+"/v1/tools/nope/call", acmeKey, `{}`, nil); code != http.StatusNotFound {
				t.Errorf("unknown tool = %d, want 404", code)
			}
			if n := b.lookup.Load(); n != 2 {
				t.Errorf("lookup backend called %d times, want 2 (malformed calls never reach it)", n)
			}

			if code, _, _ := doHTTP(t, http.MethodGet, base+"/v1/tools", "", "", nil); code != http.StatusUnauthorized {
				t.Errorf("GET /v1/tools without a key = %d, want 401", code)
			}
			if code, _, _ := doHTTP(t, http.MethodPost, base+"/v1/tools/lookup/call", "sk-wrong", `{}`, nil); code != http.StatusUnauthorized {
				t.Errorf("call with a wrong key = %d, want 401", code)
			}

			hdr := map[string]string{"Idempotency-Key": "order-7"}
			for i, want := range []string{"ok", "replayed", "replayed"} {
				code, body, h := doHTTP(t, http.MethodPost, base+"/v1/tools/order/call", acmeKey, `{"arguments":{"sku":"x"}}`, hdr)
				if code != http.StatusOK || h.Get("x-mantle-tool-status") != want || !strings.Contains(string(body), `"order":"o-1"`) {
					t.Fatalf("order call %d = %d %v %s, want %s with the first result", i, code, h.Get("x-mantle-tool-status"), body, want)
				}
			}
			if n := b.orders.Load(); n != 1 {
				t.Errorf("order backend ran %d times for one key, want 1", n)
			}
			code, body, _ = doHTTP(t, http.MethodPost, base+"/v1/tools/order/call", acmeKey, `{"arguments":{"sku":"y"}}`, hdr)
			if code != http.StatusUnprocessableEntity || !strings.Contains(string(body), "idempotency_key_reused") {
				t.Errorf("key reused with other arguments = %d %s, want 422", code, body)
			}
			if code, body, _ := doHTTP(t, http.MethodPost, base+"/v1/tools/order/call", acmeKey, `{"arguments":{"sku":"x"}}`, nil); code != http.StatusBadRequest || !strings.Contains(string(body), "idempotency_key") {
				t.Errorf("action without a key = %d %s, want 400 naming idempotency_key", code, body)
			}
		})
	}
}

// TestToolPlanes: a tenant key lists and calls tools over gRPC but cannot describe the
// deployment's backends; an operator can.
func TestToolPlanes(t *testing.T) {
	t.Parallel()
	b := newToolBackend(t)
	m := meshtest.Start(t, toolsConfig(b), meshtest.All)
	client := agentv1.NewToolServiceClient(meshtest.Dial(t, m.GRPCAddr))
	if _, err := client.DescribeTools(authed(acmeKey), &agentv1.DescribeToolsRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("DescribeTools with a tenant key = %v, want PERMISSION_DENIED", err)
	}
	resp, err := client.DescribeTools(authed(meshtest.OperatorKey), &agentv1.DescribeToolsRequest{})
	if err != nil || len(resp.GetTools()) != 2 || resp.GetTools()[0].GetEndpoint() != b.srv.URL+"/lookup" {
		t.Errorf("DescribeTools with the operator key = %v, %v", resp, err)
	}
	list, err := client.ListTools(authed(acmeKey), &agentv1.ListToolsRequest{})
	if err != nil || len(list.GetTools()) != 2 {
		t.Errorf("ListTools with a tenant key = %v, %v", list, err)
	}
	res, err := client.CallTool(authed(acmeKey), &agentv1.CallToolRequest{Name: "lookup", Arguments: `{"city":"Oslo"}`})
	if err != nil || res.GetStatus() != agentv1.ToolCallStatus_TOOL_CALL_STATUS_OK || res.GetQuality().GetTenant() != "acme" {
		t.Errorf("CallTool with a tenant key = %v, %v", res, err)
	}
}

// doHTTP sends one request with key as its bearer token ("" for none).
func doHTTP(t *testing.T, method, url, key, body string, headers map[string]string) (int, []byte, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out, resp.Header
}
