//go:build !nolab

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	mdrill "github.com/mantle-mesh/mantle/pkg/drill"
)

// errTargetsMissed makes `mantle drill --check` exit non-zero when mantle missed a target.
var errTargetsMissed = errors.New("mantle missed one or more of the scenario's targets")

// drillFlags are the flags of `mantle drill`.
type drillFlags struct {
	scenario, scenarioFile                  string
	list, printScenario, printConfig, check bool
	timeScale, rate                         float64
	duration                                time.Duration
	sides, out, format                      string
	meshURL, route, apiKeyEnv, natsURL      string
	simAddr, httpAddr                       string
	maxInFlight                             int
	requestsCSV, verbose                    bool
}

// drill is `mantle drill`. The drill package is imported as mdrill so that the command can
// have the name main.go's commands table uses.
func drill(ctx context.Context, args []string, env cmdEnv) error {
	f, err := parseDrillFlags(args, env.stderr)
	if err != nil {
		return err
	}
	return runDrill(ctx, f, env)
}

// parseDrillFlags parses and checks drill's command line.
func parseDrillFlags(args []string, stderr io.Writer) (drillFlags, error) {
	var f drillFlags
	fs := flag.NewFlagSet("drill", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, `usage: mantle drill [flags]

Runs a fault drill: the scenario's simulated providers misbehave while an open-loop load
runs twice, through mantle and through a naive client (static 5 s timeout, 3 fixed 100 ms
retries, no breaker, budget or idempotency), on the same seed. Prints the side-by-side
table and writes <out>/<scenario>.json and <out>/<scenario>.html.

Built-in scenarios: %s (or all).

`, strings.Join(mdrill.Names(), ", "))
		fs.PrintDefaults()
	}
	fs.StringVar(&f.scenario, "scenario", "seed-incident", "built-in scenario to run, or all")
	fs.StringVar(&f.scenarioFile, "scenario-file", "", "run the scenario in this YAML file instead (start from --print-scenario)")
	fs.BoolVar(&f.list, "list", false, "list the built-in scenarios and exit")
	fs.BoolVar(&f.printScenario, "print-scenario", false, "print the scenario's YAML and exit")
	fs.BoolVar(&f.printConfig, "print-config", false, "print the mesh configuration mantle's side runs with and exit")
	fs.Float64Var(&f.timeScale, "time-scale", 0, "multiply every scenario time by this (0.1 replays 10 minutes in 1); 0 keeps the scenario's")
	fs.Float64Var(&f.rate, "rate", 0, "requests per second of scenario time; 0 keeps the scenario's")
	fs.DurationVar(&f.duration, "duration", 0, "scenario time to run (cuts the scenario short); 0 keeps the scenario's")
	fs.StringVar(&f.sides, "sides", "mantle,naive", "sides to run, in order")
	fs.StringVar(&f.out, "out", "drill-report", "directory for the JSON and HTML reports; empty writes none")
	fs.StringVar(&f.format, "format", "text", "what to print on stdout: text or json")
	fs.BoolVar(&f.check, "check", false, "exit with status 1 when mantle misses a target of the scenario")
	fs.StringVar(&f.meshURL, "mesh", "", "drive a running mesh at this base URL (http://host:8080) instead of starting one; route its models to --sim-addr")
	fs.StringVar(&f.route, "route", mdrill.RouteName, "with --mesh: the model name (route) to ask for")
	fs.StringVar(&f.apiKeyEnv, "api-key-env", "MANTLE_API_KEY", "with --mesh: environment variable holding the API key")
	fs.StringVar(&f.natsURL, "nats-url", "", "with --mesh: NATS URL the mesh publishes events to (for breaker transitions)")
	fs.StringVar(&f.simAddr, "sim-addr", "127.0.0.1:0", "listen address of the drill's simulated provider")
	fs.StringVar(&f.httpAddr, "http-addr", "", "HTTP listen address of the in-process mesh, to watch http://<addr>/status while mantle's side runs (default: a free port, printed)")
	fs.IntVar(&f.maxInFlight, "max-in-flight", 0, "most concurrent requests per side (0: 10000); more are shed and counted as failures")
	fs.BoolVar(&f.requestsCSV, "requests", false, "also write every request of both sides to <out>/<scenario>-requests.csv")
	fs.BoolVar(&f.verbose, "v", false, "write the mesh's and the simulator's warnings to stderr")
	if err := parseFlags(fs, args); err != nil {
		return f, err
	}
	if fs.NArg() > 0 {
		return f, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if f.format != "text" && f.format != "json" {
		return f, fmt.Errorf("--format: want text or json, got %q", f.format)
	}
	return f, nil
}

// runDrill does what f asks: list, print or run the scenarios.
func runDrill(ctx context.Context, f drillFlags, env cmdEnv) error {
	if f.list {
		return listScenarios(env.stdout)
	}
	scenarios, err := loadScenarios(f.scenario, f.scenarioFile)
	if err != nil {
		return err
	}
	switch {
	case f.printScenario:
		return printScenarios(env.stdout, f.scenarioFile, scenarios)
	case f.printConfig:
		return printMeshConfigs(env.stdout, f.timeScale, scenarios)
	}
	if f.requestsCSV && f.out == "" {
		return errors.New("--requests needs --out")
	}
	if f.out != "" {
		if err := os.MkdirAll(f.out, 0o755); err != nil {
			return fmt.Errorf("--out: %w", err)
		}
	}
	opts := f.options(env)
	missed := false
	for i, s := range scenarios {
		rep, err := runScenario(ctx, f, opts, s)
		if err != nil {
			return err
		}
		if f.format == "json" {
			err = rep.WriteJSON(env.stdout)
		} else {
			if i > 0 {
				fmt.Fprintln(env.stdout)
			}
			err = rep.WriteText(env.stdout)
		}
		if err != nil {
			return err
		}
		if f.out != "" {
			files, err := writeReports(f.out, rep)
			if err != nil {
				return err
			}
			fmt.Fprintf(env.stderr, "reports: %s\n", strings.Join(files, ", "))
		}
		for _, c := range rep.Checks {
			missed = missed || !c.Met
		}
	}
	if f.check && missed {
		return errTargetsMissed
	}
	return nil
}

