package httpcall

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sync"
	"sync/atomic"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/httpbody"
	"github.com/mantle-mesh/mantle/pkg/provider"
)

// Decoder is an adapter's reading of its event stream: what each event means, and how the
// answer ends. The stream calls it from Recv only, so it needs no locking.
type Decoder interface {
	// Apply folds one event into the decoder's state. It returns what the event adds to
	// the answer (text, tool call pieces, logprobs), whether the answer is complete, or the
	// failure the server wrote into the stream.
	Apply(provider.Event) (piece provider.Chunk, done bool, err *provider.Error)
	// Stopped reports whether the model has finished, which makes the end of the body a
	// clean end rather than a cut connection.
	Stopped() bool
	// Last returns the chunk that ends a complete answer (a zero chunk when there is nothing
	// to report), or the failure that a complete answer turns out to be.
	Last() (provider.Chunk, *provider.Error)
}

// Undecodable classifies an event whose data failed to decode with err: an event named
// "error" is the server's failure in its own words, anything else is MALFORMED_OUTPUT.
func Undecodable(ev provider.Event, err error) *provider.Error {
	if ev.Name == "error" {
		return &provider.Error{Class: mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR, Message: ev.Data}
	}
	return &provider.Error{
		Class:   mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
		Message: "stream event is not JSON",
		Err:     err,
	}
}

// Stream posts body, which asks for a stream, and returns the answer as it is generated.
// HTTP failures are returned here, classified; failures after the first byte come from
// Recv. truncated is the message of the TRUNCATED error for a body that ends before dec has
// Stopped.
func (e Endpoint) Stream(ctx context.Context, body any, own []Header, dec Decoder, truncated string) (provider.Stream, error) {
	// The stream owns a cancel of its own so that Close tears down the request even when
	// the caller's context lives on.
	sctx, cancel := context.WithCancel(ctx)
	resp, err := e.post(sctx, body, true, own)
	if err != nil {
		cancel()
		return nil, err
	}
	requestID := provider.RequestID(resp.Header)

	// A server or gateway that cannot stream (or fails before it starts) may answer 200
	// with a plain JSON body; reading it as events would only report a truncated stream.
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "application/json" {
		defer cancel()
		defer resp.Body.Close()
		data, _ := httpbody.Response(resp, maxErrorBody)
		pe := &provider.Error{
			Class:   mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
			Message: "expected an event stream, got a JSON body",
		}
		if apiErr, ok := provider.ParseAPIError(data); ok {
			pe = provider.ClassifyEmbedded(apiErr)
		}
		pe.StatusCode, pe.RequestID = resp.StatusCode, requestID
		return nil, pe
	}

	return &stream{
		ctx:       ctx,
		cancel:    cancel,
		body:      resp.Body,
		events:    provider.NewEventReader(resp.Body),
		requestID: requestID,
		dec:       dec,
		truncated: truncated,
	}, nil
}

// stream is a provider.Stream over a server-sent event stream. Recv is meant for one
// goroutine; Close may be called from any.
type stream struct {
	ctx       context.Context // the caller's; its error decides CANCELED or TIMEOUT
	cancel    context.CancelFunc
	body      io.ReadCloser
	events    *provider.EventReader
	requestID string
	truncated string

	releaseOnce sync.Once
	closed      atomic.Bool

	// Owned by Recv.
	dec Decoder
	err error // sticky: io.EOF or the *provider.Error that ended the stream
	// ahead is what Recv read on after its chunk, from events already buffered: the next
	// Recv returns it without reading (lookAhead), when hasAhead.
	ahead    result
	hasAhead bool
}

type result struct {
	chunk provider.Chunk
	err   error
}

func (s *stream) RequestID() string { return s.requestID }

// Recv returns the next piece of text. The finish reason and usage arrive together in a
// last chunk once the answer is complete, then Recv returns io.EOF. After an error every
// call returns that error again. A chunk says whether the next Recv has another piece
// without reading (Chunk.More).
func (s *stream) Recv() (provider.Chunk, error) {
	r := s.ahead
	if s.hasAhead {
		s.ahead, s.hasAhead = result{}, false
	} else {
		r, _ = s.read(true)
	}
	if r.err == nil {
		r.chunk.More = s.lookAhead()
	}
	return r.chunk, r.err
}

// lookAhead reads on while whole events are buffered, keeping what it read in ahead for
// the next Recv, and reports whether that is another piece of the answer (Chunk.More).
// The end of the stream (its last chunk, io.EOF or a failure) is not: a caller flushes for
// it, and the caller's own work at the end, such as checking the answer, does not hold back
// the last piece. Events without a piece (a role, a finish reason, usage) are folded into
// the decoder as Recv would fold them.
func (s *stream) lookAhead() bool {
	if s.err != nil {
		return false
	}
	r, ok := s.read(false)
	s.ahead, s.hasAhead = r, ok
	return ok && r.err == nil && !r.chunk.Empty() && s.err == nil
}

// read returns the next chunk, the end or the failure, reading from the network as needed;
// with wait false it reads only events already buffered whole, and reports false when
// they were not enough.
func (s *stream) read(wait bool) (_ result, ok bool) {
	if s.err != nil {
		return result{err: s.err}, true
	}
	for {
		if !wait && !s.events.Ready() {
			return result{}, false
		}
		ev, err := s.events.Next()
		if err != nil {
			return s.end(s.readFailure(err)), true
		}
		piece, done, perr := s.dec.Apply(ev)
		switch {
		case perr != nil:
			return s.end(s.fromBody(perr)), true
		case done:
			return s.end(nil), true
		case !piece.Empty():
			return result{chunk: piece}, true
		}
	}
}

// readFailure classifies why the event stream stopped before the answer was complete. The
// end of the body is a clean end only if the model had stopped; otherwise the connection
// was cut and the answer is TRUNCATED. It returns nil for a clean end.
func (s *stream) readFailure(err error) error {
	switch {
	case s.closed.Load():
		return s.classified(&provider.Error{
			Class: mantlev1.ErrorClass_ERROR_CLASS_CANCELED, Message: "stream closed", Err: err,
		})
	case s.ctx.Err() != nil:
		return s.classified(provider.ClassifyTransport(s.ctx, err))
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		if s.dec.Stopped() {
			return nil
		}
		return s.classified(&provider.Error{
			Class:   mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED,
			Message: s.truncated,
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
// the answer is complete: the decoder's last chunk follows, unless it is empty, and then
// io.EOF.
func (s *stream) end(cause error) result {
	s.release()
	var last provider.Chunk
	if cause == nil {
		var perr *provider.Error
		if last, perr = s.dec.Last(); perr != nil {
			cause = s.fromBody(perr)
		}
	}
	if cause != nil {
		s.err = cause
		return result{err: cause}
	}
	s.err = io.EOF
	if last.Empty() && last.FinishReason == "" && last.Usage == nil {
		return result{err: io.EOF}
	}
	return result{chunk: last}
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
