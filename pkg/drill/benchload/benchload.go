// Package benchload measures what mantle adds to a request: it sends the same
// OpenAI-compatible request at fixed rates, bounded in time, to an instant upstream (the
// simulator with a zero profile: no latency, no failures), either directly or through a
// mesh, and reports latency percentiles, CPU seconds per 1000 requests and peak RSS.
//
// The load is open loop (see pkg/drill/load): request i is due at i/rate and its latency
// runs from that due time, so a mesh that falls behind shows it as latency instead of
// quietly sending less. The load generator and the upstream run in the calling process;
// the proxy or mesh in front of the upstream runs there too, or, with Config.HopCommand,
// in a process of its own (mantle bench-load does that by default), as it would in
// production: its garbage collector then does not pause the generator and its CPU and
// peak RSS are measured apart. Either way the cost of mantle is a mode's figures minus
// the direct mode's at the same rate, which cancels the generator's and the upstream's
// own cost. Peak RSS is a process lifetime high water mark, so each mode should run in a
// process of its own (mantle bench-load does).
package benchload

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os/exec"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health/grpc_health_v1"

	"github.com/mantle-mesh/mantle/pkg/drill/load"
	"github.com/mantle-mesh/mantle/pkg/httpbody"
	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/procusage"
	"github.com/mantle-mesh/mantle/pkg/sim"
	"github.com/mantle-mesh/mantle/services/quota"
	"github.com/mantle-mesh/mantle/services/router"
)

// Mode is what the requests go through.
type Mode string

// Modes.
const (
	// Direct sends requests straight to the upstream: the baseline.
	Direct Mode = "direct"
	// Proxy sends them through net/http/httputil's ReverseProxy and nothing else: the
	// floor of any Go HTTP gateway (one more HTTP server and client hop), against which
	// what mantle's own work adds can be told apart from what the hop itself costs on
	// this machine.
	Proxy Mode = "proxy"
	// RouterOnly runs the router alone (--target=router) with quota, cache and verifier
	// off: no admission, no cache, the answer checked by the router's own L1. It measures
	// the router's own path: routing, breaker and budget bookkeeping, the provider call,
	// idempotency, the L1 check, metrics.
	RouterOnly Mode = "router"
	// All runs every service in one process (--target=all) with quota, cache and verifier
	// on: the full path of a request.
	All Mode = "all"
)

// Modes lists the modes in the order they are compared.
func Modes() []Mode { return []Mode{Direct, Proxy, RouterOnly, All} }

// ModelName is the model (and route) the benchmark asks for.
const ModelName = "bench"

// Config is one benchmark.
type Config struct {
	Mode Mode
	// Rates are requests per second, run one after the other.
	Rates []float64
	// Duration is how long each rate runs; Warmup runs before each rate, at that rate, and
	// is not measured.
	Duration, Warmup time.Duration
	// MaxInFlight bounds concurrent requests; more are shed and counted.
	MaxInFlight int
	// SamePrompt sends the identical request every time. By default each request differs by
	// a number, so the cache cannot answer it and every request takes the whole path.
	SamePrompt bool
	// Temperature, when set, is sent with every request. Unset, like OpenAI SDKs' default
	// requests, it means the provider's default, which the cache policy treats as too high
	// to cache: the cache service is asked and declines. At 0 answers are cacheable, so the
	// full mesh looks every prompt up in the cache and stores every answer.
	Temperature *float64
	// Stream asks for every answer as a server-sent event stream ("stream": true). A
	// request's latency then runs to the stream's end, and its first-event latency to the
	// first event; a stream that does not end with [DONE], or carries an error event, is
	// an error.
	Stream bool
	// Log receives the mesh's errors; nil discards them.
	Log io.Writer
	// HopCommand, when set, runs the proxy or the mesh in a process of its own: the
	// command it returns must call ServeHop with mode and upstreamAddr. Its CPU and peak
	// RSS are then reported apart (Result.HopCPUPer1000, HopPeakRSSMB), and its garbage
	// collector and scheduler are not the load generator's. Nil runs it in this process.
	HopCommand func(ctx context.Context, mode Mode, upstreamAddr string) *exec.Cmd
	// Mesh is the configuration the router and all modes start from (MeshConfig); nil is
	// mesh.Default(). A HopCommand's process is not given it: its command must carry it.
	Mesh *mesh.Config
}

