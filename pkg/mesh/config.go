// Package mesh is mantle's composition root: the one YAML configuration with a block per
// service, the list of modules the binary can run, and the wiring of process-wide
// collaborators (logger, metrics registry, events, authentication) around pkg/app.
package mesh

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/mantle-mesh/mantle/pkg/app"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/pkg/telemetry"
	"github.com/mantle-mesh/mantle/pkg/tlsconfig"
	"github.com/mantle-mesh/mantle/services/agent"
	"github.com/mantle-mesh/mantle/services/cache"
	"github.com/mantle-mesh/mantle/services/quota"
	"github.com/mantle-mesh/mantle/services/router"
	"github.com/mantle-mesh/mantle/services/verifier"
)

// Config is mantle.yaml. Precedence: defaults, then the file, then flags. Unknown keys
// are errors. Secrets are never in it: keys come from environment variables it names.
type Config struct {
	// Target is the modules to run: all, or a comma list of router, cache, quota,
	// verifier and agent.
	Target string `yaml:"target"`
	// Server is the process's listeners, shared by every module it runs.
	Server ServerConfig `yaml:"server"`
	// TLS secures both listeners and the calls to modules in other processes; see
	// docs/security.md.
	TLS tlsconfig.Config `yaml:"tls"`
	// Auth lists tenants and their API keys.
	Auth AuthConfig `yaml:"auth"`
	// Events says where events go: subjects mantle.events.<kind> on NATS, kept in the
	// JetStream stream MANTLE_EVENTS for 7 days.
	Events EventsConfig `yaml:"events"`
	// Log configures the process logger.
	Log LogConfig `yaml:"log"`
	// Runtime tunes the Go runtime of mantle serve and mantle dev.
	Runtime RuntimeConfig `yaml:"runtime"`
	// Tracing exports OpenTelemetry spans.
	Tracing telemetry.TracingConfig `yaml:"tracing"`
	// Router is the router module: limits, its dependencies, providers, models and routes.
	// docs/resilience.md explains retries, budgets, breakers, hedging and the ladder.
	Router router.Config `yaml:"router"`
	// Cache is the semantic cache module. services/cache/README.md explains how a lookup
	// decides, the thresholds, coalescing, the two backends, and what the built-in lexical
	// embedder can and cannot match (it measures shared wording, not meaning).
	Cache cache.Config `yaml:"cache"`
	// Quota is the quota module: rate limits, money budgets, the wait queue and the
	// mesh-wide retry budget. How quota decides, its Redis layout and its priority queue
	// are in docs/quota.md.
	Quota quota.Config `yaml:"quota"`
	// Verifier is the verifier module: L1 checks, L2 rules, risk scoring, human review and
	// the L3 semantic checks, explained in docs/verification.md. Fractions are 0 to 1; a
	// scenario's overrides go under scenarios.<name>.
	Verifier verifier.Config `yaml:"verifier"`
	// Agent is the agent module: the tool gateway (a registry of typed tools: query,
	// action, external) and agent sessions, explained in docs/agents.md.
	Agent agent.Config `yaml:"agent"`
}

