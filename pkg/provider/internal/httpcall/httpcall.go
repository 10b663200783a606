// Package httpcall is the HTTP exchange the adapters share: sending a request so that every
// outcome is a classified *provider.Error, reading a whole answer, and owning a streamed one
// (see Stream). OpenAI-compatible servers and Anthropic differ in request and response
// shapes and in what their events mean; those stay in the adapters, which hand this package
// their request body, their own headers and functions that read their answers.
//
// It is internal so that only the adapters under pkg/provider can depend on it: the router
// sees the provider.Provider interface and nothing of how an adapter speaks HTTP.
package httpcall

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/textproto"
	"slices"
	"time"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/httpbody"
	"github.com/mantle-mesh/mantle/pkg/httpheader"
	"github.com/mantle-mesh/mantle/pkg/provider"
)

const (
	// maxBody bounds how much of a response body is read.
	maxBody = provider.MaxAnswerBytes
	// maxErrorBody bounds an error body, which only feeds classification and the message.
	maxErrorBody = 64 << 10
)

// Endpoint is one API URL reached with one HTTP client. It is safe for concurrent use.
type Endpoint struct {
	URL    string
	Client *http.Client
	// Headers are added to every request, their names canonical; they override the
	// adapter's own headers of the same name.
	Headers []Header
	// Now turns absolute retry and reset times into durations.
	Now func() time.Time
}

// NewEndpoint returns an Endpoint; a nil client means http.DefaultClient and a nil now
// time.Now.
func NewEndpoint(url string, client *http.Client, headers map[string]string, now func() time.Time) Endpoint {
	if client == nil {
		client = http.DefaultClient
	}
	if now == nil {
		now = time.Now
	}
	return Endpoint{URL: url, Client: client, Headers: canonicalHeaders(headers), Now: now}
}

// canonicalHeaders lists the configured headers under canonical names, once for every
// request, in the order of their names as configured, so that of two names alike but for
// case the same one wins every time.
func canonicalHeaders(m map[string]string) []Header {
	out := make([]Header, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, Header{Name: textproto.CanonicalMIMEHeaderKey(k), Value: m[k]})
	}
	return out
}

// Complete posts body and reads the whole answer. A 2xx body that is too large or that
// carries an error object is classified here; any other is handed to parse, which returns
// the answer or the failure it hides. Errors from the body carry the response's status;
// all carry the provider's request id.
func (e Endpoint) Complete(ctx context.Context, body any, own []Header,
	parse func([]byte) (provider.Response, *provider.Error)) (provider.Response, error) {
	resp, err := e.post(ctx, body, false, own)
	if err != nil {
		return provider.Response{}, err
	}
	defer resp.Body.Close()
	requestID := provider.RequestID(resp.Header)

	data, err := httpbody.Response(resp, maxBody+1)
	if err != nil {
		pe := provider.ClassifyTransport(ctx, fmt.Errorf("read response: %w", err))
		pe.RequestID = requestID
		return provider.Response{}, pe
	}
	out, perr := parseAnswer(data, parse)
	if perr != nil {
		perr.StatusCode, perr.RequestID = resp.StatusCode, requestID
		return provider.Response{}, perr
	}
	out.RequestID = requestID
	out.RateLimit = provider.ParseRateLimit(resp.Header, e.Now)
	return out, nil
}

// parseAnswer reads a 2xx body, returning a classified error when the body is a failure in
// disguise.
func parseAnswer(body []byte, parse func([]byte) (provider.Response, *provider.Error)) (provider.Response, *provider.Error) {
	if len(body) > maxBody {
		return provider.Response{}, &provider.Error{
			Class:   mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
			Message: fmt.Sprintf("response body larger than %d bytes", maxBody),
		}
	}
	if apiErr, ok := provider.ParseAPIError(body); ok {
		return provider.Response{}, provider.ClassifyEmbedded(apiErr)
	}
	return parse(body)
}

// SelfEncoder is a request body that encodes itself to complete, compact JSON. post sends
// those bytes as they are: json.Marshal would re-scan and copy the whole of what a
// MarshalJSON returns, the largest part of encoding a long conversation.
type SelfEncoder interface {
	EncodeJSON() ([]byte, error)
}

// encode is body as JSON: its own encoding when it has one, json.Marshal's otherwise.
func encode(body any) ([]byte, error) {
	if b, ok := body.(SelfEncoder); ok {
		return b.EncodeJSON()
	}
	return json.Marshal(body)
}

// Header is one header sent with a request: an adapter's own (credentials, API version)
// or a configured one. Name is in canonical form (textproto.CanonicalMIMEHeaderKey).
type Header struct{ Name, Value string }

// post sends body as JSON and returns the response when its status is 2xx; any other
// outcome is a classified *provider.Error. own are the adapter's headers, set before
// e.Headers. The caller closes the body.
func (e Endpoint) post(ctx context.Context, body any, stream bool, own []Header) (*http.Response, error) {
	payload, err := encode(body)
	if err != nil {
		return nil, &provider.Error{
			Class: mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST,
			Err:   fmt.Errorf("encode request: %w", err),
		}
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, e.URL, bytes.NewReader(payload))
	if err != nil {
		return nil, &provider.Error{
			Class: mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST,
			Err:   fmt.Errorf("build request: %w", err),
		}
	}
	// net/http silently resends a request that carries an Idempotency-Key when a reused
	// connection fails before the response. Every upstream call must be the router's own
	// decision (retry budgets, billing), so the body is made non-rewindable.
	hreq.GetBody = nil
	setHeaders(hreq.Header, stream, own, e.Headers)

	resp, err := e.Client.Do(hreq)
	if err != nil {
		return nil, provider.ClassifyTransport(ctx, err)
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp, nil
	}
	defer resp.Body.Close()
	errBody, _ := httpbody.Response(resp, maxErrorBody)
	return nil, provider.ClassifyHTTP(resp.StatusCode, resp.Header, errBody, e.Now)
}

// setHeaders sets a request's headers as http.Header.Set would, each later one replacing
// an earlier of the same name, with one allocation for all their values (httpheader):
// every call to a model sets four or five. Names are canonical already.
func setHeaders(h http.Header, stream bool, own, extra []Header) {
	s := httpheader.NewSetter(h, 2+len(own)+len(extra))
	s.Set("Content-Type", "application/json")
	if stream {
		s.Set("Accept", "text/event-stream")
	} else {
		s.Set("Accept", "application/json")
	}
	for _, o := range own {
		s.Set(o.Name, o.Value)
	}
	for _, o := range extra {
		s.Set(o.Name, o.Value)
	}
}