// options are the drill's options for every scenario f runs.
func (f drillFlags) options(env cmdEnv) mdrill.Options {
	opts := mdrill.Options{
		TimeScale: f.timeScale, Rate: f.rate, Duration: f.duration,
		MeshURL: f.meshURL, Route: f.route, APIKey: env.getenv(f.apiKeyEnv), NATSURL: f.natsURL, SimAddr: f.simAddr, HTTPAddr: f.httpAddr,
		MaxInFlight: f.maxInFlight, Progress: env.stderr, ProgressInline: isTerminal(env.stderr),
	}
	for _, side := range strings.Split(f.sides, ",") {
		if side = strings.TrimSpace(side); side != "" {
			opts.Sides = append(opts.Sides, side)
		}
	}
	if f.verbose {
		opts.Log = env.stderr
	}
	return opts
}

// runScenario runs one scenario, writing every request to <out>/<scenario>-requests.csv
// when f asks for it.
func runScenario(ctx context.Context, f drillFlags, opts mdrill.Options, s *mdrill.Scenario) (*mdrill.Report, error) {
	opts.Scenario = s
	if !f.requestsCSV {
		return mdrill.Run(ctx, opts)
	}
	csv, err := os.Create(filepath.Join(f.out, s.Name+"-requests.csv"))
	if err != nil {
		return nil, fmt.Errorf("--requests: %w", err)
	}
	opts.Requests = csv
	rep, err := mdrill.Run(ctx, opts)
	if cerr := csv.Close(); err == nil {
		err = cerr
	}
	return rep, err
}

// listScenarios prints the built-in scenarios with their descriptions.
func listScenarios(stdout io.Writer) error {
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	for _, n := range mdrill.Names() {
		s, err := mdrill.Builtin(n)
		if err != nil {
			return err
		}
		fmt.Fprintf(tw, "%s\t%s\n", n, s.Description)
	}
	return tw.Flush()
}

// printScenarios prints the YAML of file, or of the built-in scenarios.
func printScenarios(stdout io.Writer, file string, scenarios []*mdrill.Scenario) error {
	if file != "" {
		data, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		_, err = stdout.Write(data)
		return err
	}
	for i, s := range scenarios {
		data, err := mdrill.BuiltinSource(s.Name)
		if err != nil {
			return err
		}
		if i > 0 {
			fmt.Fprintln(stdout, "---")
		}
		if _, err := stdout.Write(data); err != nil {
			return err
		}
	}
	return nil
}

// printMeshConfigs prints the mesh configuration mantle's side runs each scenario with, at
// timeScale (the scenario's own when 0).
func printMeshConfigs(stdout io.Writer, timeScale float64, scenarios []*mdrill.Scenario) error {
	for _, s := range scenarios {
		scale := s.TimeScale
		if timeScale > 0 {
			scale = timeScale
		}
		y, err := s.MeshConfig("http://127.0.0.1:8081/v1", scale).YAML()
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "# mantle drill --scenario %s: the mesh configuration at time scale %g\n# (the simulator's address is chosen when the drill runs; the simulator ignores API keys,\n# but mantle serve wants %s set to any value)\n", s.Name, scale, mdrill.SimKeyEnv)
		if _, err := stdout.Write(y); err != nil {
			return err
		}
	}
	return nil
}

// loadScenarios resolves --scenario and --scenario-file.
func loadScenarios(name, file string) ([]*mdrill.Scenario, error) {
	if file != "" {
		f, err := os.Open(file)
		if err != nil {
			return nil, fmt.Errorf("--scenario-file: %w", err)
		}
		defer f.Close()
		s, err := mdrill.Parse(f)
		if err != nil {
			return nil, fmt.Errorf("--scenario-file %s: %w", file, err)
		}
		return []*mdrill.Scenario{s}, nil
	}
	names := []string{name}
	if name == "all" {
		names = mdrill.Names()
	}
	var out []*mdrill.Scenario
	for _, n := range names {
		s, err := mdrill.Builtin(n)
		if err != nil {
			return nil, fmt.Errorf("--scenario: %w", err)
		}
		out = append(out, s)
	}
	return out, nil
}

// writeReports writes the JSON and HTML reports of rep into dir.
func writeReports(dir string, rep *mdrill.Report) ([]string, error) {
	var files []string
	for _, f := range []struct {
		ext   string
		write func(io.Writer) error
	}{{"json", rep.WriteJSON}, {"html", rep.WriteHTML}} {
		path := filepath.Join(dir, rep.Scenario+"."+f.ext)
		w, err := os.Create(path)
		if err != nil {
			return nil, err
		}
		err = f.write(w)
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, fmt.Errorf("write %s: %w", path, err)
		}
		files = append(files, path)
	}
	return files, nil
}

// isTerminal reports whether w is a terminal, where the progress line rewrites itself.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
