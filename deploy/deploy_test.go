// Package deploy_test checks the deployment files against the code they deploy: the compose
// stack runs every module once with the configuration it mounts, that configuration loads
// strictly and validates for every target (and serves requests, as one process and split),
// and the image builds the mantle binary and runs it as a non-root user. Docker is not
// needed: the files are parsed, not run.
package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/mantle-mesh/mantle/pkg/app"
	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// Paths relative to this package's directory, where go test runs.
const (
	repoRoot     = ".."
	composeFile  = "../docker-compose.yml"
	configFile   = "config/mantle.yaml"
	dockerfile   = "docker/Dockerfile"
	dockerignore = "../.dockerignore"
	mantleImage  = "mantle:dev"
	configFlag   = "--config.file="
	targetFlag   = "--target="
)

// compose is the part of docker-compose.yml these tests read. Anchors and merge keys
// (<<: *mantle) are resolved by the YAML decoder, as compose resolves them.
type compose struct {
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image       string            `yaml:"image"`
	Build       *composeBuild     `yaml:"build"`
	Command     []string          `yaml:"command"`
	Volumes     []string          `yaml:"volumes"`
	Ports       []string          `yaml:"ports"`
	Environment map[string]string `yaml:"environment"`
}

type composeBuild struct {
	Context    string `yaml:"context"`
	Dockerfile string `yaml:"dockerfile"`
}

func loadCompose(t *testing.T) compose {
	t.Helper()
	data, err := os.ReadFile(composeFile)
	if err != nil {
		t.Fatal(err)
	}
	var c compose
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatalf("%s: %v", composeFile, err)
	}
	return c
}

// loadConfig reads a mantle.yaml the way `mantle serve --config.file` does: defaults, then
// the file, strictly (unknown keys are errors).
func loadConfig(t *testing.T, path string) mesh.Config {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg := mesh.Default()
	if err := cfg.Decode(bytes.NewReader(data)); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return cfg
}

// mantleServices returns the compose services that run the mantle image, by name.
func mantleServices(t *testing.T, c compose) map[string]composeService {
	t.Helper()
	out := map[string]composeService{}
	for name, s := range c.Services {
		if s.Image == mantleImage {
			out[name] = s
		}
	}
	if len(out) == 0 {
		t.Fatalf("no service in %s runs image %s", composeFile, mantleImage)
	}
	return out
}

// flagValue returns the value of --name=value in args and how many times it appears.
func flagValue(args []string, prefix string) (string, int) {
	var value string
	n := 0
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, prefix); ok {
			value = v
			n++
		}
	}
	return value, n
}

// hostPath returns the host side of a compose bind mount whose container side is target.
func hostPath(volumes []string, target string) (host string, readOnly, ok bool) {
	for _, v := range volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && parts[1] == target {
			return parts[0], len(parts) == 3 && strings.Contains(parts[2], "ro"), true
		}
	}
	return "", false, false
}

// containerPorts returns the container side of compose short-syntax port mappings
// ("127.0.0.1:8080:8080", "8080:8080", "8080/tcp").
func containerPorts(ports []string) []string {
	var out []string
	for _, p := range ports {
		p, _, _ = strings.Cut(p, "/")
		out = append(out, p[strings.LastIndex(p, ":")+1:])
	}
	return out
}

func port(t *testing.T, addr string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	return p
}

func TestComposeRunsEveryModuleOnce(t *testing.T) {
	t.Parallel()
	c := loadCompose(t)
	modules := app.Names(mesh.Modules(mesh.Default()))
	var targets []string
	for name, s := range mantleServices(t, c) {
		t.Run(name, func(t *testing.T) {
			if len(s.Command) == 0 || s.Command[0] != "serve" {
				t.Fatalf("command = %q, want serve ...", s.Command)
			}
			target, n := flagValue(s.Command, targetFlag)
			if n != 1 {
				t.Fatalf("command %q has %d %s flags, want 1", s.Command, n, targetFlag)
			}
			if !slices.Contains(modules, target) {
				t.Errorf("--target=%s is not a module (have %s)", target, strings.Join(modules, ", "))
			}
			if target != name {
				t.Errorf("service %s runs --target=%s; name the service after its module", name, target)
			}
			path, n := flagValue(s.Command, configFlag)
			if n != 1 {
				t.Fatalf("command %q has %d %s flags, want 1", s.Command, n, configFlag)
			}
			host, readOnly, ok := hostPath(s.Volumes, path)
			if !ok {
				t.Fatalf("nothing is mounted at %s (volumes %q)", path, s.Volumes)
			}
			if !readOnly {
				t.Errorf("%s is mounted writable; mount it :ro", path)
			}
			if _, err := os.Stat(filepath.Join(repoRoot, host)); err != nil {
				t.Errorf("mounted config: %v", err)
			}
		})
		target, _ := flagValue(s.Command, targetFlag)
		targets = append(targets, target)
	}
	slices.Sort(targets)
	if !slices.Equal(targets, modules) {
		t.Errorf("compose runs targets %q, want each module once: %q", targets, modules)
	}
}

