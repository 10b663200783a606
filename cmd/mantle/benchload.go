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
)

// benchLoadName is the command's name in main.go's table; the parent re-runs the binary
// with it to measure each mode in a process of its own.
const benchLoadName = "bench-load"

// benchLoad is `mantle bench-load`: the overhead and throughput benchmark.
func benchLoad(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(benchLoadName, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: mantle bench-load [flags]

Sends the same OpenAI-compatible request at fixed rates, each for a fixed time, to an
instant upstream: directly, through a bare reverse proxy, through the router alone, and
through the whole mesh. Reports latency percentiles of the answered requests, what each
mode adds to them, CPU seconds per 1000 requests and peak RSS; "refused" counts the
mesh's 503 OVERLOADED answers, "shed" the requests over --max-in-flight; "own" are
percentiles of the mesh's own time per answer, from its Server-Timing header.
Each mode runs in a process of its own so that its CPU and memory figures are its own.

`)
		printFlags(fs)
	}
	modes := fs.String("modes", "direct,proxy,router,all", "modes to run: direct, proxy (a bare reverse proxy, the floor of any HTTP hop), router (the router alone) and all (the whole mesh)")
	rates := fs.String("rates", "500,1000,2000,4000", "requests per second, each run in turn")
	duration := fs.Duration("duration", 10*time.Second, "how long each rate runs")
	warmup := fs.Duration("warmup", 2*time.Second, "unmeasured load at each rate before it is measured")
	maxInFlight := fs.Int("max-in-flight", 5000, "most concurrent requests; more are shed and counted (each holds a few file descriptors)")
	samePrompt := fs.Bool("same-prompt", false, "send the identical request every time (the cache then answers all but the first)")
	temperature := fs.String("temperature", "", "temperature of every request; unset (the SDK default) the cache declines to cache, 0 makes every answer cacheable")
	format := fs.String("format", "text", "output: text or json")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of each mode to <this>.<mode>.pprof")
	traceOut := fs.String("trace", "", "write an execution trace of each mode to <this>.<mode>.trace (go tool trace; -pprof=sched shows waits for a CPU)")
	memProfile := fs.String("memprofile", "", "write an allocation profile of each mode to <this>.<mode>.pprof (go tool pprof -sample_index=alloc_space)")
	inProcess := fs.Bool("in-process", false, "run every mode in this process (CPU and RSS figures then mix; with --split the proxy or mesh still gets a process of its own)")
	split := fs.Bool("split", true, "run the proxy or the mesh in a process of its own, apart from the load generator and the upstream; false puts all three in one")
	child := fs.Bool("child", false, "internal: run one mode and print its results as JSON")
	serveHop := fs.Bool("serve-hop", false, "internal: serve one mode's proxy or mesh for a benchmark in another process")
	upstream := fs.String("upstream", "", "internal: with --serve-hop, the upstream's host:port")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *format != "text" && *format != "json" {
		return fmt.Errorf("--format: want text or json, got %q", *format)
	}
	cfg := benchload.Config{Duration: *duration, Warmup: *warmup, MaxInFlight: *maxInFlight, SamePrompt: *samePrompt}
	if *temperature != "" {
		v, err := strconv.ParseFloat(*temperature, 64)
		if err != nil || v < 0 || v > 2 {
			return fmt.Errorf("--temperature: want a number in [0, 2], got %q", *temperature)
		}
		cfg.Temperature = &v
	}
	for _, r := range strings.Split(*rates, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(r), 64)
		if err != nil || v <= 0 {
			return fmt.Errorf("--rates: %q is not a positive number", r)
		}
		cfg.Rates = append(cfg.Rates, v)
	}
	var run []benchload.Mode
	for _, m := range strings.Split(*modes, ",") {
		mode := benchload.Mode(strings.TrimSpace(m))
		if !slices.Contains(benchload.Modes(), mode) {
			return fmt.Errorf("--modes: unknown mode %q (want direct, proxy, router or all)", m)
		}
		run = append(run, mode)
	}

	// record starts one recording of this process (a CPU profile, an execution trace) into
	// <prefix>.<mode>.<ext>; the func it returns ends it.
	record := func(flag, prefix string, mode benchload.Mode, ext string, start func(io.Writer) error, stop func()) (func(), error) {
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
	// profiled runs f with the CPU and allocation profiles and the execution trace of this
	// process that the flags ask for, named after mode.
	profiled := func(mode benchload.Mode, f func() error) error {
		if *cpuProfile != "" {
			end, err := record("cpuprofile", *cpuProfile, mode, "pprof", pprof.StartCPUProfile, pprof.StopCPUProfile)
			if err != nil {
				return err
			}
			defer end()
		}
		if *traceOut != "" {
			end, err := record("trace", *traceOut, mode, "trace", trace.Start, trace.Stop)
			if err != nil {
				return err
			}
			defer end()
		}
		if err := f(); err != nil {
			return err
		}
		if *memProfile != "" {
			return writeAllocProfile(fmt.Sprintf("%s.%s.pprof", *memProfile, mode))
		}
		return nil
	}

	if *serveHop {
		if len(run) != 1 {
			return errors.New("--serve-hop serves exactly one mode")
		}
		return profiled(run[0], func() error {
			return benchload.ServeHop(ctx, run[0], *upstream, os.Stdin, stdout, stderr)
		})
	}

	runMode := func(mode benchload.Mode) (res []benchload.Result, err error) {
		c := cfg
		c.Mode = mode
		if *split && mode != benchload.Direct {
			self, err := os.Executable()
			if err != nil {
				return nil, err
			}
			// The hop's process profiles itself: that is where mantle's work is.
			c.HopCommand = func(ctx context.Context, mode benchload.Mode, upstreamAddr string) *exec.Cmd {
				cmd := exec.CommandContext(ctx, self, benchLoadName, "--serve-hop", "--modes", string(mode), "--upstream", upstreamAddr,
					"--cpuprofile", *cpuProfile, "--memprofile", *memProfile, "--trace", *traceOut)
				cmd.Stderr = stderr
				return cmd
			}
			return benchload.Run(ctx, c)
		}
		err = profiled(mode, func() error {
			res, err = benchload.Run(ctx, c)
			return err
		})
		return res, err
	}

	if *child {
		if len(run) != 1 {
			return errors.New("--child runs exactly one mode")
		}
		res, err := runMode(run[0])
		if err != nil {
			return err
		}
		return json.NewEncoder(stdout).Encode(res)
	}

	var all []benchload.Result
	for _, mode := range run {
		fmt.Fprintf(stderr, "bench-load: %s at %s/s, %s each...\n", mode, *rates, *duration)
		var res []benchload.Result
		var err error
		if *inProcess {
			res, err = runMode(mode)
		} else {
			res, err = runChild(ctx, mode, []string{
				"--rates", *rates, "--duration", duration.String(), "--warmup", warmup.String(),
				"--max-in-flight", strconv.Itoa(*maxInFlight), "--same-prompt=" + strconv.FormatBool(*samePrompt),
				"--cpuprofile", *cpuProfile, "--memprofile", *memProfile, "--trace", *traceOut, "--temperature", *temperature,
				"--split=" + strconv.FormatBool(*split),
			}, stderr)
		}
		if err != nil {
			return fmt.Errorf("mode %s: %w", mode, err)
		}
		all = append(all, res...)
	}
	if *format == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(all)
	}
	return writeBenchTable(stdout, all)
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

// runChild runs one mode in a fresh process of this binary, with flags, and reads its
// results.
func runChild(ctx context.Context, mode benchload.Mode, flags []string, stderr io.Writer) ([]benchload.Result, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := append([]string{benchLoadName, "--child", "--modes", string(mode), "--format", "json"}, flags...)
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
// latency and CPU at the same rate, and the proxy's or mesh's own process's CPU and
// peak RSS when it ran in one.
func writeBenchTable(w io.Writer, all []benchload.Result) error {
	direct := map[float64]benchload.Result{}
	split := false
	for _, r := range all {
		if r.Mode == benchload.Direct {
			direct[r.Rate] = r
		}
		split = split || r.HopPeakRSSMB > 0
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	header := "mode\trate/s\tachieved/s\tok\tok/s\terrors\trefused\tshed\tp50 ms\tp90 ms\tp99 ms\tmax ms\tCPU s/1000\tpeak RSS MiB\tadded p50\tadded p90\tadded p99\tadded CPU s/1000\town p50\town p90\town p99\t"
	if split {
		header += "hop CPU s/1000\thop RSS MiB\t"
	}
	fmt.Fprintln(tw, header)
	for _, r := range all {
		extra := "\t\t\t\t" // added, own and hop columns
		if d, ok := direct[r.Rate]; ok && r.Mode != benchload.Direct {
			extra = fmt.Sprintf("%+.3f\t%+.3f\t%+.3f\t%+.3f\t", r.P50Ms-d.P50Ms, r.P90Ms-d.P90Ms, r.P99Ms-d.P99Ms, r.CPUPer1000-d.CPUPer1000)
		}
		if r.OwnP99Ms > 0 {
			extra += fmt.Sprintf("%.3f\t%.3f\t%.3f\t", r.OwnP50Ms, r.OwnP90Ms, r.OwnP99Ms)
		} else {
			extra += "\t\t\t"
		}
		if split && r.HopPeakRSSMB > 0 {
			extra += fmt.Sprintf("%.3f\t%.0f\t", r.HopCPUPer1000, r.HopPeakRSSMB)
		} else if split {
			extra += "\t\t"
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%d\t%.0f\t%d\t%d\t%d\t%.3f\t%.3f\t%.3f\t%.1f\t%.3f\t%.0f\t%s\n",
			r.Mode, r.Rate, r.AchievedRate, r.OK, r.AnsweredRate, r.Errors, r.Refused, r.Shed, r.P50Ms, r.P90Ms, r.P99Ms, r.MaxMs, r.CPUPer1000, r.PeakRSSMB, extra)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range all {
		if r.Errors > 0 {
			fmt.Fprintf(w, "%s at %.0f/s: %d errors, first: %s\n", r.Mode, r.Rate, r.Errors, r.FirstError)
		}
	}
	return nil
}
