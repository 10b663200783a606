package embed

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/mantle-mesh/mantle/pkg/httpbody"
	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/services/cache/internal/vector"
)

// OpenAIConfig configures an OpenAI-compatible embeddings endpoint.
type OpenAIConfig struct {
	// BaseURL is the API root that /embeddings is appended to, for example
	// https://api.openai.com/v1, http://localhost:11434/v1 (Ollama), http://tei:80/v1,
	// http://vllm:8000/v1 or https://dashscope.aliyuncs.com/compatible-mode/v1.
	BaseURL string
	Model   string
	// Dimensions asks models that can shorten their vectors (text-embedding-3-*) for this
	// many; 0 leaves the parameter out and takes the model's size.
	Dimensions int
	// APIKey is sent as a bearer token when not empty.
	APIKey string
	// Version is appended to the namespace. Change it when the model behind the endpoint
	// changes without its name changing (a new checkpoint under the same tag), so old
	// vectors stop being compared with new ones.
	Version string
	// Client sends the requests; nil uses one that does not follow redirects
	// (provider.RefuseRedirects), as the cache module does. Deadlines come from the
	// context of each call.
	Client *http.Client
}

// OpenAI embeds through POST {base_url}/embeddings, the API that OpenAI, Ollama, TEI, vLLM
// and DashScope (compatible mode) share. It is safe for concurrent use.
type OpenAI struct {
	cfg       OpenAIConfig
	url       string
	namespace string
	// dim is the dimension of the first vector received; every later vector must match it,
	// or the model changed under the namespace.
	dim atomic.Int64
}

// maxResponseBytes bounds the body read from the endpoint: a 3072-dimension vector is about
// 70 KB of JSON, so anything near this is not an embeddings response.
const maxResponseBytes = 8 << 20

// NewOpenAI returns a client for cfg.
func NewOpenAI(cfg OpenAIConfig) (*OpenAI, error) {
	if cfg.BaseURL == "" || cfg.Model == "" {
		return nil, errors.New("embed: openai embedder needs a base_url and a model")
	}
	if cfg.Dimensions < 0 {
		return nil, fmt.Errorf("embed: dimensions must not be negative, got %d", cfg.Dimensions)
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{CheckRedirect: provider.RefuseRedirects}
	}
	dims := "native"
	if cfg.Dimensions > 0 {
		dims = strconv.Itoa(cfg.Dimensions)
	}
	ns := "openai-" + cfg.Model + "-" + dims
	if cfg.Version != "" {
		ns += "-" + cfg.Version
	}
	return &OpenAI{
		cfg:       cfg,
		url:       strings.TrimRight(cfg.BaseURL, "/") + "/embeddings",
		namespace: sanitize(ns),
	}, nil
}

// Namespace implements the cache's Embedder: the model, its dimensions and the configured
// version.
func (o *OpenAI) Namespace() string { return o.namespace }

// Dense reports that the embedder's vectors are dense.
func (*OpenAI) Dense() bool { return true }

type embeddingsRequest struct {
	Model          string   `json:"model"`
	Input          []string `json:"input"`
	Dimensions     int      `json:"dimensions,omitempty"`
	EncodingFormat string   `json:"encoding_format"`
}

type embeddingsResponse struct {
	Data []struct {
		Embedding []float32 `json:"embedding"`
		Index     int       `json:"index"`
	} `json:"data"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// StatusError is a non-2xx answer from the endpoint.
type StatusError struct {
	Code    int
	Message string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("embeddings endpoint answered %d: %s", e.Code, e.Message)
}

// Embed returns the unit vector of text. It makes one request and does not retry: the
// cache calls it on the request path with a short deadline, and a miss is cheaper than a
// late answer.
func (o *OpenAI) Embed(ctx context.Context, text string) (vector.Vector, error) {
	body, err := json.Marshal(embeddingsRequest{
		Model: o.cfg.Model, Input: []string{text}, Dimensions: o.cfg.Dimensions, EncodingFormat: "float",
	})
	if err != nil {
		return vector.Vector{}, fmt.Errorf("embed: encode request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.url, bytes.NewReader(body))
	if err != nil {
		return vector.Vector{}, fmt.Errorf("embed: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if o.cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+o.cfg.APIKey)
	}
	resp, err := o.cfg.Client.Do(req)
	if err != nil {
		return vector.Vector{}, fmt.Errorf("embed: %w", err)
	}
	defer func() { _ = resp.Body.Close() }() // the body was read or is abandoned; nothing to report
	raw, err := httpbody.Response(resp, maxResponseBytes+1)
	if err != nil {
		return vector.Vector{}, fmt.Errorf("embed: read response: %w", err)
	}
	if len(raw) > maxResponseBytes {
		return vector.Vector{}, fmt.Errorf("embed: response larger than %d bytes", maxResponseBytes)
	}
	var parsed embeddingsResponse
	jsonErr := json.Unmarshal(raw, &parsed)
	if resp.StatusCode/100 != 2 {
		msg := http.StatusText(resp.StatusCode)
		if jsonErr == nil && parsed.Error != nil && parsed.Error.Message != "" {
			msg = parsed.Error.Message
		}
		if resp.StatusCode/100 == 3 {
			msg = provider.RedirectMessage(resp.StatusCode, resp.Header.Get("Location"))
		}
		return vector.Vector{}, &StatusError{Code: resp.StatusCode, Message: msg}
	}
	if jsonErr != nil {
		return vector.Vector{}, fmt.Errorf("embed: decode response: %w", jsonErr)
	}
	if len(parsed.Data) != 1 || len(parsed.Data[0].Embedding) == 0 {
		return vector.Vector{}, fmt.Errorf("embed: response has %d embeddings, want 1", len(parsed.Data))
	}
	x := parsed.Data[0].Embedding
	if o.cfg.Dimensions > 0 && len(x) != o.cfg.Dimensions {
		return vector.Vector{}, fmt.Errorf("embed: got %d dimensions, asked for %d", len(x), o.cfg.Dimensions)
	}
	if !o.dim.CompareAndSwap(0, int64(len(x))) && o.dim.Load() != int64(len(x)) {
		return vector.Vector{}, fmt.Errorf("embed: got %d dimensions after %d: the model changed; set a new version", len(x), o.dim.Load())
	}
	// Some servers (Ollama, TEI without normalisation) return vectors of any length.
	return vector.NewDense(x)
}

// sanitize keeps a namespace usable as a Qdrant collection name and a metric label.
func sanitize(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}
