package events

import (
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mantle-mesh/mantle/pkg/tlsconfig"
)

// TestConnectTLS connects the publisher to a NATS server that requires TLS and a client
// certificate of its CA.
func TestConnectTLS(t *testing.T) {
	dir := t.TempDir()
	if err := tlsconfig.WriteDevPKI(dir, []string{"nats", "router"}, time.Now(), time.Hour); err != nil {
		t.Fatal(err)
	}
	foreign := filepath.Join(dir, "foreign")
	if err := tlsconfig.WriteDevPKI(foreign, []string{"router"}, time.Now(), time.Hour); err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "nats.crt"), filepath.Join(dir, "nats.key"))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, NoSigs: true, NoLog: true,
		TLS: true, TLSVerify: true, TLSTimeout: 5,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	defer srv.Shutdown()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready")
	}
	url := srv.ClientURL()

	tests := []struct {
		name      string
		files     tlsconfig.Files
		connected bool
	}{
		{"mesh certificate", tlsconfig.Files{CertFile: filepath.Join(dir, "router.crt"), KeyFile: filepath.Join(dir, "router.key"), CAFile: filepath.Join(dir, "ca.crt")}, true},
		{"no client certificate", tlsconfig.Files{CAFile: filepath.Join(dir, "ca.crt")}, false},
		{"certificate of another CA", tlsconfig.Files{CertFile: filepath.Join(foreign, "router.crt"), KeyFile: filepath.Join(foreign, "router.key"), CAFile: filepath.Join(dir, "ca.crt")}, false},
		{"server not trusted", tlsconfig.Files{CertFile: filepath.Join(dir, "router.crt"), KeyFile: filepath.Join(dir, "router.key"), CAFile: filepath.Join(foreign, "ca.crt")}, false},
	}
	log := slog.New(slog.DiscardHandler)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, err := tlsconfig.Load("nats", tt.files, tlsconfig.Options{Log: log})
			if err != nil {
				t.Fatal(err)
			}
			// The server's certificate names 127.0.0.1 among its addresses.
			p, err := Connect(t.Context(), url, log, prometheus.NewRegistry(), WithTLS(src, ""))
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if got := p.Conn().IsConnected(); got != tt.connected {
				t.Fatalf("connected = %v, want %v", got, tt.connected)
			}
			if tt.connected && p.Conn().TLSRequired() != true {
				t.Error("connected without TLS")
			}
		})
	}
}
