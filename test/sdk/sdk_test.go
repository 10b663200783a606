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

	runNode(t, "compat.mjs", "MANTLE_BASE_URL=http://"+m.HTTPAddr+"/v1", "MANTLE_API_KEY="+key)
}

// TestOpenAINodeSDKFields runs fields.mjs: tool calling (unary, streamed with parallel
// index-based pieces, and the follow-up turn with tool results), a vision request,
// stop/seed/top_p/logprobs and json_schema structured output through mantle to a recording
// OpenAI-type upstream; the script checks what the upstream received and what the SDK got.
func TestOpenAINodeSDKFields(t *testing.T) {
	up := &meshtest.RecordingUpstream{}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	m := upstreamMesh(t, router.ProviderOpenAI, srv.URL+"/v1", []router.ModelConfig{{Name: "gpt", Provider: "up"}},
		router.RouteConfig{Name: "chat", Candidates: []string{"gpt"}})
	runNode(t, "fields.mjs", "MANTLE_BASE_URL=http://"+m.HTTPAddr+"/v1", "MANTLE_API_KEY="+key, "UPSTREAM_URL="+srv.URL)
}

// TestAnthropicSDKMessages runs messages.mjs: the official Anthropic TypeScript SDK against
// /v1/messages (text, tools unary and streamed with input_json_delta, the tool_result turn,
// an image, stop_sequences, refused fields, a wrong key) through mantle to a recording
// OpenAI-type upstream; the script checks what the upstream received and what the SDK got.
func TestAnthropicSDKMessages(t *testing.T) {
	up := &meshtest.RecordingUpstream{}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	m := upstreamMesh(t, router.ProviderOpenAI, srv.URL+"/v1", []router.ModelConfig{{Name: "gpt", Provider: "up"}},
		router.RouteConfig{Name: "chat", Candidates: []string{"gpt"}})
	runNode(t, "messages.mjs", "MANTLE_URL=http://"+m.HTTPAddr, "MANTLE_API_KEY="+key, "UPSTREAM_URL="+srv.URL)
}

// TestAnthropicSDKToAnthropicUpstream runs messages-anthropic.mjs: the official Anthropic
// TypeScript SDK against /v1/messages (text and sampling fields, tools unary and streamed,
// tool results with is_error, an image, extended thinking) through mantle to a recording
// Anthropic-type upstream; the script checks the Anthropic request the upstream received.
func TestAnthropicSDKToAnthropicUpstream(t *testing.T) {
	up := &meshtest.AnthropicRecordingUpstream{}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	m := upstreamMesh(t, router.ProviderAnthropic, srv.URL, []router.ModelConfig{{Name: "claude", Provider: "up", Upstream: "claude-up"}})
	runNode(t, "messages-anthropic.mjs", "MANTLE_URL=http://"+m.HTTPAddr, "MANTLE_API_KEY="+key, "UPSTREAM_URL="+srv.URL)
}

// upstreamMesh starts a whole mesh whose one provider (of type typ, named "up") is the
// recording upstream at url, with models, and optionally routes over them.
func upstreamMesh(t *testing.T, typ, url string, models []router.ModelConfig, routes ...router.RouteConfig) *meshtest.Mesh {
	t.Helper()
	t.Setenv("MANTLE_SDK_UPSTREAM_KEY", "sk-upstream")
	cfg := mesh.Default()
	cfg.Auth.Tenants = []rpc.TenantKey{{ID: "sdk", KeySHA256: rpc.HashKey(key)}}
	cfg.Router.Providers = []router.ProviderConfig{{Name: "up", Type: typ, BaseURL: url, Timeout: 5 * time.Second,
		Keys: []router.KeyConfig{{ID: "k1", Env: "MANTLE_SDK_UPSTREAM_KEY"}}}}
	cfg.Router.Models, cfg.Router.Routes = models, routes
	return meshtest.Start(t, cfg, meshtest.All)
}

// runNode runs a script of this directory with env added to the environment, and fails
// the test with its output when it fails.
func runNode(t *testing.T, script string, env ...string) {
	t.Helper()
	cmd := exec.Command("node", script)
	cmd.Env = append(cmd.Environ(), env...)
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("%s against mantle: %v", script, err)
	}
}