// ServerConfig is the process's listeners.
type ServerConfig struct {
	// GRPCListenAddress is the gRPC listener shared by every module, with health (and
	// reflection with grpc_reflection).
	GRPCListenAddress string `yaml:"grpc_listen_address"`
	// HTTPListenAddress is the HTTP listener: /metrics, /healthz, /readyz, and the router's
	// OpenAI API under /v1.
	HTTPListenAddress string `yaml:"http_listen_address"`
	// DebugListenAddress serves Go's profiler (/debug/pprof/) and runtime variables
	// (/debug/vars: memory statistics, command line) on a listener of its own, for
	// operators only; empty (the default) turns it off. With authentication on, every
	// request needs an operator key (Authorization: Bearer); with the tls block, it speaks
	// TLS with the process certificate. An address without a host (":6060") is bound to
	// 127.0.0.1. See docs/operations.md.
	DebugListenAddress string `yaml:"debug_listen_address"`
	// MetricsOnDebugListener serves /metrics on the debug listener instead of the public
	// HTTP one: the metrics name tenants, models and keys, so a deployment whose HTTP
	// listener faces tenants keeps them for operators and the scraper. Needs
	// debug_listen_address.
	MetricsOnDebugListener bool `yaml:"metrics_on_debug_listener,omitempty"`
	// GRPCReflection serves gRPC reflection on the gRPC listener, so that grpcurl can list
	// services and call methods without proto files. Only operator keys may use it (a
	// tenant key is refused): it maps every method of every service. Off by default;
	// mantle dev turns it on.
	GRPCReflection bool `yaml:"grpc_reflection,omitempty"`
	// GracefulShutdownTimeout is how long in-flight calls may drain after SIGTERM.
	GracefulShutdownTimeout time.Duration `yaml:"graceful_shutdown_timeout"`
	// ShutdownDelay is how long to keep serving after readiness turns off, so that load
	// balancers notice before the listeners close (a few seconds on Kubernetes; 0 in
	// development).
	ShutdownDelay time.Duration `yaml:"shutdown_delay"`
	// MaxMessageBytes is the largest gRPC message received (at least 1 MiB). Prompts are
	// bounded separately by router.max_prompt_bytes, so that oversized ones get a clear
	// INVALID_ARGUMENT.
	MaxMessageBytes int `yaml:"max_message_bytes"`
	// ReadHeaderTimeout is how long an HTTP client may take to send a request's headers.
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"`
	// BodyReadTimeout is how long an HTTP client may then take to send the request's body;
	// a slower one is cut off. The deadline is lifted once the body is read, so streamed
	// answers are not cut.
	BodyReadTimeout time.Duration `yaml:"body_read_timeout"`
	// IdleTimeout closes a keep-alive HTTP connection with no request for this long.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxHeaderBytes is the largest HTTP request header block accepted (at least 4096),
	// request line included. A larger one gets 431 in the door's error shape (Anthropic's
	// under /v1/messages, OpenAI's elsewhere); past four times this, net/http answers a
	// plain-text 431 itself, before any handler.
	MaxHeaderBytes int `yaml:"max_header_bytes"`
}

// AuthConfig says who may call: tenants and operators by hashed API keys, mesh services
// by a shared secret. With neither tenants nor operators authentication is off, which is
// allowed only on loopback listeners or with Disabled set.
type AuthConfig struct {
	// Tenants are the tenants and their keys (docs/security.md). With neither tenants nor
	// operators, authentication is off, which a listener other hosts can reach refuses
	// unless disabled is set.
	Tenants []rpc.TenantKey `yaml:"tenants"`
	// Operators are operator keys, {id, key_env | key_sha256}: they call the operator plane
	// (DecideDraftRule, ReloadRules, DescribeRoutes) and see every tenant's reviews.
	Operators []rpc.TenantKey `yaml:"operators"`
	// MeshSecretEnv names the environment variable holding the secret mesh services
	// present to each other (at least 32 bytes, the same in every process). Required, or
	// mesh_secret_file, when authentication is on and modules run in separate processes; a
	// process that runs every module makes one up.
	MeshSecretEnv string `yaml:"mesh_secret_env"`
	// MeshSecretFile is a file holding the mesh secret instead (surrounding whitespace is
	// dropped); not together with mesh_secret_env.
	MeshSecretFile string `yaml:"mesh_secret_file"`
	// Disabled turns authentication off on purpose, also on listeners other hosts can
	// reach; logged at warn. An error together with tenants or operators.
	Disabled bool `yaml:"disabled"`
}

// EventsConfig says where events go.
type EventsConfig struct {
	// NATSURL is a NATS server with JetStream. Events go to the subjects
	// mantle.events.<kind> and the stream MANTLE_EVENTS (7 days). With neither nats_url
	// nor embedded set, events are off.
	NATSURL string `yaml:"nats_url"`
	// Embedded starts an in-process NATS server with JetStream instead, for mantle dev and
	// the drills: target all only, not together with nats_url, and its JetStream data (review
	// queue, idempotency records, rules) is deleted at shutdown. mantle serve refuses it.
	Embedded bool `yaml:"embedded"`
	// TLS secures the connection to nats_url; every reconnection reads the current files.
	TLS tlsconfig.ClientConfig `yaml:"tls"`
}

