package mesh_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/pkg/tlsconfig"
	"github.com/mantle-mesh/mantle/services/cache"
	"github.com/mantle-mesh/mantle/services/quota"
	"github.com/mantle-mesh/mantle/services/router"
)

// validConfig is the defaults plus the smallest router block that validates.
func validConfig() mesh.Config {
	c := mesh.Default()
	c.Router.Providers = []router.ProviderConfig{{Name: "sim", Type: router.ProviderSim, Timeout: time.Second}}
	c.Router.Models = []router.ModelConfig{{Name: "m", Provider: "sim"}}
	return c
}

func TestDecodeRejectsUnknownKeys(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		yaml string
		want string
	}{
		{"top level", "bogus: 1\n", "field bogus not found"},
		{"nested", "server:\n  grpc_listen: 127.0.0.1:1\n", "field grpc_listen not found"},
		{"in a list", "router:\n  models:\n    - name: a\n      providr: sim\n", "field providr not found"},
		{"in a service block", "quota:\n  default_limits:\n    rpn: 5\n", "field rpn not found"},
		{"wrong type", "server:\n  graceful_shutdown_timeout: soon\n", "soon"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := mesh.Default()
			err := c.Decode(strings.NewReader(tt.yaml))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Decode(%q) = %v, want an error containing %q", tt.yaml, err, tt.want)
			}
		})
	}
}

func TestDecodeAppliesOnTopOfDefaults(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		yaml   string
		mutate func(*mesh.Config) // what the document changes relative to the defaults
	}{
		{"empty document", "", func(*mesh.Config) {}},
		{"comment only", "# nothing\n", func(*mesh.Config) {}},
		{"one nested key", "log:\n  level: debug\n", func(c *mesh.Config) { c.Log.Level = "debug" }},
		{"tracing block", "tracing:\n  enabled: true\n  otlp_endpoint: jaeger:4317\n  insecure: true\n  sample_ratio: 0.25\n", func(c *mesh.Config) {
			c.Tracing.Enabled, c.Tracing.OTLPEndpoint, c.Tracing.Insecure, c.Tracing.SampleRatio = true, "jaeger:4317", true, 0.25
		}},
		{
			"durations and lists",
			"server:\n  graceful_shutdown_timeout: 3s\nrouter:\n  default_budget: 1m30s\n  routes:\n    - name: chat\n      candidates: [a, b]\n",
			func(c *mesh.Config) {
				c.Server.GracefulShutdownTimeout = 3 * time.Second
				c.Router.DefaultBudget = 90 * time.Second
				c.Router.Routes = []router.RouteConfig{{Name: "chat", Candidates: []string{"a", "b"}}}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := mesh.Default()
			if err := got.Decode(strings.NewReader(tt.yaml)); err != nil {
				t.Fatalf("Decode: %v", err)
			}
			want := mesh.Default()
			tt.mutate(&want)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("Decode(%q) (-want +got):\n%s", tt.yaml, diff)
			}
		})
	}
}

