package anthropic

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/pkg/provider/internal/httpcall"
)

// Stream sends req with stream: true and returns the answer as it is generated. HTTP
// failures are returned here, classified; failures after the first byte come from Recv.
//
// The finish reason and usage arrive together in a last chunk at message_stop, then Recv
// returns io.EOF.
func (c *Client) Stream(ctx context.Context, req provider.Request) (provider.Stream, error) {
	body, f := messagesBody(req, true)
	if f != "" {
		return nil, refusedError(f)
	}
	return c.ep.Stream(ctx, body, c.ownHeaders(), &decoder{},
		"stream ended before message_stop and without a stop reason")
}

// decoder reads a Messages API event stream: typed events, ended by message_stop.
type decoder struct {
	stopped      bool // a message_delta carried a stop_reason
	finishReason string
	usage        provider.Usage
	// tools maps the content-block index of each tool_use block to its tool call: Anthropic
	// numbers all blocks (text, thinking, tool_use), OpenAI's tool calls count only calls.
	tools map[int]*streamedCall
}

// streamedCall is a tool_use block being streamed.
type streamedCall struct {
	index int // the tool call's index among the answer's calls
	// input is the block's input at content_block_start, sent when no input_json_delta
	// follows; argued says whether any arguments were sent.
	input  json.RawMessage
	argued bool
}

// streamEvent is the union of the event payloads the adapter reads. Every payload names
// its own type, so the SSE event name is only a fallback.
type streamEvent struct {
	Type    string `json:"type"`
	Message struct {
		Usage usage `json:"usage"`
	} `json:"message"`
	Index        int `json:"index"`
	ContentBlock struct {
		Type  string          `json:"type"`
		ID    string          `json:"id"`
		Name  string          `json:"name"`
		Input json.RawMessage `json:"input"`
	} `json:"content_block"`
	Delta struct {
		Type        string `json:"type"`
		Text        string `json:"text"`
		PartialJSON string `json:"partial_json"`
		StopReason  string `json:"stop_reason"`
	} `json:"delta"`
	Usage *usage `json:"usage"`
}

// Apply folds one event into the decoder's state; it returns the event's text and whether
// the message is complete.
func (d *decoder) Apply(ev provider.Event) (provider.Chunk, bool, *provider.Error) {
	var se streamEvent
	if err := json.Unmarshal([]byte(ev.Data), &se); err != nil {
		return provider.Chunk{}, false, httpcall.Undecodable(ev, fmt.Errorf("decode %s event: %w", ev.Name, err))
	}
	kind := se.Type
	if kind == "" {
		kind = ev.Name
	}
	switch kind {
	case "message_start":
		d.usage = provider.Usage{
			InputTokens:  se.Message.Usage.inputTokens(),
			OutputTokens: se.Message.Usage.OutputTokens,
		}
	case "content_block_start":
		if se.ContentBlock.Type == "tool_use" {
			return d.startTool(se)
		}
	case "content_block_delta":
		switch se.Delta.Type {
		case "text_delta":
			return provider.Chunk{Content: se.Delta.Text}, false, nil
		case "input_json_delta":
			call, ok := d.tools[se.Index]
			if !ok {
				return provider.Chunk{}, false, &provider.Error{
					Class:   mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
					Message: fmt.Sprintf("input_json_delta for content block %d, which is not a tool_use block", se.Index),
				}
			}
			if se.Delta.PartialJSON == "" {
				break
			}
			call.argued = true
			return provider.Chunk{ToolCalls: []provider.ToolCallDelta{{Index: call.index, Arguments: se.Delta.PartialJSON}}}, false, nil
		}
	case "content_block_stop":
		if call, ok := d.tools[se.Index]; ok && !call.argued {
			// A call that got no input_json_delta has the input it started with: "{}" for a
			// function without arguments, as OpenAI would send.
			call.argued = true
			return provider.Chunk{ToolCalls: []provider.ToolCallDelta{{Index: call.index, Arguments: toolArguments(call.input)}}}, false, nil
		}
	case "message_delta":
		// message_delta's usage is cumulative; input counts appear there only in newer
		// API versions, so they replace message_start's only when present.
		if se.Usage != nil {
			d.usage.OutputTokens = se.Usage.OutputTokens
			if in := se.Usage.inputTokens(); in > 0 {
				d.usage.InputTokens = in
			}
		}
		if se.Delta.StopReason != "" {
			finish, perr := finishReason(se.Delta.StopReason)
			if perr != nil {
				return provider.Chunk{}, false, perr
			}
			d.stopped, d.finishReason = true, finish
		}
	case "message_stop":
		return provider.Chunk{}, true, nil
	case "error":
		return provider.Chunk{}, false, streamError(ev.Data)
	}
	// ping, text and thinking block starts and stops, thinking and signature deltas (the
	// model's reasoning, which OpenAI's answer shape has no place for), and event types
	// added after this adapter was written carry nothing for the caller.
	return provider.Chunk{}, false, nil
}