// LogConfig configures the process logger.
type LogConfig struct {
	// Level is debug, info, warn or error.
	Level string `yaml:"level"`
	// Format is json or text.
	Format string `yaml:"format"`
	// DebugBodies logs prompt and answer bodies (attributes named in logredact.BodyKeys),
	// with API keys redacted. Off, they never reach the logs; secrets never do either way.
	DebugBodies bool `yaml:"debug_bodies"`
}

// Default returns the built-in defaults.
func Default() Config {
	return Config{
		Target: "all",
		Server: ServerConfig{
			GRPCListenAddress:       "127.0.0.1:9090",
			HTTPListenAddress:       "127.0.0.1:8080",
			GracefulShutdownTimeout: 15 * time.Second,
			MaxMessageBytes:         16 << 20,
			ReadHeaderTimeout:       app.DefaultHTTPLimits().ReadHeaderTimeout,
			BodyReadTimeout:         app.DefaultHTTPLimits().BodyReadTimeout,
			IdleTimeout:             app.DefaultHTTPLimits().IdleTimeout,
			MaxHeaderBytes:          app.DefaultHTTPLimits().MaxHeaderBytes,
		},
		Log:      LogConfig{Level: "info", Format: "json"},
		Runtime:  DefaultRuntimeConfig(),
		Tracing:  telemetry.DefaultTracingConfig(),
		Router:   router.DefaultConfig(),
		Cache:    cache.DefaultConfig(),
		Quota:    quota.DefaultConfig(),
		Verifier: verifier.DefaultConfig(),
		Agent:    agent.DefaultConfig(),
	}
}

// Decode applies a YAML document on top of c, strictly.
func (c *Config) Decode(r io.Reader) error {
	dec := yaml.NewDecoder(r)
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("config: %w", err)
	}
	return nil
}

// Flags registers the command-line overrides; Apply copies the ones that were set.
type Flags struct {
	fs                            *flag.FlagSet
	File                          string
	PrintConfig                   bool
	target, grpcAddr, httpAddr    string
	natsURL, logLevel, logFormat  string
	logDebugBodies                bool
	quotaAddr, cacheAddr, verAddr string
	agentAddr                     string
	tracingEnabled                bool
	otlpEndpoint                  string
	tlsCert, tlsKey, tlsCA        string
	tlsGRPCAuth, tlsHTTPAuth      string
	tlsServerName                 string
}

// RegisterFlags adds mantle's configuration flags to fs.
func RegisterFlags(fs *flag.FlagSet) *Flags {
	f := &Flags{fs: fs}
	fs.StringVar(&f.File, "config.file", "", "YAML configuration file")
	fs.BoolVar(&f.PrintConfig, "print-config", false, "print the effective configuration and exit")
	fs.StringVar(&f.target, "target", "", "modules to run: all, or a comma list of router,cache,quota,verifier,agent")
	fs.StringVar(&f.grpcAddr, "server.grpc-listen-address", "", "gRPC listen address")
	fs.StringVar(&f.httpAddr, "server.http-listen-address", "", "HTTP listen address (metrics, health, OpenAI API)")
	fs.StringVar(&f.natsURL, "events.nats-url", "", "NATS URL for events")
	fs.StringVar(&f.logLevel, "log.level", "", "log level: debug, info, warn, error")
	fs.StringVar(&f.logFormat, "log.format", "", "log format: json or text")
	fs.BoolVar(&f.logDebugBodies, "log.debug-bodies", false, "log prompt and answer bodies, API keys redacted (log.debug_bodies)")
	fs.StringVar(&f.quotaAddr, "router.quota-address", "", "quota service address when not in this process")
	fs.StringVar(&f.cacheAddr, "router.cache-address", "", "cache service address when not in this process")
	fs.StringVar(&f.verAddr, "router.verifier-address", "", "verifier service address when not in this process")
	fs.StringVar(&f.agentAddr, "router.agent-address", "", "agent service address when not in this process")
	fs.BoolVar(&f.tracingEnabled, "tracing.enabled", false, "export OpenTelemetry spans over OTLP/gRPC (tracing.enabled)")
	fs.StringVar(&f.otlpEndpoint, "tracing.otlp-endpoint", "", "host:port of the OTLP/gRPC collector (tracing.otlp_endpoint)")
	fs.StringVar(&f.tlsCert, "tls.cert-file", "", "this process's certificate, PEM (tls.cert_file); turns TLS on")
	fs.StringVar(&f.tlsKey, "tls.key-file", "", "its private key, PEM (tls.key_file)")
	fs.StringVar(&f.tlsCA, "tls.ca-file", "", "the mesh CA bundle, PEM (tls.ca_file)")
	fs.StringVar(&f.tlsGRPCAuth, "tls.grpc-client-auth", "", "client certificates on the gRPC listener: require, verify_if_given or none (tls.grpc_client_auth)")
	fs.StringVar(&f.tlsHTTPAuth, "tls.http-client-auth", "", "client certificates on the HTTP listener: require, verify_if_given or none (tls.http_client_auth)")
	fs.StringVar(&f.tlsServerName, "tls.server-name", "", "name expected in the certificates of the services dialled (tls.server_name)")
	return f
}

