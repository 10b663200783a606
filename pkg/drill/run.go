package drill

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mantle-mesh/mantle/pkg/drill/load"
	"github.com/mantle-mesh/mantle/pkg/sim"
)

// Sides of a run.
const (
	SideMantle = "mantle"
	SideNaive  = "naive"
)

// Options configure a run of one scenario.
type Options struct {
	Scenario *Scenario
	// TimeScale overrides the scenario's time scale when positive.
	TimeScale float64
	// Rate (requests per second of scenario time) and Duration (scenario time) override the
	// scenario's load when positive; a shorter duration cuts the scenario short.
	Rate     float64
	Duration time.Duration
	// Sides to run, in order; nil means both (mantle, then naive).
	Sides []string

	// MeshURL, when set, is the base URL (http://host:port) of a running mesh whose
	// OpenAI-compatible front door mantle's side calls, instead of a mesh the drill starts.
	// That mesh must route Route to models reached at the drill's simulator (SimAddr).
	MeshURL string
	// Route is the model name mantle's side asks for at MeshURL; default RouteName.
	Route string
	// APIKey is sent as a bearer token to MeshURL.
	APIKey string
	// NATSURL, with MeshURL, is where that mesh publishes events; breaker transitions are
	// read from it. Empty: no breaker history.
	NATSURL string
	// SimAddr is where the simulator listens; default 127.0.0.1:0 (any free port).
	SimAddr string
	// HTTPAddr is where the in-process mesh serves HTTP (the chat API, /metrics and the
	// /status page), so a person or a browser can watch it while mantle's side runs; empty
	// picks a free port.
	HTTPAddr string

	// MaxInFlight bounds each side's concurrent requests; 0 means load.DefaultMaxInFlight.
	MaxInFlight int
	// Buckets is the number of timeline buckets; 0 means 60.
	Buckets int
	// Progress receives a progress line while a side runs; nil for none. Inline rewrites
	// one line with carriage returns (for terminals); otherwise a line is written every
	// ProgressInterval.
	Progress         io.Writer
	ProgressInline   bool
	ProgressInterval time.Duration
	// Log receives the in-process mesh's and the simulator's logs; nil discards them.
	Log io.Writer
	// Requests, when set, receives a CSV header and then one line per request of each side
	// (scenario, side, index, due time and latency in scenario time, answered, correct,
	// ladder level, verified, failure, degradation reason), for analyses the report does
	// not make.
	Requests io.Writer
}

// plan is a run's fixed parameters, derived from the options.
type plan struct {
	s        *Scenario
	scale    float64
	sc       scaler
	rate     float64       // scenario requests per second
	duration time.Duration // scenario time
	requests int
	runID    string
	log      *slog.Logger

	avgPromptTokens, avgAnswerTokens float64
}

// Run runs the scenario on each side and returns the report. It returns an error only when
// a side could not run at all; what the requests came to is in the report.
func Run(ctx context.Context, opts Options) (*Report, error) {
	p, err := newPlan(opts)
	if err != nil {
		return nil, err
	}
	sides := opts.Sides
	if len(sides) == 0 {
		sides = []string{SideMantle, SideNaive}
	}
	buckets := opts.Buckets
	if buckets <= 0 {
		buckets = 60
	}
	s := p.s
	rep := &Report{
		Scenario: s.Name, Description: s.Description, Seed: s.Seed, TimeScale: p.scale,
		Rate: p.rate, DurationS: p.duration.Seconds(), BudgetMs: float64(s.Budget) / float64(time.Millisecond),
		Requests: p.requests, Target: "in-process mesh (--target=all)", StartedAt: time.Now(),
		BucketS: p.duration.Seconds() / float64(buckets),
	}
	if opts.MeshURL != "" {
		rep.Target = "mesh at " + opts.MeshURL
	}
	rep.Build = buildInfo()
	rep.Machine = Machine{CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0)}
	rep.Machine.LoadAverage[0] = loadAverage()
	if inc := s.Incident; inc != nil {
		start, end := inc.Start.Seconds(), inc.End.Seconds()
		rep.IncidentStartS, rep.IncidentEndS = &start, &end
	}
	if s.Tools != nil {
		rep.Target = "in-process mesh (--target=all), sessions through its HTTP door"
		return p.runToolStorm(ctx, opts, sides, rep)
	}
	if opts.Requests != nil {
		if _, err := io.WriteString(opts.Requests, requestsCSVHeader); err != nil {
			return nil, err
		}
	}
	for _, side := range sides {
		d, err := p.runSide(ctx, side, opts)
		if err != nil {
			return nil, err
		}
		if opts.Requests != nil {
			if err := p.writeRequestsCSV(opts.Requests, d); err != nil {
				return nil, err
			}
		}
		rep.Sides = append(rep.Sides, p.summarize(d, buckets))
	}
	if m := rep.Side(SideMantle); m != nil {
		rep.Checks = p.check(m)
	}
	rep.Machine.LoadAverage[1] = loadAverage()
	return rep, nil
}

