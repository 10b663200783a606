// Package tlsconfig secures mantle's listeners and connections with TLS and mutual TLS.
// Certificates and CA bundles are read from PEM files and read again when they change, so
// a certificate is rotated by replacing its files: the next handshake uses the new one and
// nothing restarts. Every mesh service carries a certificate of the mesh CA whose URI SAN
// names it (spiffe://mantle/<service>); ServiceFromURI reads that name back.
package tlsconfig

import (
	"crypto/tls"
	"errors"
	"fmt"
	"time"
)

// DefaultReloadInterval is how often, at most, the files are read again to notice a
// rotation. Reading is done by the handshake that finds the interval passed, not by a
// goroutine, so an idle process reads nothing.
const DefaultReloadInterval = 10 * time.Second

// Config is the tls block of a process: one certificate for both listeners and for the
// calls this process makes to other mesh services. Empty (no cert_file), everything is
// plaintext.
type Config struct {
	// CertFile is this process's certificate chain (PEM); setting it turns TLS on. The
	// certificate names the service in a URI SAN, spiffe://mantle/<service>.
	CertFile string `yaml:"cert_file,omitempty"`
	// KeyFile is the certificate's private key (PEM).
	KeyFile string `yaml:"key_file,omitempty"`
	// CAFile is the mesh CA bundle (PEM): it verifies the servers this process dials and
	// the client certificates presented to its listeners. Several CAs may be listed while
	// the mesh moves from one to the next.
	CAFile string `yaml:"ca_file,omitempty"`
	// GRPCClientAuth is what the gRPC listener asks of its clients: require (a
	// certificate of the mesh CA, or no connection), verify_if_given (the default: a
	// certificate is optional, and verified when present; tenants call with a key and no
	// certificate, services with their certificate) or none.
	GRPCClientAuth ClientAuth `yaml:"grpc_client_auth,omitempty"`
	// HTTPClientAuth is the same for the HTTP listener (the OpenAI front door, /metrics)
	// and the debug listener.
	HTTPClientAuth ClientAuth `yaml:"http_client_auth,omitempty"`
	// ServerName is the name expected in the certificates of the services this process
	// dials; empty, it is the host of the address dialled (router.quota_address...).
	ServerName string `yaml:"server_name,omitempty"`
	// ReloadInterval is how often, at most, the files are checked for a new certificate
	// or CA; 0 means 10s.
	ReloadInterval time.Duration `yaml:"reload_interval,omitempty"`
}

// Enabled reports whether the block turns TLS on.
func (c Config) Enabled() bool { return c.CertFile != "" }

// Validate checks the block. A field set while cert_file is empty is an error rather than
// ignored: a half-written block must not leave the process in plaintext by surprise.
func (c Config) Validate() error {
	var errs []error
	if !c.Enabled() {
		for name, v := range map[string]string{
			"key_file": c.KeyFile, "ca_file": c.CAFile, "server_name": c.ServerName,
			"grpc_client_auth": string(c.GRPCClientAuth), "http_client_auth": string(c.HTTPClientAuth),
		} {
			if v != "" {
				errs = append(errs, fmt.Errorf("%s: set without cert_file; TLS needs cert_file, key_file and ca_file", name))
			}
		}
		if c.ReloadInterval != 0 {
			errs = append(errs, errors.New("reload_interval: set without cert_file; TLS needs cert_file, key_file and ca_file"))
		}
		return errors.Join(errs...)
	}
	if c.KeyFile == "" {
		errs = append(errs, errors.New("key_file: required with cert_file"))
	}
	if c.CAFile == "" {
		errs = append(errs, errors.New("ca_file: required with cert_file (the mesh CA verifies peers)"))
	}
	if err := c.GRPCClientAuth.validate(); err != nil {
		errs = append(errs, fmt.Errorf("grpc_client_auth: %w", err))
	}
	if err := c.HTTPClientAuth.validate(); err != nil {
		errs = append(errs, fmt.Errorf("http_client_auth: %w", err))
	}
	if c.ReloadInterval < 0 {
		errs = append(errs, fmt.Errorf("reload_interval: must not be negative, got %s", c.ReloadInterval))
	}
	return errors.Join(errs...)
}

// ClientConfig is the tls block of a client of a server outside the mesh (Redis, NATS):
// the server's CA and, when the server asks for one, a client certificate.
type ClientConfig struct {
	// Enabled turns TLS on for the connection.
	Enabled bool `yaml:"enabled"`
	// CAFile verifies the server; empty, the system's roots do.
	CAFile string `yaml:"ca_file,omitempty"`
	// CertFile is the client certificate (PEM), for servers that require one.
	CertFile string `yaml:"cert_file,omitempty"`
	// KeyFile is its private key (PEM).
	KeyFile string `yaml:"key_file,omitempty"`
	// ServerName is the name expected in the server's certificate; empty, the host of
	// the address dialled.
	ServerName string `yaml:"server_name,omitempty"`
	// ReloadInterval is how often, at most, the files are checked for a change; 0 means
	// 10s.
	ReloadInterval time.Duration `yaml:"reload_interval,omitempty"`
}

// Validate checks the block.
func (c ClientConfig) Validate() error {
	var errs []error
	if !c.Enabled {
		if c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" || c.ServerName != "" || c.ReloadInterval != 0 {
			errs = append(errs, errors.New("enabled: false, yet ca_file, cert_file, key_file, server_name or reload_interval is set; set enabled: true or remove them"))
		}
		return errors.Join(errs...)
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		errs = append(errs, errors.New("cert_file and key_file: set both or neither"))
	}
	if c.ReloadInterval < 0 {
		errs = append(errs, fmt.Errorf("reload_interval: must not be negative, got %s", c.ReloadInterval))
	}
	return errors.Join(errs...)
}

// ClientAuth is what a listener asks of its clients.
type ClientAuth string

// Client authentication modes.
const (
	ClientAuthRequire       ClientAuth = "require"
	ClientAuthVerifyIfGiven ClientAuth = "verify_if_given"
	ClientAuthNone          ClientAuth = "none"
)

func (a ClientAuth) validate() error {
	switch a {
	case "", ClientAuthRequire, ClientAuthVerifyIfGiven, ClientAuthNone:
		return nil
	}
	return fmt.Errorf("want require, verify_if_given or none, got %q", string(a))
}

func (a ClientAuth) tls() tls.ClientAuthType {
	switch a {
	case ClientAuthRequire:
		return tls.RequireAndVerifyClientCert
	case ClientAuthNone:
		return tls.NoClientCert
	}
	return tls.VerifyClientCertIfGiven
}
