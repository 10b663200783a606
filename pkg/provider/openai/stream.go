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
	Choices []struct {
		Delta struct {
			Content string `json:"content"`
			Refusal string `json:"refusal"`
		} `json:"delta"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage          `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// Apply folds one event into the decoder's state and returns its content.
func (d *decoder) Apply(ev provider.Event) (string, bool, *provider.Error) {
	if strings.TrimSpace(ev.Data) == "[DONE]" {
		return "", true, nil
	}
	var chunk streamChunk
	if err := json.Unmarshal([]byte(ev.Data), &chunk); err != nil {
		return "", false, httpcall.Undecodable(ev, fmt.Errorf("decode stream event: %w", err))
	}
	if ev.Name == "error" || len(chunk.Error) > 0 {
		if apiErr, ok := provider.ParseAPIError([]byte(ev.Data)); ok {
			return "", false, provider.ClassifyEmbedded(apiErr)
		}
		if ev.Name == "error" {
			return "", false, &provider.Error{
				Class:   mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR,
				Message: ev.Data,
			}
		}
	}
	if chunk.Usage != nil {
		d.usage = chunk.Usage.toProvider()
	}
	var content strings.Builder
	for _, choice := range chunk.Choices {
		content.WriteString(choice.Delta.Content)
		d.refusal.WriteString(choice.Delta.Refusal)
		if choice.FinishReason != "" {
			d.finishReason = choice.FinishReason
		}
	}
	if d.finishReason == "content_filter" {
		return "", false, finishError(d.finishReason, "")
	}
	return content.String(), false, nil
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
