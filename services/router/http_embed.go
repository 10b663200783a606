package router

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"unicode/utf8"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	"github.com/mantle-mesh/mantle/pkg/httpbody"
	"github.com/mantle-mesh/mantle/pkg/jsonfield"
	"github.com/mantle-mesh/mantle/pkg/openaiapi"
)

// embeddings serves POST /v1/embeddings: OpenAI's request and answer shapes mapped onto
// the router's Embed.
func (f *frontDoor) embeddings(w http.ResponseWriter, r *http.Request) {
	arrived := f.router.deps.Clock.Now()
	ctx, ok := f.authenticate(w, r)
	if !ok {
		return
	}
	ctx, _ = withDoor(ctx, arrived)
	priority, priorityErr := headerPriority(r.Header)
	release, err := f.router.admit(priority)
	if err != nil {
		writeOverloaded(w)
		return
	}
	defer release()
	// 2048 inputs of token ids are the largest body: up to about 8 bytes a token.
	limit := int64(f.router.conf().MaxPromptBytes)*2 + 64<<10
	raw, err := httpbody.Request(w, r, limit)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeOpenAIError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large", "input",
				fmt.Sprintf("request body exceeds %d bytes (router.max_prompt_bytes is %d)", limit, f.router.conf().MaxPromptBytes))
			return
		}
		writeOpenAIError(w, http.StatusBadRequest, "invalid_request_error", "invalid_json", "", "request body could not be read: "+err.Error())
		return
	}
	if !utf8.Valid(raw) {
		writeOpenAIError(w, http.StatusBadRequest, "invalid_request_error", "invalid_json", "",
			fmt.Sprintf("request body is not valid UTF-8 (byte offset %d)", invalidUTF8At(raw)))
		return
	}
	if !jsonfield.Valid(raw) {
		var v any
		err := json.Unmarshal(raw, &v)
		writeOpenAIError(w, http.StatusBadRequest, "invalid_request_error", "invalid_json", "", "request body is not valid JSON: "+errOrNil(err))
		return
	}
	req, err := openaiapi.DecodeEmbeddingsRequest(raw)
	if err != nil {
		writeError(w, toStatus(err))
		return
	}
	if priorityErr != nil {
		writeError(w, toStatus(priorityErr))
		return
	}
	if v := r.Header.Get(HeaderScenario); !utf8.ValidString(v) {
		writeOpenAIError(w, http.StatusBadRequest, "invalid_request_error", "invalid_value", HeaderScenario, HeaderScenario+" must be UTF-8 text")
		return
	}
	req.Scenario, req.Priority = r.Header.Get(HeaderScenario), priority
	budget, err := headerBudget(r.Header)
	if err != nil {
		writeError(w, toStatus(err))
		return
	}
	if budget > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, budget)
		defer cancel()
	}
	resp, err := f.router.Embed(ctx, req)
	if err != nil {
		writeError(w, toStatus(err))
		return
	}
	setResponseHeaders(w, &routerv1.CompleteResponse{Quality: resp.Quality, RateLimit: resp.RateLimit})
	writeJSONWithQuality(w, http.StatusOK, json.RawMessage(embeddingsJSON(resp, req.EncodingFormat == "base64")), resp.Quality, func(h http.Header) {
		setServerTiming(h, arrived, f.router.deps.Clock.Now(), resp.Quality)
	})
}

// embeddingsJSON renders resp in OpenAI's shape. Floats are written in the shortest form
// that reads back as the same float32; base64 is the little-endian float32 array OpenAI
// sends.
func embeddingsJSON(resp *routerv1.EmbedResponse, b64 bool) []byte {
	b := []byte(`{"object":"list","data":[`)
	var raw []byte
	for i, e := range resp.Data {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"object":"embedding","index":`...)
		b = strconv.AppendInt(b, int64(e.Index), 10)
		b = append(b, `,"embedding":`...)
		if b64 {
			raw = raw[:0]
			for _, f := range e.Vector {
				raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(f))
			}
			b = append(b, '"')
			b = base64.StdEncoding.AppendEncode(b, raw)
			b = append(b, '"')
		} else {
			b = append(b, '[')
			for j, f := range e.Vector {
				if j > 0 {
					b = append(b, ',')
				}
				b = strconv.AppendFloat(b, float64(f), 'g', -1, 32)
			}
			b = append(b, ']')
		}
		b = append(b, '}')
	}
	b = append(b, `],"model":`...)
	model, _ := json.Marshal(resp.Model) // a string always marshals
	b = append(b, model...)
	tokens := resp.GetUsage().GetInputTokens()
	b = append(b, `,"usage":{"prompt_tokens":`...)
	b = strconv.AppendInt(b, tokens, 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, tokens, 10)
	return append(b, `}}`...)
}
