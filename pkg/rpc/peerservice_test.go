package rpc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/mantle-mesh/mantle/pkg/tlsconfig"
)

func TestPeerServiceFromContext(t *testing.T) {
	leaf := func(uris ...string) *x509.Certificate {
		c := &x509.Certificate{}
		for _, s := range uris {
			u, err := url.Parse(s)
			if err != nil {
				t.Fatal(err)
			}
			c.URIs = append(c.URIs, u)
		}
		return c
	}
	tlsPeer := func(state tls.ConnectionState) context.Context {
		return peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{State: state}})
	}
	tests := []struct {
		name    string
		ctx     context.Context
		want    string // "" wants ErrNoServiceIdentity from PeerService
		invalid bool   // PeerCertificateService reports an error rather than ok=false
	}{
		{name: "verified router", ctx: tlsPeer(tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{leaf("spiffe://mantle/router")}}}), want: "router"},
		{name: "no peer", ctx: context.Background()},
		{name: "plaintext", ctx: peer.NewContext(context.Background(), &peer.Peer{})},
		{name: "tls without client certificate", ctx: tlsPeer(tls.ConnectionState{})},
		// Presented but not verified (a listener that asks for none): never trusted.
		{name: "unverified certificate", ctx: tlsPeer(tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf("spiffe://mantle/router")}})},
		{name: "verified without spiffe URI", ctx: tlsPeer(tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{leaf("https://mantle/router")}}}), invalid: true},
		{name: "verified, other trust domain", ctx: tlsPeer(tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{leaf("spiffe://other/router")}}}), invalid: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := PeerService(tt.ctx)
			svc, ok, serr := PeerCertificateService(tt.ctx)
			if tt.want == "" {
				if !errors.Is(err, ErrNoServiceIdentity) {
					t.Fatalf("got %q, %v; want ErrNoServiceIdentity", got, err)
				}
				if ok || (serr != nil) != tt.invalid {
					t.Fatalf("PeerCertificateService = %q, %v, %v; want ok=false and an error only for an invalid certificate (%v)", svc, ok, serr, tt.invalid)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %q, %v; want %q", got, err, tt.want)
			}
			if svc != tt.want || !ok || serr != nil {
				t.Fatalf("PeerCertificateService = %q, %v, %v; want %q", svc, ok, serr, tt.want)
			}
		})
	}
}

// TestPeerServiceOverMTLS reads the identity as a handler sees it behind a real gRPC
// listener with the mesh's credentials, for each kind of caller.
func TestPeerServiceOverMTLS(t *testing.T) {
	dir := t.TempDir()
	if err := tlsconfig.WriteDevPKI(dir, []string{"quota", "router"}, time.Now(), time.Hour); err != nil {
		t.Fatal(err)
	}
	foreign := filepath.Join(dir, "foreign")
	if err := tlsconfig.WriteDevPKI(foreign, []string{"router"}, time.Now(), time.Hour); err != nil {
		t.Fatal(err)
	}
	source := func(dir, svc string) *tlsconfig.Source {
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
	server := source(dir, "quota")
	seen := make(chan error, 1)
	var got string
	srv := grpc.NewServer(
		grpc.Creds(server.GRPCServerCredentials(tlsconfig.ClientAuthVerifyIfGiven)),
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			var err error
			got, err = PeerService(ctx)
			seen <- err
			return h(ctx, req)
		}),
	)
	grpc_health_v1.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)

	tests := []struct {
		name     string
		creds    credentials.TransportCredentials
		want     string // the identity the handler sees; "" for none
		wantCode codes.Code
	}{
		{name: "router certificate", creds: source(dir, "router").GRPCClientCredentials("quota"), want: "router"},
		{name: "no client certificate", creds: source(dir, "").GRPCClientCredentials("quota")},
		{name: "certificate of another CA", creds: source(foreign, "router").GRPCClientCredentials("quota"), wantCode: codes.Unavailable},
		{name: "plaintext", creds: insecure.NewCredentials(), wantCode: codes.Unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(tt.creds))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_, err = grpc_health_v1.NewHealthClient(conn).Check(context.Background(), &grpc_health_v1.HealthCheckRequest{})
			if tt.wantCode != codes.OK {
				if status.Code(err) != tt.wantCode {
					t.Fatalf("err = %v, want %s", err, tt.wantCode)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			perr := <-seen
			if tt.want == "" {
				if !errors.Is(perr, ErrNoServiceIdentity) {
					t.Fatalf("handler saw %q, %v; want no identity", got, perr)
				}
				return
			}
			if perr != nil || got != tt.want {
				t.Fatalf("handler saw %q, %v; want %q", got, perr, tt.want)
			}
		})
	}
}
