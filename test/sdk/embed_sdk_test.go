//go:build sdk

package sdk

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

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
	m := upstreamMesh(t, router.ProviderOpenAI, srv.URL+"/v1", []router.ModelConfig{
		{Name: "embed", Provider: "up", Upstream: "embed-small", Capabilities: &router.Capabilities{Embeddings: true}},
		{Name: "gpt", Provider: "up"},
	}, router.RouteConfig{Name: "chat", Candidates: []string{"gpt"}})

	runNode(t, "embeddings.mjs", "MANTLE_BASE_URL=http://"+m.HTTPAddr+"/v1", "MANTLE_API_KEY="+key, "UPSTREAM_URL="+srv.URL)
}
