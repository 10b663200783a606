package router

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"unicode/utf8"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/httpbody"
	"github.com/mantle-mesh/mantle/pkg/jsonfield"
	"github.com/mantle-mesh/mantle/pkg/openaiapi"
)

// decodeChat reads the body of a chat completions request, at most limit bytes, and
// decodes it; on failure it has written the error and returns false.
func (f *frontDoor) decodeChat(w http.ResponseWriter, r *http.Request, limit int64) (*openaiapi.ChatRequest, bool) {
	raw, berr := f.readBody(w, r, limit)
	if berr != nil {
		writeOpenAIError(w, berr.shape.status, berr.shape.openAI, berr.code, berr.param, berr.msg)
		return nil, false
	}
	// readBody has checked that the body is UTF-8 and JSON: the decoder does not again.
	cr, err := openaiapi.DecodeValidChatRequest(raw)
	if err != nil {
		writeError(w, toStatus(err))
		return nil, false
	}
	return cr, true
}

// bodyError is why a request body could not be read as JSON, for each door to answer in
// its own shape.
type bodyError struct {
	shape            errorShape
	code, param, msg string
}

// readBody reads a JSON request body of at most limit bytes: UTF-8, one JSON value and
// nothing after it.
func (f *frontDoor) readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, *bodyError) {
	raw, err := httpbody.Request(w, r, limit)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &bodyError{shapeTooLarge, "request_too_large", "messages",
				fmt.Sprintf("request body exceeds %d bytes (router.max_prompt_bytes is %d)", limit, f.router.conf().MaxPromptBytes)}
		}
		return nil, &bodyError{shapeInvalid, "invalid_json", "", "request body could not be read: " + err.Error()}
	}
	// Before decoding: encoding/json would turn bad bytes into U+FFFD and the prompt
	// would reach a provider changed.
	if !utf8.Valid(raw) {
		return nil, &bodyError{shapeInvalid, "invalid_json", "", fmt.Sprintf("request body is not valid UTF-8 (byte offset %d)", invalidUTF8At(raw))}
	}
	// Valid also refuses anything but whitespace after the JSON value.
	if !jsonfield.Valid(raw) {
		var v any
		err := json.Unmarshal(raw, &v) // for the position of the error
		return nil, &bodyError{shapeInvalid, "invalid_json", "", "request body is not valid JSON: " + errOrNil(err)}
	}
	return raw, nil
}

func errOrNil(err error) string {
	if err == nil {
		return "invalid"
	}
	return err.Error()
}

// deltaChunks renders a stream's deltas as chunks, one chunk, message and choice rewritten
// for each: a chunk's JSON is written before the next delta is rendered, and none is kept,
// so the deltas of a stream cost none of their own.
type deltaChunks struct {
	c       openaiapi.ChatCompletion
	choice  [1]openaiapi.Choice
	msg     openaiapi.Message
	content string
	calls   []openaiapi.ToolCall
	indexes []int
}

// of returns d's chunk, valid until the next call.
func (s *deltaChunks) of(id string, created int64, d Delta) *openaiapi.ChatCompletion {
	s.msg = openaiapi.Message{}
	s.content = d.Content
	if d.Content != "" || len(d.ToolCalls) == 0 {
		s.msg.Content = &s.content
	}
	if len(d.ToolCalls) > 0 {
		// The indexes first: the calls point into them, so they must not grow after.
		s.indexes = s.indexes[:0]
		for _, tc := range d.ToolCalls {
			s.indexes = append(s.indexes, tc.Index)
		}
		s.calls = s.calls[:0]
		for i, tc := range d.ToolCalls {
			s.calls = append(s.calls, openaiapi.ToolCall{Index: &s.indexes[i], ID: tc.ID, Type: tc.Type,
				Function: openaiapi.FunctionCall{Name: tc.Name, Arguments: tc.Arguments}})
		}
		s.msg.ToolCalls = s.calls
	}
	s.choice[0] = openaiapi.Choice{Delta: &s.msg}
	if len(d.Logprobs) > 0 {
		s.choice[0].Logprobs = json.RawMessage(d.Logprobs)
	}
	s.c = chunkHead(id, created, d.Model)
	s.c.Choices = s.choice[:]
	return &s.c
}

// toolCallsJSON is an answer's tool calls in OpenAI's shape.
func toolCallsJSON(calls []*mantlev1.ToolCall) []openaiapi.ToolCall {
	if len(calls) == 0 {
		return nil
	}
	out := make([]openaiapi.ToolCall, len(calls))
	for i, c := range calls {
		out[i] = openaiapi.ToolCall{ID: c.Id, Type: c.Type, Function: openaiapi.FunctionCall{Name: c.Name, Arguments: c.Arguments}}
	}
	return out
}
