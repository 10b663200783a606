package openai

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
)

var _ provider.Embedder = (*Client)(nil)

// MaxEmbeddingDimensions bounds the size of one vector an upstream may return; the
// largest embedding models have a few thousand.
const MaxEmbeddingDimensions = 16384

// embedRequest is the body of POST /embeddings. The vectors are asked for as floats,
// which every OpenAI-compatible server supports; the router encodes base64 for callers
// who want it.
type embedRequest struct {
	Model          string `json:"model"`
	Input          any    `json:"input"`
	Dimensions     *int   `json:"dimensions,omitempty"`
	EncodingFormat string `json:"encoding_format"`
	User           string `json:"user,omitempty"`
}

type embedResponse struct {
	Data []struct {
		Index     *int            `json:"index"`
		Embedding json.RawMessage `json:"embedding"`
	} `json:"data"`
	Model string `json:"model"`
	Usage *struct {
		PromptTokens int64 `json:"prompt_tokens"`
		TotalTokens  int64 `json:"total_tokens"`
	} `json:"usage"`
}

// Embed sends req to the embeddings endpoint.
func (c *Client) Embed(ctx context.Context, req provider.EmbedRequest) (provider.EmbedResponse, error) {
	body := embedRequest{Model: req.Model, Dimensions: req.Dimensions, EncodingFormat: "float", User: req.User}
	if req.InputTokens != nil {
		body.Input = req.InputTokens
	} else {
		body.Input = req.Input
	}
	want := max(len(req.Input), len(req.InputTokens))
	var out provider.EmbedResponse
	res, err := c.embed.Complete(ctx, body, c.ownHeaders(provider.Request{}), func(b []byte) (provider.Response, *provider.Error) {
		var perr *provider.Error
		out, perr = parseEmbeddings(b, want)
		return provider.Response{Usage: out.Usage, Model: out.Model}, perr
	})
	if err != nil {
		return provider.EmbedResponse{}, err
	}
	out.RateLimit, out.RequestID = res.RateLimit, res.RequestID
	return out, nil
}

// parseEmbeddings reads a 2xx embeddings body: want vectors, each placed by its index, of
// one size, floats or base64 (little-endian float32, for servers that send it anyway).
func parseEmbeddings(body []byte, want int) (provider.EmbedResponse, *provider.Error) {
	malformed := func(format string, args ...any) *provider.Error {
		return &provider.Error{Class: mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT, Message: fmt.Sprintf(format, args...)}
	}
	var er embedResponse
	if err := json.Unmarshal(body, &er); err != nil {
		return provider.EmbedResponse{}, &provider.Error{Class: mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
			Message: "response body is not an embeddings list", Err: fmt.Errorf("decode response: %w", err)}
	}
	if len(er.Data) != want {
		return provider.EmbedResponse{}, malformed("%d embeddings for %d inputs", len(er.Data), want)
	}
	out := provider.EmbedResponse{Vectors: make([][]float32, want), Model: er.Model}
	size := -1
	for i, d := range er.Data {
		idx := i
		if d.Index != nil {
			idx = *d.Index
		}
		if idx < 0 || idx >= want || out.Vectors[idx] != nil {
			return provider.EmbedResponse{}, malformed("embedding %d has index %d", i, idx)
		}
		v, err := decodeVector(d.Embedding)
		if err != nil {
			return provider.EmbedResponse{}, malformed("embedding %d: %v", idx, err)
		}
		if size >= 0 && len(v) != size {
			return provider.EmbedResponse{}, malformed("embedding %d has %d dimensions, the others %d", idx, len(v), size)
		}
		size = len(v)
		out.Vectors[idx] = v
	}
	if er.Usage != nil {
		out.Usage = provider.Usage{InputTokens: er.Usage.PromptTokens}
	}
	return out, nil
}

func decodeVector(raw json.RawMessage) ([]float32, error) {
	var fs []float64
	if err := json.Unmarshal(raw, &fs); err != nil {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return nil, fmt.Errorf("neither a list of numbers nor base64")
		}
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil || len(b)%4 != 0 {
			return nil, fmt.Errorf("base64 of float32s expected")
		}
		if len(b)/4 > MaxEmbeddingDimensions {
			return nil, fmt.Errorf("%d dimensions, more than %d", len(b)/4, MaxEmbeddingDimensions)
		}
		v := make([]float32, len(b)/4)
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		return checkVector(v)
	}
	if len(fs) > MaxEmbeddingDimensions {
		return nil, fmt.Errorf("%d dimensions, more than %d", len(fs), MaxEmbeddingDimensions)
	}
	v := make([]float32, len(fs))
	for i, f := range fs {
		v[i] = float32(f)
	}
	return checkVector(v)
}

func checkVector(v []float32) ([]float32, error) {
	if len(v) == 0 {
		return nil, fmt.Errorf("empty vector")
	}
	for _, f := range v {
		if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
			return nil, fmt.Errorf("not a finite number")
		}
	}
	return v, nil
}
