package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/router"
)

func TestRunUsage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		// code is the exit code: 0 when help was asked for, 2 for a wrong command line.
		code       int
		wantStdout []string
		wantStderr []string
	}{
		{"no args", nil, 2, nil, []string{"usage: mantle <command> [flags]", "serve", "dev", "sim", "chat", "version"}},
		{"help", []string{"help"}, 0, []string{"usage: mantle <command> [flags]"}, nil},
		{"-h", []string{"-h"}, 0, []string{"usage: mantle <command> [flags]"}, nil},
		{"--help", []string{"--help"}, 0, []string{"usage: mantle <command> [flags]"}, nil},
		{"unknown command", []string{"frobnicate", "--x"}, 2, nil, []string{`mantle: unknown command "frobnicate"`, "usage: mantle <command> [flags]"}},
		{"command help", []string{"serve", "-h"}, 0, nil, []string{"-config.file", "-print-config", "-target"}},
		{"unknown flag", []string{"serve", "--frobnicate"}, 2, nil, []string{"flag provided but not defined: -frobnicate"}},
		{"review without a command", []string{"review"}, 2, nil, []string{"usage: mantle review"}},
		{"review help", []string{"review", "help"}, 0, nil, []string{"usage: mantle review"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			if code := run(context.Background(), tt.args, testEnv(&stdout, &stderr)); code != tt.code {
				t.Errorf("run(%q) = %d, want %d (stderr %q)", tt.args, code, tt.code, stderr.String())
			}
			for _, w := range []struct {
				name string
				got  string
				want []string
			}{{"stdout", stdout.String(), tt.wantStdout}, {"stderr", stderr.String(), tt.wantStderr}} {
				if len(w.want) == 0 && w.got != "" {
					t.Errorf("%s = %q, want nothing", w.name, w.got)
				}
				for _, want := range w.want {
					if !strings.Contains(w.got, want) {
						t.Errorf("%s does not contain %q:\n%s", w.name, want, w.got)
					}
				}
			}
		})
	}
}

// TestBenchLoadHidesInternalFlags holds bench-load's help to the flags a user sets: the
// flags the command passes to its own child processes are not listed.
func TestBenchLoadHidesInternalFlags(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"bench-load", "-h"}, testEnv(&stdout, &stderr)); code != 0 {
		t.Fatalf("bench-load -h = %d, want 0", code)
	}
	help := stderr.String()
	for _, want := range []string{"-modes", "-rates", "-duration"} {
		if !strings.Contains(help, want) {
			t.Errorf("help does not list %s:\n%s", want, help)
		}
	}
	for _, hidden := range []string{"-child", "-serve-hop", "-upstream", "internal:"} {
		if strings.Contains(help, hidden) {
			t.Errorf("help lists the internal %s:\n%s", hidden, help)
		}
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"version"}, testEnv(&stdout, &stderr)); code != 0 {
		t.Fatalf("version = %d, want 0 (stderr %q)", code, stderr.String())
	}
	out := stdout.String()
	// A test binary has build info with the module path and the Go version; the commit is
	// known only to binaries built from a checkout, so it is not asserted here.
	for _, want := range []string{"mantle ", runtime.Version(), "github.com/mantle-mesh/mantle"} {
		if !strings.Contains(out, want) {
			t.Errorf("version output does not contain %q:\n%s", want, out)
		}
	}
	if code := run(context.Background(), []string{"version", "extra"}, testEnv(&stdout, &stderr)); code != 2 {
		t.Errorf("version extra = %d, want 2", code)
	}
}

func TestServePrintConfig(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"serve", "--print-config", "-log.level=debug", "-target=cache"}, testEnv(&stdout, &stderr))
	if code != 0 {
		t.Fatalf("run = %d, stderr:\n%s", code, stderr.String())
	}
	got := mesh.Config{}
	if err := got.Decode(&stdout); err != nil {
		t.Fatalf("printed config does not decode: %v", err)
	}
	want := mesh.Default()
	want.Log.Level, want.Target = "debug", "cache"
	if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("printed config (-want +got):\n%s", diff)
	}
}

func TestServeRejectsInvalidConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, doc string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	models := "router:\n  providers: [{name: p, type: sim, timeout: 1s}]\n  models: [{name: m, provider: p}]\n"
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"defaults have no models", nil, []string{"invalid configuration", "router.models: at least one model is required"}},
		{"bad log level", []string{"-config.file", write("level.yaml", models+"log: {level: loud}\n")}, []string{`log.level: want debug, info, warn or error, got "loud"`}},
		{"bad flag value", []string{"-config.file", write("ok.yaml", models), "-log.format=xml"}, []string{`log.format: want json or text, got "xml"`}},
		{"unknown key", []string{"-config.file", write("typo.yaml", "servre: {}\n")}, []string{"typo.yaml", "field servre not found"}},
		{"unknown target", []string{"-target=routr"}, []string{`unknown module "routr"`}},
		{"missing dependency address", []string{"-config.file", write("router.yaml", models), "-target=router"}, []string{"router needs", "_address"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			err := serve(context.Background(), tt.args, testEnv(&stdout, &stderr))
			if err == nil {
				t.Fatal("serve = nil, want an error")
			}
			for _, want := range tt.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error does not contain %q:\n%v", want, err)
				}
			}
		})
	}

	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"serve", "-log.level=loud"}, testEnv(&stdout, &stderr)); code != 1 {
		t.Errorf("run(serve) with an invalid config = %d, want 1", code)
	}
	if !strings.HasPrefix(stderr.String(), "mantle serve: invalid configuration") {
		t.Errorf("stderr = %q, want it to start with the command and the error", stderr.String())
	}
}

func TestDevConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name           string
		env            map[string]string
		wantCandidates []string
		wantBudget     time.Duration
		wantOpenAI     *router.ProviderConfig
	}{
		{
			name:           "sim only",
			wantCandidates: []string{"primary", "backup"},
			wantBudget:     15 * time.Second,
		},
		{
			name:           "real model first",
			env:            map[string]string{"OPENAI_API_KEY": "sk-real-secret"},
			wantCandidates: []string{"gpt-4o-mini", "primary", "backup"},
			wantBudget:     30 * time.Second,
			wantOpenAI: &router.ProviderConfig{Name: "openai", Type: router.ProviderOpenAI,
				Keys: []router.KeyConfig{{ID: "env", Env: "OPENAI_API_KEY"}}, Timeout: 20 * time.Second},
		},
		{
			name:           "model and base URL from the environment",
			env:            map[string]string{"OPENAI_API_KEY": "sk-real-secret", "OPENAI_MODEL": "deepseek-chat", "OPENAI_BASE_URL": "https://api.deepseek.com/v1"},
			wantCandidates: []string{"deepseek-chat", "primary", "backup"},
			wantBudget:     30 * time.Second,
			wantOpenAI: &router.ProviderConfig{Name: "openai", Type: router.ProviderOpenAI, BaseURL: "https://api.deepseek.com/v1",
				Keys: []router.KeyConfig{{ID: "env", Env: "OPENAI_API_KEY"}}, Timeout: 20 * time.Second},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := devConfig("flaky", func(k string) string { return tt.env[k] })
			if err := cfg.Validate(); err != nil {
				t.Fatalf("devConfig does not validate: %v", err)
			}
			if len(cfg.Router.Routes) != 1 || cfg.Router.Routes[0].Name != "chat" {
				t.Fatalf("routes = %+v, want one route named chat", cfg.Router.Routes)
			}
			chat := cfg.Router.Routes[0]
			if diff := cmp.Diff(tt.wantCandidates, chat.Candidates); diff != "" {
				t.Errorf("chat candidates (-want +got):\n%s", diff)
			}
			if chat.Budget != tt.wantBudget {
				t.Errorf("chat budget = %s, want %s", chat.Budget, tt.wantBudget)
			}
			// The examples must answer from a model on the first try: the route hedges, and
			// its budget leaves room for a failover after any provider's per-try timeout.
			if !chat.Hedge.Enabled {
				t.Error("chat does not hedge")
			}
			// The fallbacks are simulated models: after any provider's timeout, a whole try on
			// the sim provider must still fit.
			fallback := cfg.Router.Providers[0].Timeout
			for _, p := range cfg.Router.Providers {
				if room := chat.Budget - p.Timeout - cfg.Router.HopReserve; room < fallback {
					t.Errorf("provider %s: timeout %s leaves %s of the %s budget, less than a fallback try (%s)", p.Name, p.Timeout, room, chat.Budget, fallback)
				}
			}
			var openai *router.ProviderConfig
			for _, p := range cfg.Router.Providers {
				if p.Name == "openai" {
					openai = &p
				}
			}
			if diff := cmp.Diff(tt.wantOpenAI, openai); diff != "" {
				t.Errorf("openai provider (-want +got):\n%s", diff)
			}
			if cfg.Router.Models[0].SimProfile != "flaky" {
				t.Errorf("primary sim profile = %q, want the one asked for", cfg.Router.Models[0].SimProfile)
			}
			if !cfg.Events.Embedded {
				t.Error("events.embedded = false, want dev to start NATS in process")
			}
			if a, err := rpc.NewAuthenticator(cfg.Auth.Tenants, nil); err != nil {
				t.Errorf("dev tenants: %v", err)
			} else if tenant, ok := a.Authenticate(devKey); !ok || tenant != "dev" {
				t.Errorf("dev key authenticates as %q, %t; want dev", tenant, ok)
			}
			out, err := cfg.YAML()
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(out, []byte("sk-real-secret")) {
				t.Error("the API key's value is in the configuration")
			}
		})
	}
}