func TestComposeMatchesConfig(t *testing.T) {
	t.Parallel()
	c := loadCompose(t)
	cfg := loadConfig(t, configFile)
	services := mantleServices(t, c)
	grpcPort, httpPort := port(t, cfg.Server.GRPCListenAddress), port(t, cfg.Server.HTTPListenAddress)

	t.Run("router publishes its ports", func(t *testing.T) {
		router, ok := services["router"]
		if !ok {
			t.Fatal("no router service")
		}
		published := containerPorts(router.Ports)
		for _, p := range []string{httpPort, grpcPort} {
			if !slices.Contains(published, p) {
				t.Errorf("router publishes container ports %q, want %s (server listen addresses)", published, p)
			}
		}
	})

	// The router dials the modules it does not run at router.<module>_address: each must
	// name the compose service that runs that module, on the port it listens on.
	for module, addr := range cfg.Addresses() {
		t.Run("router reaches "+module, func(t *testing.T) {
			host, p, err := net.SplitHostPort(addr)
			if err != nil {
				t.Fatalf("router.%s_address %q: %v", module, addr, err)
			}
			s, ok := services[host]
			if !ok {
				t.Fatalf("router.%s_address %q: no mantle service named %s", module, addr, host)
			}
			if target, _ := flagValue(s.Command, targetFlag); target != module {
				t.Errorf("router.%s_address points at %s, which runs --target=%s", module, host, target)
			}
			if p != grpcPort {
				t.Errorf("router.%s_address port %s, want the gRPC port %s", module, p, grpcPort)
			}
		})
	}

	t.Run("events reach nats with jetstream", func(t *testing.T) {
		host := strings.TrimPrefix(cfg.Events.NATSURL, "nats://")
		host, _, _ = strings.Cut(host, ":")
		nats, ok := c.Services[host]
		if !ok {
			t.Fatalf("events.nats_url %q: no compose service %q", cfg.Events.NATSURL, host)
		}
		if !slices.Contains(nats.Command, "-js") {
			t.Errorf("%s runs %q without -js; mantle needs JetStream", host, nats.Command)
		}
	})

	t.Run("spans reach the collector", func(t *testing.T) {
		if !cfg.Tracing.Enabled {
			t.Skip("tracing is off in the compose configuration")
		}
		host, p, err := net.SplitHostPort(cfg.Tracing.OTLPEndpoint)
		if err != nil {
			t.Fatalf("tracing.otlp_endpoint %q: %v", cfg.Tracing.OTLPEndpoint, err)
		}
		collector, ok := c.Services[host]
		if !ok {
			t.Fatalf("tracing.otlp_endpoint %q: no compose service %q", cfg.Tracing.OTLPEndpoint, host)
		}
		if !slices.Contains(containerPorts(collector.Ports), p) {
			t.Errorf("tracing.otlp_endpoint port %s: %s exposes %q", p, host, containerPorts(collector.Ports))
		}
		if v, ok := collector.Environment["COLLECTOR_OTLP_ENABLED"]; ok && v != "true" {
			t.Errorf("%s: COLLECTOR_OTLP_ENABLED=%q, want true", host, v)
		}
		// Compose networks are plaintext; without insecure the exporter would insist on TLS.
		if !cfg.Tracing.Insecure {
			t.Error("tracing.insecure is false, but the compose collector serves plaintext")
		}
	})

	// Every process authenticates (the router forwards the caller's key), so every mantle
	// container needs each tenant's key variable, with a default so `up` works as is.
	for _, tenant := range cfg.Auth.Tenants {
		if tenant.KeyEnv == "" {
			continue
		}
		for name, s := range services {
			if v := s.Environment[tenant.KeyEnv]; !strings.Contains(v, ":-") {
				t.Errorf("service %s: %s = %q, want ${%s:-<default>}", name, tenant.KeyEnv, v, tenant.KeyEnv)
			}
		}
	}

	t.Run("one build of the image", func(t *testing.T) {
		var builds []string
		for name, s := range services {
			if s.Build != nil {
				builds = append(builds, name)
				if _, err := os.Stat(filepath.Join(repoRoot, s.Build.Context, s.Build.Dockerfile)); err != nil {
					t.Errorf("service %s builds from a missing Dockerfile: %v", name, err)
				}
			}
		}
		if len(builds) != 1 {
			t.Errorf("services %q build %s; want exactly one", builds, mantleImage)
		}
	})
}

