package providertest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
)

// Adapter describes an adapter to the shared checks.
type Adapter struct {
	// New returns the adapter's provider for the server at url, reached with client (nil:
	// http.DefaultClient).
	New func(url string, client *http.Client) provider.Provider
	// Request is a valid request.
	Request provider.Request
	// Answer is a 200 body that Complete accepts.
	Answer string
	// First is event-stream text after which the stream's first chunk is the content
	// "first".
	First string
}

// connect returns a provider for a test server running h.
func (a Adapter) connect(t *testing.T, h http.Handler) provider.Provider {
	srv := NewServer(t, h)
	return a.New(srv.URL, srv.Client())
}

// CompleteError is one case of CompleteErrors.
type CompleteError struct {
	Name       string
	Handler    http.HandlerFunc
	Class      provider.Class
	Status     int
	RetryAfter time.Duration
	Message    string // substring of Message
}

// CompleteErrors checks how Complete classifies each case. Errors that came with a
// response must carry requestID, the id the handlers send.
func CompleteErrors(t *testing.T, a Adapter, requestID string, cases []CompleteError) {
	for _, tt := range cases {
		t.Run(tt.Name, func(t *testing.T) {
			_, err := a.connect(t, tt.Handler).Complete(context.Background(), a.Request)
			wantID := requestID
			if tt.Status == 0 {
				wantID = "" // no response, no id
			}
			e := checkError(t, err, tt.Class, tt.Message, wantID)
			if e.StatusCode != tt.Status {
				t.Errorf("status = %d, want %d", e.StatusCode, tt.Status)
			}
			if e.RetryAfter != tt.RetryAfter {
				t.Errorf("RetryAfter = %v, want %v", e.RetryAfter, tt.RetryAfter)
			}
		})
	}
}

// checkError checks that err is a *provider.Error of class whose Message contains message
// and, unless requestID is empty, that carries requestID.
func checkError(t *testing.T, err error, class provider.Class, message, requestID string) *provider.Error {
	t.Helper()
	t.Logf("error: %v", err)
	e := AsError(t, err)
	if e.Class != class {
		t.Errorf("class = %v, want %v (%v)", e.Class, class, e)
	}
	if !strings.Contains(e.Message, message) {
		t.Errorf("Message = %q, want it to contain %q", e.Message, message)
	}
	if requestID != "" && e.RequestID != requestID {
		t.Errorf("RequestID = %q, want %s", e.RequestID, requestID)
	}
	return e
}