// Result is one window of one mode at one rate.
type Result struct {
	Mode Mode    `json:"mode"`
	Rate float64 `json:"rate"`
	// Round is the window's round when Compare measured every rate more than once (1,
	// 2, ...); 0 otherwise.
	Round    int `json:"round,omitempty"`
	Requests int `json:"requests"`
	OK       int `json:"ok"`
	Errors   int `json:"errors"`
	Shed     int `json:"shed"`
	// Refused are requests the mesh answered with 503 OVERLOADED (router.overload): counted
	// apart from errors, and left out of the latency percentiles as errors are.
	Refused      int     `json:"refused"`
	AchievedRate float64 `json:"achieved_rate"`
	// AnsweredRate is requests answered (OK) per second: what AchievedRate sent less the
	// errors and refusals.
	AnsweredRate float64 `json:"answered_rate"`
	P50Ms        float64 `json:"p50_ms"`
	P90Ms        float64 `json:"p90_ms"`
	P99Ms        float64 `json:"p99_ms"`
	MaxMs        float64 `json:"max_ms"`
	// CPUPer1000 is user plus system CPU seconds of the whole process per 1000 requests.
	CPUPer1000 float64 `json:"cpu_s_per_1000"`
	// PeakRSSMB is the process's peak resident set so far, in MiB: with Compare, that of
	// the one process that loads every mode.
	PeakRSSMB float64 `json:"peak_rss_mib"`
	// HopCPUPer1000 and HopPeakRSSMB are the proxy's or the mesh's own process's, when it
	// runs in one (Config.HopCommand); CPUPer1000 then counts both processes.
	HopCPUPer1000 float64 `json:"hop_cpu_s_per_1000,omitempty"`
	HopPeakRSSMB  float64 `json:"hop_peak_rss_mib,omitempty"`
	// HopGOMAXPROCS is the processors the hop's own process schedules goroutines on.
	HopGOMAXPROCS int `json:"hop_gomaxprocs,omitempty"`
	// HopSwitchesPerRequest is how many times the hop's threads gave up a CPU (waiting or
	// preempted) per request: at low rates, where every request wakes an idle process,
	// about how many wake-ups a request costs.
	HopSwitchesPerRequest float64 `json:"hop_switches_per_request,omitempty"`
	// OwnP50Ms, OwnP90Ms and OwnP99Ms are percentiles of the mesh's own time per answered
	// request, as its Server-Timing header reports it (mantle;dur): from its handler's
	// start (reading the body included) to the answer's headers, measured inside the
	// process, so without the kernel, the HTTP server's parsing and the waits for a CPU
	// before the handler runs. Zero for the modes that send no such header.
	OwnP50Ms float64 `json:"own_p50_ms,omitempty"`
	OwnP90Ms float64 `json:"own_p90_ms,omitempty"`
	OwnP99Ms float64 `json:"own_p99_ms,omitempty"`
	// FirstP50Ms and FirstP99Ms are percentiles of the time from a streamed request's due
	// time to its first event (Config.Stream); zero without streaming.
	FirstP50Ms float64 `json:"first_event_p50_ms,omitempty"`
	FirstP99Ms float64 `json:"first_event_p99_ms,omitempty"`
	// StoresShed is how many cacheable answers the router did not store in the measured
	// window because router.max_async_cache_stores stores were already in flight
	// (mantle_router_cache_stores_shed_total): a run that sheds stores measures a cache
	// that fills more slowly than requests ask.
	StoresShed int `json:"stores_shed,omitempty"`
	// MaxLagMs is how far the generator fell behind its schedule.
	MaxLagMs float64 `json:"generator_max_lag_ms"`
	// FirstError is one error, to say what went wrong when Errors > 0.
	FirstError string `json:"first_error,omitempty"`
}

// Run benchmarks cfg.Mode at each rate and returns one result per rate.
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	return Compare(ctx, cfg, []Mode{cfg.Mode}, 1)
}

