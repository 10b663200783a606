package quota

import (
	"context"
	"crypto/tls"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mantle-mesh/mantle/pkg/tlsconfig"
)

// TestRedisClientTLS dials through the dialer newRedisClient installs, against a TLS
// listener that requires a client certificate of the test CA, as a TLS Redis would.
func TestRedisClientTLS(t *testing.T) {
	dir := t.TempDir()
	if err := tlsconfig.WriteDevPKI(dir, []string{"redis", "quota"}, time.Now(), time.Hour); err != nil {
		t.Fatal(err)
	}
	foreign := filepath.Join(dir, "foreign")
	if err := tlsconfig.WriteDevPKI(foreign, []string{"redis"}, time.Now(), time.Hour); err != nil {
		t.Fatal(err)
	}
	quiet := tlsconfig.Options{Log: slog.New(slog.DiscardHandler)}
	server, err := tlsconfig.Load("redis", tlsconfig.Files{CertFile: filepath.Join(dir, "redis.crt"), KeyFile: filepath.Join(dir, "redis.key"), CAFile: filepath.Join(dir, "ca.crt")}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := tls.Listen("tcp", "127.0.0.1:0", server.ServerConfig(tlsconfig.ClientAuthRequire))
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	// The listener reports the service each client certificate names.
	peers := make(chan string)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				close(peers)
				return
			}
			go func() {
				defer c.Close()
				tc := c.(*tls.Conn)
				if err := tc.Handshake(); err != nil {
					peers <- "refused: " + err.Error()
					return
				}
				svc, err := tlsconfig.ServiceFromCertificate(tc.ConnectionState().VerifiedChains[0][0])
				if err != nil {
					svc = err.Error()
				}
				peers <- svc
			}()
		}
	}()

	tests := []struct {
		name     string
		tls      tlsconfig.ClientConfig
		wantPeer string // what the server saw
		wantErr  string // what the client got
	}{
		{name: "mesh CA and client certificate", tls: tlsconfig.ClientConfig{Enabled: true, CAFile: filepath.Join(dir, "ca.crt"), CertFile: filepath.Join(dir, "quota.crt"), KeyFile: filepath.Join(dir, "quota.key"), ServerName: "redis"}, wantPeer: "quota"},
		{name: "server name from the address", tls: tlsconfig.ClientConfig{Enabled: true, CAFile: filepath.Join(dir, "ca.crt"), CertFile: filepath.Join(dir, "quota.crt"), KeyFile: filepath.Join(dir, "quota.key")}, wantPeer: "quota"},
		{name: "server of another CA", tls: tlsconfig.ClientConfig{Enabled: true, CAFile: filepath.Join(foreign, "ca.crt"), CertFile: filepath.Join(dir, "quota.crt"), KeyFile: filepath.Join(dir, "quota.key")}, wantErr: "unknown authority", wantPeer: "refused"},
		{name: "wrong server name", tls: tlsconfig.ClientConfig{Enabled: true, CAFile: filepath.Join(dir, "ca.crt"), CertFile: filepath.Join(dir, "quota.crt"), KeyFile: filepath.Join(dir, "quota.key"), ServerName: "cache"}, wantErr: "not cache", wantPeer: "refused"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig().Redis
			cfg.Address, cfg.TLS = lis.Addr().String(), tt.tls
			client, err := newRedisClient(cfg, os.Getenv, quiet)
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			conn, err := client.Options().Dialer(context.Background(), "tcp", cfg.Address)
			if conn != nil {
				conn.Close()
			}
			if got := <-peers; !strings.HasPrefix(got, tt.wantPeer) {
				t.Errorf("server saw %q, want %q", got, tt.wantPeer)
			}
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("dial: %v, want %q", err, tt.wantErr)
			}
		})
	}

	cfg := DefaultConfig().Redis
	cfg.Address = lis.Addr().String()
	cfg.TLS = tlsconfig.ClientConfig{Enabled: true, CAFile: filepath.Join(dir, "missing.crt")}
	if _, err := newRedisClient(cfg, os.Getenv, quiet); err == nil || !strings.Contains(err.Error(), "redis.tls: ") || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing CA file: %v, want an error naming redis.tls", err)
	}
}
