package benchload

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os/exec"
	"runtime"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mantle-mesh/mantle/pkg/app"
	"github.com/mantle-mesh/mantle/pkg/mesh"
)

// A hop is what requests pass through on their way to the upstream in every mode but
// Direct: the bare proxy or a mesh. It runs in the benchmark's process or, with
// Config.HopCommand, in a process of its own.
type hop interface {
	// endpoint is the chat completions URL to send requests to.
	endpoint() string
	// usage is the resource use of the hop's own process (zero when the hop shares the
	// benchmark's process, whose usage already counts it) and the mesh's counters.
	usage() (hopReading, error)
	stop() error
}

// hopReading is what a hop reports before and after each measured window.
type hopReading struct {
	rusage
	// storesShed is the router's mantle_router_cache_stores_shed_total so far: cacheable
	// answers not stored because router.max_async_cache_stores stores were in flight. Zero
	// for the proxy.
	storesShed int64
	// procs is the hop process's GOMAXPROCS; zero for a hop in the benchmark's process.
	procs int
}

// storesShedMetric names the router's counter of stores shed.
const storesShedMetric = "mantle_router_cache_stores_shed_total"

// startHop starts mode's hop in this process, in front of the upstream at upstreamAddr; a
// mesh's configuration is MeshConfig's from base. ownProcess says the process exists to
// serve it, as mantle serve's does: a mesh then tunes the Go runtime as its configuration
// says (mesh.Options.TuneRuntime).
func startHop(ctx context.Context, mode Mode, upstreamAddr string, base mesh.Config, ownProcess bool, logOut io.Writer) (hop, error) {
	if mode == Proxy {
		return startProxy(ctx, upstreamAddr)
	}
	mc, err := MeshConfig(mode, "http://"+upstreamAddr+"/v1", base)
	if err != nil {
		return nil, err
	}
	// The instant upstream ignores keys; the router wants the variable its provider names set.
	getenv := func(name string) string {
		if name == benchKeyEnv {
			return "sk-bench"
		}
		return app.Env{}.Var(name)
	}
	p, err := mesh.Start(ctx, mc, mesh.Options{LogOutput: logOut, TuneRuntime: ownProcess, Getenv: getenv})
	if err != nil {
		return nil, fmt.Errorf("benchload: start mesh: %w", err)
	}
	runCtx, stopMesh := context.WithCancel(context.WithoutCancel(ctx))
	stopped := make(chan error, 1)
	go func() { stopped <- p.Run(runCtx) }()
	h := &localHop{
		url:        "http://" + p.App.HTTPAddr() + "/v1/chat/completions",
		stopFunc:   func() error { stopMesh(); return <-stopped },
		storesShed: func() (int64, error) { return counterValue(p.Metrics, storesShedMetric) },
	}
	if err := waitServing(ctx, p.App.GRPCAddr()); err != nil {
		_ = h.stop()
		return nil, err
	}
	return h, nil
}

// localHop is a hop in this process.
type localHop struct {
	url      string
	stopFunc func() error
	// storesShed reads the mesh's counter; nil for the proxy.
	storesShed func() (int64, error)
}

func (h *localHop) endpoint() string { return h.url }
func (h *localHop) stop() error      { return h.stopFunc() }

func (h *localHop) usage() (hopReading, error) {
	if h.storesShed == nil {
		return hopReading{}, nil
	}
	n, err := h.storesShed()
	return hopReading{storesShed: n}, err
}

// counterValue is the value of the counter family name in g, summed over its series; 0
// when g has no such family.
func counterValue(g prometheus.Gatherer, name string) (int64, error) {
	families, err := g.Gather()
	if err != nil {
		return 0, fmt.Errorf("benchload: read the mesh's metrics: %w", err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		var sum float64
		for _, m := range f.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
		return int64(sum), nil
	}
	return 0, nil
}

// startProxy serves a bare reverse proxy to upstream on a free loopback port, with the
// connection pool the router's provider client has.
func startProxy(ctx context.Context, upstream string) (hop, error) {
	target, err := url.Parse("http://" + upstream)
	if err != nil {
		return nil, fmt.Errorf("benchload: proxy target: %w", err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second}
	// Pooled copy buffers, as production Go proxies keep them: without a pool every
	// request allocates and clears 32 KiB for the copy of its answer, four fifths of all
	// the proxy allocates, which raised the floor every mode is compared with.
	rp.BufferPool = &copyBuffers{}
	l, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("benchload: proxy: %w", err)
	}
	// Full duplex: an upstream that answers before the proxy's transport has finished with
	// the request body (the transport reads it once more after the declared length) would
	// otherwise find it closed by the response's headers, and the transport would drop the
	// connection with the streamed answer half copied.
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).EnableFullDuplex()
		rp.ServeHTTP(w, r)
	})
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l) // returns when Close is called
	}()
	return &localHop{url: "http://" + l.Addr().String() + "/v1/chat/completions", stopFunc: func() error {
		err := srv.Close()
		<-done
		return err
	}}, nil
}