func TestLoadPrecedence(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "mantle.yaml")
	const doc = `
target: cache
server:
  grpc_listen_address: 127.0.0.1:7001
log:
  level: debug
router:
  quota_address: quota-from-file:9090
`
	if err := os.WriteFile(file, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		args   []string
		mutate func(*mesh.Config) // relative to the defaults
	}{
		{"defaults", nil, func(*mesh.Config) {}},
		{"flags without file", []string{"-log.level=warn", "-target=router"}, func(c *mesh.Config) {
			c.Log.Level, c.Target = "warn", "router"
		}},
		{"file over defaults", []string{"-config.file", file}, func(c *mesh.Config) {
			c.Target, c.Server.GRPCListenAddress, c.Log.Level, c.Router.QuotaAddress = "cache", "127.0.0.1:7001", "debug", "quota-from-file:9090"
		}},
		{"flags over file", []string{"-config.file", file, "-log.level", "error", "-router.quota-address", "quota-flag:1", "-server.http-listen-address", "127.0.0.1:7002"}, func(c *mesh.Config) {
			c.Target, c.Server.GRPCListenAddress = "cache", "127.0.0.1:7001" // not set by a flag: the file's
			c.Log.Level, c.Router.QuotaAddress, c.Server.HTTPListenAddress = "error", "quota-flag:1", "127.0.0.1:7002"
		}},
		{"tracing flags", []string{"-config.file", file, "-tracing.enabled", "-tracing.otlp-endpoint=jaeger:4317"}, func(c *mesh.Config) {
			c.Target, c.Server.GRPCListenAddress, c.Log.Level, c.Router.QuotaAddress = "cache", "127.0.0.1:7001", "debug", "quota-from-file:9090"
			c.Tracing.Enabled, c.Tracing.OTLPEndpoint = true, "jaeger:4317"
		}},
		{"every flag", []string{"-config.file", file, "-target=all", "-server.grpc-listen-address=a:1", "-server.http-listen-address=a:2",
			"-events.nats-url=nats://n:4222", "-log.level=warn", "-log.format=text",
			"-router.quota-address=q:1", "-router.cache-address=c:1", "-router.verifier-address=v:1"}, func(c *mesh.Config) {
			c.Target, c.Server.GRPCListenAddress, c.Server.HTTPListenAddress = "all", "a:1", "a:2"
			c.Events.NATSURL, c.Log.Level, c.Log.Format = "nats://n:4222", "warn", "text"
			c.Router.QuotaAddress, c.Router.CacheAddress, c.Router.VerifierAddress = "q:1", "c:1", "v:1"
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fs := flag.NewFlagSet("serve", flag.ContinueOnError)
			flags := mesh.RegisterFlags(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			got, err := mesh.Load(flags)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			want := mesh.Default()
			tt.mutate(&want)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("Load(%q) (-want +got):\n%s", tt.args, diff)
			}
		})
	}
}

func TestLoadErrorsNameTheFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("log:\n  levle: debug\n"), 0o600); err != nil { //nolint:misspell // an unknown key on purpose
		t.Fatal(err)
	}
	tests := []struct {
		file string
		want []string
	}{
		{filepath.Join(dir, "missing.yaml"), []string{"config.file", "missing.yaml"}},
		{bad, []string{bad, "levle"}}, //nolint:misspell // the unknown key above
	}
	for _, tt := range tests {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		flags := mesh.RegisterFlags(fs)
		if err := fs.Parse([]string{"-config.file", tt.file}); err != nil {
			t.Fatal(err)
		}
		_, err := mesh.Load(flags)
		for _, want := range tt.want {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("Load(%s) = %v, want an error containing %q", tt.file, err, want)
			}
		}
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mutate func(*mesh.Config)
		want   []string // every line must appear in the error; none means valid
	}{
		{"valid", func(*mesh.Config) {}, nil},
		{"defaults have no models", func(c *mesh.Config) { *c = mesh.Default() }, []string{"router.models: at least one model is required"}},
		{"grpc address", func(c *mesh.Config) { c.Server.GRPCListenAddress = "" }, []string{"server.grpc_listen_address: required"}},
		{"http address", func(c *mesh.Config) { c.Server.HTTPListenAddress = "" }, []string{"server.http_listen_address: required"}},
		{"shutdown timeout", func(c *mesh.Config) { c.Server.GracefulShutdownTimeout = 0 }, []string{"server.graceful_shutdown_timeout: must be positive"}},
		{"message size", func(c *mesh.Config) { c.Server.MaxMessageBytes = 1000 }, []string{"server.max_message_bytes: must be at least 1 MiB, got 1000"}},
		{"log level", func(c *mesh.Config) { c.Log.Level = "loud" }, []string{`log.level: want debug, info, warn or error, got "loud"`}},
		{"log format", func(c *mesh.Config) { c.Log.Format = "xml" }, []string{`log.format: want json or text, got "xml"`}},
		{"events", func(c *mesh.Config) { c.Events = mesh.EventsConfig{NATSURL: "nats://x", Embedded: true} }, []string{"events: set nats_url or embedded, not both"}},
		{"embedded events in a split mesh", func(c *mesh.Config) { c.Target, c.Events = "router", mesh.EventsConfig{Embedded: true} }, []string{"events.embedded: only with target all"}},
		{"tracing endpoint", func(c *mesh.Config) { c.Tracing.Enabled, c.Tracing.OTLPEndpoint = true, "" }, []string{"tracing.otlp_endpoint: required when tracing.enabled is true"}},
		{"tracing endpoint URL", func(c *mesh.Config) { c.Tracing.Enabled, c.Tracing.OTLPEndpoint = true, "http://jaeger:4317" }, []string{"tracing.otlp_endpoint: want host:port without a scheme"}},
		{"tracing ratio", func(c *mesh.Config) { c.Tracing.SampleRatio = 2 }, []string{"tracing.sample_ratio: want a number from 0 to 1, got 2"}},
		{"tracing service name", func(c *mesh.Config) { c.Tracing.ServiceName = "" }, []string{"tracing.service_name: required"}},
		{"tracing off needs no endpoint", func(c *mesh.Config) { c.Tracing.OTLPEndpoint = "" }, nil},
		{"tls half set", func(c *mesh.Config) { c.TLS = tlsconfig.Config{CAFile: "ca.crt"} }, []string{"tls.ca_file: set without cert_file"}},
		{"tls without key and CA", func(c *mesh.Config) { c.TLS = tlsconfig.Config{CertFile: "x.crt"} }, []string{"tls.key_file: required", "tls.ca_file: required"}},
		{"tls client auth", func(c *mesh.Config) {
			c.TLS = tlsconfig.Config{CertFile: "x.crt", KeyFile: "x.key", CAFile: "ca.crt", GRPCClientAuth: "always"}
		}, []string{`tls.grpc_client_auth: want require, verify_if_given or none, got "always"`}},
		{"tls", func(c *mesh.Config) {
			c.TLS = tlsconfig.Config{CertFile: "x.crt", KeyFile: "x.key", CAFile: "ca.crt", GRPCClientAuth: tlsconfig.ClientAuthRequire}
		}, nil},
		{"events tls without a server", func(c *mesh.Config) {
			c.Events = mesh.EventsConfig{Embedded: true, TLS: tlsconfig.ClientConfig{Enabled: true}}
		}, []string{"events.tls: needs nats_url"}},
		{"events tls half set", func(c *mesh.Config) {
			c.Events = mesh.EventsConfig{NATSURL: "nats://x", TLS: tlsconfig.ClientConfig{Enabled: true, CertFile: "x.crt"}}
		}, []string{"events.tls.cert_file and key_file: set both or neither"}},
		{"tenant id", func(c *mesh.Config) { c.Auth.Tenants = []rpc.TenantKey{{KeyEnv: "K"}} }, []string{"auth.tenants[0].id: required"}},
		{"tenant key", func(c *mesh.Config) {
			c.Auth.Tenants = []rpc.TenantKey{{ID: "a", KeyEnv: "K"}, {ID: "b", KeyEnv: "K", KeySHA256: rpc.HashKey("x")}, {ID: "c"}}
		}, []string{"auth.tenants[1]: set exactly one of key_sha256 or key_env", "auth.tenants[2]: set exactly one"}},
		// A tenant id with a separator made idempotency keys ("<tenant>/<key>") of two
		// tenants collide: "acme" + "x/1" and "acme/x" + "1".
		{"tenant id with a slash", func(c *mesh.Config) { c.Auth.Tenants = []rpc.TenantKey{{ID: "acme/x", KeyEnv: "K"}} },
			[]string{`auth.tenants[0].id: want 1 to 64 characters of [a-z0-9_-], got "acme/x"`}},
		{"duplicate tenant id", func(c *mesh.Config) {
			c.Auth.Tenants = []rpc.TenantKey{{ID: "acme", KeyEnv: "K1"}, {ID: "acme", KeyEnv: "K2"}}
		}, []string{`auth.tenants[1].id: "acme" is already auth.tenants[0]`}},
		{"duplicate key", func(c *mesh.Config) {
			c.Auth.Tenants = []rpc.TenantKey{{ID: "a", KeySHA256: rpc.HashKey("k")}}
			c.Auth.Operators = []rpc.TenantKey{{ID: "ops", KeySHA256: strings.ToUpper(rpc.HashKey("k"))}}
		}, []string{"auth.operators[0]: the same key as auth.tenants[0]"}},
		{"mesh secret twice", func(c *mesh.Config) { c.Auth.MeshSecretEnv, c.Auth.MeshSecretFile = "S", "/s" }, []string{"auth: set mesh_secret_env or mesh_secret_file, not both"}},
		{"disabled with tenants", func(c *mesh.Config) {
			c.Auth.Disabled, c.Auth.Tenants = true, []rpc.TenantKey{{ID: "a", KeyEnv: "K"}}
		}, []string{"auth.disabled: true, but tenants or operators are configured"}},
		{"no tenants on every interface", func(c *mesh.Config) { c.Auth.Tenants, c.Server.GRPCListenAddress = nil, "0.0.0.0:9090" },
			[]string{"server.grpc_listen_address: 0.0.0.0:9090 is reachable from other hosts and no auth.tenants are configured"}},
		{"no tenants on a host name", func(c *mesh.Config) { c.Auth.Tenants, c.Server.HTTPListenAddress = nil, "mantle:8080" },
			[]string{"server.http_listen_address: mantle:8080 is reachable from other hosts"}},
		{"no tenants, debug listener on every interface", func(c *mesh.Config) { c.Auth.Tenants, c.Server.DebugListenAddress = nil, "0.0.0.0:6060" },
			[]string{"server.debug_listen_address: 0.0.0.0:6060 is reachable from other hosts"}},
		{"no tenants, debug listener without a host", func(c *mesh.Config) { c.Auth.Tenants, c.Server.DebugListenAddress = nil, ":6060" }, nil},
		{"no tenants on loopback", func(c *mesh.Config) {
			c.Auth.Tenants, c.Server.GRPCListenAddress, c.Server.HTTPListenAddress = nil, "[::1]:9090", "localhost:8080"
		}, nil},
		{"no tenants, disabled on purpose", func(c *mesh.Config) {
			c.Auth.Tenants, c.Auth.Disabled, c.Server.GRPCListenAddress = nil, true, ":9090"
		}, nil},
		{"router block", func(c *mesh.Config) {
			c.Router.Routes = []router.RouteConfig{{Name: "r", Candidates: []string{"nope"}}}
		},
			[]string{`router.routes[0].candidates[0]: unknown model "nope"`}},
		{"quota block", func(c *mesh.Config) { c.Quota.DefaultLimits.RPM = 0 }, []string{"quota.default_limits.rpm: must be positive"}},
		{"qdrant presenting the mesh certificate without the tls block", func(c *mesh.Config) {
			c.Cache.Backend, c.Cache.Qdrant.Address = cache.BackendQdrant, "qdrant:6334"
			c.Cache.Qdrant.TLS, c.Cache.Qdrant.ClientCertificate = true, cache.QdrantClientCertificateMesh
		}, []string{"cache.qdrant.client_certificate: mesh presents this process's certificate, so it needs the tls block"}},
		{"qdrant ca_file without tls", func(c *mesh.Config) {
			c.Cache.Backend, c.Cache.Qdrant.Address, c.Cache.Qdrant.CAFile = cache.BackendQdrant, "qdrant:6334", "ca.crt"
		}, []string{"cache.qdrant: ca_file and client_certificate need tls: true"}},
		{"qdrant client certificate of an unknown kind", func(c *mesh.Config) {
			c.Cache.Backend, c.Cache.Qdrant.Address = cache.BackendQdrant, "qdrant:6334"
			c.Cache.Qdrant.TLS, c.Cache.Qdrant.ClientCertificate = true, "file"
		}, []string{`cache.qdrant.client_certificate: must be none or mesh, got "file"`}},
		{"qdrant with the mesh certificate", func(c *mesh.Config) {
			c.Cache.Backend, c.Cache.Qdrant.Address = cache.BackendQdrant, "qdrant:6334"
			c.Cache.Qdrant.TLS, c.Cache.Qdrant.ClientCertificate = true, cache.QdrantClientCertificateMesh
			c.TLS = tlsconfig.Config{CertFile: "x.crt", KeyFile: "x.key", CAFile: "ca.crt"}
		}, nil},
		{"cache block", func(c *mesh.Config) { c.Cache.MaxEntries = 0 }, []string{"cache.max_entries: must be positive"}},
		{"verifier block", func(c *mesh.Config) { c.Verifier.RepetitionThreshold = 1 }, []string{"verifier.repetition_threshold: must be at least 2"}},
		{"every error at once", func(c *mesh.Config) {
			c.Log.Level, c.Server.HTTPListenAddress, c.Router.Models = "x", "", nil
		}, []string{"log.level", "server.http_listen_address", "router.models"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := validConfig()
			tt.mutate(&c)
			err := c.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate = nil, want errors %q", tt.want)
			}
			lines := strings.Split(err.Error(), "\n")
			for _, want := range tt.want {
				found := false
				for _, l := range lines {
					found = found || strings.HasPrefix(l, want)
				}
				if !found {
					t.Errorf("Validate error has no line starting with %q:\n%v", want, err)
				}
			}
		})
	}
}

