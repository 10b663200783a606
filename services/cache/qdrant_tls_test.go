package cache

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc/connectivity"

	"github.com/mantle-mesh/mantle/pkg/tlsconfig"
	"github.com/mantle-mesh/mantle/services/cache/qdranttest"
)

// qdrantWait bounds each call and wait of the TLS test, so that a hang fails it; it is
// never a pause.
const qdrantWait = 20 * time.Second

// qdrantPKI is a CA whose key the test keeps, to issue certificates and replace them.
type qdrantPKI struct {
	dir string
	ca  *tlsconfig.CA
}

func newQdrantPKI(t *testing.T, name string) *qdrantPKI {
	t.Helper()
	ca, err := tlsconfig.NewCA(name, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p := &qdrantPKI{dir: t.TempDir(), ca: ca}
	writeTLSFile(t, filepath.Join(p.dir, "ca.crt"), ca.CertPEM)
	return p
}

// issue writes <name>.crt and <name>.key, replacing earlier ones, and returns the pair.
func (p *qdrantPKI) issue(t *testing.T, name string) tls.Certificate {
	t.Helper()
	certPEM, keyPEM, err := p.ca.Issue(tlsconfig.Leaf{Service: name, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now(), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	writeTLSFile(t, filepath.Join(p.dir, name+".crt"), certPEM)
	writeTLSFile(t, filepath.Join(p.dir, name+".key"), keyPEM)
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

// source loads <name>'s files as a process's mesh Source on clock.
func (p *qdrantPKI) source(t *testing.T, name string, clock clockwork.Clock) *tlsconfig.Source {
	t.Helper()
	s, err := tlsconfig.Load("mesh", tlsconfig.Files{
		CertFile: filepath.Join(p.dir, name+".crt"), KeyFile: filepath.Join(p.dir, name+".key"), CAFile: filepath.Join(p.dir, "ca.crt"),
	}, tlsconfig.Options{Clock: clock, Log: slog.New(slog.DiscardHandler), ReloadInterval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func writeTLSFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestQdrantClientCertificate runs the cache module against a Qdrant that requires client
// certificates of the mesh CA: a client without one, or with one of another CA, is refused
// in the handshake; with client_certificate: mesh it presents the process's certificate;
// and once the files are replaced, the next connection presents the new certificate,
// without a restart.
func TestQdrantClientCertificate(t *testing.T) {
	t.Parallel()
	mesh := newQdrantPKI(t, "test mesh CA")
	qdrantCA := newQdrantPKI(t, "test qdrant CA") // Qdrant's own CA, for its server certificate
	foreign := newQdrantPKI(t, "another CA")
	serverPair := qdrantCA.issue(t, "qdrant")
	first := mesh.issue(t, "cache")
	foreign.issue(t, "cache")
	clientCAs := x509.NewCertPool()
	clientCAs.AddCert(mesh.ca.Cert)
	srv, err := qdranttest.StartTLS(&tls.Config{
		MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{serverPair},
		ClientCAs: clientCAs, ClientAuth: tls.RequireAndVerifyClientCert,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)

	// connect builds the module with qdrant block q and the process certificate mesh (nil:
	// no tls block), and asks Qdrant for its version once.
	connect := func(t *testing.T, q QdrantConfig, meshSource *tlsconfig.Source) (*runner, error) {
		t.Helper()
		cfg := DefaultConfig()
		cfg.Backend = BackendQdrant
		q.Address, q.Timeout, q.SweepInterval, q.CollectionPrefix = srv.Addr, qdrantWait, time.Minute, "test_"
		cfg.Qdrant = q
		env, _, _ := moduleEnv(t)
		env.TLS = meshSource
		r, err := build(context.Background(), cfg, env, func(string) string { return "" })
		if err != nil {
			t.Fatalf("build: %v", err)
		}
		t.Cleanup(r.close)
		_, err = r.qdrant.ServerVersion(context.Background())
		return r, err
	}
	qdrantCAFile := filepath.Join(qdrantCA.dir, "ca.crt")

	t.Run("refused", func(t *testing.T) {
		for _, tt := range []struct {
			name string
			q    QdrantConfig
			mesh *tlsconfig.Source
		}{
			{"plaintext", QdrantConfig{}, nil},
			{"no client certificate", QdrantConfig{TLS: true, CAFile: qdrantCAFile, ClientCertificate: QdrantClientCertificateNone}, mesh.source(t, "cache", clockwork.NewRealClock())},
			{"a certificate of another CA", QdrantConfig{TLS: true, CAFile: qdrantCAFile, ClientCertificate: QdrantClientCertificateMesh}, foreign.source(t, "cache", clockwork.NewRealClock())},
			{"Qdrant's CA not trusted", QdrantConfig{TLS: true, ClientCertificate: QdrantClientCertificateMesh}, mesh.source(t, "cache", clockwork.NewRealClock())},
		} {
			before := srv.Calls("HealthCheck")
			if _, err := connect(t, tt.q, tt.mesh); err == nil {
				t.Errorf("%s: Qdrant answered, want the connection refused", tt.name)
			}
			if n := srv.Calls("HealthCheck") - before; n != 0 {
				t.Errorf("%s: %d calls reached Qdrant, want none", tt.name, n)
			}
		}
	})

	t.Run("mesh certificate, rotated without a restart", func(t *testing.T) {
		clock := clockwork.NewFakeClock()
		r, err := connect(t, QdrantConfig{TLS: true, CAFile: qdrantCAFile, ClientCertificate: QdrantClientCertificateMesh}, mesh.source(t, "cache", clock))
		if err != nil {
			t.Fatalf("with the mesh certificate: %v", err)
		}
		if got := srv.ClientCertificate(); got == nil || got.SerialNumber.Cmp(first.Leaf.SerialNumber) != 0 {
			t.Fatalf("Qdrant saw client certificate %v, want serial %v", got, first.Leaf.SerialNumber)
		}
		second := mesh.issue(t, "cache")
		clock.Advance(2 * time.Minute) // past the reload interval: the next handshake reads the files
		srv.DropConnections()
		// Wait for the client to notice the closed connection (an event, not a pause).
		conn := r.qdrant.client.GetGrpcClient().Conn()
		ctx, cancel := context.WithTimeout(context.Background(), qdrantWait)
		defer cancel()
		for s := conn.GetState(); s == connectivity.Ready; s = conn.GetState() {
			if !conn.WaitForStateChange(ctx, s) {
				t.Fatal("the client never noticed its connection was closed")
			}
		}
		if _, err := r.qdrant.ServerVersion(context.Background()); err != nil {
			t.Fatalf("after the rotation: %v", err)
		}
		if got := srv.ClientCertificate(); got == nil || got.SerialNumber.Cmp(second.Leaf.SerialNumber) != 0 {
			t.Fatalf("after the rotation Qdrant saw certificate %v, want the new one (serial %v)", got, second.Leaf.SerialNumber)
		}
	})
}