// Compare benchmarks modes side by side (cfg.Mode is not read): at each rate, rounds
// times, one window of every mode in turn, in reverse order every other round, so that
// no mode always follows the same one. Every mode's load comes from this process, against
// one upstream, each mode with a hop (and a connection pool) of its own, started before
// the first window and kept until the last. It returns one result per mode, rate and
// round, grouped by mode in the order given, with Round set when rounds > 1.
//
// A machine whose speed drifts over minutes (a shared virtual machine) moves a mode's
// CPU per request by a quarter from one window to the next; windows of the modes next to
// each other, and the median of their ratios over rounds, compare the modes better than
// each mode measured after the other.
func Compare(ctx context.Context, cfg Config, modes []Mode, rounds int) (_ []Result, err error) {
	if len(cfg.Rates) == 0 || cfg.Duration <= 0 || cfg.Warmup < 0 || len(modes) == 0 || rounds < 1 {
		return nil, errors.New("benchload: want at least one mode and one rate, a positive duration and rounds, and a non-negative warmup")
	}
	logOut := cfg.Log
	if logOut == nil {
		logOut = io.Discard
	}
	log := slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: slog.LevelError}))

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	upstreamAddr, waitUpstream, err := sim.Start(ctx, "127.0.0.1:0", sim.NewServer(sim.ServerConfig{Log: log}), log)
	if err != nil {
		return nil, err
	}
	defer func() { cancel(); _ = waitUpstream() }()
	var targets []*target
	defer func() {
		for _, t := range targets {
			err = errors.Join(err, t.stop())
		}
	}()
	for _, mode := range modes {
		t, err := startTarget(ctx, cfg, mode, upstreamAddr, logOut)
		if err != nil {
			return nil, err
		}
		targets = append(targets, t)
	}

	byMode := make([][]Result, len(modes))
	for _, rate := range cfg.Rates {
		for round := range rounds {
			for k := range targets {
				i := turn(k, len(targets), round)
				res, err := targets[i].window(ctx, cfg, rate)
				if err != nil {
					return nil, fmt.Errorf("benchload: %s at %g/s: %w", modes[i], rate, err)
				}
				if rounds > 1 {
					res.Round = round + 1
				}
				byMode[i] = append(byMode[i], res)
			}
		}
	}
	return slices.Concat(byMode...), nil
}

// turn is which of n modes takes the k-th window of a round (both from 0): the modes in
// their order in even rounds and in reverse in odd ones, so that no mode always follows
// the same one.
func turn(k, n, round int) int {
	if round%2 == 1 {
		return n - 1 - k
	}
	return k
}

// target is one mode set up for Compare: its hop (nil for the direct mode), the endpoint
// its load goes to and the client that sends it, and the number of the next request.
type target struct {
	mode     Mode
	h        hop
	endpoint string
	client   *http.Client
	seq      int
}

func startTarget(ctx context.Context, cfg Config, mode Mode, upstreamAddr string, logOut io.Writer) (*target, error) {
	t := &target{mode: mode, endpoint: "http://" + upstreamAddr + "/v1/chat/completions",
		client: &http.Client{Transport: &http.Transport{MaxIdleConns: 8192, MaxIdleConnsPerHost: 8192, IdleConnTimeout: time.Minute}}}
	if mode == Direct {
		return t, nil
	}
	var err error
	if cfg.HopCommand != nil {
		t.h, err = startProcessHop(cfg.HopCommand(ctx, mode, upstreamAddr))
	} else {
		base := mesh.Default()
		if cfg.Mesh != nil {
			base = *cfg.Mesh
		}
		t.h, err = startHop(ctx, mode, upstreamAddr, base, false, logOut)
	}
	if err != nil {
		return nil, err
	}
	t.endpoint = t.h.endpoint()
	return t, nil
}

// stop stops the target's hop and lets its idle connections go.
func (t *target) stop() error {
	t.client.CloseIdleConnections()
	if t.h == nil {
		return nil
	}
	return t.h.stop()
}

