package tlsconfig

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// CA is a throwaway certificate authority for development and tests (`mantle dev --tls`,
// `mantle certs`). Production meshes get their certificates from their own PKI
// (cert-manager, Vault, SPIRE): mantle only reads files.
type CA struct {
	Cert    *x509.Certificate
	CertPEM []byte
	key     crypto.Signer
}

// NewCA creates a self-signed CA valid from now for ttl.
func NewCA(commonName string, now time.Time, ttl time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("ca key: %w", err)
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{"mantle"}},
		NotBefore:             now.Add(-time.Minute), // tolerates a little clock skew between processes
		NotAfter:              now.Add(ttl),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("ca certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("ca certificate: %w", err)
	}
	return &CA{Cert: cert, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key: key}, nil
}

// Leaf describes a service certificate: server and client at once, as every mesh process
// both serves and dials.
type Leaf struct {
	// Service becomes the URI SAN spiffe://mantle/<service> and the common name.
	Service string
	// DNSNames and IPs are the names the service is dialled at.
	DNSNames []string
	IPs      []net.IP
	// NotBefore and TTL bound the validity.
	NotBefore time.Time
	TTL       time.Duration
}

// Issue signs a leaf certificate and returns it and its private key, PEM-encoded.
func (ca *CA) Issue(l Leaf) (certPEM, keyPEM []byte, err error) {
	uri, err := ServiceURI(l.Service)
	if err != nil {
		return nil, nil, err
	}
	if l.TTL <= 0 {
		return nil, nil, errors.New("leaf ttl: must be positive")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("leaf key: %w", err)
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: l.Service, Organization: []string{"mantle"}},
		NotBefore:    l.NotBefore.Add(-time.Minute),
		NotAfter:     l.NotBefore.Add(l.TTL),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     l.DNSNames,
		IPAddresses:  l.IPs,
		URIs:         []*url.URL{uri},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("leaf certificate: %w", err)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("leaf key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}), nil
}

// DevServices are the certificates `mantle certs` and `mantle dev --tls` issue by default.
var DevServices = []string{"router", "cache", "quota", "verifier", "agent"}

// WriteDevPKI creates a CA and one certificate per service in dir: ca.crt, and
// <service>.crt and <service>.key, each valid for ttl. Every certificate names its service
// (DNS and spiffe://mantle/<service>), localhost, 127.0.0.1 and ::1, so the same files
// serve compose (services dialled by name) and a mesh on one machine; each of dnsPrefixes
// adds the DNS name <prefix><service> (Kubernetes Services named mantle-<service>). The
// CA's key is not kept: new certificates need a new CA.
func WriteDevPKI(dir string, services []string, now time.Time, ttl time.Duration, dnsPrefixes ...string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("certs dir: %w", err)
	}
	ca, err := NewCA("mantle development CA", now, ttl)
	if err != nil {
		return err
	}
	if err := writeFile(filepath.Join(dir, "ca.crt"), ca.CertPEM, 0o644); err != nil {
		return err
	}
	for _, svc := range services {
		dns := []string{svc, "localhost"}
		for _, p := range dnsPrefixes {
			dns = append(dns, p+svc)
		}
		certPEM, keyPEM, err := ca.Issue(Leaf{
			Service: svc, DNSNames: dns,
			IPs:       []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
			NotBefore: now, TTL: ttl,
		})
		if err != nil {
			return fmt.Errorf("%s: %w", svc, err)
		}
		if err := writeFile(filepath.Join(dir, svc+".crt"), certPEM, 0o644); err != nil {
			return err
		}
		if err := writeFile(filepath.Join(dir, svc+".key"), keyPEM, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// writeFile replaces path atomically (a temporary file renamed over it), so a process
// reloading its certificate never reads half a file.
func writeFile(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func serialNumber() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("serial number: %w", err)
	}
	return n, nil
}