func buildInfo() Build {
	b := Build{GoVersion: runtime.Version()}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.modified":
			b.Modified = s.Value == "true"
		}
	}
	return b
}

// loadAverage reads the 1-minute load average on Linux; 0 elsewhere.
func loadAverage() float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var v float64
	if _, err := fmt.Sscan(string(data), &v); err != nil {
		return 0
	}
	return v
}

func newPlan(opts Options) (*plan, error) {
	s := opts.Scenario
	if s == nil {
		return nil, errors.New("drill: no scenario")
	}
	p := &plan{s: s, scale: s.TimeScale, rate: s.Load.Rate, duration: s.Load.Duration}
	if opts.TimeScale > 0 {
		p.scale = opts.TimeScale
	}
	if opts.Rate > 0 {
		p.rate = opts.Rate
	}
	if opts.Duration > 0 {
		p.duration = opts.Duration
	}
	if !(p.scale > 0 && p.scale <= 10) {
		return nil, fmt.Errorf("drill: time scale must be in (0, 10], got %g", p.scale)
	}
	p.sc = scaler(p.scale)
	cfg := p.loadConfig(opts.MaxInFlight)
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("drill: %w", err)
	}
	p.requests = cfg.Requests()
	for _, side := range opts.Sides {
		if side != SideMantle && side != SideNaive {
			return nil, fmt.Errorf("drill: unknown side %q (want %s or %s)", side, SideMantle, SideNaive)
		}
	}
	var id [4]byte
	_, _ = rand.Read(id[:])
	p.runID = hex.EncodeToString(id[:])
	logOut := opts.Log
	if logOut == nil {
		logOut = io.Discard
	}
	p.log = slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var in, out float64
	for i := range p.requests {
		r := requestFor(s, i)
		in += float64(promptTokens(r))
		out += float64(answerTokens(r))
	}
	p.avgPromptTokens, p.avgAnswerTokens = in/float64(p.requests), out/float64(p.requests)
	return p, nil
}

// loadConfig is the generator's wall-clock schedule: the scenario's rate and duration
// compressed by the time scale.
func (p *plan) loadConfig(maxInFlight int) load.Config {
	return load.Config{Rate: p.rate / p.scale, Duration: p.sc.d(p.duration), MaxInFlight: maxInFlight}
}

// simConfig is the simulator both sides run against: every model's profile at the run's
// time scale, and the scenario's seed.
func (p *plan) simConfig() sim.ServerConfig {
	models := map[string]sim.Profile{}
	for _, m := range p.s.Models {
		prof := m.Profile
		prof.TimeScale = p.scale * orOne(prof.TimeScale)
		models[m.Name] = prof
	}
	return sim.ServerConfig{Models: models, Seed: p.s.Seed, Log: p.log}
}

func orOne(v float64) float64 {
	if v == 0 {
		return 1
	}
	return v
}