// Apply copies flags that were set on the command line onto c.
func (f *Flags) Apply(c *Config) {
	set := map[string]bool{}
	f.fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	apply := func(name string, dst *string, v string) {
		if set[name] {
			*dst = v
		}
	}
	apply("target", &c.Target, f.target)
	apply("server.grpc-listen-address", &c.Server.GRPCListenAddress, f.grpcAddr)
	apply("server.http-listen-address", &c.Server.HTTPListenAddress, f.httpAddr)
	apply("events.nats-url", &c.Events.NATSURL, f.natsURL)
	apply("log.level", &c.Log.Level, f.logLevel)
	apply("log.format", &c.Log.Format, f.logFormat)
	if set["log.debug-bodies"] {
		c.Log.DebugBodies = f.logDebugBodies
	}
	apply("router.quota-address", &c.Router.QuotaAddress, f.quotaAddr)
	apply("router.cache-address", &c.Router.CacheAddress, f.cacheAddr)
	apply("router.verifier-address", &c.Router.VerifierAddress, f.verAddr)
	apply("router.agent-address", &c.Router.AgentAddress, f.agentAddr)
	apply("tracing.otlp-endpoint", &c.Tracing.OTLPEndpoint, f.otlpEndpoint)
	if set["tracing.enabled"] {
		c.Tracing.Enabled = f.tracingEnabled
	}
	apply("tls.cert-file", &c.TLS.CertFile, f.tlsCert)
	apply("tls.key-file", &c.TLS.KeyFile, f.tlsKey)
	apply("tls.ca-file", &c.TLS.CAFile, f.tlsCA)
	apply("tls.server-name", &c.TLS.ServerName, f.tlsServerName)
	if set["tls.grpc-client-auth"] {
		c.TLS.GRPCClientAuth = tlsconfig.ClientAuth(f.tlsGRPCAuth)
	}
	if set["tls.http-client-auth"] {
		c.TLS.HTTPClientAuth = tlsconfig.ClientAuth(f.tlsHTTPAuth)
	}
}

// Load builds the effective configuration: defaults, then the file (if any), then flags.
func Load(f *Flags) (Config, error) {
	c := Default()
	if f.File != "" {
		var err error
		if c, err = LoadFile(f.File); err != nil {
			return c, err
		}
	}
	f.Apply(&c)
	return c, nil
}

// LoadFile is the configuration of the YAML file at path over the defaults.
func LoadFile(path string) (Config, error) {
	c := Default()
	data, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("config.file: %w", err)
	}
	if err := c.Decode(bytes.NewReader(data)); err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Targets splits the target list.
func (c Config) Targets() []string {
	var out []string
	for _, t := range strings.Split(c.Target, ",") {
		if t = strings.TrimSpace(t); t != "" {
			out = append(out, t)
		}
	}
	return out
}

// Addresses maps module names to the addresses they are dialled at when remote.
func (c Config) Addresses() map[string]string {
	return map[string]string{
		"quota":    c.Router.QuotaAddress,
		"cache":    c.Router.CacheAddress,
		"verifier": c.Router.VerifierAddress,
		"agent":    c.Router.AgentAddress,
	}
}

