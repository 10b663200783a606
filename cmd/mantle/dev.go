//go:build !nolab

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mantle-mesh/mantle/pkg/natsembed"

	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/pkg/sim"
	"github.com/mantle-mesh/mantle/pkg/tlsconfig"
	"github.com/mantle-mesh/mantle/services/router"
)

// devKey is the API key of the development tenant, devOperatorKey the development
// operator's (`mantle review`, draft rule approval, DescribeRoutes). They only exist in
// `mantle dev`, which listens on loopback; its modules call each other with a mesh secret
// the process makes up at start.
func dev(ctx context.Context, args []string, env cmdEnv) error {
	stdout, stderr := env.stdout, env.stderr
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	fs.SetOutput(stderr)
	grpcAddr := fs.String("grpc", "127.0.0.1:9090", "gRPC address (a free port is used when it is taken)")
	httpAddr := fs.String("http", "127.0.0.1:8080", "HTTP address (a free port is used when it is taken)")
	profile := fs.String("sim-profile", "healthy", "sim profile of the primary model: "+strings.Join(sim.ProfileNames(), ", "))
	logLevel := fs.String("log.level", "warn", "log level")
	tracing := fs.Bool("tracing.enabled", false, "export spans over OTLP/gRPC (docker compose up jaeger, then http://127.0.0.1:16686)")
	otlp := fs.String("tracing.otlp-endpoint", "127.0.0.1:4317", "host:port of the OTLP/gRPC collector")
	withTLS := fs.Bool("tls", false, "serve gRPC and HTTP over TLS with a throwaway CA written to a temporary directory (removed on exit)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg := devConfig(*profile, env.getenv)
	cfg.Server.GRPCListenAddress = freeOr(*grpcAddr)
	cfg.Server.HTTPListenAddress = freeOr(*httpAddr)
	cfg.Server.GRPCReflection = true // for grpcurl, with the operator key below
	cfg.Log = mesh.LogConfig{Level: *logLevel, Format: "text"}
	// Off unless asked: most dev sessions have no collector, and the exporter would log
	// every failed flush. A collector on this machine speaks plaintext.
	cfg.Tracing.Enabled, cfg.Tracing.OTLPEndpoint, cfg.Tracing.Insecure = *tracing, *otlp, true
	if *withTLS {
		dir, err := os.MkdirTemp("", "mantle-dev-tls-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if cfg.TLS, err = devTLS(dir); err != nil {
			return err
		}
	}
	p, err := mesh.Start(ctx, cfg, mesh.Options{LogOutput: stderr, TuneRuntime: true, RouteLibraryLogs: true, EmbeddedNATS: natsembed.Launch, Getenv: env.getenv})
	if err != nil {
		return err
	}
	printDevBanner(stdout, p.App.GRPCAddr(), p.App.HTTPAddr(), cfg)
	return p.Run(ctx)
}

// devConfig is the configuration of `mantle dev`: every module in one process, embedded
// NATS, in-memory stores, three simulated models behind the "chat" route, and a real
// OpenAI-compatible model in front of them when OPENAI_API_KEY is set.
func devConfig(primaryProfile string, getenv func(string) string) mesh.Config {
	cfg := mesh.Default()
	cfg.Events.Embedded = true
	cfg.Auth.Tenants = []rpc.TenantKey{{ID: "dev", KeySHA256: rpc.HashKey(devKey)}}
	cfg.Auth.Operators = []rpc.TenantKey{{ID: "dev-operator", KeySHA256: rpc.HashKey(devOperatorKey)}}
	r := &cfg.Router
	// The simulated primary answers like a typical model (P99 8.5 s): a 4 s per-try timeout
	// inside a 15 s budget, with hedging after the primary's p95, leaves room to fail over,
	// so the examples answer from a model on the first try instead of from the ladder.
	r.Providers = []router.ProviderConfig{{Name: "sim", Type: router.ProviderSim, Timeout: 4 * time.Second, SimProfile: "fast", SimSeed: time.Now().UnixNano()}}
	r.Models = []router.ModelConfig{
		{Name: "primary", Provider: "sim", SimProfile: primaryProfile, ContextWindow: 128000, InputPricePerMillion: 2.5, OutputPricePerMillion: 10},
		{Name: "backup", Provider: "sim", SimProfile: "fast", ContextWindow: 64000, InputPricePerMillion: 0.5, OutputPricePerMillion: 1.5,
			FormatStability: 0.95, AcceptsPrefill: true},
		{Name: "small", Provider: "sim", SimProfile: "fast", ContextWindow: 32000, InputPricePerMillion: 0.15, OutputPricePerMillion: 0.6},
	}
	chat := router.RouteConfig{
		Name: "chat", Scenario: "chat", Candidates: []string{"primary", "backup"}, Budget: 15 * time.Second,
		Hedge: router.HedgeConfig{Enabled: true},
		Ladder: router.LadderConfig{
			Smaller:  []string{"small"},
			Cache:    true,
			Template: "Our assistant is busy right now. We have noted your question and will get back to you.",
		},
	}
	if getenv("OPENAI_API_KEY") != "" {
		model := getenv("OPENAI_MODEL")
		if model == "" {
			model = "gpt-4o-mini"
		}
		r.Providers = append(r.Providers, router.ProviderConfig{
			Name: "openai", Type: router.ProviderOpenAI, BaseURL: getenv("OPENAI_BASE_URL"),
			Keys: []router.KeyConfig{{ID: "env", Env: "OPENAI_API_KEY"}}, Timeout: 20 * time.Second,
		})
		r.Models = append(r.Models, router.ModelConfig{Name: model, Provider: "openai"})
		chat.Candidates = append([]string{model}, chat.Candidates...)
		chat.Budget = 30 * time.Second
	}
	r.Routes = []router.RouteConfig{chat}
	return cfg
}

// devTLS writes a throwaway CA and certificates into dir and returns the tls block of a
// dev process: it runs every module, so it presents the router's certificate, and its
// listeners take callers with or without a certificate (tenants have none).
func devTLS(dir string) (tlsconfig.Config, error) {
	if err := tlsconfig.WriteDevPKI(dir, tlsconfig.DevServices, time.Now(), 7*24*time.Hour); err != nil {
		return tlsconfig.Config{}, err
	}
	return tlsconfig.Config{
		CertFile:       filepath.Join(dir, "router.crt"),
		KeyFile:        filepath.Join(dir, "router.key"),
		CAFile:         filepath.Join(dir, "ca.crt"),
		GRPCClientAuth: tlsconfig.ClientAuthVerifyIfGiven,
		HTTPClientAuth: tlsconfig.ClientAuthVerifyIfGiven,
	}, nil
}

// freeOr returns addr when it can be bound now, and a free loopback port otherwise, so
// `mantle dev` starts even where 9090 or 8080 are taken.
func freeOr(addr string) string {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return "127.0.0.1:0"
	}
	l.Close()
	return addr
}