func TestValidateChecksOnlyTheTargetsBlocks(t *testing.T) {
	t.Parallel()
	broken := func() mesh.Config {
		c := mesh.Default() // router: no models
		c.Cache.MaxEntries = 0
		return c
	}
	tests := []struct {
		target string
		want   []string // block prefixes expected in the error
		skip   []string // block prefixes that must not appear
	}{
		{"all", []string{"router.", "cache."}, nil},
		{"router", []string{"router."}, []string{"cache."}},
		{"cache", []string{"cache."}, []string{"router."}},
		{"quota", nil, []string{"router.", "cache."}},
		{"quota, verifier", nil, []string{"router.", "cache."}},
		{"verifier,router", []string{"router."}, []string{"cache."}},
	}
	for _, tt := range tests {
		t.Run(tt.target, func(t *testing.T) {
			t.Parallel()
			c := broken()
			c.Target = tt.target
			err := c.Validate()
			msg := ""
			if err != nil {
				msg = "\n" + err.Error()
			}
			if len(tt.want) == 0 && err != nil {
				t.Errorf("Validate = %v, want nil", err)
			}
			for _, p := range tt.want {
				if !strings.Contains(msg, "\n"+p) {
					t.Errorf("Validate error has no %s line:%s", p, msg)
				}
			}
			for _, p := range tt.skip {
				if strings.Contains(msg, "\n"+p) {
					t.Errorf("Validate checked the %s block of a module not in %q:%s", p, tt.target, msg)
				}
			}
		})
	}
}

