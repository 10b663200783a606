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

	mdrill "github.com/mantle-mesh/mantle/pkg/drill"
)

// errTargetsMissed makes `mantle drill --check` exit non-zero when mantle missed a target.
var errTargetsMissed = errors.New("mantle missed one or more of the scenario's targets")

// drill is `mantle drill`. The drill package is imported as mdrill so that the command can
// have the name main.go's commands table uses.
func drill(ctx context.Context, args []string, stdout, stderr io.Writer) error {
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
	name := fs.String("scenario", "seed-incident", "built-in scenario to run, or all")
	file := fs.String("scenario-file", "", "run the scenario in this YAML file instead (start from --print-scenario)")
	list := fs.Bool("list", false, "list the built-in scenarios and exit")
	printScenario := fs.Bool("print-scenario", false, "print the scenario's YAML and exit")
	printConfig := fs.Bool("print-config", false, "print the mesh configuration mantle's side runs with and exit")
	timeScale := fs.Float64("time-scale", 0, "multiply every scenario time by this (0.1 replays 10 minutes in 1); 0 keeps the scenario's")
	rate := fs.Float64("rate", 0, "requests per second of scenario time; 0 keeps the scenario's")
	duration := fs.Duration("duration", 0, "scenario time to run (cuts the scenario short); 0 keeps the scenario's")
	sides := fs.String("sides", "mantle,naive", "sides to run, in order")
	out := fs.String("out", "drill-report", "directory for the JSON and HTML reports; empty writes none")
	format := fs.String("format", "text", "what to print on stdout: text or json")
	check := fs.Bool("check", false, "exit with status 1 when mantle misses a target of the scenario")
	meshURL := fs.String("mesh", "", "drive a running mesh at this base URL (http://host:8080) instead of starting one; route its models to --sim-addr")
	route := fs.String("route", mdrill.RouteName, "with --mesh: the model name (route) to ask for")
	apiKeyEnv := fs.String("api-key-env", "MANTLE_API_KEY", "with --mesh: environment variable holding the API key")
	natsURL := fs.String("nats-url", "", "with --mesh: NATS URL the mesh publishes events to (for breaker transitions)")
	simAddr := fs.String("sim-addr", "127.0.0.1:0", "listen address of the drill's simulated provider")
	httpAddr := fs.String("http-addr", "", "HTTP listen address of the in-process mesh, to watch http://<addr>/status while mantle's side runs (default: a free port, printed)")
	maxInFlight := fs.Int("max-in-flight", 0, "most concurrent requests per side (0: 10000); more are shed and counted as failures")
	requestsCSV := fs.Bool("requests", false, "also write every request of both sides to <out>/<scenario>-requests.csv")
	verbose := fs.Bool("v", false, "write the mesh's and the simulator's warnings to stderr")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *format != "text" && *format != "json" {
		return fmt.Errorf("--format: want text or json, got %q", *format)
	}

	if *list {
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

	scenarios, err := loadScenarios(*name, *file)
	if err != nil {
		return err
	}
	if *printScenario {
		if *file != "" {
			data, err := os.ReadFile(*file)
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
	if *printConfig {
		for _, s := range scenarios {
			scale := s.TimeScale
			if *timeScale > 0 {
				scale = *timeScale
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

	opts := mdrill.Options{
		TimeScale: *timeScale, Rate: *rate, Duration: *duration,
		MeshURL: *meshURL, Route: *route, APIKey: os.Getenv(*apiKeyEnv), NATSURL: *natsURL, SimAddr: *simAddr, HTTPAddr: *httpAddr,
		MaxInFlight: *maxInFlight, Progress: stderr, ProgressInline: isTerminal(stderr),
	}
	for _, side := range strings.Split(*sides, ",") {
		if side = strings.TrimSpace(side); side != "" {
			opts.Sides = append(opts.Sides, side)
		}
	}
	if *verbose {
		opts.Log = stderr
	}
	if *requestsCSV && *out == "" {
		return errors.New("--requests needs --out")
	}
	if *out != "" {
		if err := os.MkdirAll(*out, 0o755); err != nil {
			return fmt.Errorf("--out: %w", err)
		}
	}

	missed := false
	for i, s := range scenarios {
		opts.Scenario = s
		var csv *os.File
		if *requestsCSV {
			if csv, err = os.Create(filepath.Join(*out, s.Name+"-requests.csv")); err != nil {
				return fmt.Errorf("--requests: %w", err)
			}
			opts.Requests = csv
		}
		rep, err := mdrill.Run(ctx, opts)
		if csv != nil {
			if cerr := csv.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			return err
		}
		if *format == "json" {
			err = rep.WriteJSON(stdout)
		} else {
			if i > 0 {
				fmt.Fprintln(stdout)
			}
			err = rep.WriteText(stdout)
		}
		if err != nil {
			return err
		}
		if *out != "" {
			files, err := writeReports(*out, rep)
			if err != nil {
				return err
			}
			fmt.Fprintf(stderr, "reports: %s\n", strings.Join(files, ", "))
		}
		for _, c := range rep.Checks {
			missed = missed || !c.Met
		}
	}
	if *check && missed {
		return errTargetsMissed
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