// Validate checks every block; each message is prefixed with its block so it names the key.
// Blocks of modules that do not run in this process are not checked.
func (c Config) Validate() error {
	var errs []error
	wrap := func(block string, err error) {
		if err == nil {
			return
		}
		for _, line := range strings.Split(err.Error(), "\n") {
			errs = append(errs, fmt.Errorf("%s.%s", block, line))
		}
	}
	if c.Server.GRPCListenAddress == "" {
		errs = append(errs, errors.New("server.grpc_listen_address: required"))
	}
	if c.Server.HTTPListenAddress == "" {
		errs = append(errs, errors.New("server.http_listen_address: required"))
	}
	if c.Server.GracefulShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("server.graceful_shutdown_timeout: must be positive, got %s", c.Server.GracefulShutdownTimeout))
	}
	if c.Server.ShutdownDelay < 0 {
		errs = append(errs, fmt.Errorf("server.shutdown_delay: must not be negative, got %s", c.Server.ShutdownDelay))
	}
	for key, d := range map[string]time.Duration{
		"server.read_header_timeout": c.Server.ReadHeaderTimeout,
		"server.body_read_timeout":   c.Server.BodyReadTimeout,
		"server.idle_timeout":        c.Server.IdleTimeout,
	} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s: must be positive, got %s", key, d))
		}
	}
	if c.Server.MaxHeaderBytes < 4<<10 {
		errs = append(errs, fmt.Errorf("server.max_header_bytes: must be at least 4096, got %d", c.Server.MaxHeaderBytes))
	}
	if c.Server.MaxMessageBytes < 1<<20 {
		errs = append(errs, fmt.Errorf("server.max_message_bytes: must be at least 1 MiB, got %d", c.Server.MaxMessageBytes))
	}
	if !oneOf(c.Log.Level, "debug", "info", "warn", "error") {
		errs = append(errs, fmt.Errorf("log.level: want debug, info, warn or error, got %q", c.Log.Level))
	}
	if !oneOf(c.Log.Format, "json", "text") {
		errs = append(errs, fmt.Errorf("log.format: want json or text, got %q", c.Log.Format))
	}
	wrap("tracing", c.Tracing.Validate())
	wrap("tls", c.TLS.Validate())
	wrap("runtime", c.Runtime.Validate())
	if c.Events.Embedded && c.Events.NATSURL != "" {
		errs = append(errs, errors.New("events: set nats_url or embedded, not both"))
	}
	if c.Events.Embedded && !slices.Equal(c.Targets(), []string{"all"}) {
		// An in-process server is this process's alone: other processes of a split mesh
		// could not reach its review queue or idempotency records.
		errs = append(errs, fmt.Errorf("events.embedded: only with target all (got %q); a split mesh needs events.nats_url", c.Target))
	}
	wrap("events.tls", c.Events.TLS.Validate())
	if c.Events.TLS.Enabled && c.Events.NATSURL == "" {
		errs = append(errs, errors.New("events.tls: needs nats_url (the embedded server is in-process and plaintext)"))
	}
	if c.runs("cache") && c.Cache.Backend == cache.BackendQdrant && c.Cache.Qdrant.ClientCertificate == cache.QdrantClientCertificateMesh && !c.TLS.Enabled() {
		errs = append(errs, errors.New("cache.qdrant.client_certificate: mesh presents this process's certificate, so it needs the tls block (cert_file, key_file, ca_file)"))
	}
	if c.Server.MetricsOnDebugListener && c.Server.DebugListenAddress == "" {
		errs = append(errs, errors.New("server.metrics_on_debug_listener: needs server.debug_listen_address"))
	}
	errs = append(errs, c.Auth.validate()...)
	errs = append(errs, c.exposure()...)
	runs := c.runs
	if runs("router") {
		wrap("router", c.Router.Validate())
	}
	if runs("cache") {
		wrap("cache", c.Cache.Validate())
	}
	if runs("quota") {
		wrap("quota", c.Quota.Validate())
	}
	if runs("verifier") {
		wrap("verifier", c.Verifier.Validate())
	}
	if runs("agent") {
		wrap("agent", c.Agent.Validate())
	}
	return errors.Join(errs...)
}

// requestServices counts the services on a request's path this process runs: router,
// cache, quota and verifier.
func (c Config) requestServices() int {
	n := 0
	for _, m := range []string{"router", "cache", "quota", "verifier"} {
		if c.runs(m) {
			n++
		}
	}
	return n
}

func (c Config) runs(module string) bool {
	for _, t := range c.Targets() {
		if t == "all" || t == module {
			return true
		}
	}
	return false
}