// copyBuffers is the proxy's httputil.BufferPool. It pools arrays, not slices: putting a
// slice back would allocate its header each time, and the floor should allocate nothing
// it need not.
type copyBuffers struct{ pool sync.Pool }

type copyBuffer = [32 << 10]byte

func (b *copyBuffers) Get() []byte {
	if p, ok := b.pool.Get().(*copyBuffer); ok {
		return p[:]
	}
	return new(copyBuffer)[:]
}

func (b *copyBuffers) Put(buf []byte) {
	if len(buf) == len(copyBuffer{}) {
		b.pool.Put((*copyBuffer)(buf))
	}
}

// The protocol between the benchmark and a hop in a process of its own (ServeHop): the
// hop writes one hopReady line when it serves; then each "usage" line the benchmark
// writes is answered with a hopUsage line, and the end of its input stops the hop.
type hopReady struct {
	URL string `json:"url"`
}

type hopUsage struct {
	CPUNanos   int64   `json:"cpu_ns"`
	MaxRSSMiB  float64 `json:"max_rss_mib"`
	Switches   int64   `json:"switches"`
	StoresShed int64   `json:"stores_shed"`
	GOMAXPROCS int     `json:"gomaxprocs"`
}

// ServeHop runs mode's hop in this process for a benchmark in another one (see
// Config.HopCommand), speaking the protocol above on in and out, until in ends; a mesh
// starts from base (Config.Mesh).
func ServeHop(ctx context.Context, mode Mode, upstreamAddr string, base mesh.Config, in io.Reader, out io.Writer, logOut io.Writer) (err error) {
	if mode == Direct {
		return errors.New("benchload: the direct mode has no hop")
	}
	h, err := startHop(ctx, mode, upstreamAddr, base, true, logOut)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, h.stop()) }()
	enc := json.NewEncoder(out)
	if err := enc.Encode(hopReady{URL: h.endpoint()}); err != nil {
		return fmt.Errorf("benchload: hop: %w", err)
	}
	// Nothing but the end of in stops the loop: the benchmark closes it, or kills this
	// process if it is itself stopped.
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		if sc.Text() != "usage" {
			return fmt.Errorf("benchload: hop: unknown request %q", sc.Text())
		}
		u := usage()
		r, err := h.usage()
		if err != nil {
			return err
		}
		if err := enc.Encode(hopUsage{CPUNanos: u.cpu.Nanoseconds(), MaxRSSMiB: u.maxRSSMiB, Switches: u.switches, StoresShed: r.storesShed, GOMAXPROCS: runtime.GOMAXPROCS(0)}); err != nil {
			return fmt.Errorf("benchload: hop: %w", err)
		}
	}
	return sc.Err()
}

// processHop is a hop in a process of its own, started from cmd and driven through its
// standard input and output.
type processHop struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	dec   *json.Decoder
	url   string
}

func startProcessHop(cmd *exec.Cmd) (hop, error) {
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("benchload: hop process: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("benchload: hop process: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("benchload: hop process: %w", err)
	}
	h := &processHop{cmd: cmd, stdin: stdin, dec: json.NewDecoder(stdout)}
	// A hop that never says it serves is killed, which ends the read below.
	wedged := time.AfterFunc(hopStartTimeout, func() { _ = cmd.Process.Kill() })
	defer wedged.Stop()
	var ready hopReady
	if err := h.dec.Decode(&ready); err != nil {
		return nil, errors.Join(fmt.Errorf("benchload: hop process did not start: %w", err), h.stop())
	}
	h.url = ready.URL
	return h, nil
}

func (h *processHop) endpoint() string { return h.url }

func (h *processHop) usage() (hopReading, error) {
	if _, err := io.WriteString(h.stdin, "usage\n"); err != nil {
		return hopReading{}, fmt.Errorf("benchload: hop process: %w", err)
	}
	var u hopUsage
	if err := h.dec.Decode(&u); err != nil {
		return hopReading{}, fmt.Errorf("benchload: hop process usage: %w", err)
	}
	return hopReading{
		rusage:     rusage{cpu: time.Duration(u.CPUNanos), maxRSSMiB: u.MaxRSSMiB, switches: u.Switches},
		storesShed: u.StoresShed,
		procs:      u.GOMAXPROCS,
	}, nil
}

// Bounds on a hop process that hangs: starting (a mesh starts in well under a second)
// and stopping (its graceful shutdown).
const (
	hopStartTimeout = time.Minute
	hopStopTimeout  = 30 * time.Second
)

// stop closes the hop's input, which ends it, and waits for it to exit; one that does
// not within hopStopTimeout is killed.
func (h *processHop) stop() error {
	_ = h.stdin.Close()
	exited := make(chan error, 1)
	go func() { exited <- h.cmd.Wait() }()
	var err error
	select {
	case err = <-exited:
	case <-time.After(hopStopTimeout):
		_ = h.cmd.Process.Kill()
		err = errors.Join(errors.New("did not stop in time; killed"), <-exited)
	}
	if err != nil {
		return fmt.Errorf("benchload: hop process: %w", err)
	}
	return nil
}