// window runs cfg.Warmup, then measures cfg.Duration, at rate.
func (t *target) window(ctx context.Context, cfg Config, rate float64) (Result, error) {
	if cfg.Warmup > 0 {
		if _, err := step(ctx, t.client, t.endpoint, cfg, rate, cfg.Warmup, &t.seq); err != nil {
			return Result{}, err
		}
	}
	before, hopBefore, err := usages(t.h)
	if err != nil {
		return Result{}, err
	}
	res, err := step(ctx, t.client, t.endpoint, cfg, rate, cfg.Duration, &t.seq)
	if err != nil {
		return Result{}, err
	}
	after, hopAfter, err := usages(t.h)
	if err != nil {
		return Result{}, err
	}
	per1000 := func(cpu time.Duration) float64 { return cpu.Seconds() / float64(max(res.Requests, 1)) * 1000 }
	res.Mode = t.mode
	res.CPUPer1000 = per1000(after.cpu - before.cpu + hopAfter.cpu - hopBefore.cpu)
	res.PeakRSSMB = after.maxRSSMiB
	if cfg.HopCommand != nil && t.h != nil {
		res.HopCPUPer1000 = per1000(hopAfter.cpu - hopBefore.cpu)
		res.HopPeakRSSMB = hopAfter.maxRSSMiB
		res.HopGOMAXPROCS = hopAfter.procs
		res.HopSwitchesPerRequest = float64(hopAfter.switches-hopBefore.switches) / float64(max(res.Requests, 1))
	}
	res.StoresShed = int(hopAfter.storesShed - hopBefore.storesShed)
	return res, nil
}

// usages reads this process's usage and h's: its process's (zero without a hop, or one in
// this process) and its mesh's counters.
func usages(h hop) (self rusage, ofHop hopReading, err error) {
	self = usage()
	if h != nil {
		ofHop, err = h.usage()
	}
	return self, ofHop, err
}

// MeshConfig is the configuration mode's mesh runs with: cfg (mesh.Default() unless the
// benchmark was given one) with what the benchmark needs in place of its own. It calls
// the instant upstream at upstream as its one provider and model (the file's providers,
// models and routes go, and with them the LLM judge, which would need a route); it listens
// on loopback ports of its own without TLS or authentication (the load carries no key);
// no tenant limit refuses the load; it logs errors only; and the router alone calls no
// other service, while the whole mesh runs every module in its process. The rest (cache,
// verifier, quota, overload, runtime, events) is cfg's.
func MeshConfig(mode Mode, upstream string, cfg mesh.Config) (mesh.Config, error) {
	defaults := mesh.Default()
	cfg.Server.GRPCListenAddress = "127.0.0.1:0"
	cfg.Server.HTTPListenAddress = "127.0.0.1:0"
	cfg.TLS = defaults.TLS
	cfg.Auth = defaults.Auth
	cfg.Log = mesh.LogConfig{Level: "error", Format: "text"}
	// Tenant limits are not what is measured.
	cfg.Quota.DefaultLimits = quota.RateLimits{RPM: 1_000_000_000, TPM: 1_000_000_000_000}
	cfg.Quota.Tenants, cfg.Quota.ModelLimits, cfg.Quota.Budgets.Tenants = defaults.Quota.Tenants, defaults.Quota.ModelLimits, defaults.Quota.Budgets.Tenants
	r := &cfg.Router
	switch mode {
	case All:
		cfg.Target = "all"
		r.QuotaAddress, r.CacheAddress, r.VerifierAddress, r.AgentAddress = defaults.Router.QuotaAddress, defaults.Router.CacheAddress, defaults.Router.VerifierAddress, defaults.Router.AgentAddress
	case RouterOnly:
		cfg.Target = "router"
		r.QuotaAddress, r.CacheAddress, r.VerifierAddress, r.AgentAddress = router.Off, router.Off, router.Off, router.Off
	default:
		return cfg, fmt.Errorf("benchload: mode %q runs no mesh", mode)
	}
	r.Providers = []router.ProviderConfig{{
		Name: "upstream", Type: router.ProviderOpenAI, BaseURL: upstream,
		Keys: []router.KeyConfig{{ID: "bench", Env: benchKeyEnv}}, Timeout: 10 * time.Second,
	}}
	r.Models = []router.ModelConfig{{Name: ModelName, Provider: "upstream", InputPricePerMillion: 1, OutputPricePerMillion: 2}}
	r.Routes = nil
	cfg.Verifier.L3.Judge.Enabled = false
	return cfg, nil
}

