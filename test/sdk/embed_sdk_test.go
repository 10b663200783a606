//go:build sdk

package sdk

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/router"
)

// TestOpenAINodeSDKEmbeddings runs embeddings.mjs: the SDK's embeddings.create through
// mantle to an OpenAI-type upstream that answers input i with [i, 0.5, -0.25].
func TestOpenAINodeSDKEmbeddings(t *testing.T) {
	var mu sync.Mutex
	var last []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/recorded/last") {
			_, _ = w.Write(last)
			return
		}
		last, _ = io.ReadAll(r.Body)
		var body struct {
			Input []json.RawMessage `json:"input"`
		}
		_ = json.Unmarshal(last, &body)
		var data []string
		for i := range body.Input {
			data = append(data, fmt.Sprintf(`{"object":"embedding","index":%d,"embedding":[%d,0.5,-0.25]}`, i, i))
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"list","data":[%s],"model":"embed-small","usage":{"prompt_tokens":4,"total_tokens":4}}`, strings.Join(data, ","))
	}))
	t.Cleanup(srv.Close)
	t.Setenv("MANTLE_SDK_UPSTREAM_KEY", "sk-upstream")
	cfg := mesh.Default()
	cfg.Auth.Tenants = []rpc.TenantKey{{ID: "sdk", KeySHA256: rpc.HashKey(key)}}
	cfg.Router.Providers = []router.ProviderConfig{{Name: "up", Type: router.ProviderOpenAI, BaseURL: srv.URL + "/v1", Timeout: 5 * time.Second,
		Keys: []router.KeyConfig{{ID: "k1", Env: "MANTLE_SDK_UPSTREAM_KEY"}}}}
	cfg.Router.Models = []router.ModelConfig{
		{Name: "embed", Provider: "up", Upstream: "embed-small", Capabilities: &router.Capabilities{Embeddings: true}},
		{Name: "gpt", Provider: "up"},
	}
	cfg.Router.Routes = []router.RouteConfig{{Name: "chat", Candidates: []string{"gpt"}}}
	m := meshtest.Start(t, cfg, meshtest.All)

	cmd := exec.Command("node", "embeddings.mjs")
	cmd.Env = append(cmd.Environ(), "MANTLE_BASE_URL=http://"+m.HTTPAddr+"/v1", "MANTLE_API_KEY="+key, "UPSTREAM_URL="+srv.URL)
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("openai-node embeddings against mantle: %v", err)
	}
}
