package app_test

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mantle-mesh/mantle/pkg/app"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/pkg/tlsconfig"
)

// TestDebugListener: configured without a host, the debug listener binds loopback and
// serves pprof and expvar; the public HTTP listener serves neither; unconfigured, there is
// no debug listener at all.
func TestDebugListener(t *testing.T) {
	t.Parallel()
	t.Run("on", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig("blocker")
		cfg.DebugListenAddress = ":0"
		r := start(t, cfg, []app.Module{newBlocker().module("blocker", nil, nil)})
		host, _, err := net.SplitHostPort(r.app.DebugAddr())
		if err != nil || host != "127.0.0.1" {
			t.Fatalf("DebugAddr() = %q, want a 127.0.0.1 address", r.app.DebugAddr())
		}
		for _, tt := range []struct{ path, want string }{
			{"/debug/pprof/", "goroutine"},
			{"/debug/pprof/heap?debug=1", "heap profile"},
			{"/debug/vars", `"memstats"`},
		} {
			code, body := httpGet(t, "http://"+r.app.DebugAddr()+tt.path)
			if code != http.StatusOK || !strings.Contains(body, tt.want) {
				t.Errorf("GET %s on the debug listener = %d, body without %q", tt.path, code, tt.want)
			}
			if code, _ := httpGet(t, "http://"+r.app.HTTPAddr()+tt.path); code != http.StatusNotFound {
				t.Errorf("GET %s on the public listener = %d, want 404", tt.path, code)
			}
		}
	})
	t.Run("metrics moved to the debug listener", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig("blocker")
		cfg.DebugListenAddress, cfg.MetricsOnDebug = ":0", true
		r := start(t, cfg, []app.Module{newBlocker().module("blocker", nil, nil)})
		if code, body := httpGet(t, "http://"+r.app.DebugAddr()+"/metrics"); code != http.StatusOK || !strings.Contains(body, "# TYPE") {
			t.Errorf("GET /metrics on the debug listener = %d, want the metrics", code)
		}
		if code, _ := httpGet(t, "http://"+r.app.HTTPAddr()+"/metrics"); code != http.StatusNotFound {
			t.Errorf("GET /metrics on the public listener = %d, want 404", code)
		}
	})
	t.Run("metrics stay public by default", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig("blocker")
		cfg.DebugListenAddress = ":0"
		r := start(t, cfg, []app.Module{newBlocker().module("blocker", nil, nil)})
		if code, _ := httpGet(t, "http://"+r.app.HTTPAddr()+"/metrics"); code != http.StatusOK {
			t.Errorf("GET /metrics on the public listener = %d, want 200", code)
		}
		if code, _ := httpGet(t, "http://"+r.app.DebugAddr()+"/metrics"); code != http.StatusNotFound {
			t.Errorf("GET /metrics on the debug listener = %d, want 404", code)
		}
	})
	t.Run("off", func(t *testing.T) {
		t.Parallel()
		r := start(t, testConfig("blocker"), []app.Module{newBlocker().module("blocker", nil, nil)})
		if addr := r.app.DebugAddr(); addr != "" {
			t.Errorf("DebugAddr() = %q without debug_listen_address", addr)
		}
		if code, _ := httpGet(t, "http://"+r.app.HTTPAddr()+"/debug/pprof/"); code != http.StatusNotFound {
			t.Errorf("GET /debug/pprof/ on the public listener = %d, want 404", code)
		}
	})
}

