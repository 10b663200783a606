package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/pkg/tlsconfig"
)

func TestCerts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"certs", "--out", dir, "--services", "router, quota", "--dns-prefix", "mantle-"}, testEnv(&stdout, &stderr)); code != 0 {
		t.Fatalf("certs: %d, %s", code, stderr.String())
	}
	for _, svc := range []string{"router", "quota"} {
		cert, err := tls.LoadX509KeyPair(filepath.Join(dir, svc+".crt"), filepath.Join(dir, svc+".key"))
		if err != nil {
			t.Fatal(err)
		}
		if got, err := tlsconfig.ServiceFromCertificate(cert.Leaf); err != nil || got != svc {
			t.Errorf("%s.crt names %q, %v", svc, got, err)
		}
		for _, name := range []string{svc, "mantle-" + svc, "localhost", "127.0.0.1"} {
			if err := cert.Leaf.VerifyHostname(name); err != nil {
				t.Errorf("%s.crt: %v", svc, err)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "cache.crt")); !os.IsNotExist(err) {
		t.Errorf("cache.crt written though not asked for: %v", err)
	}
	stderr.Reset()
	if code := run(context.Background(), []string{"certs", "--out", dir, "--services", " , "}, testEnv(&stdout, &stderr)); code != 1 || !strings.Contains(stderr.String(), "--services: at least one service") {
		t.Errorf("no services: %d, %q", code, stderr.String())
	}
	stderr.Reset()
	if code := run(context.Background(), []string{"certs", "--out", dir, "--services", "Router"}, testEnv(&stdout, &stderr)); code != 1 || !strings.Contains(stderr.String(), `service name "Router"`) {
		t.Errorf("bad service name: %d, %q", code, stderr.String())
	}
}

// TestDevTLS runs the dev configuration with `mantle dev --tls`'s certificates and asks it
// with `mantle chat`: over TLS with the CA it answers, in plaintext it does not.
func TestDevTLS(t *testing.T) {
	t.Parallel()
	cfg := devConfig("fast", func(string) string { return "" })
	for i := range cfg.Router.Models {
		cfg.Router.Models[i].SimProfile = "fast"
	}
	dir := t.TempDir()
	var err error
	if cfg.TLS, err = devTLS(dir); err != nil {
		t.Fatal(err)
	}
	m := meshtest.Start(t, cfg, meshtest.All)
	ca := filepath.Join(dir, "ca.crt")
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStderr string
	}{
		{"tls", []string{"--tls.ca-file", ca}, 0, ""},
		{"plaintext", nil, 1, "Unavailable"},
		{"cert without ca", []string{"--tls.cert-file", filepath.Join(dir, "router.crt")}, 1, "--tls.ca-file: required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"chat", "--addr", m.GRPCAddr, "--key", devKey, "--timeout", "20s"}, tt.args...)
			args = append(args, "Is this encrypted?")
			var stdout, stderr bytes.Buffer
			if code := run(context.Background(), args, testEnv(&stdout, &stderr)); code != tt.wantCode {
				t.Fatalf("chat %q: %d, want %d; stderr: %s", tt.args, code, tt.wantCode, stderr.String())
			}
			if !strings.Contains(stderr.String(), tt.wantStderr) {
				t.Errorf("stderr %q, want %q", stderr.String(), tt.wantStderr)
			}
		})
	}
	var banner bytes.Buffer
	printDevBanner(&banner, m.GRPCAddr, m.HTTPAddr, cfg)
	for _, want := range []string{"https://" + m.HTTPAddr, "grpcurl -cacert " + ca, "--cacert " + ca, "SSL_CERT_FILE=" + ca, "--tls.ca-file " + ca} {
		if !strings.Contains(banner.String(), want) {
			t.Errorf("banner lacks %q:\n%s", want, banner.String())
		}
	}
}