func TestConfigValidatesForEveryTarget(t *testing.T) {
	t.Parallel()
	base := loadConfig(t, configFile)
	modules := app.Names(mesh.Modules(base))
	for _, target := range append([]string{app.TargetAll}, modules...) {
		t.Run(target, func(t *testing.T) {
			t.Parallel()
			cfg := base
			cfg.Target = target
			if err := cfg.Validate(); err != nil {
				t.Fatalf("Validate with --target=%s:\n%v", target, err)
			}
			// What app.New checks next: every dependency outside the process has an address.
			if _, err := app.Resolve(mesh.Modules(cfg), cfg.Targets(), cfg.Addresses()); err != nil {
				t.Fatalf("Resolve with --target=%s: %v", target, err)
			}
		})
	}
	t.Run("tenant keys", func(t *testing.T) {
		t.Parallel()
		env := map[string]string{}
		for i, tenant := range base.Auth.Tenants {
			if tenant.KeyEnv != "" {
				env[tenant.KeyEnv] = "sk-test-" + tenant.ID
			}
			if tenant.KeyEnv == "" && tenant.KeySHA256 == "" {
				t.Errorf("auth.tenants[%d] has no key", i)
			}
		}
		authn, err := rpc.NewAuthenticator(base.Auth.Tenants, func(name string) string { return env[name] })
		if err != nil {
			t.Fatal(err)
		}
		for _, tenant := range base.Auth.Tenants {
			if tenant.KeyEnv == "" {
				continue
			}
			if got, ok := authn.Authenticate(env[tenant.KeyEnv]); !ok || got != tenant.ID {
				t.Errorf("key from %s authenticates as %q, %t; want %q", tenant.KeyEnv, got, ok, tenant.ID)
			}
		}
	})
}

// TestConfigServes runs the compose configuration as one process and as four, and sends a
// request through the OpenAI-compatible API with the tenant key. meshtest replaces only the
// listen addresses, the NATS URL (an embedded server) and the router's service addresses.
func TestConfigServes(t *testing.T) {
	cfg := loadConfig(t, configFile)
	var keyEnv, tenant string
	for _, tk := range cfg.Auth.Tenants {
		if tk.KeyEnv != "" {
			keyEnv, tenant = tk.KeyEnv, tk.ID
			break
		}
	}
	if keyEnv == "" {
		t.Fatal("no tenant with key_env in the config")
	}
	const key = "sk-deploy-test"
	t.Setenv(keyEnv, key) // mesh.Start reads tenant keys from the environment
	setOperatorAndMeshEnv(t, cfg)
	cfg.Log.Level = "error"

	// A route whose candidates answer in milliseconds, so the test does not wait on the
	// simulated long tail of the primary model.
	route := "support"
	for _, mode := range []meshtest.Mode{meshtest.All, meshtest.Split} {
		t.Run(string(mode), func(t *testing.T) {
			m := meshtest.Start(t, cfg, mode)
			tests := []struct {
				name       string
				key        string
				wantStatus int
			}{
				{"tenant key", key, http.StatusOK},
				{"wrong key", "sk-wrong", http.StatusUnauthorized},
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					status, body := chat(t, m.HTTPAddr, tt.key, route)
					if status != tt.wantStatus {
						t.Fatalf("status %d, want %d: %s", status, tt.wantStatus, body)
					}
					if status != http.StatusOK {
						return
					}
					var resp struct {
						Mantle struct {
							Tenant string `json:"tenant"`
							Route  string `json:"route"`
						} `json:"mantle"`
					}
					if err := json.Unmarshal(body, &resp); err != nil {
						t.Fatalf("response: %v: %s", err, body)
					}
					if resp.Mantle.Tenant != tenant || resp.Mantle.Route != route {
						t.Errorf("mantle.tenant, route = %q, %q; want %q, %q", resp.Mantle.Tenant, resp.Mantle.Route, tenant, route)
					}
				})
			}
		})
	}
}

