package openaiapi

import (
	"encoding/json"
	"fmt"
	"github.com/mantle-mesh/mantle/pkg/jsonfield"
	"unicode/utf8"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
)

// Limits of an embeddings request body.
const (
	// MaxEmbeddingInputs is OpenAI's own limit on inputs per request.
	MaxEmbeddingInputs = 2048
	// MaxEmbeddingTokens bounds one token-array input (OpenAI's models take 8192).
	MaxEmbeddingTokens = 8192
	// MaxEmbeddingDimensions bounds the dimensions a caller may ask for.
	MaxEmbeddingDimensions = 16384
)

// EmbeddingsFields are the documented fields of POST /v1/embeddings, all forwarded.
var EmbeddingsFields = []string{"model", "input", "dimensions", "encoding_format", "user"}

// DecodeEmbeddingsRequest decodes a POST /v1/embeddings body. input may be a string, a
// list of strings, a list of token ids or a list of such lists; an unknown field is
// refused with an error naming it, never dropped. Sizes beyond the counts here (total
// bytes) are the router's to judge.
func DecodeEmbeddingsRequest(body []byte) (*routerv1.EmbedRequest, error) {
	if !utf8.Valid(body) {
		return nil, invalid("body", "the body is not valid UTF-8")
	}
	top, err := jsonfield.Object(body, "")
	if err != nil {
		return nil, err
	}
	req := &routerv1.EmbedRequest{}
	d := decoder{}
	seenInput := false
	for _, k := range jsonfield.SortedKeys(top) {
		v := top[k]
		switch k {
		case "model":
			d.Str(v, k, &req.Model)
		case "input":
			seenInput = true
			d.embedInput(v, req)
		case "dimensions":
			req.Dimensions = d.Int32(v, k)
			if req.Dimensions != nil && (*req.Dimensions < 1 || *req.Dimensions > MaxEmbeddingDimensions) {
				d.Fail(k, "must be between 1 and %d, got %d", MaxEmbeddingDimensions, *req.Dimensions)
			}
		case "encoding_format":
			d.Str(v, k, &req.EncodingFormat)
			if req.EncodingFormat != "" && req.EncodingFormat != "float" && req.EncodingFormat != "base64" {
				d.Fail(k, "want float or base64, got %q", req.EncodingFormat)
			}
		case "user":
			d.Str(v, k, &req.User)
		default:
			d.Fail(jsonfield.Join("", k), "unknown field: mantle forwards every documented embeddings field (%v) and refuses others", EmbeddingsFields)
		}
		if d.Err != nil {
			return nil, d.Err
		}
	}
	if !seenInput {
		return nil, invalid("input", "required")
	}
	return req, nil
}

// embedInput decodes input in each of its four shapes.
func (d *decoder) embedInput(v json.RawMessage, req *routerv1.EmbedRequest) {
	const want = "want a string, a list of strings, a list of token ids or a list of lists of token ids"
	var s string
	if json.Unmarshal(v, &s) == nil {
		req.Input = []string{s}
		return
	}
	var items []json.RawMessage
	if !d.Decode(v, "input", &items, want) {
		return
	}
	if len(items) == 0 {
		d.Fail("input", "must not be empty")
		return
	}
	// A flat list of integers is one input given as tokens.
	var one []int64
	if json.Unmarshal(v, &one) == nil {
		if len(one) > MaxEmbeddingTokens {
			d.Fail("input", "at most %d tokens in one input, got %d", MaxEmbeddingTokens, len(one))
			return
		}
		req.InputTokens = []*routerv1.TokenInput{{Tokens: one}}
		return
	}
	if len(items) > MaxEmbeddingInputs {
		d.Fail("input", "at most %d inputs, got %d", MaxEmbeddingInputs, len(items))
		return
	}
	var first string
	if json.Unmarshal(items[0], &first) == nil {
		req.Input = make([]string, 0, len(items))
		for i, it := range items {
			var s string
			if !d.Decode(it, fmt.Sprintf("input[%d]", i), &s, "want a string, like the other inputs") {
				return
			}
			req.Input = append(req.Input, s)
		}
		return
	}
	req.InputTokens = make([]*routerv1.TokenInput, 0, len(items))
	for i, it := range items {
		var toks []int64
		if !d.Decode(it, fmt.Sprintf("input[%d]", i), &toks, "want a list of token ids, like the other inputs") {
			return
		}
		if len(toks) > MaxEmbeddingTokens {
			d.Fail(fmt.Sprintf("input[%d]", i), "at most %d tokens in one input, got %d", MaxEmbeddingTokens, len(toks))
			return
		}
		req.InputTokens = append(req.InputTokens, &routerv1.TokenInput{Tokens: toks})
	}
}
