package openai

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/pkg/provider/internal/httpcall"
)

// Stream sends req with stream: true and returns the answer as it is generated. HTTP
// failures are returned here, classified; failures after the first byte come from Recv.
//
// The finish reason and usage arrive together in a last chunk once the server has said
// [DONE] (OpenAI sends usage after the finish reason), then Recv returns io.EOF.
func (c *Client) Stream(ctx context.Context, req provider.Request) (provider.Stream, error) {
	return c.ep.Stream(ctx, chatBody(req, true), c.ownHeaders(req), &decoder{},
		"stream ended before [DONE] and without a finish reason")
}

// decoder reads an OpenAI server-sent event stream: data events carrying chunks, ended by
// a [DONE] event.
type decoder struct {
	finishReason string
	usage        *provider.Usage
	refusal      strings.Builder
}

// streamChunk is one data event.
type streamChunk struct {
	Choices []streamChoice  `json:"choices"`
	Usage   *usage          `json:"usage"`
	Error   json.RawMessage `json:"error"`
}

// streamChoice is an alias, not a type of its own, so that json.Unmarshal's errors name the
// type as they did when it was written in place.
type streamChoice = struct {
	Delta        messageBody     `json:"delta"`
	FinishReason string          `json:"finish_reason"`
	Logprobs     json.RawMessage `json:"logprobs"`
}

// Apply folds one event into the decoder's state and returns what it adds to the answer.
func (d *decoder) Apply(ev provider.Event) (provider.Chunk, bool, *provider.Error) {
	if strings.TrimSpace(ev.Data) == "[DONE]" {
		return provider.Chunk{}, true, nil
	}
	var chunk streamChunk
	data := []byte(ev.Data)
	// decodeStreamChunk reads the usual event without reflection; what it does not read
	// exactly as json.Unmarshal would, json.Unmarshal reads, errors included.
	if !decodeStreamChunk(data, &chunk) {
		chunk = streamChunk{}
		if err := json.Unmarshal(data, &chunk); err != nil {
			return provider.Chunk{}, false, httpcall.Undecodable(ev, fmt.Errorf("decode stream event: %w", err))
		}
	}
	return d.fold(ev, chunk)
}

// fold applies one decoded event.
func (d *decoder) fold(ev provider.Event, chunk streamChunk) (provider.Chunk, bool, *provider.Error) {
	if ev.Name == "error" || len(chunk.Error) > 0 {
		if apiErr, ok := provider.ParseAPIError([]byte(ev.Data)); ok {
			return provider.Chunk{}, false, provider.ClassifyEmbedded(apiErr)
		}
		if ev.Name == "error" {
			return provider.Chunk{}, false, &provider.Error{
				Class:   mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR,
				Message: ev.Data,
			}
		}
	}
	if chunk.Usage != nil {
		d.usage = chunk.Usage.toProvider()
	}
	var out provider.Chunk
	var content strings.Builder
	for _, choice := range chunk.Choices {
		content.WriteString(choice.Delta.Content)
		d.refusal.WriteString(choice.Delta.Refusal)
		for i, tc := range choice.Delta.ToolCalls {
			index := i
			if tc.Index != nil {
				index = *tc.Index
			}
			out.ToolCalls = append(out.ToolCalls, provider.ToolCallDelta{Index: index, ID: tc.ID, Type: tc.Type, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
		}
		if lp := nonNull(choice.Logprobs); lp != nil {
			out.Logprobs = lp
		}
		if choice.FinishReason != "" {
			d.finishReason = choice.FinishReason
		}
	}
	if d.finishReason == "content_filter" {
		return provider.Chunk{}, false, finishError(d.finishReason, "")
	}
	if d.refusal.Len() > provider.MaxAnswerBytes {
		// Kept until the end, where it becomes the error: bounded like any answer.
		return provider.Chunk{}, false, &provider.Error{
			Class:   mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
			Message: fmt.Sprintf("streamed refusal longer than %d bytes", provider.MaxAnswerBytes),
		}
	}
	out.Content = content.String()
	return out, false, nil
}

// Stopped reports whether a finish reason has arrived: after one, the end of the body
// without [DONE] is still a clean end.
func (d *decoder) Stopped() bool { return d.finishReason != "" }

// Last carries the finish reason and usage, if the server sent either; a refusal spread
// over the stream's deltas is a failure.
func (d *decoder) Last() (provider.Chunk, *provider.Error) {
	if d.refusal.Len() > 0 {
		return provider.Chunk{}, finishError("", d.refusal.String())
	}
	return provider.Chunk{FinishReason: d.finishReason, Usage: d.usage}, nil
}
