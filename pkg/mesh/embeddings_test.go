package mesh_test

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/pkg/openaiapi"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/router"
)

// embedUpstream is an OpenAI-compatible embeddings server that keeps the bodies it was
// sent. Model "down-model" answers 503; any other gets, for input i, the vector
// [i, len(model), 0.25] (or dimensions values when asked).
type embedUpstream struct {
	mu     sync.Mutex
	bodies []map[string]json.RawMessage
}

func (u *embedUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	var body map[string]json.RawMessage
	if r.URL.Path != "/v1/embeddings" || json.Unmarshal(raw, &body) != nil {
		http.Error(w, `{"error":{"message":"no","type":"invalid_request_error"}}`, http.StatusBadRequest)
		return
	}
	u.mu.Lock()
	u.bodies = append(u.bodies, body)
	u.mu.Unlock()
	var model string
	_ = json.Unmarshal(body["model"], &model)
	if model == "down-model" {
		http.Error(w, `{"error":{"message":"overloaded","type":"server_error"}}`, http.StatusServiceUnavailable)
		return
	}
	var inputs []json.RawMessage
	if json.Unmarshal(body["input"], &inputs) != nil {
		inputs = []json.RawMessage{body["input"]}
	}
	dims := 3
	_ = json.Unmarshal(body["dimensions"], &dims)
	var data []string
	for i := range inputs {
		v := make([]string, dims)
		for j := range v {
			v[j] = fmt.Sprint([]float64{float64(i), float64(len(model)), 0.25}[j%3])
		}
		data = append(data, fmt.Sprintf(`{"object":"embedding","index":%d,"embedding":[%s]}`, i, strings.Join(v, ",")))
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"object":"list","data":[%s],"model":%q,"usage":{"prompt_tokens":7,"total_tokens":7}}`, strings.Join(data, ","), model)
}

func (u *embedUpstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.bodies)
}

func (u *embedUpstream) last() map[string]json.RawMessage {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.bodies[len(u.bodies)-1]
}

type embeddingsAnswer struct {
	Object string `json:"object"`
	Data   []struct {
		Object    string          `json:"object"`
		Index     int             `json:"index"`
		Embedding json.RawMessage `json:"embedding"`
	} `json:"data"`
	Model string `json:"model"`
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
	Error struct {
		Message string  `json:"message"`
		Param   *string `json:"param"`
	} `json:"error"`
}

// TestEmbeddingsThroughTheMesh sends POST /v1/embeddings through the whole mesh to an
// OpenAI-type upstream: what the upstream received, the answer's shape, the exact cache,
// base64, token inputs, failover past a 503, and the refusals between chat and embeddings.
func TestEmbeddingsThroughTheMesh(t *testing.T) {
	up := &embedUpstream{}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	t.Setenv("MANTLE_EMBED_UPSTREAM_KEY", "sk-upstream")
	embeds := &router.Capabilities{Embeddings: true}
	cfg := mesh.Default()
	cfg.Auth.Tenants = []rpc.TenantKey{{ID: "compat", KeySHA256: rpc.HashKey(compatKey)}}
	cfg.Router.DefaultBudget = 10 * time.Second
	cfg.Router.Providers = []router.ProviderConfig{{Name: "up", Type: router.ProviderOpenAI, BaseURL: srv.URL + "/v1",
		Timeout: 5 * time.Second, Keys: []router.KeyConfig{{ID: "k1", Env: "MANTLE_EMBED_UPSTREAM_KEY"}}}}
	cfg.Router.Models = []router.ModelConfig{
		{Name: "emb", Provider: "up", Upstream: "embed-small", Capabilities: embeds},
		{Name: "emb-down", Provider: "up", Upstream: "down-model", Capabilities: embeds},
		{Name: "emb-backup", Provider: "up", Upstream: "embed-backup", Capabilities: embeds},
		{Name: "gpt", Provider: "up"},
	}
	cfg.Router.Routes = []router.RouteConfig{
		{Name: "embed", Candidates: []string{"emb"}},
		{Name: "embed-failover", Candidates: []string{"emb-down", "emb-backup"}},
		{Name: "chat", Candidates: []string{"gpt"}},
	}
	m := meshtest.Start(t, cfg, meshtest.All)
	base := "http://" + m.HTTPAddr

	post := func(path, body string) (int, embeddingsAnswer, http.Header) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+compatKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out embeddingsAnswer
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatalf("answer is not JSON: %v", err)
		}
		return resp.StatusCode, out, resp.Header
	}
	floats := func(t *testing.T, raw json.RawMessage) []float64 {
		t.Helper()
		var v []float64
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatalf("embedding %s: %v", raw, err)
		}
		return v
	}

	t.Run("forwarded and answered in OpenAI's shape", func(t *testing.T) {
		code, out, _ := post("/v1/embeddings", `{"model":"embed","input":["hello","world"],"dimensions":3,"user":"u1"}`)
		if code != http.StatusOK {
			t.Fatalf("status %d: %s", code, out.Error.Message)
		}
		got := up.last()
		for field, want := range map[string]string{"model": `"embed-small"`, "input": `["hello","world"]`, "dimensions": `3`, "user": `"u1"`, "encoding_format": `"float"`} {
			if string(got[field]) != want {
				t.Errorf("upstream got %s = %s, want %s", field, got[field], want)
			}
		}
		if len(got) != 5 {
			t.Errorf("upstream got %d fields: %v", len(got), got)
		}
		if out.Object != "list" || len(out.Data) != 2 || out.Model != "emb" || out.Usage.PromptTokens != 7 || out.Usage.TotalTokens != 7 {
			t.Fatalf("answer %+v", out)
		}
		for i, d := range out.Data {
			if d.Object != "embedding" || d.Index != i || fmt.Sprint(floats(t, d.Embedding)) != fmt.Sprint([]float64{float64(i), 11, 0.25}) {
				t.Errorf("data[%d] = %+v %s", i, d, d.Embedding)
			}
		}
	})
	t.Run("docs/compatibility.md says the same", func(t *testing.T) {
		// The first subtest saw these five fields reach the upstream, and refusals below
		// see an unknown field refused; the table must say exactly that.
		want := map[string]string{"model": "forwarded", "input": "forwarded", "dimensions": "forwarded",
			"encoding_format": "forwarded", "user": "forwarded"}
		doc, err := os.ReadFile("../../docs/compatibility.md")
		if err != nil {
			t.Fatal(err)
		}
		row := regexp.MustCompile("^\\| `([^`]+)` \\| ([a-z]+)")
		in, seen := false, map[string]bool{}
		for _, line := range strings.Split(string(doc), "\n") {
			if strings.HasPrefix(line, "| Embeddings field") {
				in = true
			} else if in && !strings.HasPrefix(line, "|") {
				break
			}
			if m := row.FindStringSubmatch(line); in && m != nil {
				seen[m[1]] = true
				if want[m[1]] != m[2] {
					t.Errorf("docs/compatibility.md says %s is %s; the test saw %q", m[1], m[2], want[m[1]])
				}
			}
		}
		for f := range want {
			if !seen[f] {
				t.Errorf("docs/compatibility.md has no embeddings row for %s", f)
			}
		}
		if !slices.Equal(slices.Sorted(maps.Keys(want)), slices.Sorted(slices.Values(openaiapi.EmbeddingsFields))) {
			t.Errorf("the decoder's fields %v are not the ones tested", openaiapi.EmbeddingsFields)
		}
	})
	t.Run("identical request is an exact cache hit", func(t *testing.T) {
		before := up.count()
		code, out, h := post("/v1/embeddings", `{"model":"embed","input":["hello","world"],"dimensions":3,"user":"u1"}`)
		if code != http.StatusOK || up.count() != before || h.Get("X-Mantle-Cache") != "hit" {
			t.Fatalf("status %d, %d upstream calls, cache %q", code, up.count()-before, h.Get("X-Mantle-Cache"))
		}
		if fmt.Sprint(floats(t, out.Data[1].Embedding)) != fmt.Sprint([]float64{1, 11, 0.25}) {
			t.Errorf("cached vector %s", out.Data[1].Embedding)
		}
		// Another input, dimensions or encoding is another answer.
		for _, body := range []string{
			`{"model":"embed","input":["hello","world!"],"dimensions":3}`,
			`{"model":"embed","input":["hello","world"],"dimensions":4}`,
			`{"model":"embed","input":["hello","world"],"dimensions":3,"encoding_format":"base64"}`,
		} {
			before := up.count()
			if code, out, _ := post("/v1/embeddings", body); code != http.StatusOK || up.count() != before+1 {
				t.Errorf("%s: status %d (%s), %d upstream calls, want 1", body, code, out.Error.Message, up.count()-before)
			}
		}
	})
	t.Run("base64", func(t *testing.T) {
		code, out, _ := post("/v1/embeddings", `{"model":"embed","input":"one","encoding_format":"base64"}`)
		if code != http.StatusOK || len(out.Data) != 1 {
			t.Fatalf("status %d: %+v", code, out)
		}
		var s string
		_ = json.Unmarshal(out.Data[0].Embedding, &s)
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil || len(b) != 12 {
			t.Fatalf("base64 %q: %v", s, err)
		}
		var v []float32
		for i := 0; i < len(b); i += 4 {
			v = append(v, math.Float32frombits(binary.LittleEndian.Uint32(b[i:])))
		}
		if fmt.Sprint(v) != fmt.Sprint([]float32{0, 11, 0.25}) {
			t.Errorf("decoded %v", v)
		}
		if string(up.last()["input"]) != `["one"]` {
			t.Errorf("upstream input %s", up.last()["input"])
		}
	})
	t.Run("token inputs", func(t *testing.T) {
		code, out, _ := post("/v1/embeddings", `{"model":"embed","input":[[1,2],[3]]}`)
		if code != http.StatusOK || len(out.Data) != 2 {
			t.Fatalf("status %d: %+v", code, out)
		}
		if string(up.last()["input"]) != `[[1,2],[3]]` {
			t.Errorf("upstream input %s", up.last()["input"])
		}
	})
	t.Run("fails over past a 503", func(t *testing.T) {
		before := up.count()
		code, out, h := post("/v1/embeddings", `{"model":"embed-failover","input":"x"}`)
		if code != http.StatusOK || out.Model != "emb-backup" || h.Get("X-Mantle-Fallback-Level") != "backup_model" {
			t.Fatalf("status %d model %q level %q: %s", code, out.Model, h.Get("X-Mantle-Fallback-Level"), out.Error.Message)
		}
		if up.count()-before != 2 {
			t.Errorf("%d upstream calls, want the 503 and the backup's answer", up.count()-before)
		}
	})
	t.Run("grpc Embed reserves quota for the counted input", func(t *testing.T) {
		client := routerv1.NewRouterServiceClient(meshtest.Dial(t, m.GRPCAddr))
		ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+compatKey)
		resp, err := client.Embed(ctx, &routerv1.EmbedRequest{Model: "embed", Input: []string{"count these five words please"}})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Data) != 1 || len(resp.Data[0].Vector) != 3 || resp.Usage.GetInputTokens() != 7 || resp.Quality.GetTenant() != "compat" {
			t.Fatalf("answer %v", resp)
		}
		reserved := ""
		for _, s := range resp.Quality.GetAudit() {
			if s.Service == "quota" && s.Step == "reserve" {
				reserved = s.Detail
			}
		}
		// Quota counted the input with its tokenizer, and reserved one output token.
		if !strings.Contains(reserved, " input + 1 max output") || strings.Contains(reserved, "(0 input") {
			t.Errorf("quota's reserve step: %q", reserved)
		}
	})
	t.Run("refusals name the field", func(t *testing.T) {
		for _, tt := range []struct{ path, body, param string }{
			{"/v1/embeddings", `{"model":"chat","input":"x"}`, "model"},
			{"/v1/embeddings", `{"model":"embed","input":"x","truncate":"END"}`, "truncate"},
			{"/v1/embeddings", `{"model":"embed","input":[""]}`, "input[0]"},
			{"/v1/embeddings", `{"model":"embed"}`, "input"},
			{"/v1/chat/completions", `{"model":"embed","messages":[{"role":"user","content":"hi"}]}`, "model"},
		} {
			before := up.count()
			code, out, _ := post(tt.path, tt.body)
			if code != http.StatusBadRequest || out.Error.Param == nil || *out.Error.Param != tt.param {
				t.Errorf("%s %s: status %d param %v (%s), want 400 naming %s", tt.path, tt.body, code, out.Error.Param, out.Error.Message, tt.param)
			}
			if up.count() != before {
				t.Errorf("%s: the upstream was called", tt.body)
			}
		}
	})
}
