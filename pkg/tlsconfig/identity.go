package tlsconfig

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"regexp"
)

// TrustDomain is the SPIFFE trust domain of mantle's service identities.
const TrustDomain = "mantle"

// serviceName is what may follow spiffe://mantle/: one lower-case path segment.
var serviceName = regexp.MustCompile(`^[a-z][a-z0-9-]{0,62}$`)

// ServiceURI is the URI SAN that names a mesh service in its certificate:
// spiffe://mantle/<service>.
func ServiceURI(service string) (*url.URL, error) {
	if !serviceName.MatchString(service) {
		return nil, fmt.Errorf("service name %q: want [a-z][a-z0-9-]*, at most 63 characters", service)
	}
	return &url.URL{Scheme: "spiffe", Host: TrustDomain, Path: "/" + service}, nil
}

// ServiceFromCertificate returns the service a certificate names: the one URI SAN of the
// form spiffe://mantle/<service>. A certificate with no SPIFFE URI, with more than one, of
// another trust domain or with a path that is not one service name names no service. It
// does not verify the certificate: callers pass a leaf that the handshake verified.
func ServiceFromCertificate(cert *x509.Certificate) (string, error) {
	var found *url.URL
	for _, u := range cert.URIs {
		if u.Scheme != "spiffe" {
			continue
		}
		if found != nil {
			return "", errors.New("certificate has more than one spiffe URI SAN")
		}
		found = u
	}
	if found == nil {
		return "", errors.New("certificate has no spiffe URI SAN")
	}
	if found.Host != TrustDomain || found.User != nil || found.RawQuery != "" || found.Fragment != "" || found.Opaque != "" {
		return "", fmt.Errorf("URI SAN %q: want spiffe://%s/<service>", found.String(), TrustDomain)
	}
	if len(found.Path) < 2 || !serviceName.MatchString(found.Path[1:]) {
		return "", fmt.Errorf("URI SAN %q: want spiffe://%s/<service>", found.String(), TrustDomain)
	}
	return found.Path[1:], nil
}
