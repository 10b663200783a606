package app

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// HTTPLimits bound what one HTTP connection may hold. The zero value of a field takes its
// default (DefaultHTTPLimits).
type HTTPLimits struct {
	// ReadHeaderTimeout bounds reading a request's headers.
	ReadHeaderTimeout time.Duration
	// BodyReadTimeout bounds reading a request's body, from the end of its headers. It is
	// not http.Server.ReadTimeout: that deadline stays on the connection while the handler
	// runs, and when it passes the server cancels the request, which would cut every
	// streamed answer longer than it. This one is lifted once the body is read.
	BodyReadTimeout time.Duration
	// IdleTimeout closes a keep-alive connection with no request for this long.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's header block.
	MaxHeaderBytes int
}

// DefaultHTTPLimits are the limits a Config that sets none gets.
func DefaultHTTPLimits() HTTPLimits {
	return HTTPLimits{ReadHeaderTimeout: 10 * time.Second, BodyReadTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
}

func (l HTTPLimits) withDefaults() HTTPLimits {
	d := DefaultHTTPLimits()
	if l.ReadHeaderTimeout <= 0 {
		l.ReadHeaderTimeout = d.ReadHeaderTimeout
	}
	if l.BodyReadTimeout <= 0 {
		l.BodyReadTimeout = d.BodyReadTimeout
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = d.IdleTimeout
	}
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = d.MaxHeaderBytes
	}
	return l
}

// newHTTPServer serves h within limits, every error it or the mux writes as error JSON in
// the shape shapes gives the request's path (OpenAI's unless a module said otherwise).
//
// net/http answers some requests before any handler runs, in plain text: headers past
// its own limit (431), a malformed request line or header (400), a transfer encoding it
// does not know (501), an unknown Expect (417), an unsupported HTTP version (505). Header
// size is the one a client reaches with a well-formed request, so the server's own limit
// is serverHeaderBytes and the configured one is checked by headerLimit, which answers in
// JSON; only headers past the larger limit get net/http's plain 431.
func newHTTPServer(h http.Handler, limits HTTPLimits, shapes *errorShapes) *http.Server {
	limits = limits.withDefaults()
	return &http.Server{
		Handler:           bodyDeadline(headerLimit(jsonErrors(h, shapes), limits.MaxHeaderBytes, shapes), limits.BodyReadTimeout),
		ReadHeaderTimeout: limits.ReadHeaderTimeout,
		IdleTimeout:       limits.IdleTimeout,
		MaxHeaderBytes:    serverHeaderBytes(limits.MaxHeaderBytes),
	}
}

// serverHeaderBytes is net/http's limit for a configured limit of max: four times it, so
// that headers somewhat over max still reach headerLimit and get a JSON answer, while what
// a connection may make the server read stays bounded.
func serverHeaderBytes(max int) int { return 4 * max }

// headerLimit answers 431 in the path's error shape to a request whose header block
// (request line and fields, counted as net/http counts them on the wire) is over max bytes.
func headerLimit(next http.Handler, max int, shapes *errorShapes) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n := headerBytes(r); n > max {
			writeJSONError(w, shapes.of(r.URL.Path), http.StatusRequestHeaderFieldsTooLarge, "invalid_request_error", "request_header_fields_too_large",
				fmt.Sprintf("request headers are %d bytes, over the limit of %d (server.max_header_bytes)", n, max))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// headerBytes is the size of r's request line and header fields as sent: "Name: value\r\n"
// per value, Host included, and the blank line.
func headerBytes(r *http.Request) int {
	n := len(r.Method) + 1 + len(r.RequestURI) + 1 + len(r.Proto) + 2
	if r.Host != "" {
		n += len("Host: ") + len(r.Host) + 2
	}
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + 2 + len(v) + 2
		}
	}
	return n + 2
}

// bodyDeadline gives reading a request's body timeout, and lifts the deadline once the body
// is read or closed: a client that sends its body slowly is cut off, and the answer that
// follows (a stream, a long poll) is not.
func bodyDeadline(next http.Handler, timeout time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		if err := rc.SetReadDeadline(time.Now().Add(timeout)); err != nil {
			next.ServeHTTP(w, r) // not a net/http connection (a test recorder)
			return
		}
		r.Body = &deadlineBody{ReadCloser: r.Body, lift: func() { _ = rc.SetReadDeadline(time.Time{}) }}
		next.ServeHTTP(w, r)
	})
}

// deadlineBody lifts the read deadline when the body ends.
type deadlineBody struct {
	io.ReadCloser
	lift   func()
	lifted bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) && !b.lifted {
		b.lifted = true
		b.lift()
	}
	return n, err
}

// jsonErrors answers every error status that was not written as JSON (the mux's 404 and
// 405, http.Error) in the path's error shape, so that SDKs raise their usual exceptions.
// The mux's redirects to a cleaned path ("//v1/models", "/v1/../v1/models") become 404:
// a client following them would resend its body to a path it did not name.
func jsonErrors(next http.Handler, shapes *errorShapes) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&jsonErrorWriter{ResponseWriter: w, method: r.Method, path: r.URL.Path, shape: shapes.of(r.URL.Path)}, r)
	})
}