func printDevBanner(w io.Writer, grpcAddr, httpAddr string, cfg mesh.Config) {
	var models []string
	for _, m := range cfg.Router.Models {
		models = append(models, m.Name)
	}
	chatFlag := ""
	if grpcAddr != "127.0.0.1:9090" {
		chatFlag = " --addr " + grpcAddr
	}
	// Plaintext, or TLS with the throwaway CA: each client is told how to trust it.
	scheme, grpcurlTLS, curlTLS, pythonEnv, security := "http", "-plaintext", "", "", "plaintext"
	if ca := cfg.TLS.CAFile; ca != "" {
		scheme, grpcurlTLS, curlTLS, pythonEnv = "https", "-cacert "+ca, " --cacert "+ca, "SSL_CERT_FILE="+ca+" "
		chatFlag += " --tls.ca-file " + ca
		security = "TLS; CA " + ca + ", service certificates beside it (removed on exit)"
	}
	fmt.Fprintf(w, `mantle dev is running: router, cache, quota and verifier in one process.

  gRPC     %[1]s   (reflection on, for the operator key: grpcurl needs no proto files)
  HTTP     %[6]s://%[2]s   (OpenAI-compatible /v1, /metrics, /healthz, /readyz)
  models   %[3]s; route "chat" tries them in order
  API key  %[4]s  (tenant "dev"); operator key %[11]s (mantle review)
  security %[10]s

Try it:

grpcurl %[7]s -reflect-header 'authorization: Bearer %[11]s' -rpc-header 'authorization: Bearer %[4]s' -d '{"request":{"model":"chat","messages":[{"role":"user","content":"What does mantle do?"}]}}' %[1]s mantle.router.v1.RouterService/Complete

curl -s%[8]s %[6]s://%[2]s/v1/chat/completions -H 'Authorization: Bearer %[4]s' -H 'Content-Type: application/json' -d '{"model":"chat","messages":[{"role":"user","content":"What does mantle do?"}]}'

%[9]spython3 -c 'from openai import OpenAI; c = OpenAI(base_url="%[6]s://%[2]s/v1", api_key="%[4]s"); print(c.chat.completions.create(model="chat", messages=[{"role": "user", "content": "What does mantle do?"}]).choices[0].message.content)'

or: go run ./cmd/mantle chat%[5]s "What does mantle do?"

Press Ctrl-C to stop.
`, grpcAddr, httpAddr, strings.Join(models, ", "), devKey, chatFlag, scheme, grpcurlTLS, curlTLS, pythonEnv, security, devOperatorKey)
}
