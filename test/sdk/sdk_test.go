//go:build sdk

// Package sdk checks mantle against the official OpenAI SDKs. It needs Node.js and
// `npm ci` in this directory (make test-sdk does both), so it is not part of make test.
package sdk

import (
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