// step runs one rate for d and measures it.
func step(ctx context.Context, c *http.Client, url string, cfg Config, rate float64, d time.Duration, seq *int) (Result, error) {
	lc := load.Config{Rate: rate, Duration: d, MaxInFlight: cfg.MaxInFlight}
	if err := lc.Validate(); err != nil {
		return Result{}, fmt.Errorf("benchload: %w", err)
	}
	n := lc.Requests()
	lat := make([]time.Duration, n)
	own := make([]time.Duration, n) // -1: no Server-Timing
	firstEvent := make([]time.Duration, n)
	errs := make([]error, n)
	first := *seq
	*seq += n
	st, err := load.Run(ctx, lc, func(ctx context.Context, i int, due time.Time) {
		var at time.Time
		own[i], at, errs[i] = send(ctx, c, url, body(cfg, first+i))
		lat[i] = time.Since(due)
		firstEvent[i] = at.Sub(due)
	}, func(i int, _ time.Time) {
		errs[i] = errShed
	})
	if err != nil {
		return Result{}, err
	}
	res := Result{Rate: rate, Requests: n, Shed: st.Shed, MaxLagMs: ms(st.MaxLag),
		AchievedRate: float64(st.Started) / st.Elapsed.Seconds()}
	ok, ownOK, firstOK := lat[:0], own[:0], firstEvent[:0]
	for i, e := range errs {
		switch {
		case e == nil:
			res.OK++
			if own[i] >= 0 {
				ownOK = append(ownOK, own[i])
			}
			ok = append(ok, lat[i])
			if cfg.Stream {
				firstOK = append(firstOK, firstEvent[i])
			}
		case errors.Is(e, errRefused):
			res.Refused++
		case !errors.Is(e, errShed):
			res.Errors++
			if res.FirstError == "" {
				res.FirstError = e.Error()
			}
		}
	}
	res.AnsweredRate = float64(res.OK) / st.Elapsed.Seconds()
	pc := load.Summarize(ok)
	res.P50Ms, res.P90Ms, res.P99Ms, res.MaxMs = ms(pc.P50), ms(pc.P90), ms(pc.P99), ms(pc.Max)
	if len(ownOK) > 0 {
		pc := load.Summarize(ownOK)
		res.OwnP50Ms, res.OwnP90Ms, res.OwnP99Ms = ms(pc.P50), ms(pc.P90), ms(pc.P99)
	}
	if len(firstOK) > 0 {
		pc := load.Summarize(firstOK)
		res.FirstP50Ms, res.FirstP99Ms = ms(pc.P50), ms(pc.P99)
	}
	return res, nil
}

var (
	errShed    = errors.New("shed")
	errRefused = errors.New("refused: overloaded")
)

func body(cfg Config, i int) []byte {
	prompt := "How long does a parcel to Lisbon take?"
	if !cfg.SamePrompt {
		prompt = fmt.Sprintf("Benchmark request %d: how long does a parcel to Lisbon take?", i)
	}
	b := fmt.Appendf(nil, `{"model":%q`, ModelName)
	if cfg.Temperature != nil {
		b = fmt.Appendf(b, `,"temperature":%g`, *cfg.Temperature)
	}
	if cfg.Stream {
		b = append(b, `,"stream":true`...)
	}
	return fmt.Appendf(b, `,"messages":[{"role":"user","content":%q}]}`, prompt)
}

// send posts payload and returns the mesh's own time from the answer's Server-Timing
// header (-1 without one) and when the answer's first event arrived (for a stream).
func send(ctx context.Context, c *http.Client, url string, payload []byte) (own time.Duration, firstEvent time.Time, _ error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(payload))
	if err != nil {
		return -1, time.Time{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return -1, time.Time{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		own := serverTiming(resp.Header.Get(router.HeaderServerTiming), "mantle")
		if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			first, err := readStream(resp.Body)
			return own, first, err
		}
		// The answer is read to the end (so the connection is reused) but not kept: the
		// generator's own allocations would load the machine it measures.
		_, err := io.Copy(io.Discard, resp.Body)
		return own, time.Time{}, err
	}
	data, err := httpbody.Response(resp, 1<<20)
	if err != nil {
		return -1, time.Time{}, err
	}
	var e struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	_ = json.Unmarshal(data, &e)
	if resp.StatusCode == http.StatusServiceUnavailable && e.Error.Code == "overloaded" {
		return -1, time.Time{}, errRefused
	}
	return -1, time.Time{}, fmt.Errorf("HTTP %d %s: %s", resp.StatusCode, e.Error.Code, e.Error.Message)
}

