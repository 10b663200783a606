// Package providertest holds what the adapters' tests share: httptest handlers that fail
// the way upstreams fail (hang, hang up, reset, stall mid-stream), helpers that wait with a
// bound, and the checks that are the same for every adapter because the code they test is
// shared (transport failures, cancellation, stream lifecycle, no hidden resends).
//
// Every wait here has a bound: the test's side waits at most Watchdog, and a handler that
// waits for the client also stops when the test ends, so that httptest.Server.Close, which
// waits for running handlers, can never block a failing test forever.
package providertest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mantle-mesh/mantle/pkg/provider"
)

// Watchdog bounds how long a test waits for something that should be prompt. It only
// fires when the code under test is broken; passing tests never wait for it.
const Watchdog = 5 * time.Second

// Now is the time at which Clock stands still.
var Now = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

// Clock is a stopped clock for an adapter's Config.Now, so that absolute reset and
// Retry-After times in test headers turn into exact durations.
func Clock() time.Time { return Now }

// NewServer starts a server for h that is closed when the test ends.
func NewServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// Respond answers with a fixed status, headers (name, value pairs) and body; the
// Content-Type is application/json unless the pairs say otherwise.
func Respond(status int, body string, kv ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i < len(kv); i += 2 {
			w.Header().Set(kv[i], kv[i+1])
		}
		if w.Header().Get("Content-Type") == "" {
			w.Header().Set("Content-Type", "application/json")
		}
		w.WriteHeader(status)
		io.WriteString(w, body)
	}
}

// Abort runs h and then aborts the response: the server closes the connection without the
// final chunk of the chunked encoding, as a dying upstream would.
func Abort(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		h(w, r)
		panic(http.ErrAbortHandler)
	}
}

// HangUp takes the connection away from the server and closes it before any response;
// with reset it sends a TCP RST instead of a FIN.
func HangUp(reset bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		if tcp, ok := conn.(*net.TCPConn); ok && reset {
			tcp.SetLinger(0)
		}
		conn.Close()
	}
}

// Hang never answers: it blocks until the client goes away or the test ends, signalling on
// started (when not nil) first. It reads the request body first because only then does the
// server watch the connection and cancel r.Context() when the client hangs up.
func Hang(t *testing.T, started chan<- struct{}) http.HandlerFunc {
	var once sync.Once
	return func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if started != nil {
			once.Do(func() { close(started) })
		}
		waitClient(t, r)
	}
}

// Stall answers 200 with the event-stream text prelude and then nothing, until the client
// goes away; gone is closed when the server sees that happen, which proves the connection
// was released. When the test ends first the handler returns without closing gone.
func Stall(t *testing.T, gone chan<- struct{}, prelude string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, prelude)
		w.(http.Flusher).Flush()
		if waitClient(t, r) {
			close(gone)
		}
	}
}

// waitClient blocks until the client has gone away (true) or the test has ended (false).
// The second bound matters when the code under test fails to release a connection: the
// test then fails on its own watchdog, and the handler must not keep the server's Close,
// which runs in the test's cleanup, waiting forever.
func waitClient(t *testing.T, r *http.Request) bool {
	select {
	case <-r.Context().Done():
		return true
	case <-t.Context().Done():
		return false
	}
}

// ResetAfter answers 200 with the event-stream text prelude, written by hand on the
// hijacked connection and delimited by its end, then resets the connection (TCP RST) once
// proceed is closed or the test ends.
func ResetAfter(t *testing.T, prelude string, proceed <-chan struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		defer conn.Close()
		writeRawStream(buf, prelude)
		select {
		case <-proceed:
		case <-t.Context().Done():
		}
		conn.(*net.TCPConn).SetLinger(0)
	}
}

// writeRawStream writes the head of an HTTP/1.1 event-stream response delimited by the end
// of the connection, and then body, so the caller controls how that connection ends.
func writeRawStream(buf *bufio.ReadWriter, body string) {
	io.WriteString(buf, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
	io.WriteString(buf, body)
	buf.Flush()
}

// Offer sends v on ch, which a handler uses to report what it saw, without ever blocking:
// a second request where one was expected is an error rather than a handler stuck forever.
func Offer[T any](t *testing.T, ch chan<- T, v T) {
	select {
	case ch <- v:
	default:
		t.Errorf("handler called more often than expected; dropped %T", v)
	}
}

// AsError returns err as a *provider.Error, failing the test when it is not one.
func AsError(t *testing.T, err error) *provider.Error {
	t.Helper()
	var pe *provider.Error
	if !errors.As(err, &pe) {
		t.Fatalf("error %v (%T) is not a *provider.Error", err, err)
	}
	return pe
}

// Drain reads a stream to its end and returns the content, the last chunk and the error
// that ended it.
func Drain(t *testing.T, s provider.Stream) (content string, last provider.Chunk, err error) {
	t.Helper()
	var b strings.Builder
	for range 1000 {
		c, err := s.Recv()
		if err != nil {
			return b.String(), last, err
		}
		b.WriteString(c.Content)
		last = c
	}
	t.Fatal("stream did not end")
	return
}

// Collect reads a stream that must end cleanly and returns its chunks.
func Collect(t *testing.T, s provider.Stream) []provider.Chunk {
	t.Helper()
	var chunks []provider.Chunk
	for range 1000 {
		c, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return chunks
		}
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		// More says how the events fell across reads, which a test server's writes do not
		// fix: the adapters' tests compare what the chunks carry, and More is checked
		// where the reads are the test's (openai's TestStreamMore).
		c.More = false
		chunks = append(chunks, c)
	}
	t.Fatal("stream did not end")
	return nil
}

// RecvAsync runs one Recv in the background.
func RecvAsync(s provider.Stream) <-chan error {
	errc := make(chan error, 1)
	go func() {
		_, err := s.Recv()
		errc <- err
	}()
	return errc
}

// WaitErr waits at most Watchdog for an error on errc.
func WaitErr(t *testing.T, errc <-chan error) error {
	t.Helper()
	select {
	case err := <-errc:
		return err
	case <-time.After(Watchdog):
		t.Fatal("the call did not return")
		return nil
	}
}

// WaitClosed waits at most Watchdog for gone to be closed.
func WaitClosed(t *testing.T, gone <-chan struct{}) {
	t.Helper()
	select {
	case <-gone:
	case <-time.After(Watchdog):
		t.Fatal("the server never saw the connection go away")
	}
}

// Expiring returns a context that a test expires when it chooses: from then on Done is
// closed and Err is context.DeadlineExceeded, as when a real deadline passes. A real
// deadline short enough for a test can pass early on a loaded machine, before the test
// has reached the point it means to test; this one cannot.
func Expiring() (ctx context.Context, expire func()) {
	e := &expiring{Context: context.Background(), done: make(chan struct{})}
	return e, func() { e.once.Do(func() { close(e.done) }) }
}

type expiring struct {
	context.Context
	once sync.Once
	done chan struct{}
}

func (e *expiring) Done() <-chan struct{} { return e.done }

func (e *expiring) Err() error {
	select {
	case <-e.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

func (e *expiring) String() string { return fmt.Sprintf("providertest.Expiring(%p)", e) }
