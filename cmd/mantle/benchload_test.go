package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/mantle-mesh/mantle/pkg/drill/benchload"
)

func TestBenchLoadInProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a router process")
	}
	t.Parallel()
	var stdout, stderr bytes.Buffer
	args := []string{"--in-process", "--modes", "direct,router", "--rates", "40", "--duration", "250ms", "--warmup", "0s"}
	if err := benchLoad(context.Background(), args, testEnv(&stdout, &stderr)); err != nil {
		t.Fatalf("bench-load: %v\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "added p99") {
		t.Fatalf("want a header and a line per mode:\n%s", stdout.String())
	}
	// The router line says what it adds to the direct line at the same rate.
	if !strings.Contains(lines[2], "router") || !strings.ContainsAny(lines[2], "+-") {
		t.Errorf("router line lacks the added latency: %q", lines[2])
	}
}

func TestBenchLoadChildPrintsJSON(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	args := []string{"--child", "--modes", "direct", "--rates", "40", "--duration", "200ms", "--warmup", "0s"}
	if err := benchLoad(context.Background(), args, testEnv(&stdout, &stderr)); err != nil {
		t.Fatalf("bench-load --child: %v", err)
	}
	var res []benchload.Result
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("child output is not JSON: %v\n%s", err, stdout.String())
	}
	if len(res) != 1 || res[0].Mode != benchload.Direct || res[0].Requests != 8 {
		t.Errorf("results %+v, want 8 direct requests", res)
	}
}

// TestBenchLoadProfiles: the profiles and the execution trace are those of the process
// that does the work: the benchmark's own in the direct mode, and with the router in a
// process of its own (--split), that process's.
func TestBenchLoadProfiles(t *testing.T) {
	t.Parallel()
	for _, mode := range []benchload.Mode{benchload.Direct, benchload.RouterOnly} {
		t.Run(string(mode), func(t *testing.T) {
			if testing.Short() && mode != benchload.Direct {
				t.Skip("starts a router process")
			}
			t.Parallel()
			dir := t.TempDir()
			var stdout, stderr bytes.Buffer
			args := []string{"--child", "--modes", string(mode), "--rates", "40", "--duration", "200ms", "--warmup", "0s",
				"--cpuprofile", filepath.Join(dir, "cpu"), "--memprofile", filepath.Join(dir, "mem"), "--trace", filepath.Join(dir, "tr")}
			if err := benchLoad(context.Background(), args, testEnv(&stdout, &stderr)); err != nil {
				t.Fatalf("bench-load: %v\n%s", err, stderr.String())
			}
			for _, name := range []string{"cpu." + string(mode) + ".pprof", "mem." + string(mode) + ".pprof"} {
				b, err := os.ReadFile(filepath.Join(dir, name))
				if err != nil {
					t.Fatal(err)
				}
				// pprof profiles are gzipped protobuf.
				if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
					t.Errorf("%s is not a gzipped profile (%d bytes)", name, len(b))
				}
			}
			b, err := os.ReadFile(filepath.Join(dir, "tr."+string(mode)+".trace"))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(b, []byte("go 1.")) || len(b) < 1024 {
				t.Errorf("the trace is not an execution trace (%d bytes, starts %q)", len(b), b[:min(len(b), 16)])
			}
			var res []benchload.Result
			if err := json.Unmarshal(stdout.Bytes(), &res); err != nil || len(res) != 1 {
				t.Fatalf("results %+v (%v), want one", res, err)
			}
			if split := res[0].HopPeakRSSMB > 0; split != (mode != benchload.Direct) {
				t.Errorf("%s measured a process of its own: %v", mode, split)
			}
		})
	}
}

func TestBenchLoadRejectsBadFlags(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--modes", "direct,teleport"}, `unknown mode "teleport"`},
		{[]string{"--rates", "500,fast"}, `"fast" is not a positive number`},
		{[]string{"--rates", "0"}, "not a positive number"},
		{[]string{"--format", "yaml"}, "--format"},
		{[]string{"--serve-hop", "--modes", "proxy,all"}, "exactly one mode"},
		{[]string{"--rounds", "0"}, "--rounds"},
		{[]string{"--config.file", "/nonexistent/mantle.yaml"}, "config.file"},
		{[]string{"--hop-gomaxprocs", "-1"}, "--hop-gomaxprocs"},
		{[]string{"--hop-gomaxprocs", "1", "--split=false"}, "--hop-gomaxprocs"},
	}
	for _, tt := range tests {
		var stdout, stderr bytes.Buffer
		err := benchLoad(context.Background(), tt.args, testEnv(&stdout, &stderr))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("bench-load %q: error %v, want one containing %q", tt.args, err, tt.want)
		}
	}
}

// TestMain lets this test binary run as mantle when a test starts it as a child process
// (bench-load runs each mode, and with --split each proxy or mesh, in a process of this
// binary): its first argument is then a subcommand, not a test flag.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == benchLoadName {
		os.Exit(run(context.Background(), os.Args[1:], cmdEnv{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}))
	}
	os.Exit(m.Run())
}

