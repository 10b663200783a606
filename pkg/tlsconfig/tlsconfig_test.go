package tlsconfig

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// pki writes a mesh CA with router and quota certificates into dir, and a second,
// unrelated CA with its own "router" certificate under dir/foreign.
func pki(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := WriteDevPKI(dir, []string{"router", "quota"}, time.Now(), time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := WriteDevPKI(filepath.Join(dir, "foreign"), []string{"router"}, time.Now(), time.Hour); err != nil {
		t.Fatal(err)
	}
	return dir
}

func files(dir, svc string) Files {
	f := Files{CAFile: filepath.Join(dir, "ca.crt")}
	if svc != "" {
		f.CertFile, f.KeyFile = filepath.Join(dir, svc+".crt"), filepath.Join(dir, svc+".key")
	}
	return f
}

func load(t *testing.T, f Files, opts Options) *Source {
	t.Helper()
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	s, err := Load("test", f, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// handshake runs one TLS connection over a pipe and returns what each side saw: the
// server's view of the client certificate, the client's view of the server certificate.
// A refusal surfaces on the client's first read under TLS 1.3, so the client reads.
func handshake(t *testing.T, server, client *tls.Config) (srvState, cliState tls.ConnectionState, srvErr, cliErr error) {
	t.Helper()
	a, b := net.Pipe()
	// A guard against a hang, not a timing assertion: a handshake takes milliseconds.
	deadline := time.Now().Add(30 * time.Second)
	a.SetDeadline(deadline)
	b.SetDeadline(deadline)
	srv, cli := tls.Server(a, server), tls.Client(b, client)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if srvErr = srv.Handshake(); srvErr == nil {
			srvState = srv.ConnectionState()
			_, srvErr = srv.Write([]byte{1})
		}
		srv.Close()
	}()
	if cliErr = cli.Handshake(); cliErr == nil {
		cliState = cli.ConnectionState()
		// Read to the server's close_notify: its Close waits for this side to take it.
		var data []byte
		if data, cliErr = io.ReadAll(cli); cliErr == nil && len(data) != 1 {
			cliErr = fmt.Errorf("read %d bytes, want 1", len(data))
		}
	}
	cli.Close()
	<-done
	return srvState, cliState, srvErr, cliErr
}

func TestMutualTLS(t *testing.T) {
	dir := pki(t)
	foreign := filepath.Join(dir, "foreign")
	tests := []struct {
		name       string
		auth       ClientAuth
		client     Files
		serverName string
		wantErr    string // in the client's or the server's error; "" for success
		wantPeer   string // the client's service as the server verified it
	}{
		{name: "mesh client certificate", auth: ClientAuthRequire, client: files(dir, "router"), serverName: "quota", wantPeer: "router"},
		{name: "verify_if_given with certificate", auth: ClientAuthVerifyIfGiven, client: files(dir, "router"), serverName: "quota", wantPeer: "router"},
		{name: "verify_if_given without certificate", auth: ClientAuthVerifyIfGiven, client: files(dir, ""), serverName: "quota"},
		{name: "require without certificate", auth: ClientAuthRequire, client: files(dir, ""), serverName: "quota", wantErr: "certificate required"},
		{name: "client certificate of another CA", auth: ClientAuthRequire, client: Files{CertFile: filepath.Join(foreign, "router.crt"), KeyFile: filepath.Join(foreign, "router.key"), CAFile: filepath.Join(dir, "ca.crt")}, serverName: "quota", wantErr: "unknown certificate authority"},
		{name: "verify_if_given rejects another CA", auth: ClientAuthVerifyIfGiven, client: Files{CertFile: filepath.Join(foreign, "router.crt"), KeyFile: filepath.Join(foreign, "router.key"), CAFile: filepath.Join(dir, "ca.crt")}, serverName: "quota", wantErr: "unknown certificate authority"},
		{name: "server of another CA", auth: ClientAuthRequire, client: files(foreign, "router"), serverName: "quota", wantErr: "unknown authority"},
		{name: "server name not in the certificate", auth: ClientAuthRequire, client: files(dir, "router"), serverName: "cache", wantErr: "not cache"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			server := load(t, files(dir, "quota"), Options{})
			client := load(t, tt.client, Options{})
			srvState, cliState, srvErr, cliErr := handshake(t, server.ServerConfig(tt.auth), client.ClientConfig(tt.serverName))
			if tt.wantErr != "" {
				if srvErr == nil && cliErr == nil {
					t.Fatalf("connection accepted, want refusal with %q", tt.wantErr)
				}
				if !strings.Contains(errString(srvErr)+errString(cliErr), tt.wantErr) {
					t.Fatalf("server: %v, client: %v; want %q", srvErr, cliErr, tt.wantErr)
				}
				return
			}
			if srvErr != nil || cliErr != nil {
				t.Fatalf("server: %v, client: %v", srvErr, cliErr)
			}
			if got := mustService(t, cliState.VerifiedChains); got != "quota" {
				t.Errorf("client verified server %q, want quota", got)
			}
			if tt.wantPeer == "" {
				if len(srvState.PeerCertificates) != 0 {
					t.Errorf("server saw a client certificate, want none")
				}
				return
			}
			if got := mustService(t, srvState.VerifiedChains); got != tt.wantPeer {
				t.Errorf("server verified client %q, want %q", got, tt.wantPeer)
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func mustService(t *testing.T, chains [][]*x509.Certificate) string {
	t.Helper()
	if len(chains) == 0 {
		t.Fatal("no verified chain")
	}
	svc, err := ServiceFromCertificate(chains[0][0])
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// TestRotation replaces a server's certificate and key files and the CA bundle, and
// checks that the next handshake after the reload interval uses them, with no new Source,
// and that a half-written rotation keeps the previous certificate.
func TestRotation(t *testing.T) {
	dir := pki(t)
	clock := clockwork.NewFakeClockAt(epoch)
	reg := prometheus.NewRegistry()
	metrics, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	server := load(t, files(dir, "quota"), Options{Clock: clock, ReloadInterval: time.Minute, Metrics: metrics})
	client := load(t, files(dir, "router"), Options{Clock: clock, ReloadInterval: time.Minute})
	serial := func() string {
		t.Helper()
		_, st, srvErr, cliErr := handshake(t, server.ServerConfig(ClientAuthRequire), client.ClientConfig("quota"))
		if srvErr != nil || cliErr != nil {
			t.Fatalf("server: %v, client: %v", srvErr, cliErr)
		}
		return st.PeerCertificates[0].SerialNumber.String()
	}
	before := serial()

	// A new CA: the server gets a certificate of it, and both sides trust the old and the
	// new CA, as during a CA rotation.
	next := filepath.Join(dir, "next")
	if err := WriteDevPKI(next, []string{"quota"}, time.Now(), time.Hour); err != nil {
		t.Fatal(err)
	}
	bundle := append(readFile(t, filepath.Join(dir, "ca.crt")), readFile(t, filepath.Join(next, "ca.crt"))...)
	for _, f := range []struct {
		path string
		data []byte
	}{
		{filepath.Join(dir, "ca.crt"), bundle},
		{filepath.Join(dir, "quota.crt"), readFile(t, filepath.Join(next, "quota.crt"))},
		{filepath.Join(dir, "quota.key"), readFile(t, filepath.Join(next, "quota.key"))},
	} {
		if err := writeFile(f.path, f.data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	want := certSerial(t, filepath.Join(next, "quota.crt"))
	if got := serial(); got != before {
		t.Fatalf("before the reload interval: serial %s, want the old %s", got, before)
	}
	clock.Advance(time.Minute)
	if got := serial(); got != want {
		t.Fatalf("after the reload interval: serial %s, want the new %s (old %s)", got, want, before)
	}
	if got := counterValue(t, metrics.reloads.WithLabelValues("test", "ok")); got != 1 {
		t.Errorf("reloads ok = %v, want 1", got)
	}

	// Half a rotation: a certificate whose key has not been written yet.
	if err := writeFile(filepath.Join(dir, "quota.crt"), readFile(t, filepath.Join(dir, "router.crt")), 0o600); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute)
	if got := serial(); got != want {
		t.Fatalf("after a bad rotation: serial %s, want the kept %s", got, want)
	}
	if got := counterValue(t, metrics.reloads.WithLabelValues("test", "error")); got != 1 {
		t.Errorf("reloads error = %v, want 1", got)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func certSerial(t *testing.T, path string) string {
	t.Helper()
	block, _ := pem.Decode(readFile(t, path))
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert.SerialNumber.String()
}

func TestLoadErrors(t *testing.T) {
	dir := pki(t)
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		files Files
		want  string
	}{
		{"missing file", Files{CertFile: filepath.Join(dir, "nope.crt"), KeyFile: filepath.Join(dir, "quota.key")}, "nope.crt"},
		{"key of another certificate", Files{CertFile: filepath.Join(dir, "quota.crt"), KeyFile: filepath.Join(dir, "router.key")}, "quota.crt and"},
		{"CA file without a certificate", Files{CAFile: garbage}, "garbage.pem: no PEM certificate"},
		{"certificate without key", Files{CertFile: filepath.Join(dir, "quota.crt")}, "go together"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load("test", tt.files, Options{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestServiceFromCertificate(t *testing.T) {
	parse := func(s string) *url.URL {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	tests := []struct {
		name    string
		uris    []string
		want    string
		wantErr string
	}{
		{"router", []string{"spiffe://mantle/router"}, "router", ""},
		{"with another non-spiffe URI", []string{"https://example.com/x", "spiffe://mantle/quota"}, "quota", ""},
		{"none", nil, "", "no spiffe URI SAN"},
		{"two", []string{"spiffe://mantle/router", "spiffe://mantle/quota"}, "", "more than one"},
		{"other trust domain", []string{"spiffe://evil/router"}, "", "want spiffe://mantle/<service>"},
		{"nested path", []string{"spiffe://mantle/router/x"}, "", "want spiffe://mantle/<service>"},
		{"escaped slash", []string{"spiffe://mantle/router%2Fx"}, "", "want spiffe://mantle/<service>"},
		{"empty path", []string{"spiffe://mantle"}, "", "want spiffe://mantle/<service>"},
		{"upper case", []string{"spiffe://mantle/Router"}, "", "want spiffe://mantle/<service>"},
		{"user info", []string{"spiffe://x@mantle/router"}, "", "want spiffe://mantle/<service>"},
		{"query", []string{"spiffe://mantle/router?a=b"}, "", "want spiffe://mantle/<service>"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cert := &x509.Certificate{}
			for _, u := range tt.uris {
				cert.URIs = append(cert.URIs, parse(u))
			}
			got, err := ServiceFromCertificate(cert)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %q, %v; want error %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestServiceURIRejectsBadNames(t *testing.T) {
	for _, name := range []string{"", "Router", "a/b", "-x", strings.Repeat("a", 64)} {
		if _, err := ServiceURI(name); err == nil {
			t.Errorf("ServiceURI(%q) accepted", name)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"off", Config{}, nil},
		{"on", Config{CertFile: "c", KeyFile: "k", CAFile: "ca", GRPCClientAuth: ClientAuthRequire}, nil},
		{"half off", Config{CAFile: "ca", GRPCClientAuth: ClientAuthRequire}, []string{"ca_file: set without cert_file", "grpc_client_auth: set without cert_file"}},
		{"missing key and ca", Config{CertFile: "c"}, []string{"key_file: required", "ca_file: required"}},
		{"bad mode", Config{CertFile: "c", KeyFile: "k", CAFile: "ca", HTTPClientAuth: "maybe"}, []string{`http_client_auth: want require, verify_if_given or none, got "maybe"`}},
		{"negative interval", Config{CertFile: "c", KeyFile: "k", CAFile: "ca", ReloadInterval: -time.Second}, []string{"reload_interval: must not be negative"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			for _, w := range tt.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("err = %v, want it to contain %q", err, w)
				}
			}
		})
	}
	clientTests := []struct {
		name string
		cfg  ClientConfig
		want string
	}{
		{"off", ClientConfig{}, ""},
		{"on with system roots", ClientConfig{Enabled: true}, ""},
		{"files while off", ClientConfig{CAFile: "ca"}, "enabled: false"},
		{"cert without key", ClientConfig{Enabled: true, CertFile: "c"}, "set both or neither"},
	}
	for _, tt := range clientTests {
		t.Run("client "+tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestWriteDevPKI(t *testing.T) {
	dir := pki(t)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(readFile(t, filepath.Join(dir, "ca.crt")))
	for _, svc := range []string{"router", "quota"} {
		block, _ := pem.Decode(readFile(t, filepath.Join(dir, svc+".crt")))
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: svc, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("%s: %v", svc, err)
		}
		if got, err := ServiceFromCertificate(cert); err != nil || got != svc {
			t.Errorf("%s: service %q, %v", svc, got, err)
		}
		st, err := os.Stat(filepath.Join(dir, svc+".key"))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s.key mode %v, want 0600", svc, st.Mode().Perm())
		}
	}
	if bytes.Contains(readFile(t, filepath.Join(dir, "ca.crt")), []byte("PRIVATE KEY")) {
		t.Error("ca.crt holds a private key")
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