// CompleteConnectionRefused: nothing listens at the address.
func CompleteConnectionRefused(t *testing.T, a Adapter) {
	srv := NewServer(t, http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	// The port is free now and another test process may bind it and never answer, so the
	// call is bounded; with context.Background() that would hang the test binary.
	ctx, cancel := context.WithTimeout(context.Background(), Watchdog)
	defer cancel()
	_, err := a.New(url, nil).Complete(ctx, a.Request)
	if got := provider.ClassOf(err); got != mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT {
		t.Errorf("class = %v, want TRANSIENT (%v)", got, err)
	}
}

// CompleteDeadline: the caller's deadline passes while the server says nothing.
func CompleteDeadline(t *testing.T, a Adapter) {
	p := a.connect(t, Hang(t, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := p.Complete(ctx, a.Request)
	if got := provider.ClassOf(err); got != mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT {
		t.Errorf("class = %v, want TIMEOUT (%v)", got, err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v does not wrap context.DeadlineExceeded", err)
	}
}

// CompleteHTTPClientTimeout: the http.Client's own Timeout passes while the server says
// nothing.
func CompleteHTTPClientTimeout(t *testing.T, a Adapter) {
	srv := NewServer(t, Hang(t, nil))
	hc := srv.Client()
	hc.Timeout = 50 * time.Millisecond
	_, err := a.New(srv.URL, hc).Complete(context.Background(), a.Request)
	if got := provider.ClassOf(err); got != mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT {
		t.Errorf("class = %v, want TIMEOUT (%v)", got, err)
	}
}

// CompleteCancel: the caller cancels while the server says nothing.
func CompleteCancel(t *testing.T, a Adapter) {
	started := make(chan struct{})
	p := a.connect(t, Hang(t, started))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := p.Complete(ctx, a.Request)
		errc <- err
	}()
	select {
	case <-started:
	case err := <-errc:
		t.Fatalf("Complete returned before the server saw the request: %v", err)
	case <-time.After(Watchdog):
		t.Fatal("the server never saw the request")
	}
	cancel()
	err := WaitErr(t, errc)
	if got := provider.ClassOf(err); got != mantlev1.ErrorClass_ERROR_CLASS_CANCELED {
		t.Errorf("class = %v, want CANCELED (%v)", got, err)
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("error %v does not wrap context.Canceled", err)
	}
}

// NoHiddenResend checks that a request with an Idempotency-Key that dies on a reused
// connection is not resent by net/http behind the router's back. a.New and a.Request
// must make the adapter send an Idempotency-Key header, which is what lets net/http
// resend a POST; the check fails if they do not.
func NoHiddenResend(t *testing.T, a Adapter) {
	var calls, keyed atomic.Int64
	srv := NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.Header.Get("Idempotency-Key") != "" {
			keyed.Add(1)
		}
		if calls.Add(1) == 1 {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, a.Answer)
			return
		}
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		conn.Close() // the reused connection dies before any response
	}))
	p := a.New(srv.URL, srv.Client())
	ctx, cancel := context.WithTimeout(context.Background(), Watchdog)
	defer cancel()
	if _, err := p.Complete(ctx, a.Request); err != nil {
		t.Fatalf("first call: %v", err)
	}
	_, err := p.Complete(ctx, a.Request)
	if provider.ClassOf(err) != mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT {
		t.Errorf("second call: %v, want TRANSIENT", err)
	}
	if got := calls.Load(); got != 2 {
		t.Errorf("server saw %d calls, want 2 (no hidden resend)", got)
	}
	if got := keyed.Load(); got != calls.Load() {
		t.Errorf("%d of %d calls carried an Idempotency-Key; the check needs all of them to", got, calls.Load())
	}
}

// StreamOutcome is one case of StreamOutcomes. A zero Class means a clean end, with Finish
// the finish reason of the last chunk.
type StreamOutcome struct {
	Name    string
	Handler http.HandlerFunc
	Content string
	Finish  string
	Class   provider.Class
	Message string // substring of Message
}

// StreamOutcomes reads each case's stream to its end and checks the content and how it
// ended. Errors must carry requestID, the id the handlers send, and must be sticky.
func StreamOutcomes(t *testing.T, a Adapter, requestID string, cases []StreamOutcome) {
	for _, tt := range cases {
		t.Run(tt.Name, func(t *testing.T) {
			s, err := a.connect(t, tt.Handler).Stream(context.Background(), a.Request)
			if err != nil {
				t.Fatalf("Stream: %v", err)
			}
			defer s.Close()
			content, last, err := Drain(t, s)
			if content != tt.Content {
				t.Errorf("content = %q, want %q", content, tt.Content)
			}
			if tt.Class == mantlev1.ErrorClass_ERROR_CLASS_UNSPECIFIED {
				if !errors.Is(err, io.EOF) {
					t.Fatalf("stream ended with %v, want io.EOF", err)
				}
				if last.FinishReason != tt.Finish {
					t.Errorf("finish reason = %q, want %q", last.FinishReason, tt.Finish)
				}
				return
			}
			checkError(t, err, tt.Class, tt.Message, requestID)
			if _, again := s.Recv(); again != err { //nolint:errorlint // the very same error, not one that wraps it
				t.Errorf("Recv after the error = %v, want the same error %v", again, err)
			}
		})
	}
}