func TestYAMLRoundTrip(t *testing.T) {
	t.Parallel()
	full := validConfig()
	full.Target = "router,cache"
	full.Server.GracefulShutdownTimeout = 2500 * time.Millisecond
	full.Auth.Tenants = []rpc.TenantKey{{ID: "acme", KeySHA256: rpc.HashKey("k")}, {ID: "beta", KeyEnv: "BETA_KEY"}}
	full.Events.NATSURL = "nats://127.0.0.1:4222"
	full.Router.QuotaAddress = "quota:9090"
	full.Router.Providers = append(full.Router.Providers, router.ProviderConfig{
		Name: "openai", Type: router.ProviderOpenAI, BaseURL: "https://api.example/v1",
		Keys: []router.KeyConfig{{ID: "k1", Env: "OPENAI_API_KEY"}}, Timeout: 20 * time.Second,
	})
	full.Router.Models = append(full.Router.Models, router.ModelConfig{
		Name: "big", Provider: "openai", Upstream: "gpt-x", ContextWindow: 128000, InputPricePerMillion: 2.5, OutputPricePerMillion: 10,
	})
	full.Router.Routes = []router.RouteConfig{{Name: "chat", Scenario: "chat", Candidates: []string{"big", "m"}, Budget: 3 * time.Second}}
	full.Quota.Tenants = map[string]quota.RateLimits{"acme": {RPM: 5, TPM: 1000}}
	ttl := 10 * time.Minute
	full.Cache.Scenarios = map[string]cache.ScenarioPolicy{"faq": {TTL: &ttl}}

	for name, c := range map[string]mesh.Config{"defaults": mesh.Default(), "full": full} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			out, err := c.YAML()
			if err != nil {
				t.Fatalf("YAML: %v", err)
			}
			for _, base := range []struct {
				name string
				cfg  mesh.Config
			}{{"onto zero", mesh.Config{}}, {"onto defaults", mesh.Default()}} {
				got := base.cfg
				if err := got.Decode(bytes.NewReader(out)); err != nil {
					t.Fatalf("%s: Decode(YAML()) = %v\n%s", base.name, err, out)
				}
				if diff := cmp.Diff(c, got, cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("%s: YAML round trip changed the config (-want +got):\n%s", base.name, diff)
				}
			}
		})
	}
}
