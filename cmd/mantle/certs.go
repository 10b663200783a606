package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/mantle-mesh/mantle/pkg/tlsconfig"
)

// certs writes a throwaway CA and one certificate per service, for a TLS mesh in
// development, compose or a test cluster. Real deployments use their own PKI.
func certs(_ context.Context, args []string, env cmdEnv) error {
	stdout, stderr := env.stdout, env.stderr
	fs := flag.NewFlagSet("certs", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "certs", "directory to write ca.crt, <service>.crt and <service>.key into")
	services := fs.String("services", strings.Join(tlsconfig.DevServices, ","), "comma list of services to issue certificates for")
	ttl := fs.Duration("ttl", 30*24*time.Hour, "validity of the CA and the certificates")
	prefixes := fs.String("dns-prefix", "", "comma list of prefixes: each adds the DNS name <prefix><service> (mantle- for the Kubernetes Services)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var names []string
	for _, s := range strings.Split(*services, ",") {
		if s = strings.TrimSpace(s); s != "" {
			names = append(names, s)
		}
	}
	if len(names) == 0 {
		return errors.New("--services: at least one service")
	}
	var dnsPrefixes []string
	for _, p := range strings.Split(*prefixes, ",") {
		if p = strings.TrimSpace(p); p != "" {
			dnsPrefixes = append(dnsPrefixes, p)
		}
	}
	if err := tlsconfig.WriteDevPKI(*out, names, time.Now(), *ttl, dnsPrefixes...); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s and a certificate per service (%s), valid for %s; the CA's key was not kept\n",
		filepath.Join(*out, "ca.crt"), strings.Join(names, ", "), *ttl)
	return nil
}

// clientTLS is the TLS of the command-line clients (chat, review): plaintext unless a CA
// is given; a certificate for listeners that require one.
type clientTLS struct {
	caFile, certFile, keyFile, serverName string
}

func (c *clientTLS) register(fs *flag.FlagSet, env cmdEnv) {
	fs.StringVar(&c.caFile, "tls.ca-file", env.varOr("MANTLE_TLS_CA_FILE", ""), "CA that signed the server's certificate; turns TLS on ($MANTLE_TLS_CA_FILE)")
	fs.StringVar(&c.certFile, "tls.cert-file", env.varOr("MANTLE_TLS_CERT_FILE", ""), "client certificate, for listeners that require one ($MANTLE_TLS_CERT_FILE)")
	fs.StringVar(&c.keyFile, "tls.key-file", env.varOr("MANTLE_TLS_KEY_FILE", ""), "its private key ($MANTLE_TLS_KEY_FILE)")
	fs.StringVar(&c.serverName, "tls.server-name", "", "name expected in the server's certificate (default: the host of --addr)")
}

func (c *clientTLS) credentials() (credentials.TransportCredentials, error) {
	if c.caFile == "" {
		if c.certFile != "" || c.keyFile != "" || c.serverName != "" {
			return nil, errors.New("--tls.ca-file: required with --tls.cert-file, --tls.key-file or --tls.server-name")
		}
		return insecure.NewCredentials(), nil
	}
	src, err := tlsconfig.Load("client", tlsconfig.Files{CAFile: c.caFile, CertFile: c.certFile, KeyFile: c.keyFile}, tlsconfig.Options{Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	return src.GRPCClientCredentials(c.serverName), nil
}
