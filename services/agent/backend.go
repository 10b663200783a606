package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/mantle-mesh/mantle/pkg/httpbody"
	"github.com/mantle-mesh/mantle/pkg/jsonfield"
)

// backendCall is one call of a tool's backend.
type backendCall struct {
	// args are the checked arguments, a JSON object.
	args []byte
	// idempotencyKey goes to the backend as the Idempotency-Key header (actions).
	idempotencyKey string
	requestID      string
}

// backendResult is what a backend answered.
type backendResult struct {
	// result is JSON text (an HTTP body, an MCP tool's structured or text content).
	result string
	// isError: the tool answered that the call failed; result says why.
	isError    bool
	httpStatus int
}

// backend runs a tool's calls. A failed call returns a *callError.
type backend interface {
	call(ctx context.Context, c backendCall) (backendResult, error)
	// close releases connections and sessions; calls in flight end with their contexts.
	close()
}

// callError is a backend call that produced no result, classified.
type callError struct {
	failure failure
	// outcome is the ToolAttempt outcome: timeout, unavailable, reset, rate_limited,
	// bad_response, breaker_open, bulkhead_full, budget_exhausted.
	outcome    string
	httpStatus int
	err        error
}

func (e *callError) Error() string { return e.outcome + ": " + e.err.Error() }
func (e *callError) Unwrap() error { return e.err }

// httpBackend POSTs the arguments as JSON to the tool's URL; a 2xx body is the result.
type httpBackend struct {
	url      string
	headers  http.Header
	client   *http.Client
	maxBytes int
}

func newHTTPBackend(cfg BackendConfig, getenv func(string) string, client *http.Client, maxBytes int) *httpBackend {
	h := http.Header{}
	for name, env := range cfg.HeadersEnv {
		h.Set(name, getenv(env))
	}
	return &httpBackend{url: cfg.URL, headers: h, client: client, maxBytes: maxBytes}
}

func (b *httpBackend) close() { b.client.CloseIdleConnections() }

func (b *httpBackend) call(ctx context.Context, c backendCall) (backendResult, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.url, bytes.NewReader(c.args))
	if err != nil {
		return backendResult{}, &callError{failure: failRefused, outcome: "unavailable", err: err}
	}
	for name, v := range b.headers {
		req.Header[name] = v
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if c.idempotencyKey != "" {
		req.Header.Set("Idempotency-Key", c.idempotencyKey)
	}
	if c.requestID != "" {
		req.Header.Set("X-Request-Id", c.requestID)
	}
	resp, err := b.client.Do(req)
	if err != nil {
		return backendResult{}, classifyTransport(ctx, err)
	}
	defer resp.Body.Close()
	body, err := httpbody.Response(resp, int64(b.maxBytes)+1)
	if err != nil {
		// The status came, the body broke off: the call ran, its answer is lost.
		ce := classifyTransport(ctx, err)
		if ce.failure == failRefused {
			ce.failure, ce.outcome = failUnknown, "reset"
		}
		ce.httpStatus = resp.StatusCode
		return backendResult{}, ce
	}
	if len(body) > b.maxBytes {
		return backendResult{}, &callError{failure: failBadResponse, outcome: "bad_response", httpStatus: resp.StatusCode,
			err: fmt.Errorf("the answer is larger than max_result_bytes (%d)", b.maxBytes)}
	}
	return classifyHTTP(resp.StatusCode, resp.Header, body)
}

