//go:build sdk

// Package sdk checks mantle against the official OpenAI and Anthropic SDKs. It needs Node.js and
// `npm ci` in this directory (make test-sdk does both), so it is not part of make test.
package sdk

import (
	"net/http/httptest"
	"os/exec"
	"testing"
	"time"

	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/router"
)

const key = "sk-sdk-test"

func TestOpenAINodeSDK(t *testing.T) {
	cfg := mesh.Default()
	cfg.Auth.Tenants = []rpc.TenantKey{{ID: "sdk", KeySHA256: rpc.HashKey(key)}}
	cfg.Router.Providers = []router.ProviderConfig{{Name: "sim", Type: router.ProviderSim, Timeout: 5 * time.Second, SimProfile: "fast"}}
	cfg.Router.Models = []router.ModelConfig{{Name: "primary", Provider: "sim"}, {Name: "backup", Provider: "sim"}}
	cfg.Router.Routes = []router.RouteConfig{{Name: "chat", Candidates: []string{"primary", "backup"}}}
	m := meshtest.Start(t, cfg, meshtest.All)

	cmd := exec.Command("node", "compat.mjs")
	cmd.Env = append(cmd.Environ(), "MANTLE_BASE_URL=http://"+m.HTTPAddr+"/v1", "MANTLE_API_KEY="+key)
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("openai-node against mantle: %v", err)
	}
}

// TestOpenAINodeSDKFields runs fields.mjs: tool calling (unary, streamed with parallel
// index-based pieces, and the follow-up turn with tool results), a vision request,
// stop/seed/top_p/logprobs and json_schema structured output through mantle to a recording
// OpenAI-type upstream; the script checks what the upstream received and what the SDK got.
func TestOpenAINodeSDKFields(t *testing.T) {
	up := &meshtest.RecordingUpstream{}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	t.Setenv("MANTLE_SDK_UPSTREAM_KEY", "sk-upstream")
	cfg := mesh.Default()
	cfg.Auth.Tenants = []rpc.TenantKey{{ID: "sdk", KeySHA256: rpc.HashKey(key)}}
	cfg.Router.Providers = []router.ProviderConfig{{Name: "up", Type: router.ProviderOpenAI, BaseURL: srv.URL + "/v1", Timeout: 5 * time.Second,
		Keys: []router.KeyConfig{{ID: "k1", Env: "MANTLE_SDK_UPSTREAM_KEY"}}}}
	cfg.Router.Models = []router.ModelConfig{{Name: "gpt", Provider: "up"}}
	cfg.Router.Routes = []router.RouteConfig{{Name: "chat", Candidates: []string{"gpt"}}}
	m := meshtest.Start(t, cfg, meshtest.All)

	cmd := exec.Command("node", "fields.mjs")
	cmd.Env = append(cmd.Environ(), "MANTLE_BASE_URL=http://"+m.HTTPAddr+"/v1", "MANTLE_API_KEY="+key, "UPSTREAM_URL="+srv.URL)
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("openai-node fields against mantle: %v", err)
	}
}

// TestAnthropicSDKMessages runs messages.mjs: the official Anthropic TypeScript SDK against
// /v1/messages (text, tools unary and streamed with input_json_delta, the tool_result turn,
// an image, stop_sequences, refused fields, a wrong key) through mantle to a recording
// OpenAI-type upstream; the script checks what the upstream received and what the SDK got.
func TestAnthropicSDKMessages(t *testing.T) {
	up := &meshtest.RecordingUpstream{}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	t.Setenv("MANTLE_SDK_UPSTREAM_KEY", "sk-upstream")
	cfg := mesh.Default()
	cfg.Auth.Tenants = []rpc.TenantKey{{ID: "sdk", KeySHA256: rpc.HashKey(key)}}
	cfg.Router.Providers = []router.ProviderConfig{{Name: "up", Type: router.ProviderOpenAI, BaseURL: srv.URL + "/v1", Timeout: 5 * time.Second,
		Keys: []router.KeyConfig{{ID: "k1", Env: "MANTLE_SDK_UPSTREAM_KEY"}}}}
	cfg.Router.Models = []router.ModelConfig{{Name: "gpt", Provider: "up"}}
	cfg.Router.Routes = []router.RouteConfig{{Name: "chat", Candidates: []string{"gpt"}}}
	m := meshtest.Start(t, cfg, meshtest.All)

	cmd := exec.Command("node", "messages.mjs")
	cmd.Env = append(cmd.Environ(), "MANTLE_URL=http://"+m.HTTPAddr, "MANTLE_API_KEY="+key, "UPSTREAM_URL="+srv.URL)
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("anthropic-sdk messages against mantle: %v", err)
	}
}

// TestAnthropicSDKToAnthropicUpstream runs messages-anthropic.mjs: the official Anthropic
// TypeScript SDK against /v1/messages (text and sampling fields, tools unary and streamed,
// tool results with is_error, an image, extended thinking) through mantle to a recording
// Anthropic-type upstream; the script checks the Anthropic request the upstream received.
func TestAnthropicSDKToAnthropicUpstream(t *testing.T) {
	up := &meshtest.AnthropicRecordingUpstream{}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	t.Setenv("MANTLE_SDK_UPSTREAM_KEY", "sk-upstream")
	cfg := mesh.Default()
	cfg.Auth.Tenants = []rpc.TenantKey{{ID: "sdk", KeySHA256: rpc.HashKey(key)}}
	cfg.Router.Providers = []router.ProviderConfig{{Name: "ant", Type: router.ProviderAnthropic, BaseURL: srv.URL, Timeout: 5 * time.Second,
		Keys: []router.KeyConfig{{ID: "k1", Env: "MANTLE_SDK_UPSTREAM_KEY"}}}}
	cfg.Router.Models = []router.ModelConfig{{Name: "claude", Provider: "ant", Upstream: "claude-up"}}
	m := meshtest.Start(t, cfg, meshtest.All)

	cmd := exec.Command("node", "messages-anthropic.mjs")
	cmd.Env = append(cmd.Environ(), "MANTLE_URL=http://"+m.HTTPAddr, "MANTLE_API_KEY="+key, "UPSTREAM_URL="+srv.URL)
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("anthropic-sdk messages to an Anthropic upstream: %v", err)
	}
}