// startTool records a tool_use block's start and returns the call's first piece: its id
// and name, with no arguments yet.
func (d *decoder) startTool(se streamEvent) (provider.Chunk, bool, *provider.Error) {
	if d.tools == nil {
		d.tools = make(map[int]*streamedCall)
	}
	if _, dup := d.tools[se.Index]; dup {
		return provider.Chunk{}, false, &provider.Error{
			Class:   mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
			Message: fmt.Sprintf("content block %d started twice", se.Index),
		}
	}
	if len(d.tools) >= provider.MaxStreamedToolCalls {
		return provider.Chunk{}, false, &provider.Error{
			Class:   mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
			Message: fmt.Sprintf("more than %d tool calls in one answer", provider.MaxStreamedToolCalls),
		}
	}
	call := &streamedCall{index: len(d.tools), input: se.ContentBlock.Input}
	d.tools[se.Index] = call
	return provider.Chunk{ToolCalls: []provider.ToolCallDelta{{Index: call.index, ID: se.ContentBlock.ID, Type: "function", Name: se.ContentBlock.Name}}}, false, nil
}

// errorStatus is the HTTP status Anthropic documents for each error type. An error event is
// Anthropic's documented way to fail after the 200 has gone out, so it is classified as
// the response would have been had the failure come earlier; only types this adapter does
// not know are treated as hidden errors.
var errorStatus = map[string]int{
	"invalid_request_error": http.StatusBadRequest,
	"authentication_error":  http.StatusUnauthorized,
	"billing_error":         http.StatusPaymentRequired,
	"permission_error":      http.StatusForbidden,
	"not_found_error":       http.StatusNotFound,
	"request_too_large":     http.StatusRequestEntityTooLarge,
	"rate_limit_error":      http.StatusTooManyRequests,
	"api_error":             http.StatusInternalServerError,
	"timeout_error":         http.StatusGatewayTimeout,
	"overloaded_error":      529,
}

// streamError classifies the data of an error event.
func streamError(data string) *provider.Error {
	apiErr, ok := provider.ParseAPIError([]byte(data))
	if !ok {
		return &provider.Error{Class: mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR, Message: data}
	}
	if status, known := errorStatus[apiErr.Type]; known {
		return provider.ClassifyHTTP(status, nil, []byte(data), nil)
	}
	return provider.ClassifyEmbedded(apiErr)
}

// Stopped reports whether a message_delta carried a stop reason: after one, the end of the
// body without message_stop is still a clean end.
func (d *decoder) Stopped() bool { return d.stopped }

// Last carries the finish reason and usage.
func (d *decoder) Last() (provider.Chunk, *provider.Error) {
	usage := d.usage
	return provider.Chunk{FinishReason: d.finishReason, Usage: &usage}, nil
}
