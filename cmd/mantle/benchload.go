//go:build !nolab

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mantle-mesh/mantle/pkg/drill/benchload"
	"github.com/mantle-mesh/mantle/pkg/mesh"
)

// benchLoadName is the command's name in main.go's table; the parent re-runs the binary
// with it to measure each mode in a process of its own.
const benchLoadName = "bench-load"

// benchLoadFlags are the flags of `mantle bench-load`.
type benchLoadFlags struct {
	modes                            []benchload.Mode
	rates, temperature, format       string
	duration, warmup                 time.Duration
	maxInFlight                      int
	hopProcs                         int
	rounds                           int
	samePrompt, stream               bool
	cpuProfile, traceOut, memProfile string
	inProcess, split                 bool
	child, serveHop                  bool // internal: see the flags
	upstream                         string
	configFile                       string
	cfg                              benchload.Config // from the flags above
}

// benchLoad is `mantle bench-load`: the overhead and throughput benchmark.
func benchLoad(ctx context.Context, args []string, env cmdEnv) error {
	f, err := parseBenchLoadFlags(args, env.stderr)
	if err != nil {
		return err
	}
	return runBenchLoad(ctx, f, env)
}

// parseBenchLoadFlags parses and checks bench-load's command line.
func parseBenchLoadFlags(args []string, stderr io.Writer) (benchLoadFlags, error) {
	var f benchLoadFlags
	fs := flag.NewFlagSet(benchLoadName, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: mantle bench-load [flags]

Sends the same OpenAI-compatible request at fixed rates, each for a fixed time, to an
instant upstream: directly, through a bare reverse proxy, through the router alone, and
through the whole mesh. Reports latency percentiles of the answered requests, what each
mode adds to them, CPU seconds per 1000 requests and peak RSS; "refused" counts the
mesh's 503 OVERLOADED answers, "shed" the requests over --max-in-flight; "own" are
percentiles of the mesh's own time per answer, from its Server-Timing header;
"stores shed" the answers the router did not store because router.max_async_cache_stores
stores were already in flight.
Each mode runs in a process of its own so that its CPU and memory figures are its own.
With --rounds N, each rate is measured N times, the modes taking turns within each round
(their load then comes from one process, whose profiles and trace are named "load"), and
the table ends with each mode's medians over the rounds and the median of its per-round
ratio to the proxy's CPU.

`)
		printFlags(fs)
	}
	modes := fs.String("modes", "direct,proxy,router,all", "modes to run: direct, proxy (a bare reverse proxy, the floor of any HTTP hop), router (the router alone) and all (the whole mesh)")
	fs.StringVar(&f.rates, "rates", "500,1000,2000,4000", "requests per second, each run in turn")
	fs.DurationVar(&f.duration, "duration", 10*time.Second, "how long each rate runs")
	fs.DurationVar(&f.warmup, "warmup", 2*time.Second, "unmeasured load at each rate before it is measured")
	fs.IntVar(&f.rounds, "rounds", 1, "how many times each rate is measured; above 1 the modes take turns, one window each per round (in reverse order every other round), so that a machine whose speed drifts moves them alike")
	fs.IntVar(&f.maxInFlight, "max-in-flight", 5000, "most concurrent requests; more are shed and counted (each holds a few file descriptors)")
	fs.BoolVar(&f.samePrompt, "same-prompt", false, "send the identical request every time (the cache then answers all but the first)")
	fs.BoolVar(&f.stream, "stream", false, "ask for streamed answers (server-sent events): latency runs to the stream's end, first-event percentiles are reported too, own time is not (streams carry no Server-Timing header)")
	fs.StringVar(&f.temperature, "temperature", "", "temperature of every request; unset (the SDK default) the cache declines to cache, 0 makes every answer cacheable")
	fs.StringVar(&f.format, "format", "text", "output: text or json")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile of each mode to <this>.<mode>.pprof")
	fs.StringVar(&f.traceOut, "trace", "", "write an execution trace of each mode to <this>.<mode>.trace (go tool trace; -pprof=sched shows waits for a CPU)")
	fs.StringVar(&f.memProfile, "memprofile", "", "write an allocation profile of each mode to <this>.<mode>.pprof (go tool pprof -sample_index=alloc_space)")
	fs.BoolVar(&f.inProcess, "in-process", false, "run every mode in this process (CPU and RSS figures then mix; with --split the proxy or mesh still gets a process of its own)")
	fs.IntVar(&f.hopProcs, "hop-gomaxprocs", 0, "GOMAXPROCS of the proxy's or mesh's own process (with --split): 1 measures a replica given one CPU, as Go sets it in a container limited to one; 0 leaves Go's default (reported as hop_gomaxprocs in JSON)")
	fs.BoolVar(&f.split, "split", true, "run the proxy or the mesh in a process of its own, apart from the load generator and the upstream; false puts all three in one")
	fs.StringVar(&f.configFile, "config.file", "", "YAML the router and all modes start from, as mantle serve reads it (default: the built-in defaults); its cache, verifier, quota, overload and runtime settings are measured, while the providers, models, routes, listeners, TLS, authentication, tenant limits and LLM judge are bench-load's (docs/performance.md)")
	fs.BoolVar(&f.child, "child", false, "internal: run the modes and print their results as JSON")
	fs.BoolVar(&f.serveHop, "serve-hop", false, "internal: serve one mode's proxy or mesh for a benchmark in another process")
	fs.StringVar(&f.upstream, "upstream", "", "internal: with --serve-hop, the upstream's host:port")
	if err := parseFlags(fs, args); err != nil {
		return f, err
	}
	if fs.NArg() > 0 {
		return f, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if f.hopProcs < 0 || (f.hopProcs > 0 && !f.split) {
		return f, fmt.Errorf("--hop-gomaxprocs: want 0 or, with --split, a positive number, got %d", f.hopProcs)
	}
	if f.rounds < 1 {
		return f, fmt.Errorf("--rounds: want 1 or more, got %d", f.rounds)
	}
	if f.format != "text" && f.format != "json" {
		return f, fmt.Errorf("--format: want text or json, got %q", f.format)
	}
	f.cfg = benchload.Config{Duration: f.duration, Warmup: f.warmup, MaxInFlight: f.maxInFlight, SamePrompt: f.samePrompt, Stream: f.stream}
	if f.configFile != "" {
		// Read now, so that a bad file fails before any load runs.
		mc, err := mesh.LoadFile(f.configFile)
		if err != nil {
			return f, err
		}
		f.cfg.Mesh = &mc
	}
	if f.temperature != "" {
		v, err := strconv.ParseFloat(f.temperature, 64)
		if err != nil || v < 0 || v > 2 {
			return f, fmt.Errorf("--temperature: want a number in [0, 2], got %q", f.temperature)
		}
		f.cfg.Temperature = &v
	}
	for _, r := range strings.Split(f.rates, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(r), 64)
		if err != nil || v <= 0 {
			return f, fmt.Errorf("--rates: %q is not a positive number", r)
		}
		f.cfg.Rates = append(f.cfg.Rates, v)
	}
	for _, m := range strings.Split(*modes, ",") {
		mode := benchload.Mode(strings.TrimSpace(m))
		if !slices.Contains(benchload.Modes(), mode) {
			return f, fmt.Errorf("--modes: unknown mode %q (want direct, proxy, router or all)", m)
		}
		f.modes = append(f.modes, mode)
	}
	return f, nil
}

// runBenchLoad does what f asks: serve one mode's hop (--serve-hop), run one mode and
// print its results as JSON (--child), or run every mode and print the table.
func runBenchLoad(ctx context.Context, f benchLoadFlags, env cmdEnv) error {
	stdout, stderr := env.stdout, env.stderr
	if f.serveHop {
		if len(f.modes) != 1 {
			return errors.New("--serve-hop serves exactly one mode")
		}
		if f.hopProcs > 0 {
			runtime.GOMAXPROCS(f.hopProcs)
		}
		base := mesh.Default()
		if f.cfg.Mesh != nil {
			base = *f.cfg.Mesh
		}
		return f.profiled(f.modes[0], func() error {
			return benchload.ServeHop(ctx, f.modes[0], f.upstream, base, os.Stdin, stdout, stderr)
		})
	}
	if f.child {
		res, err := f.runModes(ctx, f.modes, stderr)
		if err != nil {
			return err
		}
		return json.NewEncoder(stdout).Encode(res)
	}

	if err := f.tellReplaced(stderr); err != nil {
		return err
	}
	// One run per mode, or with rounds one for all, the modes taking turns.
	var runs [][]benchload.Mode
	if f.rounds > 1 {
		runs = append(runs, f.modes)
	} else {
		for _, mode := range f.modes {
			runs = append(runs, []benchload.Mode{mode})
		}
	}
	var all []benchload.Result
	for _, modes := range runs {
		names := modeNames(modes)
		fmt.Fprintf(stderr, "bench-load: %s at %s/s, %s each, %d round(s)...\n", names, f.rates, f.duration, f.rounds)
		var res []benchload.Result
		var err error
		if f.inProcess {
			res, err = f.runModes(ctx, modes, stderr)
		} else {
			res, err = runChild(ctx, names, f.childFlags(), stderr)
		}
		if err != nil {
			return fmt.Errorf("mode %s: %w", names, err)
		}
		all = append(all, res...)
	}
	if f.format == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(all)
	}
	return writeBenchTable(stdout, all)
}

// tellReplaced names the settings of --config.file that the benchmark replaces, per mode
// that runs a mesh, so that none of them is dropped without a word.
func (f benchLoadFlags) tellReplaced(stderr io.Writer) error {
	if f.cfg.Mesh == nil {
		return nil
	}
	for _, mode := range f.modes {
		if mode != benchload.RouterOnly && mode != benchload.All {
			continue
		}
		names, err := benchload.Replaced(mode, *f.cfg.Mesh)
		if err != nil {
			return err
		}
		if len(names) > 0 {
			fmt.Fprintf(stderr, "bench-load: %s mode: the benchmark replaces %s from %s\n", mode, strings.Join(names, ", "), f.configFile)
		}
	}
	return nil
}

// childFlags are the flags a child process that runs modes gets from f.
func (f benchLoadFlags) childFlags() []string {
	return []string{
		"--rates", f.rates, "--duration", f.duration.String(), "--warmup", f.warmup.String(), "--rounds", strconv.Itoa(f.rounds),
		"--max-in-flight", strconv.Itoa(f.maxInFlight), "--same-prompt=" + strconv.FormatBool(f.samePrompt), "--stream=" + strconv.FormatBool(f.stream),
		"--cpuprofile", f.cpuProfile, "--memprofile", f.memProfile, "--trace", f.traceOut, "--temperature", f.temperature,
		"--split=" + strconv.FormatBool(f.split), "--config.file", f.configFile, "--hop-gomaxprocs", strconv.Itoa(f.hopProcs),
	}
}

// runModes runs modes in this process, side by side (benchload.Compare) for f.rounds; with
// --split each proxy or mesh runs in a process of its own, which profiles itself (that is
// where mantle's work is), and this process is profiled only when it serves the direct
// mode.
func (f benchLoadFlags) runModes(ctx context.Context, modes []benchload.Mode, stderr io.Writer) (res []benchload.Result, err error) {
	c := f.cfg
	if f.split {
		self, err := os.Executable()
		if err != nil {
			return nil, err
		}
		c.HopCommand = func(ctx context.Context, mode benchload.Mode, upstreamAddr string) *exec.Cmd {
			cmd := exec.CommandContext(ctx, self, benchLoadName, "--serve-hop", "--modes", string(mode), "--upstream", upstreamAddr,
				"--cpuprofile", f.cpuProfile, "--memprofile", f.memProfile, "--trace", f.traceOut, "--config.file", f.configFile,
				"--hop-gomaxprocs", strconv.Itoa(f.hopProcs))
			cmd.Stderr = stderr
			return cmd
		}
		if !slices.Contains(modes, benchload.Direct) {
			return benchload.Compare(ctx, c, modes, f.rounds)
		}
	}
	// The profiles of a process that runs several modes are the load generator's for all
	// of them.
	name := benchload.Mode("load")
	if len(modes) == 1 {
		name = modes[0]
	}
	err = f.profiled(name, func() error {
		res, err = benchload.Compare(ctx, c, modes, f.rounds)
		return err
	})
	return res, err
}

// modeNames is modes as --modes takes them.
func modeNames(modes []benchload.Mode) string {
	names := make([]string, len(modes))
	for i, m := range modes {
		names[i] = string(m)
	}
	return strings.Join(names, ",")
}

// profiled runs run with the CPU and allocation profiles and the execution trace of this
// process that f asks for, named after mode.
func (f benchLoadFlags) profiled(mode benchload.Mode, run func() error) error {
	if f.cpuProfile != "" {
		end, err := record("cpuprofile", f.cpuProfile, mode, "pprof", pprof.StartCPUProfile, pprof.StopCPUProfile)
		if err != nil {
			return err
		}
		defer end()
	}
	if f.traceOut != "" {
		end, err := record("trace", f.traceOut, mode, "trace", trace.Start, trace.Stop)
		if err != nil {
			return err
		}
		defer end()
	}
	if err := run(); err != nil {
		return err
	}
	if f.memProfile != "" {
		return writeAllocProfile(fmt.Sprintf("%s.%s.pprof", f.memProfile, mode))
	}
	return nil
}

// record starts one recording of this process (a CPU profile, an execution trace) into
// <prefix>.<mode>.<ext>; the func it returns ends it.
func record(flag, prefix string, mode benchload.Mode, ext string, start func(io.Writer) error, stop func()) (func(), error) {
	out, err := os.Create(fmt.Sprintf("%s.%s.%s", prefix, mode, ext))
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flag, err)
	}
	if err := start(out); err != nil {
		_ = out.Close()
		return nil, fmt.Errorf("--%s: %w", flag, err)
	}
	return func() { stop(); _ = out.Close() }, nil
}

// writeAllocProfile writes the process's allocations since it started (the "allocs"
// profile: count and bytes per allocating stack, sampled by the runtime); with
// --in-process, a later mode's file includes the earlier modes'.
func writeAllocProfile(path string) error {
	runtime.GC() // the profile counts allocations up to the last collection
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--memprofile: %w", err)
	}
	defer f.Close()
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		return fmt.Errorf("--memprofile: %w", err)
	}
	return f.Close()
}

// runChild runs modes (as --modes takes them) in a fresh process of this binary, with
// flags, and reads its results.
func runChild(ctx context.Context, modes string, flags []string, stderr io.Writer) ([]benchload.Result, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := append([]string{benchLoadName, "--child", "--modes", modes, "--format", "json"}, flags...)
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, self, args...)
	cmd.Stdout, cmd.Stderr = &out, stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s %s: %w", self, strings.Join(args, " "), err)
	}
	var res []benchload.Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		return nil, fmt.Errorf("child output: %w", err)
	}
	return res, nil
}

// writeBenchTable prints the results, with what each mode adds to the direct mode's
// latency and CPU at the same rate, and the proxy's or mesh's own process's CPU, peak
// RSS and context switches when it ran in one.
func writeBenchTable(w io.Writer, all []benchload.Result) error {
	direct := map[window]benchload.Result{}
	split, streamed, rounds := false, false, false
	for _, r := range all {
		if r.Mode == benchload.Direct {
			direct[windowOf(r)] = r
		}
		split = split || r.HopPeakRSSMB > 0
		streamed = streamed || r.FirstP99Ms > 0
		rounds = rounds || r.Round > 0
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	header := "mode\trate/s\t"
	if rounds {
		header += "round\t"
	}
	header += "achieved/s\tok\tok/s\terrors\trefused\tshed\tp50 ms\tp90 ms\tp99 ms\tmax ms\tCPU s/1000\tpeak RSS MiB\tadded p50\tadded p90\tadded p99\tadded CPU s/1000\town p50\town p90\town p99\tstores shed\t"
	if split {
		header += "hop CPU s/1000\thop RSS MiB\thop switches/req\t"
	}
	if streamed {
		header += "first event p50\tfirst event p99\t"
	}
	fmt.Fprintln(tw, header)
	for _, r := range all {
		extra := "\t\t\t\t" // added, own and hop columns
		if d, ok := direct[windowOf(r)]; ok && r.Mode != benchload.Direct {
			extra = fmt.Sprintf("%+.3f\t%+.3f\t%+.3f\t%+.3f\t", r.P50Ms-d.P50Ms, r.P90Ms-d.P90Ms, r.P99Ms-d.P99Ms, r.CPUPer1000-d.CPUPer1000)
		}
		if r.OwnP99Ms > 0 {
			extra += fmt.Sprintf("%.3f\t%.3f\t%.3f\t", r.OwnP50Ms, r.OwnP90Ms, r.OwnP99Ms)
		} else {
			extra += "\t\t\t"
		}
		if r.Mode == benchload.All { // the only mode with a cache to store into
			extra += fmt.Sprintf("%d\t", r.StoresShed)
		} else {
			extra += "\t"
		}
		if split && r.HopPeakRSSMB > 0 {
			extra += fmt.Sprintf("%.3f\t%.0f\t%.2f\t", r.HopCPUPer1000, r.HopPeakRSSMB, r.HopSwitchesPerRequest)
		} else if split {
			extra += "\t\t\t"
		}
		if streamed {
			extra += fmt.Sprintf("%.3f\t%.3f\t", r.FirstP50Ms, r.FirstP99Ms)
		}
		round := ""
		if rounds {
			round = strconv.Itoa(r.Round) + "\t"
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%s%.0f\t%d\t%.0f\t%d\t%d\t%d\t%.3f\t%.3f\t%.3f\t%.1f\t%.3f\t%.0f\t%s\n",
			r.Mode, r.Rate, round, r.AchievedRate, r.OK, r.AnsweredRate, r.Errors, r.Refused, r.Shed, r.P50Ms, r.P90Ms, r.P99Ms, r.MaxMs, r.CPUPer1000, r.PeakRSSMB, extra)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range all {
		if r.Errors > 0 {
			fmt.Fprintf(w, "%s at %.0f/s: %d errors, first: %s\n", r.Mode, r.Rate, r.Errors, r.FirstError)
		}
	}
	if rounds {
		return writeRoundMedians(w, all, direct)
	}
	return nil
}

// window is a rate's window in a round (Result.Round; 0 without rounds).
type window struct {
	rate  float64
	round int
}

func windowOf(r benchload.Result) window { return window{r.Rate, r.Round} }

// writeRoundMedians prints, per mode and rate, the medians over the rounds of what the
// mode added to the direct mode's P99 in the same round, of its own P99 and of its hop's
// CPU per request, and the median of its per-round ratio to the proxy's hop CPU: a ratio
// taken within a round compares windows next to each other.
func writeRoundMedians(w io.Writer, all []benchload.Result, direct map[window]benchload.Result) error {
	proxy := map[window]benchload.Result{}
	for _, r := range all {
		if r.Mode == benchload.Proxy {
			proxy[windowOf(r)] = r
		}
	}
	type modeRate struct {
		mode benchload.Mode
		rate float64
	}
	type series struct {
		modeRate
		addedP99, ownP99, hopCPU, ratio []float64
		rounds                          int
	}
	var order []*series
	byKey := map[modeRate]*series{}
	for _, r := range all {
		if r.Mode == benchload.Direct {
			continue
		}
		key := modeRate{r.Mode, r.Rate}
		s := byKey[key]
		if s == nil {
			s = &series{modeRate: key}
			byKey[key] = s
			order = append(order, s)
		}
		s.rounds++
		if d, ok := direct[windowOf(r)]; ok {
			s.addedP99 = append(s.addedP99, r.P99Ms-d.P99Ms)
		}
		if r.OwnP99Ms > 0 {
			s.ownP99 = append(s.ownP99, r.OwnP99Ms)
		}
		if r.HopCPUPer1000 > 0 {
			s.hopCPU = append(s.hopCPU, r.HopCPUPer1000)
			if p, ok := proxy[windowOf(r)]; ok && p.HopCPUPer1000 > 0 && r.Mode != benchload.Proxy {
				s.ratio = append(s.ratio, r.HopCPUPer1000/p.HopCPUPer1000)
			}
		}
	}
	fmt.Fprintln(w, "\nmedians over the rounds:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\trate/s\trounds\tadded p99\town p99\thop CPU s/1000\thop CPU / proxy's\t")
	for _, s := range order {
		fmt.Fprintf(tw, "%s\t%.0f\t%d\t%s\t%s\t%s\t%s\t\n", s.mode, s.rate, s.rounds,
			medianOf(s.addedP99, "%+.3f"), medianOf(s.ownP99, "%.3f"), medianOf(s.hopCPU, "%.3f"), medianOf(s.ratio, "%.2f"))
	}
	return tw.Flush()
}

// medianOf is the median of v in format, "" when v is empty.
func medianOf(v []float64, format string) string {
	if len(v) == 0 {
		return ""
	}
	v = slices.Sorted(slices.Values(v))
	m := v[len(v)/2]
	if len(v)%2 == 0 {
		m = (v[len(v)/2-1] + m) / 2
	}
	return fmt.Sprintf(format, m)
}