func oneOf(v string, options ...string) bool {
	for _, o := range options {
		if v == o {
			return true
		}
	}
	return false
}

// YAML renders the configuration (for --print-config).
func (c Config) YAML() ([]byte, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(c); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func (a AuthConfig) validate() []error {
	var errs []error
	ids := map[string]string{}  // id -> where it was first configured
	keys := map[string]string{} // key_sha256 or key_env -> where
	check := func(list string, entries []rpc.TenantKey) {
		for i, t := range entries {
			at := fmt.Sprintf("auth.%s[%d]", list, i)
			switch {
			case t.ID == "":
				errs = append(errs, fmt.Errorf("%s.id: required", at))
			case !rpc.ValidTenantID(t.ID):
				errs = append(errs, fmt.Errorf("%s.id: want 1 to %d characters of [a-z0-9_-], got %q", at, rpc.MaxTenantIDLength, t.ID))
			case ids[list+"/"+t.ID] != "":
				errs = append(errs, fmt.Errorf("%s.id: %q is already %s", at, t.ID, ids[list+"/"+t.ID]))
			default:
				ids[list+"/"+t.ID] = at
			}
			if (t.KeySHA256 == "") == (t.KeyEnv == "") {
				errs = append(errs, fmt.Errorf("%s: set exactly one of key_sha256 or key_env", at))
			}
			for _, k := range []string{"sha256:" + strings.ToLower(t.KeySHA256), "env:" + t.KeyEnv} {
				if k == "sha256:" || k == "env:" {
					continue
				}
				if prev := keys[k]; prev != "" {
					errs = append(errs, fmt.Errorf("%s: the same key as %s (one key, one caller)", at, prev))
				}
				keys[k] = at
			}
		}
	}
	check("tenants", a.Tenants)
	check("operators", a.Operators)
	if a.MeshSecretEnv != "" && a.MeshSecretFile != "" {
		errs = append(errs, errors.New("auth: set mesh_secret_env or mesh_secret_file, not both"))
	}
	if a.Disabled && (len(a.Tenants) > 0 || len(a.Operators) > 0) {
		errs = append(errs, errors.New("auth.disabled: true, but tenants or operators are configured: remove one or the other"))
	}
	return errs
}

// exposure refuses to serve without authentication on a listener other hosts can reach,
// unless auth.disabled says so explicitly.
func (c Config) exposure() []error {
	if c.Auth.Disabled || len(c.Auth.Tenants) > 0 || len(c.Auth.Operators) > 0 {
		return nil
	}
	var errs []error
	for _, l := range []struct{ key, addr string }{
		{"server.grpc_listen_address", c.Server.GRPCListenAddress},
		{"server.http_listen_address", c.Server.HTTPListenAddress},
	} {
		if l.addr != "" && !loopback(l.addr) {
			errs = append(errs, fmt.Errorf("%s: %s is reachable from other hosts and no auth.tenants are configured: configure tenants, listen on 127.0.0.1, or set auth.disabled: true", l.key, l.addr))
		}
	}
	// The debug listener binds loopback when its address names no host; given one, it
	// serves profiles to other hosts, which without authentication anyone may read.
	if addr := c.Server.DebugListenAddress; addr != "" && strings.Contains(addr, ":") && !strings.HasPrefix(addr, ":") && !loopback(addr) {
		errs = append(errs, fmt.Errorf("server.debug_listen_address: %s is reachable from other hosts and no auth.operators are configured: configure operators, give no host (loopback), or set auth.disabled: true", addr))
	}
	return errs
}

// loopback reports whether a listen address accepts connections from this host only.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// meshSecret reads the configured mesh secret ("" when none is configured).
func (a AuthConfig) meshSecret(getenv func(string) string) (string, error) {
	switch {
	case a.MeshSecretEnv != "":
		v := getenv(a.MeshSecretEnv)
		if v == "" {
			return "", fmt.Errorf("auth.mesh_secret_env: environment variable %s is empty", a.MeshSecretEnv)
		}
		return v, nil
	case a.MeshSecretFile != "":
		b, err := os.ReadFile(a.MeshSecretFile)
		if err != nil {
			return "", fmt.Errorf("auth.mesh_secret_file: %w", err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	return "", nil
}
