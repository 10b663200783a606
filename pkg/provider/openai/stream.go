package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
)

// Stream sends req with stream: true and returns the answer as it is generated. HTTP
// failures are returned here, classified; failures after the first byte come from Recv.
func (c *Client) Stream(ctx context.Context, req provider.Request) (provider.Stream, error) {
	// The stream owns a cancel of its own so that Close tears down the request even when
	// the caller's context lives on.
	sctx, cancel := context.WithCancel(ctx)
	resp, err := c.post(sctx, req, true)
	if err != nil {
		cancel()
		return nil, err
	}
	requestID := provider.RequestID(resp.Header)

	// A server that cannot stream (or fails before it starts) may answer 200 with a plain
	// JSON body; reading it as events would only report a truncated stream.
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "application/json" {
		defer cancel()
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		e := &provider.Error{
			Class:   mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
			Message: "expected an event stream, got a JSON body",
		}
		if apiErr, ok := provider.ParseAPIError(body); ok {
			e = provider.ClassifyEmbedded(apiErr)
		}
		e.StatusCode, e.RequestID = resp.StatusCode, requestID
		return nil, e
	}

	return &stream{
		ctx:       ctx,
		cancel:    cancel,
		body:      resp.Body,
		events:    provider.NewEventReader(resp.Body),
		requestID: requestID,
	}, nil
}

// stream is a provider.Stream over an OpenAI server-sent event stream. Recv is meant for
// one goroutine; Close may be called from any.
type stream struct {
	ctx       context.Context // the caller's; its error decides CANCELED or TIMEOUT
	cancel    context.CancelFunc
	body      io.ReadCloser
	events    *provider.EventReader
	requestID string

	releaseOnce sync.Once
	closed      atomic.Bool

	// Owned by Recv.
	finishReason string
	usage        *provider.Usage
	refusal      strings.Builder
	err          error // sticky: io.EOF or the *provider.Error that ended the stream
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

func (s *stream) RequestID() string { return s.requestID }

// Recv returns the next piece of content. The finish reason and usage arrive together in a
// last chunk once the server has said [DONE] (OpenAI sends usage after the finish reason),
// then Recv returns io.EOF. After an error every call returns that error again.
func (s *stream) Recv() (provider.Chunk, error) {
	if s.err != nil {
		return provider.Chunk{}, s.err
	}
	for {
		ev, err := s.events.Next()
		if err != nil {
			return s.end(s.readFailure(err))
		}
		if strings.TrimSpace(ev.Data) == "[DONE]" {
			return s.end(nil)
		}
		content, err := s.apply(ev)
		if err != nil {
			return s.end(err)
		}
		if content != "" {
			return provider.Chunk{Content: content}, nil
		}
	}
}

// apply folds one event into the stream's state and returns its content.
func (s *stream) apply(ev provider.Event) (string, error) {
	var chunk streamChunk
	if err := json.Unmarshal([]byte(ev.Data), &chunk); err != nil {
		if ev.Name == "error" {
			return "", s.fromBody(&provider.Error{
				Class:   mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR,
				Message: ev.Data,
			})
		}
		return "", s.fromBody(&provider.Error{
			Class:   mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
			Message: "stream event is not JSON",
			Err:     fmt.Errorf("decode stream event: %w", err),
		})
	}
	if ev.Name == "error" || len(chunk.Error) > 0 {
		if apiErr, ok := provider.ParseAPIError([]byte(ev.Data)); ok {
			return "", s.fromBody(provider.ClassifyEmbedded(apiErr))
		}
		if ev.Name == "error" {
			return "", s.fromBody(&provider.Error{
				Class:   mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR,
				Message: ev.Data,
			})
		}
	}
	if chunk.Usage != nil {
		s.usage = chunk.Usage.toProvider()
	}
	var content strings.Builder
	for _, choice := range chunk.Choices {
		content.WriteString(choice.Delta.Content)
		s.refusal.WriteString(choice.Delta.Refusal)
		if choice.FinishReason != "" {
			s.finishReason = choice.FinishReason
		}
	}
	if s.finishReason == "content_filter" {
		return "", s.fromBody(finishError(s.finishReason, ""))
	}
	return content.String(), nil
}

// readFailure classifies why the event stream stopped before [DONE]. The end of the body is
// a clean end only if the model had finished; otherwise the connection was cut and the
// answer is TRUNCATED. It returns nil for a clean end.
func (s *stream) readFailure(err error) error {
	switch {
	case s.closed.Load():
		return s.classified(&provider.Error{
			Class: mantlev1.ErrorClass_ERROR_CLASS_CANCELED, Message: "stream closed", Err: err,
		})
	case s.ctx.Err() != nil:
		return s.classified(provider.ClassifyTransport(s.ctx, err))
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		if s.finishReason != "" {
			return nil
		}
		return s.classified(&provider.Error{
			Class:   mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED,
			Message: "stream ended before [DONE] and without a finish reason",
			Err:     err,
		})
	}
	return s.classified(provider.ClassifyTransport(s.ctx, fmt.Errorf("read stream: %w", err)))
}

// classified stamps e with the stream's request id.
func (s *stream) classified(e *provider.Error) *provider.Error {
	e.RequestID = s.requestID
	return e
}

// fromBody stamps an error the server wrote into the stream: it came with a 200, which is
// what made it hidden.
func (s *stream) fromBody(e *provider.Error) *provider.Error {
	e.StatusCode = http.StatusOK
	return s.classified(e)
}

// end releases the connection and settles what Recv returns from now on. With a nil cause
// the stream ended well: the last chunk carries the finish reason and usage, if the server
// sent either, and io.EOF follows.
func (s *stream) end(cause error) (provider.Chunk, error) {
	s.release()
	if cause == nil && s.refusal.Len() > 0 {
		cause = s.fromBody(finishError("", s.refusal.String()))
	}
	if cause != nil {
		s.err = cause
		return provider.Chunk{}, cause
	}
	s.err = io.EOF
	if s.finishReason == "" && s.usage == nil {
		return provider.Chunk{}, io.EOF
	}
	return provider.Chunk{FinishReason: s.finishReason, Usage: s.usage}, nil
}

// Close releases the connection. It is safe to call at any time, from any goroutine, more
// than once; a Recv blocked on the network returns CANCELED.
func (s *stream) Close() error {
	s.closed.Store(true)
	s.release()
	return nil
}

func (s *stream) release() {
	s.releaseOnce.Do(func() {
		s.body.Close()
		s.cancel()
	})
}