func chat(t *testing.T, addr, key, model string) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	body := `{"model":"` + model + `","messages":[{"role":"user","content":"How do I reset my password?"}]}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(res.Body); err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, buf.Bytes()
}

// dockerInstructions returns the Dockerfile's instructions, continuation lines joined and
// comments dropped, each as (keyword, rest).
func dockerInstructions(t *testing.T) [][2]string {
	t.Helper()
	f, err := os.Open(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out [][2]string
	var cur strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || (line == "" && cur.Len() == 0) {
			continue
		}
		if cont, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(cont + " ")
			continue
		}
		cur.WriteString(line)
		kw, rest, _ := strings.Cut(strings.TrimSpace(cur.String()), " ")
		out = append(out, [2]string{strings.ToUpper(kw), strings.TrimSpace(rest)})
		cur.Reset()
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestDockerfile(t *testing.T) {
	t.Parallel()
	all := dockerInstructions(t)
	// The final stage is what runs: everything after the last FROM.
	last := 0
	for i, in := range all {
		if in[0] == "FROM" {
			last = i
		}
	}
	final := all[last:]
	find := func(instructions [][2]string, kw string) []string {
		var out []string
		for _, in := range instructions {
			if in[0] == kw {
				out = append(out, in[1])
			}
		}
		return out
	}
	cfg := loadConfig(t, configFile)
	checks := []struct {
		name string
		ok   func() bool
		want string
	}{
		{"builds cmd/mantle statically", func() bool {
			for _, run := range find(all, "RUN") {
				if strings.Contains(run, "go build") && strings.Contains(run, "./cmd/mantle") &&
					strings.Contains(run, "CGO_ENABLED=0") && strings.Contains(run, "-trimpath") &&
					strings.Contains(run, "-tags nolab") {
					return true
				}
			}
			return false
		}, "a RUN with CGO_ENABLED=0 go build -tags nolab -trimpath ... ./cmd/mantle (the serving build)"},
		{"runs as non-root", func() bool {
			users := find(final, "USER")
			if len(users) == 0 {
				return false
			}
			user, _, _ := strings.Cut(users[len(users)-1], ":")
			return user != "root" && user != "0"
		}, "a final USER that is not root"},
		{"entrypoint is the binary", func() bool {
			return slices.Contains(find(final, "ENTRYPOINT"), `["/mantle"]`)
		}, `ENTRYPOINT ["/mantle"]`},
		{"serves the config it ships", func() bool {
			cmds := find(final, "CMD")
			return len(cmds) == 1 && strings.Contains(cmds[0], `"serve"`) &&
				strings.Contains(cmds[0], `"--config.file=/etc/mantle/mantle.yaml"`) &&
				slices.Contains(find(final, "COPY"), "deploy/config/mantle.yaml /etc/mantle/mantle.yaml")
		}, `CMD ["serve", "--config.file=/etc/mantle/mantle.yaml"] and the file copied there`},
		{"exposes the listen ports", func() bool {
			exposed := strings.Fields(strings.Join(find(final, "EXPOSE"), " "))
			return slices.Contains(exposed, port(t, cfg.Server.GRPCListenAddress)) &&
				slices.Contains(exposed, port(t, cfg.Server.HTTPListenAddress))
		}, "EXPOSE with the gRPC and HTTP ports of mantle.yaml"},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			if !c.ok() {
				t.Errorf("%s: want %s", dockerfile, c.want)
			}
		})
	}
}

// TestDockerignoreKeepsBuildInputs guards against an ignore pattern that would hide what the
// Dockerfile copies or builds.
func TestDockerignoreKeepsBuildInputs(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(dockerignore)
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for line := range strings.Lines(string(data)) {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			patterns = append(patterns, strings.TrimSuffix(strings.TrimPrefix(line, "/"), "/"))
		}
	}
	for _, path := range []string{"go.mod", "go.sum", "cmd/mantle/main.go", "pkg/mesh/config.go", "services/router/router.go", "deploy/config/mantle.yaml"} {
		for _, p := range patterns {
			if strings.HasPrefix(p, "!") {
				continue
			}
			// A pattern hides a path when it matches the path or one of its parent directories.
			for dir := path; dir != "."; dir = filepath.Dir(dir) {
				if ok, _ := filepath.Match(p, dir); ok {
					t.Errorf("%s: pattern %q hides %s", dockerignore, p, path)
				}
			}
		}
	}
	for _, want := range []string{".git", "bin"} {
		if !slices.Contains(patterns, want) {
			t.Errorf("%s does not exclude %s", dockerignore, want)
		}
	}
}

// setOperatorAndMeshEnv sets the operator keys and the mesh secret a configuration reads
// from the environment, as the deployment's Secret does.
func setOperatorAndMeshEnv(t *testing.T, cfg mesh.Config) {
	t.Helper()
	for i, o := range cfg.Auth.Operators {
		if o.KeyEnv != "" {
			t.Setenv(o.KeyEnv, "sk-operator-test-"+strconv.Itoa(i))
		}
	}
	if cfg.Auth.MeshSecretEnv != "" {
		t.Setenv(cfg.Auth.MeshSecretEnv, "deploy-test-mesh-secret-0123456789abcdef")
	}
}