// classifyHTTP turns a backend's HTTP answer into a result or a classified failure.
func classifyHTTP(code int, h http.Header, body []byte) (backendResult, error) {
	status := strconv.Itoa(code)
	switch {
	case code >= 200 && code < 300:
		if !jsonfield.Valid(body) {
			return backendResult{}, &callError{failure: failBadResponse, outcome: "bad_response", httpStatus: code,
				err: errors.New("the answer is not JSON")}
		}
		return backendResult{result: string(body), httpStatus: code}, nil
	case code >= 300 && code < 400:
		// Redirects are not followed (a POST would be replayed elsewhere): the call went
		// nowhere.
		return backendResult{}, &callError{failure: failRefused, outcome: "unavailable", httpStatus: code, err: errors.New("HTTP " + status + " (redirects are not followed)")}
	case code == http.StatusTooManyRequests:
		return backendResult{}, &callError{failure: failRefused, outcome: "rate_limited", httpStatus: code,
			err: fmt.Errorf("HTTP %s (Retry-After %q)", status, h.Get("Retry-After"))}
	case code == http.StatusServiceUnavailable:
		// The server says it did not take the call.
		return backendResult{}, &callError{failure: failRefused, outcome: "unavailable", httpStatus: code, err: errors.New("HTTP " + status)}
	case code == http.StatusRequestTimeout:
		return backendResult{}, &callError{failure: failUnknown, outcome: "timeout", httpStatus: code, err: errors.New("HTTP " + status)}
	case code >= 400 && code < 500:
		// The tool's own answer that the call is wrong: the same call gets the same one.
		result := string(body)
		if !jsonfield.Valid(body) {
			quoted, _ := json.Marshal(string(body)) // a string always marshals
			result = string(quoted)
		}
		return backendResult{result: result, isError: true, httpStatus: code}, nil
	default:
		// 500, 502, 504 and the rest: the call may have run.
		return backendResult{}, &callError{failure: failUnknown, outcome: "unavailable", httpStatus: code, err: errors.New("HTTP " + status)}
	}
}

// classifyTransport classifies an error that came instead of an HTTP answer. Only a
// connection that was never made certainly did not run the call.
func classifyTransport(ctx context.Context, err error) *callError {
	var opErr *net.OpError
	switch {
	case errors.As(err, &opErr) && opErr.Op == "dial":
		// Also when the deadline ended the dial: nothing was sent.
		return &callError{failure: failRefused, outcome: "unavailable", err: err}
	case errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil:
		return &callError{failure: failUnknown, outcome: "timeout", err: err}
	default:
		var netErr net.Error
		if errors.As(err, &netErr) && netErr.Timeout() {
			return &callError{failure: failUnknown, outcome: "timeout", err: err}
		}
		return &callError{failure: failUnknown, outcome: "reset", err: err}
	}
}

// toolHTTPClient is the HTTP client of one tool's backend: a dial timeout of its own so an
// unreachable backend is known not to have run the call, quickly; the call's timeout comes
// from its context.
func toolHTTPClient(timeout time.Duration) *http.Client {
	dial := min(timeout, 5*time.Second)
	return &http.Client{Transport: &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: dial, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout: dial,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   true,
	}, CheckRedirect: func(*http.Request, []*http.Request) error {
		// A redirected POST would be replayed elsewhere, or turned into a GET.
		return http.ErrUseLastResponse
	}}
}

// endpointOf is a backend's URL as operators see it: without credentials, query or
// fragment, and with the MCP tool's name after #.
func endpointOf(b BackendConfig) string {
	u, err := url.Parse(b.URL)
	if err != nil {
		return ""
	}
	u.User, u.RawQuery, u.Fragment, u.RawFragment = nil, "", "", ""
	s := u.String()
	if b.Type == BackendMCP && b.Tool != "" {
		s += "#" + b.Tool
	}
	return s
}

// defaultBackend builds a tool's backend from its configuration.
func defaultBackend(tc ToolConfig, maxResultBytes int, getenv func(string) string) (backend, error) {
	switch tc.Backend.Type {
	case BackendHTTP:
		return newHTTPBackend(tc.Backend, getenv, toolHTTPClient(tc.Timeout), maxResultBytes), nil
	case BackendMCP:
		return newMCPBackend(tc, getenv, toolHTTPClient(tc.Timeout), maxResultBytes), nil
	}
	return nil, fmt.Errorf("backend type %q", tc.Backend.Type)
}