// StreamHTTPError is one case of StreamHTTPErrors.
type StreamHTTPError struct {
	Name       string
	Handler    http.HandlerFunc
	Class      provider.Class
	RetryAfter time.Duration
}

// StreamHTTPErrors checks that failures before the stream starts come from Stream.
func StreamHTTPErrors(t *testing.T, a Adapter, cases []StreamHTTPError) {
	for _, tt := range cases {
		t.Run(tt.Name, func(t *testing.T) {
			s, err := a.connect(t, tt.Handler).Stream(context.Background(), a.Request)
			if s != nil {
				s.Close()
				t.Fatal("Stream returned a stream and an error")
			}
			t.Logf("error: %v", err)
			e := AsError(t, err)
			if e.Class != tt.Class || e.RetryAfter != tt.RetryAfter {
				t.Errorf("class, RetryAfter = %v, %v; want %v, %v (%v)", e.Class, e.RetryAfter, tt.Class, tt.RetryAfter, e)
			}
		})
	}
}

// startStall opens a stream on a server that stalls after a.First and checks the first
// chunk; gone is closed when the server sees the client leave.
func startStall(t *testing.T, a Adapter, ctx context.Context) (s provider.Stream, gone <-chan struct{}) {
	t.Helper()
	g := make(chan struct{})
	s, err := a.connect(t, Stall(t, g, a.First)).Stream(ctx, a.Request)
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	if chunk, err := s.Recv(); err != nil || chunk.Content != "first" {
		t.Fatalf("first Recv = %+v, %v", chunk, err)
	}
	return s, g
}

// StreamStall: the caller gives up on a stream that has stopped sending, by canceling its
// context or by closing the stream. A Recv blocked on the network returns CANCELED and the
// connection is released.
func StreamStall(t *testing.T, a Adapter) {
	tests := []struct {
		name string
		stop func(cancel context.CancelFunc, s provider.Stream)
	}{
		{"caller cancels", func(cancel context.CancelFunc, _ provider.Stream) { cancel() }},
		{"caller closes the stream", func(_ context.CancelFunc, s provider.Stream) { s.Close() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s, gone := startStall(t, a, ctx)
			errc := RecvAsync(s)
			tt.stop(cancel, s)
			err := WaitErr(t, errc)
			if got := provider.ClassOf(err); got != mantlev1.ErrorClass_ERROR_CLASS_CANCELED {
				t.Errorf("class = %v, want CANCELED (%v)", got, err)
			}
			WaitClosed(t, gone)
			if err := s.Close(); err != nil {
				t.Errorf("second Close = %v", err)
			}
		})
	}
}

// StreamStallDeadline: the caller's deadline passes on a stream that has stopped sending.
// The deadline is expired by the test once the stream has started (see Expiring).
func StreamStallDeadline(t *testing.T, a Adapter) {
	ctx, expire := Expiring()
	defer expire()
	s, gone := startStall(t, a, ctx)
	errc := RecvAsync(s)
	expire()
	err := WaitErr(t, errc)
	if got := provider.ClassOf(err); got != mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT {
		t.Errorf("class = %v, want TIMEOUT (%v)", got, err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v does not wrap context.DeadlineExceeded", err)
	}
	WaitClosed(t, gone)
}

// StreamConnectionReset: a connection that dies mid-stream (RST, not a clean close) is a
// transient network failure rather than a truncated answer.
func StreamConnectionReset(t *testing.T, a Adapter) {
	proceed := make(chan struct{})
	s, err := a.connect(t, ResetAfter(t, a.First, proceed)).Stream(context.Background(), a.Request)
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	defer s.Close()
	if chunk, err := s.Recv(); err != nil || chunk.Content != "first" {
		t.Fatalf("first Recv = %+v, %v", chunk, err)
	}
	close(proceed)
	err = WaitErr(t, RecvAsync(s))
	if got := provider.ClassOf(err); got != mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT {
		t.Errorf("class = %v, want TRANSIENT (%v)", got, err)
	}
}