// runSide runs the load against one side with its own simulator, so each side's upstream
// counts are its own and both start from the same seed.
func (p *plan) runSide(ctx context.Context, side string, opts Options) (d sideData, err error) {
	addr := opts.SimAddr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	up, err := startUpstream(ctx, addr, p.log)
	if err != nil {
		return d, err
	}
	defer func() { err = errors.Join(err, up.close()) }()

	var c client
	var watch *breakerWatch
	switch side {
	case SideMantle:
		mc := &mantleClient{route: RouteName, runID: p.runID, http: &http.Client{Transport: newTransport()},
			timeout: 2*p.sc.d(p.s.Budget) + time.Second}
		if opts.MeshURL != "" {
			mc.url = strings.TrimRight(opts.MeshURL, "/") + "/v1/chat/completions"
			mc.apiKey = opts.APIKey
			if opts.Route != "" {
				mc.route = opts.Route
			}
			if opts.NATSURL != "" {
				var nc *nats.Conn
				if nc, err = nats.Connect(opts.NATSURL, nats.Name("mantle-drill")); err != nil {
					return d, fmt.Errorf("drill: events at %s: %w", opts.NATSURL, err)
				}
				defer nc.Close()
				if watch, err = watchBreakers(nc); err != nil {
					return d, err
				}
				// Registered after the connection's Close, so it runs before it.
				defer watch.stop(context.WithoutCancel(ctx))
			}
		} else {
			logOut := opts.Log
			if logOut == nil {
				logOut = io.Discard
			}
			var m *inProcessMesh
			cfg := p.s.MeshConfig(up.baseURL, p.scale)
			if opts.HTTPAddr != "" {
				cfg.Server.HTTPListenAddress = opts.HTTPAddr
			}
			if m, err = startMesh(ctx, cfg, logOut); err != nil {
				return d, err
			}
			defer func() { err = errors.Join(err, m.stop()) }()
			mc.url = m.url
			if opts.Progress != nil {
				fmt.Fprintf(opts.Progress, "status page while mantle's side runs: http://%s/status\n", m.proc.App.HTTPAddr())
			}
			if watch, err = watchBreakers(m.proc.Events.Conn()); err != nil {
				return d, err
			}
			// Registered after the mesh's stop, so it runs before it, while NATS is up.
			defer watch.stop(context.WithoutCancel(ctx))
		}
		c = mc
	case SideNaive:
		n := p.s.Naive
		c = newNaiveClient(up.baseURL, n.Model, p.runID, p.sc.d(n.Timeout), n.Retries, p.sc.d(n.RetryDelay))
	}

	d.name = side
	d.results = make([]result, p.requests)
	var prog progress
	stopProgress := p.showProgress(side, opts, &prog)
	up.arm(p.simConfig())
	d.start = time.Now()
	d.gen, err = load.Run(ctx, p.loadConfig(opts.MaxInFlight), func(ctx context.Context, i int, due time.Time) {
		prog.inFlight.Add(1)
		r := c.do(ctx, requestFor(p.s, i))
		r.latency = p.scenarioLatency(time.Since(due), r)
		r.due = due.Sub(d.start)
		d.results[i] = r
		prog.inFlight.Add(-1)
		if r.answered {
			prog.answered.Add(1)
		} else {
			prog.failed.Add(1)
		}
	}, func(i int, due time.Time) {
		d.results[i] = result{due: due.Sub(d.start), level: -1, failure: "shed"}
		prog.failed.Add(1)
	})
	d.wall = time.Since(d.start)
	stopProgress()
	if err != nil {
		return d, fmt.Errorf("drill: %s side: %w", side, err)
	}
	d.stats = up.stats()
	d.calls = up.log()
	if watch != nil {
		d.breakers = watch.stop(ctx).events
	}
	return d, nil
}

// progress counts a side's requests for the progress line.
type progress struct {
	inFlight, answered, failed atomic.Int64
}

// showProgress writes the progress line until the returned function is called.
func (p *plan) showProgress(side string, opts Options, prog *progress) (stop func()) {
	if opts.Progress == nil {
		return func() {}
	}
	interval := opts.ProgressInterval
	if interval <= 0 {
		interval = 250 * time.Millisecond
		if !opts.ProgressInline {
			interval = 10 * time.Second
		}
	}
	start := time.Now()
	total := p.sc.d(p.duration)
	line := func() string {
		elapsed := min(time.Since(start), total)
		return fmt.Sprintf("%-6s %s  t=%s/%s  answered %d  failed %d  in flight %d",
			side, p.s.Name, clockTime(time.Duration(float64(elapsed)/p.scale)), clockTime(p.duration),
			prog.answered.Load(), prog.failed.Load(), prog.inFlight.Load())
	}
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-done:
				if opts.ProgressInline {
					fmt.Fprintf(opts.Progress, "\r%s\033[K\n", line())
				} else {
					fmt.Fprintln(opts.Progress, line())
				}
				return
			case <-t.C:
				if opts.ProgressInline {
					fmt.Fprintf(opts.Progress, "\r%s\033[K", line())
				} else {
					fmt.Fprintln(opts.Progress, line())
				}
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

const requestsCSVHeader = "scenario,side,index,due_s,latency_ms,answered,correct,level,verified,failure,degradation,audit_trail\n"

// writeRequestsCSV writes one line per request of d; times are scenario time, except in
// mantle's audit trail, which keeps the wall-clock offsets the mesh recorded.
func (p *plan) writeRequestsCSV(w io.Writer, d sideData) error {
	var b strings.Builder
	for i, r := range d.results {
		fmt.Fprintf(&b, "%s,%s,%d,%.3f,%.1f,%t,%t,%d,%t,%s,%s,%s\n", p.s.Name, d.name, i,
			r.due.Seconds()/p.scale, float64(r.latency)/float64(time.Millisecond)/p.scale,
			r.answered, r.correct, r.level, r.verified, csvField(r.failure), csvField(r.reason), csvField(r.trail))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func csvField(s string) string {
	if strings.ContainsAny(s, ",\"\n") {
		return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
	}
	return s
}

// clockTime formats d as m:ss.
func clockTime(d time.Duration) string {
	d = d.Round(time.Second)
	return fmt.Sprintf("%d:%02d", int(d.Minutes()), int(d.Seconds())%60)
}