func TestChat(t *testing.T) {
	t.Parallel()
	cfg := devConfig("fast", func(string) string { return "" })
	for i := range cfg.Router.Models {
		cfg.Router.Models[i].SimProfile = "fast"
	}
	cfg.Router.Providers[0].SimSeed = 1
	m := meshtest.Start(t, cfg, meshtest.All)

	// Without a temperature the answer is not cached, so every question reaches primary.
	answered := regexp.MustCompile(`^-- model=primary level=primary cache=miss quality=[a-z]+ attempts=1 ` +
		`tokens=[1-9]\d*\+[1-9]\d* cost=\$\d+\.\d{6} latency=\d\S*s mantle=[1-9]\S*s upstream=\d\S*s request=req_[0-9a-f]{24}$`)
	tests := []struct {
		name        string
		args        []string
		wantCode    int
		wantSummary *regexp.Regexp
		wantStderr  string
	}{
		{"unary", []string{"What does mantle do?"}, 0, answered, ""},
		{"stream", []string{"--stream", "--system", "be brief", "Why route requests?"}, 0, answered, ""},
		{"wrong key", []string{"--key", "sk-wrong", "hi"}, 1, nil, "Unauthenticated: invalid API key [UNAUTHENTICATED]"},
		{"unknown model", []string{"--model", "gpt-9", "hi"}, 1, nil, `NotFound: unknown model or route "gpt-9" [UNKNOWN_ROUTE]`},
		{"no question", nil, 1, nil, "usage: mantle chat"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"chat", "--addr", m.GRPCAddr, "--key", devKey}, tt.args...)
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), args, testEnv(&stdout, &stderr))
			if code != tt.wantCode {
				t.Fatalf("run(%q) = %d, want %d; stderr:\n%s", args, code, tt.wantCode, stderr.String())
			}
			if tt.wantStderr != "" && !strings.Contains(stderr.String(), tt.wantStderr) {
				t.Errorf("stderr = %q, want it to contain %q", stderr.String(), tt.wantStderr)
			}
			if tt.wantSummary == nil {
				return
			}
			lines := strings.Split(strings.TrimRight(stdout.String(), "\n"), "\n")
			if len(lines) < 2 || strings.TrimSpace(strings.Join(lines[:len(lines)-1], "\n")) == "" {
				t.Fatalf("stdout = %q, want the answer then the summary line", stdout.String())
			}
			if last := lines[len(lines)-1]; !tt.wantSummary.MatchString(last) {
				t.Errorf("summary line = %q, want it to match %s", last, tt.wantSummary)
			}
		})
	}
}

// testEnv is a command's process in a test: the given streams and an empty environment,
// so that no variable set on the machine changes what a test sees.
func testEnv(stdout, stderr io.Writer) cmdEnv {
	return cmdEnv{stdout: stdout, stderr: stderr, getenv: func(string) string { return "" }}
}