type jsonErrorWriter struct {
	http.ResponseWriter
	method, path string
	shape        ErrorShape
	replaced     bool // the handler's own body is dropped
	wrote        bool
}

func (w *jsonErrorWriter) WriteHeader(code int) {
	if w.wrote {
		w.ResponseWriter.WriteHeader(code)
		return
	}
	w.wrote = true
	h := w.Header()
	if code < 300 || code == http.StatusNotModified || strings.Contains(h.Get("Content-Type"), "json") {
		w.ResponseWriter.WriteHeader(code)
		return
	}
	w.replaced = true
	typ, errCode, msg := "invalid_request_error", "", http.StatusText(code)
	switch {
	case code >= 300 && code < 400:
		h.Del("Location")
		code, errCode, msg = http.StatusNotFound, "not_found", "unknown path "+quote(w.path)+"; paths are case-sensitive and not cleaned"
	case code == http.StatusNotFound:
		errCode, msg = "not_found", "unknown path "+quote(w.path)
	case code == http.StatusMethodNotAllowed:
		errCode, msg = "method_not_allowed", w.method+" is not allowed on "+quote(w.path)
		if allow := h.Get("Allow"); allow != "" {
			msg += "; use " + allow
		}
	case code >= 500:
		typ, errCode = "api_error", strings.ReplaceAll(strings.ToLower(http.StatusText(code)), " ", "_")
	default:
		errCode = strings.ReplaceAll(strings.ToLower(http.StatusText(code)), " ", "_")
	}
	writeJSONError(w.ResponseWriter, w.shape, code, typ, errCode, msg)
}

// writeJSONError writes an error in shape: typ and errCode are OpenAI's error type and
// code; Anthropic's error type follows from the status.
func writeJSONError(w http.ResponseWriter, shape ErrorShape, code int, typ, errCode, msg string) {
	h := w.Header()
	h.Del("Content-Length")
	h.Del("X-Content-Type-Options")
	h.Set("Content-Type", "application/json")
	w.WriteHeader(code)
	if shape == ErrorShapeAnthropic {
		var body struct {
			Type  string `json:"type"`
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		body.Type, body.Error.Type, body.Error.Message = "error", anthropicErrorType(code), msg
		_ = json.NewEncoder(w).Encode(body)
		return
	}
	body := struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    string  `json:"code"`
		} `json:"error"`
	}{}
	body.Error.Message, body.Error.Type, body.Error.Code = msg, typ, errCode
	_ = json.NewEncoder(w).Encode(body)
}

func (w *jsonErrorWriter) Write(p []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if w.replaced {
		return len(p), nil
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection (Flush, deadlines).
func (w *jsonErrorWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func quote(path string) string {
	const max = 128
	if len(path) > max {
		path = path[:max] + "..."
	}
	b, _ := json.Marshal(path)
	return string(b)
}

// ErrorShape is the JSON shape of the errors the HTTP listener answers itself (an unknown
// path, a method not allowed, headers too large) under a path: the shape the clients of
// that path's API parse.
type ErrorShape int

// Error shapes.
const (
	// ErrorShapeOpenAI is {"error": {"message", "type", "param", "code"}}, the default.
	ErrorShapeOpenAI ErrorShape = iota
	// ErrorShapeAnthropic is {"type": "error", "error": {"type", "message"}}, the Messages
	// API's.
	ErrorShapeAnthropic
)

// errorShapes maps path prefixes to shapes. Modules add to it while they are built (New),
// before the listener serves, and it is only read afterwards.
type errorShapes struct {
	prefixes []string
	shapes   []ErrorShape
}

// add gives the paths prefix and prefix/... shape.
func (s *errorShapes) add(prefix string, shape ErrorShape) {
	s.prefixes = append(s.prefixes, strings.TrimSuffix(prefix, "/"))
	s.shapes = append(s.shapes, shape)
}

// of returns the shape of path: that of the longest prefix it is under, OpenAI's when none.
func (s *errorShapes) of(path string) ErrorShape {
	shape, best := ErrorShapeOpenAI, -1
	for i, p := range s.prefixes {
		if (path == p || strings.HasPrefix(path, p+"/")) && len(p) > best {
			shape, best = s.shapes[i], len(p)
		}
	}
	return shape
}

// anthropicErrorType is the Messages API's error type for an HTTP status.
func anthropicErrorType(code int) string {
	switch {
	case code == http.StatusUnauthorized:
		return "authentication_error"
	case code == http.StatusForbidden:
		return "permission_error"
	case code == http.StatusNotFound:
		return "not_found_error"
	case code == http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case code == http.StatusTooManyRequests:
		return "rate_limit_error"
	case code == 529:
		return "overloaded_error"
	case code >= 500:
		return "api_error"
	}
	return "invalid_request_error"
}