// TestDebugListenerIsOperatorsOnly: with authentication on, the debug listener answers
// operator keys only (401 without a key, 403 for a tenant's), counting every refusal; with
// TLS on, it speaks TLS with the process certificate, refuses plaintext and a client
// certificate of another CA, like the HTTP listener.
func TestDebugListenerIsOperatorsOnly(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := tlsconfig.WriteDevPKI(dir, []string{"router", "quota"}, time.Now(), time.Hour); err != nil {
		t.Fatal(err)
	}
	foreign := filepath.Join(dir, "foreign")
	if err := tlsconfig.WriteDevPKI(foreign, []string{"quota"}, time.Now(), time.Hour); err != nil {
		t.Fatal(err)
	}
	authn, err := rpc.NewAuthenticator([]rpc.TenantKey{{ID: "acme", KeySHA256: rpc.HashKey("sk-tenant")}}, nil,
		rpc.WithOperators([]rpc.TenantKey{{ID: "ops", KeySHA256: rpc.HashKey("sk-operator")}}, nil))
	if err != nil {
		t.Fatal(err)
	}
	source := func(t *testing.T, dir, svc string) *tlsconfig.Source {
		t.Helper()
		f := tlsconfig.Files{CAFile: filepath.Join(dir, "ca.crt")}
		if svc != "" {
			f.CertFile, f.KeyFile = filepath.Join(dir, svc+".crt"), filepath.Join(dir, svc+".key")
		}
		s, err := tlsconfig.Load("test", f, tlsconfig.Options{Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	// run starts an app with a debug listener (and /metrics on it) and returns it with
	// its registry.
	run := func(t *testing.T, tlsOn bool) (*app.App, *prometheus.Registry) {
		t.Helper()
		cfg := testConfig("blocker")
		cfg.DebugListenAddress, cfg.MetricsOnDebug = "127.0.0.1:0", true
		deps := testDeps()
		deps.Authenticator = authn
		if tlsOn {
			deps.TLS = app.TLS{Source: source(t, dir, "router")}
		}
		a, err := app.New(context.Background(), cfg, []app.Module{newBlocker().module("blocker", nil, nil)}, deps)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		return a, deps.Metrics
	}
	// get asks the debug listener for path with key, over client (nil: plaintext).
	get := func(t *testing.T, a *app.App, client *tls.Config, path, key string) (int, string, error) {
		t.Helper()
		scheme, transport := "http", &http.Transport{}
		if client != nil {
			scheme, transport = "https", &http.Transport{TLSClientConfig: client}
		}
		defer transport.CloseIdleConnections()
		req, err := http.NewRequest(http.MethodGet, scheme+"://"+a.DebugAddr()+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := (&http.Client{Transport: transport, Timeout: waitLimit}).Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), nil
	}
	t.Run("tls", func(t *testing.T) {
		t.Parallel()
		a, reg := run(t, true)
		mesh := source(t, dir, "").ClientConfig("127.0.0.1")
		for _, tt := range []struct {
			name       string
			client     *tls.Config
			path, key  string
			wantStatus int
			want       string
		}{
			{"operator key: profiles", mesh, "/debug/pprof/", "sk-operator", http.StatusOK, "goroutine"},
			{"operator key: metrics", mesh, "/metrics", "sk-operator", http.StatusOK, "# TYPE"},
			{"operator key and a mesh client certificate", source(t, dir, "quota").ClientConfig("127.0.0.1"), "/debug/vars", "sk-operator", http.StatusOK, `"memstats"`},
			{"no key", mesh, "/debug/pprof/", "", http.StatusUnauthorized, "operator key"},
			{"a key nobody has", mesh, "/debug/pprof/", "sk-nobody", http.StatusUnauthorized, "operator key"},
			{"tenant key", mesh, "/debug/pprof/heap", "sk-tenant", http.StatusForbidden, "operator keys"},
			{"tenant key on metrics", mesh, "/metrics", "sk-tenant", http.StatusForbidden, "operator keys"},
			{"plaintext", nil, "/debug/pprof/", "sk-operator", http.StatusBadRequest, "HTTPS server"},
		} {
			code, body, err := get(t, a, tt.client, tt.path, tt.key)
			if err != nil || code != tt.wantStatus || !strings.Contains(body, tt.want) {
				t.Errorf("%s: GET %s = %d %v, body %.80q; want %d with %q", tt.name, tt.path, code, err, body, tt.wantStatus, tt.want)
			}
		}
		// A client certificate of another CA is refused in the handshake, key or not.
		foreignClient := source(t, foreign, "quota").ClientConfig("127.0.0.1")
		foreignClient.RootCAs = mesh.RootCAs
		if code, _, err := get(t, a, foreignClient, "/debug/pprof/", "sk-operator"); err == nil {
			t.Errorf("a client certificate of another CA: GET = %d, want a refused handshake", code)
		}
		// The server presented the process certificate, which the mesh CA verified.
		conn, err := tls.Dial("tcp", a.DebugAddr(), mesh)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		leaf := conn.ConnectionState().PeerCertificates[0]
		if svc, err := tlsconfig.ServiceFromCertificate(leaf); err != nil || svc != "router" {
			t.Errorf("debug listener presented %v (%v), want the router's certificate", leaf.URIs, err)
		}
		for reason, want := range map[string]float64{"wrong_plane": 2, "missing_credential": 1, "unknown_key": 1} {
			if got := refusals(t, reg, reason); got != want {
				t.Errorf("mantle_auth_refusals_total{reason=%q} = %v, want %v", reason, got, want)
			}
		}
	})
	t.Run("plaintext with authentication on", func(t *testing.T) {
		t.Parallel()
		a, _ := run(t, false)
		for _, tt := range []struct {
			key  string
			want int
		}{{"", http.StatusUnauthorized}, {"sk-tenant", http.StatusForbidden}, {"sk-operator", http.StatusOK}} {
			if code, _, err := get(t, a, nil, "/debug/pprof/", tt.key); err != nil || code != tt.want {
				t.Errorf("key %q: GET /debug/pprof/ = %d %v, want %d", tt.key, code, err, tt.want)
			}
		}
	})
}

// refusals is mantle_auth_refusals_total{reason} summed over codes.
func refusals(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, f := range families {
		if f.GetName() != "mantle_auth_refusals_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}
