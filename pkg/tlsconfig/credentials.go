package tlsconfig

import (
	"context"
	"crypto/tls"
	"errors"
	"net"

	"google.golang.org/grpc/credentials"
)

// GRPCServerCredentials are the transport credentials of a gRPC listener.
func (s *Source) GRPCServerCredentials(auth ClientAuth) credentials.TransportCredentials {
	return credentials.NewTLS(s.ServerConfig(auth, "h2"))
}

// GRPCClientCredentials are the transport credentials of connections to other mesh
// services. Each handshake (a new connection, a reconnection) builds its configuration
// from the current files, so a rotated certificate or CA reaches the next one; a
// tls.Config handed to credentials.NewTLS once could not follow a CA rotation.
func (s *Source) GRPCClientCredentials(serverName string) credentials.TransportCredentials {
	return &clientCredentials{config: s.ClientConfig, serverName: serverName}
}

// GRPCOutsideCredentials are the transport credentials of connections to a server outside
// the mesh (Qdrant) that has a CA of its own: the server is verified against roots' CA pool
// (the system's roots when roots is nil), and cert's certificate is presented when the
// server asks for one (none when cert is nil; the process's mesh Source, to present the
// mesh certificate). Each handshake reads both as they are then, so a rotated certificate
// or CA reaches the next connection without a restart. serverName is the name the server's
// certificate must carry; empty, the host dialled.
func GRPCOutsideCredentials(roots, cert *Source, serverName string) credentials.TransportCredentials {
	return &clientCredentials{serverName: serverName, config: func(serverName string) *tls.Config {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
		if roots != nil {
			cfg.RootCAs = roots.current().pool
		}
		if cert != nil {
			cfg.GetClientCertificate = cert.GetClientCertificate
		}
		return cfg
	}}
}

type clientCredentials struct {
	config     func(serverName string) *tls.Config
	serverName string
}

func (c *clientCredentials) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return credentials.NewTLS(c.config(c.serverName)).ClientHandshake(ctx, authority, raw)
}

func (c *clientCredentials) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("tlsconfig: client credentials cannot accept connections")
}

func (c *clientCredentials) Info() credentials.ProtocolInfo {
	// grpc still takes a channel's default authority from the deprecated ServerName.
	return credentials.ProtocolInfo{SecurityProtocol: "tls", ServerName: c.serverName} //nolint:staticcheck // SA1019, see above
}

func (c *clientCredentials) Clone() credentials.TransportCredentials {
	clone := *c
	return &clone
}

// OverrideServerName implements the deprecated method of credentials.TransportCredentials.
func (c *clientCredentials) OverrideServerName(name string) error {
	c.serverName = name
	return nil
}
