package mesh_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/pkg/sim"
	"github.com/mantle-mesh/mantle/pkg/tlsconfig"
)

// testPKI is a mesh CA whose key the test keeps, to issue replacement certificates.
type testPKI struct {
	dir string
	ca  *tlsconfig.CA
}

func newTestPKI(t *testing.T, services ...string) *testPKI {
	t.Helper()
	ca, err := tlsconfig.NewCA("test mesh CA", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p := &testPKI{dir: t.TempDir(), ca: ca}
	writeTestFile(t, filepath.Join(p.dir, "ca.crt"), ca.CertPEM)
	for _, svc := range services {
		p.issue(t, svc)
	}
	return p
}

// issue writes <svc>.crt and <svc>.key, replacing any earlier ones, and returns the
// certificate's serial number.
func (p *testPKI) issue(t *testing.T, svc string) string {
	t.Helper()
	certPEM, keyPEM, err := p.ca.Issue(tlsconfig.Leaf{Service: svc, DNSNames: []string{svc}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now(), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	writeTestFile(t, filepath.Join(p.dir, svc+".crt"), certPEM)
	writeTestFile(t, filepath.Join(p.dir, svc+".key"), keyPEM)
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return cert.Leaf.SerialNumber.String()
}

func (p *testPKI) files(svc string) tlsconfig.Files {
	f := tlsconfig.Files{CAFile: filepath.Join(p.dir, "ca.crt")}
	if svc != "" {
		f.CertFile, f.KeyFile = filepath.Join(p.dir, svc+".crt"), filepath.Join(p.dir, svc+".key")
	}
	return f
}

func (p *testPKI) source(t *testing.T, svc string) *tlsconfig.Source {
	t.Helper()
	s, err := tlsconfig.Load("test", p.files(svc), tlsconfig.Options{Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func writeTestFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestSplitMeshMutualTLS runs the four services as four processes, each with its own
// certificate of a CA made by the test: the router's gRPC listener takes tenants with or
// without a certificate (verify_if_given), quota, cache and verifier take only mesh
// certificates (require). A tenant's request crosses all four; callers without a valid
// certificate are refused; a rotated certificate is served on the next handshake.
func TestSplitMeshMutualTLS(t *testing.T) {
	pki := newTestPKI(t, "router", "quota", "cache", "verifier", "agent")
	foreign := newTestPKI(t, "router")
	clock := clockwork.NewFakeClockAt(time.Now())
	const reload = time.Minute
	// The sims answer at once: the mesh runs on the fake clock that paces the reloads.
	cfg := testConfig()
	cfg.Router.SimProfiles = map[string]sim.Profile{"instant": {}}
	cfg.Router.Providers[0].SimProfile = "instant"
	m := meshtest.StartEach(t, cfg, meshtest.Split, mesh.Options{Clock: clock}, func(target string, c *mesh.Config) {
		f := pki.files(target)
		c.TLS = tlsconfig.Config{
			CertFile: f.CertFile, KeyFile: f.KeyFile, CAFile: f.CAFile,
			GRPCClientAuth: tlsconfig.ClientAuthRequire, HTTPClientAuth: tlsconfig.ClientAuthVerifyIfGiven,
			ReloadInterval: reload,
		}
		if target == "router" {
			c.TLS.GRPCClientAuth = tlsconfig.ClientAuthVerifyIfGiven
		}
	})
	// A tenant trusts the mesh CA and has no certificate of its own.
	tenant := pki.source(t, "")

	t.Run("a tenant's request crosses the four services over mTLS", func(t *testing.T) {
		client := routerv1.NewRouterServiceClient(meshtest.DialWith(t, m.GRPCAddr, tenant.GRPCClientCredentials("")))
		resp, err := client.Complete(authed(acmeKey), &routerv1.CompleteRequest{Request: ask("primary", "Is this encrypted?")})
		if err != nil {
			t.Fatalf("Complete: %v", err)
		}
		var services []string
		for _, s := range resp.Quality.Audit {
			services = append(services, s.Service)
		}
		for _, want := range []string{"router", "quota", "cache", "verifier"} {
			if !slices.Contains(services, want) {
				t.Errorf("audit trail services %v: missing %s", services, want)
			}
		}
	})

	t.Run("the front door speaks HTTPS", func(t *testing.T) {
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tenant.ClientConfig(""), ForceAttemptHTTP2: true}}
		defer hc.CloseIdleConnections()
		req, err := http.NewRequest(http.MethodPost, "https://"+m.HTTPAddr+"/v1/chat/completions",
			strings.NewReader(`{"model":"primary","messages":[{"role":"user","content":"And over HTTP?"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+acmeKey)
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || res.ProtoMajor != 2 || !bytes.Contains(body, []byte("And over HTTP?")) {
			t.Fatalf("status %d over %s: %s", res.StatusCode, res.Proto, body)
		}
		plain, err := http.Get("http://" + m.HTTPAddr + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		plain.Body.Close()
		if plain.StatusCode != http.StatusBadRequest {
			t.Errorf("plaintext HTTP: status %d, want 400 (an HTTP request to an HTTPS server)", plain.StatusCode)
		}
	})

	t.Run("services refuse callers without a mesh certificate", func(t *testing.T) {
		callers := []struct {
			name  string
			creds credentials.TransportCredentials
			want  codes.Code
		}{
			{"router certificate", pki.source(t, "router").GRPCClientCredentials(""), codes.OK},
			{"plaintext", insecure.NewCredentials(), codes.Unavailable},
			{"no client certificate", tenant.GRPCClientCredentials(""), codes.Unavailable},
			{"certificate of another CA", withCA(t, foreign.files("router"), pki.files("").CAFile).GRPCClientCredentials(""), codes.Unavailable},
		}
		for _, svc := range []string{"quota", "cache", "verifier"} {
			for _, c := range callers {
				t.Run(svc+"/"+c.name, func(t *testing.T) {
					conn := meshtest.DialWith(t, m.Processes[svc].App.GRPCAddr(), c.creds)
					res, err := grpc_health_v1.NewHealthClient(conn).Check(context.Background(), &grpc_health_v1.HealthCheckRequest{})
					if status.Code(err) != c.want {
						t.Fatalf("health: %v %v, want %s", res.GetStatus(), err, c.want)
					}
				})
			}
		}
		t.Run("router/plaintext", func(t *testing.T) {
			conn := meshtest.DialWith(t, m.GRPCAddr, insecure.NewCredentials())
			if _, err := grpc_health_v1.NewHealthClient(conn).Check(context.Background(), &grpc_health_v1.HealthCheckRequest{}); status.Code(err) != codes.Unavailable {
				t.Fatalf("health over plaintext: %v, want Unavailable", err)
			}
		})
	})

	t.Run("a rotated certificate is served on the next handshake", func(t *testing.T) {
		addr := m.Processes["quota"].App.GRPCAddr()
		router := pki.source(t, "router")
		served := func() string {
			t.Helper()
			cfg := router.ClientConfig("quota")
			cfg.NextProtos = []string{"h2"}
			conn, err := tls.Dial("tcp", addr, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
		}
		before := served()
		after := pki.issue(t, "quota")
		if got := served(); got != before {
			t.Fatalf("within the reload interval: serial %s, want the old %s", got, before)
		}
		clock.Advance(reload)
		if got := served(); got != after {
			t.Fatalf("after the reload interval: serial %s, want the new %s (old %s)", got, after, before)
		}
		// The mesh still answers: the router's connection predates the rotation, and a
		// new connection from a mesh service handshakes with the new certificate.
		conn := meshtest.DialWith(t, addr, router.GRPCClientCredentials(""))
		if _, err := grpc_health_v1.NewHealthClient(conn).Check(context.Background(), &grpc_health_v1.HealthCheckRequest{}); err != nil {
			t.Fatalf("health after rotation: %v", err)
		}
		client := routerv1.NewRouterServiceClient(meshtest.DialWith(t, m.GRPCAddr, tenant.GRPCClientCredentials("")))
		if _, err := client.Complete(authed(acmeKey), &routerv1.CompleteRequest{Request: ask("primary", "Still there?")}); err != nil {
			t.Fatalf("Complete after rotation: %v", err)
		}
	})
}

// withCA is a certificate from files that trusts another CA: a caller of a foreign mesh
// that would accept our servers.
func withCA(t *testing.T, f tlsconfig.Files, caFile string) *tlsconfig.Source {
	t.Helper()
	f.CAFile = caFile
	s, err := tlsconfig.Load("test", f, tlsconfig.Options{Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
