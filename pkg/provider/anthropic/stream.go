package anthropic

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
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

	// A gateway that cannot stream may answer 200 with a plain JSON body; reading it as
	// events would only report a truncated stream.
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

// stream is a provider.Stream over a Messages API event stream. Recv is meant for one
// goroutine; Close may be called from any.
type stream struct {
	ctx       context.Context // the caller's; its error decides CANCELED or TIMEOUT
	cancel    context.CancelFunc
	body      io.ReadCloser
	events    *provider.EventReader
	requestID string

	releaseOnce sync.Once
	closed      atomic.Bool

	// Owned by Recv.
	stopped      bool // a message_delta carried a stop_reason
	finishReason string
	usage        provider.Usage
	err          error // sticky: io.EOF or the *provider.Error that ended the stream
}

// streamEvent is the union of the event payloads the adapter reads. Every payload names
// its own type, so the SSE event name is only a fallback.
type streamEvent struct {
	Type    string `json:"type"`
	Message struct {
		Usage usage `json:"usage"`
	} `json:"message"`
	Delta struct {
		Type       string `json:"type"`
		Text       string `json:"text"`
		StopReason string `json:"stop_reason"`
	} `json:"delta"`
	Usage *usage `json:"usage"`
}

func (s *stream) RequestID() string { return s.requestID }

// Recv returns the next piece of text. The finish reason and usage arrive together in a
// last chunk at message_stop, then Recv returns io.EOF. After an error every call returns
// that error again.
func (s *stream) Recv() (provider.Chunk, error) {
	if s.err != nil {
		return provider.Chunk{}, s.err
	}
	for {
		ev, err := s.events.Next()
		if err != nil {
			return s.end(s.readFailure(err))
		}
		text, done, err := s.apply(ev)
		switch {
		case err != nil:
			return s.end(err)
		case done:
			return s.end(nil)
		case text != "":
			return provider.Chunk{Content: text}, nil
		}
	}
}

// apply folds one event into the stream's state; it returns the event's text and whether
// the message is complete.
func (s *stream) apply(ev provider.Event) (text string, done bool, err error) {
	var se streamEvent
	if err := json.Unmarshal([]byte(ev.Data), &se); err != nil {
		if ev.Name == "error" {
			return "", false, s.fromBody(&provider.Error{
				Class:   mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR,
				Message: ev.Data,
			})
		}
		return "", false, s.fromBody(&provider.Error{
			Class:   mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
			Message: "stream event is not JSON",
			Err:     fmt.Errorf("decode %s event: %w", ev.Name, err),
		})
	}
	kind := se.Type
	if kind == "" {
		kind = ev.Name
	}
	switch kind {
	case "message_start":
		s.usage = provider.Usage{
			InputTokens:  se.Message.Usage.inputTokens(),
			OutputTokens: se.Message.Usage.OutputTokens,
		}
	case "content_block_delta":
		if se.Delta.Type == "text_delta" {
			return se.Delta.Text, false, nil
		}
	case "message_delta":
		// message_delta's usage is cumulative; input counts appear there only in newer
		// API versions, so they replace message_start's only when present.
		if se.Usage != nil {
			s.usage.OutputTokens = se.Usage.OutputTokens
			if in := se.Usage.inputTokens(); in > 0 {
				s.usage.InputTokens = in
			}
		}
		if se.Delta.StopReason != "" {
			finish, perr := finishReason(se.Delta.StopReason)
			if perr != nil {
				return "", false, s.fromBody(perr)
			}
			s.stopped, s.finishReason = true, finish
		}
	case "message_stop":
		return "", true, nil
	case "error":
		return "", false, s.fromBody(streamError(ev.Data))
	}
	// ping, content_block_start/stop, thinking and tool deltas, and event types added
	// after this adapter was written carry no text for the caller.
	return "", false, nil
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

// readFailure classifies why the event stream stopped before message_stop. The end of the
// body is a clean end only if the model had already stopped; otherwise the connection was
// cut and the answer is TRUNCATED. It returns nil for a clean end.
func (s *stream) readFailure(err error) error {
	switch {
	case s.closed.Load():
		return s.classified(&provider.Error{
			Class: mantlev1.ErrorClass_ERROR_CLASS_CANCELED, Message: "stream closed", Err: err,
		})
	case s.ctx.Err() != nil:
		return s.classified(provider.ClassifyTransport(s.ctx, err))
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		if s.stopped {
			return nil
		}
		return s.classified(&provider.Error{
			Class:   mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED,
			Message: "stream ended before message_stop and without a stop reason",
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
// the message is complete and the last chunk carries the finish reason and usage.
func (s *stream) end(cause error) (provider.Chunk, error) {
	s.release()
	if cause != nil {
		s.err = cause
		return provider.Chunk{}, cause
	}
	s.err = io.EOF
	usage := s.usage
	return provider.Chunk{FinishReason: s.finishReason, Usage: &usage}, nil
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
