package drill

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mantle-mesh/mantle/pkg/httpbody"
	"github.com/mantle-mesh/mantle/pkg/sim"
)

// upstream is the simulated provider of one side of a run: a sim.Server behind a loopback
// HTTP listener, plus a log of every call it received (when, which model, what it did),
// which the report needs for timelines, half-open probe counts and recovery bursts.
//
// The listener is bound before the sim server is created so the mesh can be configured with
// its address; arm creates the sim server right before the load starts, so the scenario's
// phases are measured from the first request, on both sides alike.
type upstream struct {
	baseURL string
	hs      *http.Server
	served  chan error

	srv   atomic.Pointer[sim.Server]
	mu    sync.Mutex
	start time.Time
	calls []upstreamCall
}

// upstreamCall is one call the simulator received.
type upstreamCall struct {
	// At is when it arrived, since arm.
	At       time.Duration
	Model    string
	Outcome  string
	Duration time.Duration
}

// maxUpstreamBody bounds what the recorder reads to learn a call's model.
const maxUpstreamBody = 8 << 20

// startUpstream listens on addr and serves until close. It answers 503 until armed.
func startUpstream(ctx context.Context, addr string, log *slog.Logger) (*upstream, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("drill: simulator: listen on %s: %w", addr, err)
	}
	u := &upstream{baseURL: "http://" + ln.Addr().String() + "/v1", served: make(chan error, 1)}
	u.hs = &http.Server{
		Handler:           u,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	go func() { u.served <- u.hs.Serve(ln) }()
	return u, nil
}

// arm starts a fresh simulator: phases count from now and the call log starts empty.
func (u *upstream) arm(cfg sim.ServerConfig) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.start = time.Now()
	u.calls = u.calls[:0]
	u.srv.Store(sim.NewServer(cfg))
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	srv := u.srv.Load()
	if srv == nil {
		http.Error(w, "simulator not armed", http.StatusServiceUnavailable)
		return
	}
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		srv.ServeHTTP(w, r)
		return
	}
	body, err := httpbody.Request(w, r, maxUpstreamBody)
	if err != nil {
		http.Error(w, "reading body: "+err.Error(), http.StatusBadRequest)
		return
	}
	var head struct {
		Model string `json:"model"`
	}
	_ = json.Unmarshal(body, &head) // the simulator reports a bad body itself
	r.Body = io.NopCloser(bytes.NewReader(body))
	arrived := time.Now()
	// Recorded in a defer: the simulator aborts connections (resets, cut streams) by
	// hijacking them, and on HTTP/2 by panicking with http.ErrAbortHandler.
	defer func() {
		c := upstreamCall{Model: head.Model, Outcome: w.Header().Get("x-sim-outcome"), Duration: time.Since(arrived)}
		u.mu.Lock()
		c.At = arrived.Sub(u.start)
		u.calls = append(u.calls, c)
		u.mu.Unlock()
	}()
	srv.ServeHTTP(w, r)
}

// stats returns the simulator's counters.
func (u *upstream) stats() sim.Stats {
	if srv := u.srv.Load(); srv != nil {
		return srv.Stats()
	}
	return sim.Stats{Models: map[string]sim.ModelStats{}}
}

// log returns a copy of the calls received since arm.
func (u *upstream) log() []upstreamCall {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]upstreamCall(nil), u.calls...)
}

// close stops serving. Calls still held open by the simulator (hangs, stalls) are dropped
// with their connections: their clients have given up by the time a side is over.
func (u *upstream) close() error {
	err := u.hs.Close()
	if serr := <-u.served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}