// readStream reads a server-sent event stream of chat chunks to its end and returns when
// its first event arrived. A stream is complete when its last event is [DONE] and none
// carried an error.
func readStream(r io.Reader) (first time.Time, _ error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	done := false
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:"))
		if !ok {
			continue
		}
		if first.IsZero() {
			first = time.Now()
		}
		data = bytes.TrimSpace(data)
		switch {
		case bytes.Equal(data, []byte("[DONE]")):
			done = true
		case bytes.HasPrefix(data, []byte(`{"error"`)):
			return first, fmt.Errorf("stream error event: %.200s", data)
		default:
			done = false // an event after [DONE] reopens nothing: the stream is malformed
		}
	}
	if err := sc.Err(); err != nil {
		return first, fmt.Errorf("reading the stream: %w", err)
	}
	if !done {
		return first, errors.New("the stream ended without [DONE]")
	}
	return first, nil
}

// serverTiming is the dur of metric name in a Server-Timing header value (W3C: metrics
// separated by commas, parameters by semicolons, dur in milliseconds), or -1.
func serverTiming(header, name string) time.Duration {
	for metric := range strings.SplitSeq(header, ",") {
		metricName, params, _ := strings.Cut(metric, ";")
		if strings.TrimSpace(metricName) != name {
			continue
		}
		for p := range strings.SplitSeq(params, ";") {
			v, ok := strings.CutPrefix(strings.TrimSpace(p), "dur=")
			if !ok {
				continue
			}
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || !(f >= 0) || math.IsInf(f, 0) { // NaN fails f >= 0
				return -1
			}
			return time.Duration(f * float64(time.Millisecond))
		}
	}
	return -1
}

// waitServing blocks until the gRPC health check at addr says SERVING; WaitForReady queues
// the check until the server accepts connections, so nothing polls.
func waitServing(ctx context.Context, addr string) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("benchload: dial mesh: %w", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := grpc_health_v1.NewHealthClient(conn).Check(ctx, &grpc_health_v1.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("benchload: mesh health: %w", err)
	}
	if res.Status != grpc_health_v1.HealthCheckResponse_SERVING {
		return fmt.Errorf("benchload: mesh health: %s", res.Status)
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// rusage is the process's resource use so far (see usage).
type rusage struct {
	cpu       time.Duration
	maxRSSMiB float64
	switches  int64 // threads' context switches
}

// usage returns this process's CPU time so far, its peak resident set and its context
// switches; each reads as zero where it is not measured.
func usage() rusage {
	cpu, _ := procusage.CPU()
	peak, _ := procusage.PeakRSS()
	switches, _ := procusage.Switches()
	return rusage{cpu: cpu, maxRSSMiB: float64(peak) / (1 << 20), switches: switches}
}

// benchKeyEnv names the variable of the benchmark provider's key; the hop sets it.
const benchKeyEnv = "MANTLE_BENCH_KEY"

// Replaced names the settings of cfg that MeshConfig replaces for mode although cfg set
// them (they differ from mesh.Default()), as YAML paths ("router.providers", "auth.tenants"):
// what a configuration file given to the benchmark does not get to say, to be told rather
// than dropped in silence. Listeners and logging, which every file sets its own way, are
// left out.
func Replaced(mode Mode, cfg mesh.Config) ([]string, error) {
	out, err := MeshConfig(mode, "http://upstream/v1", cfg)
	if err != nil {
		return nil, err
	}
	var names []string
	var walk func(prefix string, user, def, got reflect.Value)
	walk = func(prefix string, user, def, got reflect.Value) {
		if user.Kind() == reflect.Struct && user.Type() != reflect.TypeFor[time.Time]() {
			for i := range user.NumField() {
				f := user.Type().Field(i)
				name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
				if !f.IsExported() || name == "" || name == "-" {
					continue
				}
				walk(prefix+name+".", user.Field(i), def.Field(i), got.Field(i))
			}
			return
		}
		if !reflect.DeepEqual(user.Interface(), def.Interface()) && !reflect.DeepEqual(user.Interface(), got.Interface()) {
			names = append(names, strings.TrimSuffix(prefix, "."))
		}
	}
	walk("", reflect.ValueOf(cfg), reflect.ValueOf(mesh.Default()), reflect.ValueOf(out))
	return slices.DeleteFunc(names, func(n string) bool {
		return strings.HasPrefix(n, "server.") || strings.HasPrefix(n, "log.")
	}), nil
}
