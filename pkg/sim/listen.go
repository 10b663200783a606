package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// ShutdownGrace bounds how long Start's shutdown waits for calls in flight to finish
// before it closes their connections. Calls that would never finish (hang, stall) do not
// count against it: they are dropped as soon as shutdown begins.
const ShutdownGrace = 5 * time.Second

// Start listens on addr and serves srv until ctx is done. It returns once the listener is
// bound, with the bound address (so callers can pass "127.0.0.1:0") and a wait function
// that blocks until the server has shut down. Shutdown is graceful and bounded: calls in
// flight get ShutdownGrace to finish, then their connections are closed. wait returns nil
// after a shutdown caused by ctx and the serving error otherwise; it may be called more
// than once.
func Start(ctx context.Context, addr string, srv *Server, log *slog.Logger) (bound string, wait func() error, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("sim: listen on %s: %w", addr, err)
	}
	drain := make(chan struct{})
	hs := &http.Server{
		Handler:           srv,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		// Request contexts carry this listener's drain signal, which hung calls watch.
		// It is not a cancellation: ordinary calls in flight should finish gracefully.
		BaseContext: func(net.Listener) context.Context {
			return context.WithValue(context.Background(), drainKey{}, (<-chan struct{})(drain))
		},
	}
	hs.RegisterOnShutdown(func() { close(drain) })

	bound = ln.Addr().String()
	log.Info("sim: serving", "addr", bound)
	done := make(chan error, 1)
	go func() { done <- serve(ctx, hs, ln, log) }()
	return bound, sync.OnceValue(func() error { return <-done }), nil
}

// ListenAndServe serves srv on addr until ctx is done; see Start.
func ListenAndServe(ctx context.Context, addr string, srv *Server, log *slog.Logger) error {
	_, wait, err := Start(ctx, addr, srv, log)
	if err != nil {
		return err
	}
	return wait()
}

// serve runs hs on ln until ctx is done or serving fails, and returns once hs has stopped.
func serve(ctx context.Context, hs *http.Server, ln net.Listener, log *slog.Logger) error {
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("sim: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ShutdownGrace)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		log.Warn("sim: graceful shutdown incomplete; closing connections", "err", err)
		_ = hs.Close()
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("sim: serve: %w", err)
	}
	log.Info("sim: stopped")
	return nil
}

type drainKey struct{}

// drainSignal returns the channel closed when the listener serving ctx's request starts
// shutting down, or nil (never ready) when the request did not come through Start.
func drainSignal(ctx context.Context) <-chan struct{} {
	ch, _ := ctx.Value(drainKey{}).(<-chan struct{})
	return ch
}
