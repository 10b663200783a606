package embed

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mantle-mesh/mantle/services/cache/internal/vector"
)

func similarity(t *testing.T, e interface {
	Embed(context.Context, string) (vector.Vector, error)
}, a, b string) float32 {
	t.Helper()
	va, err := e.Embed(context.Background(), a)
	if err != nil {
		t.Fatalf("Embed(%q): %v", a, err)
	}
	vb, err := e.Embed(context.Background(), b)
	if err != nil {
		t.Fatalf("Embed(%q): %v", b, err)
	}
	return vector.Dot(va, vb)
}

func TestLexicalSimilarity(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		a, b     string
		min, max float32
	}{
		{"identical", "How do I reset my password?", "How do I reset my password?", 0.9999, 1.0001},
		{"case, width and punctuation do not count", "ＨＯＷ ＤＯ Ｉ ＲＥＳＥＴ ＭＹ ＰＡＳＳＷＯＲＤ？", "how do i reset my password", 0.9999, 1.0001},
		{"function words count little", "how do I reset my password", "how to reset password", 0.85, 1},
		{"chinese function words count little", "请问怎么退货呢", "如何退货", 0.75, 1},
		{"morphology through trigrams", "cancel my subscription", "cancelling subscription", 0.4, 0.9},
		{"other product shares the frame", "华为手机怎么退货", "小米手机怎么退货", 0.3, 0.85},
		{"unrelated", "How do I reset my password?", "What is your refund policy?", 0, 0.2},
		{"unrelated chinese", "怎么重置密码", "运费怎么算", 0, 0.3},
		{"other language shares nothing", "how do I return an item", "怎么退货", 0, 0.01},
	}
	e := NewLexical()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := similarity(t, e, tt.a, tt.b)
			if s < tt.min || s > tt.max {
				t.Errorf("similarity(%q, %q) = %.3f, want in [%.2f, %.2f]", tt.a, tt.b, s, tt.min, tt.max)
			}
			if back := similarity(t, e, tt.b, tt.a); math.Abs(float64(back-s)) > 1e-6 {
				t.Errorf("similarity is not symmetric: %v and %v", s, back)
			}
		})
	}
}

func TestLexicalWithoutWords(t *testing.T) {
	t.Parallel()
	for _, text := range []string{"", "   ", "？？！", "..."} {
		if _, err := NewLexical().Embed(context.Background(), text); !errors.Is(err, vector.ErrZero) {
			t.Errorf("Embed(%q) error = %v, want vector.ErrZero", text, err)
		}
	}
}

func TestLexicalIsSparseAndStable(t *testing.T) {
	t.Parallel()
	e := NewLexical()
	a, _ := e.Embed(context.Background(), "怎么重置密码")
	b, _ := e.Embed(context.Background(), "怎么重置密码")
	if !a.Sparse() || a.Len() == 0 || a.Len() > 20 {
		t.Fatalf("vector has %d coordinates (sparse %v), want a short sparse vector", a.Len(), a.Sparse())
	}
	for i := range a.Indices {
		if a.Indices[i] != b.Indices[i] || a.Values[i] != b.Values[i] || a.Indices[i] >= lexicalBuckets {
			t.Fatalf("coordinate %d differs between calls or is out of range: %v/%v vs %v/%v", i, a.Indices[i], a.Values[i], b.Indices[i], b.Values[i])
		}
	}
	if e.Namespace() != "lexical-v1" || e.Dense() {
		t.Errorf("Namespace %q dense %v, want lexical-v1, sparse", e.Namespace(), e.Dense())
	}
}

// embeddingsServer answers POST /v1/embeddings with vector for every request it accepts and
// records the last request.
type embeddingsServer struct {
	vector []float32
	status int
	body   string
	last   struct {
		auth string
		req  embeddingsRequest
		path string
	}
}

func (s *embeddingsServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.last.auth, s.last.path = r.Header.Get("Authorization"), r.URL.Path
	_ = json.NewDecoder(r.Body).Decode(&s.last.req)
	if s.status != 0 {
		w.WriteHeader(s.status)
		_, _ = w.Write([]byte(s.body))
		return
	}
	if s.body != "" {
		_, _ = w.Write([]byte(s.body))
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]any{
		"object": "list",
		"data":   []map[string]any{{"object": "embedding", "index": 0, "embedding": s.vector}},
		"model":  s.last.req.Model,
	})
}

func TestOpenAIEmbed(t *testing.T) {
	t.Parallel()
	srv := &embeddingsServer{vector: []float32{3, 0, 4}}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)

	e, err := NewOpenAI(OpenAIConfig{BaseURL: ts.URL + "/v1/", Model: "text-embedding-3-small", Dimensions: 3, APIKey: "sk-test", Client: ts.Client()})
	if err != nil {
		t.Fatalf("NewOpenAI: %v", err)
	}
	v, err := e.Embed(context.Background(), "how do I reset my password")
	if err != nil {
		t.Fatalf("Embed: %v", err)
	}
	want := []float32{0.6, 0, 0.8} // normalised: the server's vector had length 5
	for i := range want {
		if math.Abs(float64(v.Dense[i]-want[i])) > 1e-6 {
			t.Fatalf("vector = %v, want %v", v.Dense, want)
		}
	}
	got := srv.last
	if got.path != "/v1/embeddings" || got.auth != "Bearer sk-test" || got.req.Model != "text-embedding-3-small" ||
		got.req.Dimensions != 3 || len(got.req.Input) != 1 || got.req.Input[0] != "how do I reset my password" || got.req.EncodingFormat != "float" {
		t.Errorf("request = %+v, want POST /v1/embeddings with the bearer key, model, dimensions 3 and one input", got)
	}
	if e.Namespace() != "openai-text-embedding-3-small-3" || !e.Dense() {
		t.Errorf("Namespace = %q dense %v, want openai-text-embedding-3-small-3, dense", e.Namespace(), e.Dense())
	}
}

func TestOpenAIErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		srv     embeddingsServer
		dims    int
		wantErr string
		status  int
	}{
		{name: "http error with message", srv: embeddingsServer{status: 401, body: `{"error":{"message":"invalid api key"}}`}, wantErr: "invalid api key", status: 401},
		{name: "http error without json", srv: embeddingsServer{status: 503, body: "upstream down"}, wantErr: "Service Unavailable", status: 503},
		{name: "not json", srv: embeddingsServer{body: "<html>"}, wantErr: "decode response"},
		{name: "no data", srv: embeddingsServer{body: `{"data":[]}`}, wantErr: "0 embeddings"},
		{name: "wrong dimensions", srv: embeddingsServer{vector: []float32{1, 2}}, dims: 3, wantErr: "got 2 dimensions, asked for 3"},
		{name: "zero vector", srv: embeddingsServer{vector: []float32{0, 0}}, wantErr: "zero vector"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ts := httptest.NewServer(&tt.srv)
			t.Cleanup(ts.Close)
			e, err := NewOpenAI(OpenAIConfig{BaseURL: ts.URL, Model: "m", Dimensions: tt.dims, Client: ts.Client()})
			if err != nil {
				t.Fatalf("NewOpenAI: %v", err)
			}
			_, err = e.Embed(context.Background(), "hi")
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Embed error = %v, want one containing %q", err, tt.wantErr)
			}
			var se *StatusError
			if tt.status != 0 && (!errors.As(err, &se) || se.Code != tt.status) {
				t.Errorf("error %v is not a StatusError with code %d", err, tt.status)
			}
			if tt.srv.last.auth != "" {
				t.Errorf("Authorization %q sent without an API key", tt.srv.last.auth)
			}
		})
	}
}

func TestOpenAIDimensionChangeIsAnError(t *testing.T) {
	t.Parallel()
	srv := &embeddingsServer{vector: []float32{1, 2, 3}}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	e, _ := NewOpenAI(OpenAIConfig{BaseURL: ts.URL, Model: "nomic-embed-text", Client: ts.Client()})
	if _, err := e.Embed(context.Background(), "a"); err != nil {
		t.Fatalf("first Embed: %v", err)
	}
	srv.vector = []float32{1, 2}
	if _, err := e.Embed(context.Background(), "b"); err == nil || !strings.Contains(err.Error(), "model changed") {
		t.Errorf("Embed after a dimension change: error = %v, want one saying the model changed", err)
	}
}

func TestOpenAIHonoursTheDeadline(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(release); ts.Close() })
	e, _ := NewOpenAI(OpenAIConfig{BaseURL: ts.URL, Model: "m", Client: ts.Client()})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := e.Embed(ctx, "hi"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Embed error = %v, want context.DeadlineExceeded", err)
	}
}

func TestNewOpenAIValidation(t *testing.T) {
	t.Parallel()
	for _, cfg := range []OpenAIConfig{{Model: "m"}, {BaseURL: "http://x"}, {BaseURL: "http://x", Model: "m", Dimensions: -1}} {
		if _, err := NewOpenAI(cfg); err == nil {
			t.Errorf("NewOpenAI(%+v) succeeded, want an error", cfg)
		}
	}
	e, err := NewOpenAI(OpenAIConfig{BaseURL: "http://x", Model: "BAAI/bge-m3", Version: "2"})
	if err != nil || e.Namespace() != "openai-baai_bge-m3-native-2" {
		t.Errorf("Namespace = %q (err %v), want openai-baai_bge-m3-native-2", e.Namespace(), err)
	}
}

// TestOpenAIRefusesRedirects: the embedder as the cache module builds it (no client given)
// does not follow a redirect, neither as the bodiless GET Go's client makes of a redirected
// POST nor as a replay of the body and key; the error names the target, without its query.
func TestOpenAIRefusesRedirects(t *testing.T) {
	t.Parallel()
	var followed atomic.Int64
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		followed.Add(1)
		http.Error(w, "not here", http.StatusNotFound)
	}))
	t.Cleanup(target.Close)
	mover := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/")[:3])
		http.Redirect(w, r, target.URL+"/v1/embeddings?sig=secret", code)
	}))
	t.Cleanup(mover.Close)
	for _, code := range []int{http.StatusFound, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		e, err := NewOpenAI(OpenAIConfig{BaseURL: mover.URL + "/" + strconv.Itoa(code), Model: "m", APIKey: "sk-test"})
		if err != nil {
			t.Fatalf("NewOpenAI: %v", err)
		}
		_, err = e.Embed(context.Background(), "hi")
		want := "redirected (HTTP " + strconv.Itoa(code) + ") to " + target.URL + "/v1/embeddings;"
		var se *StatusError
		if !errors.As(err, &se) || se.Code != code || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "secret") {
			t.Errorf("HTTP %d from the endpoint: error %v, want a StatusError %d naming %q and not the query", code, err, code, want)
		}
	}
	if n := followed.Load(); n != 0 {
		t.Errorf("the redirect target was sent %d requests; want none", n)
	}
}