// TestBenchLoadSplit runs bench-load as a user does, each mode in a child process and the
// router in a process of its own, and checks that the table reports that process.
func TestBenchLoadSplit(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three processes")
	}
	t.Parallel()
	var stdout, stderr bytes.Buffer
	// A GOMAXPROCS no process would have by default shows that the router's process,
	// and only it, was given the flag's.
	procs := runtime.NumCPU() + 1
	args := []string{"--modes", "direct,router", "--rates", "40", "--duration", "250ms", "--warmup", "0s", "--format", "json",
		"--hop-gomaxprocs", strconv.Itoa(procs)}
	if err := benchLoad(context.Background(), args, testEnv(&stdout, &stderr)); err != nil {
		t.Fatalf("bench-load: %v\n%s", err, stderr.String())
	}
	var res []benchload.Result
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, stdout.String())
	}
	if len(res) != 2 || res[0].Mode != benchload.Direct || res[1].Mode != benchload.RouterOnly {
		t.Fatalf("results %+v, want direct then router", res)
	}
	if r := res[1]; r.OK != 10 || r.HopPeakRSSMB <= 0 || r.HopCPUPer1000 <= 0 {
		t.Errorf("router: %d ok, hop RSS %v MiB, hop CPU %v s/1000; want 10 ok through a router process of its own", r.OK, r.HopPeakRSSMB, r.HopCPUPer1000)
	}
	if r := res[1]; r.HopGOMAXPROCS != procs {
		t.Errorf("router: hop GOMAXPROCS %d, want --hop-gomaxprocs's %d", r.HopGOMAXPROCS, procs)
	}
	if r := res[0]; r.HopPeakRSSMB != 0 || r.HopGOMAXPROCS != 0 {
		t.Errorf("direct: hop RSS %v MiB, GOMAXPROCS %d, want none: the direct mode has no hop", r.HopPeakRSSMB, r.HopGOMAXPROCS)
	}
}

// TestBenchLoadRounds runs the modes side by side as a user does with --rounds: one child
// process for all of them and the router in a process of its own. Every mode has a window
// at every rate in every round, and the table ends with each mode's medians, the router's
// ratio to the proxy's CPU among them.
func TestBenchLoadRounds(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three processes")
	}
	t.Parallel()
	base := []string{"--modes", "direct,proxy,router", "--rates", "40", "--duration", "250ms", "--warmup", "0s", "--rounds", "2"}
	var stdout, stderr bytes.Buffer
	if err := benchLoad(context.Background(), append(base, "--format", "json"), testEnv(&stdout, &stderr)); err != nil {
		t.Fatalf("bench-load: %v\n%s", err, stderr.String())
	}
	var res []benchload.Result
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, stdout.String())
	}
	var got []string
	for _, r := range res {
		got = append(got, fmt.Sprintf("%s/%d", r.Mode, r.Round))
		if r.OK != 10 {
			t.Errorf("%s, round %d: %d ok (%d errors, first: %s), want 10", r.Mode, r.Round, r.OK, r.Errors, r.FirstError)
		}
		if hop := r.HopCPUPer1000 > 0; hop != (r.Mode != benchload.Direct) {
			t.Errorf("%s, round %d: hop CPU %v s per 1000; want a process of its own for the proxy and the router only", r.Mode, r.Round, r.HopCPUPer1000)
		}
	}
	if want := "direct/1 direct/2 proxy/1 proxy/2 router/1 router/2"; strings.Join(got, " ") != want {
		t.Errorf("windows %q, want %q", strings.Join(got, " "), want)
	}

	stdout.Reset()
	if err := writeBenchTable(&stdout, res); err != nil {
		t.Fatal(err)
	}
	table := stdout.String()
	_, medians, ok := strings.Cut(table, "medians over the rounds:")
	if !ok {
		t.Fatalf("table without medians:\n%s", table)
	}
	var router []string
	for _, line := range strings.Split(medians, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "router" {
			router = f
		}
	}
	// mode, rate, rounds, added p99, own p99, hop CPU, ratio to the proxy's
	if len(router) != 7 || router[2] != "2" {
		t.Fatalf("router's medians %q, want 7 columns over 2 rounds:\n%s", router, table)
	}
	if ratio, err := strconv.ParseFloat(router[6], 64); err != nil || ratio <= 0 {
		t.Errorf("router's median ratio to the proxy %q: want a positive number (%v)", router[6], err)
	}
}

// TestMedianOf: the middle value, or the mean of the two middle ones.
func TestMedianOf(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		v    []float64
		want string
	}{
		{nil, ""},
		{[]float64{3}, "3.00"},
		{[]float64{5, 1, 3}, "3.00"},
		{[]float64{4, 1, 3, 2}, "2.50"},
	} {
		if got := medianOf(tt.v, "%.2f"); got != tt.want {
			t.Errorf("medianOf(%v) = %q, want %q", tt.v, got, tt.want)
		}
	}
}

// TestBenchLoadConfigFile: --config.file reaches the router's own process through the
// mode's child process: a file whose prompt limit every request is over has them all
// refused there, with the router's reason.
func TestBenchLoadConfigFile(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three processes")
	}
	t.Parallel()
	file := filepath.Join(t.TempDir(), "mantle.yaml")
	yaml := "router:\n  max_prompt_bytes: 8\n  routes: [{name: chat, candidates: [" + benchload.ModelName + "]}]\n"
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	args := []string{"--modes", "router", "--rates", "40", "--duration", "250ms", "--warmup", "0s", "--format", "json", "--config.file", file}
	if err := benchLoad(context.Background(), args, testEnv(&stdout, &stderr)); err != nil {
		t.Fatalf("bench-load: %v\n%s", err, stderr.String())
	}
	var res []benchload.Result
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, stdout.String())
	}
	if len(res) != 1 || res[0].OK != 0 || res[0].Errors != 10 || !strings.Contains(res[0].FirstError, "max_prompt_bytes") {
		t.Errorf("results %+v, want all 10 requests refused for the file's max_prompt_bytes", res)
	}
	// The file's routes are replaced, and the benchmark says so.
	if want := "router mode: the benchmark replaces router.routes from " + file; !strings.Contains(stderr.String(), want) {
		t.Errorf("stderr %q, want it to say %q", stderr.String(), want)
	}
}
