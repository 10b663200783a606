package tlsconfig

import (
	"crypto/x509"
	"net/url"
	"testing"
)

// FuzzServiceFromCertificate feeds URI SANs as a peer could put them in a certificate:
// the parser never panics, and a name it accepts is one ServiceURI gives back unchanged.
func FuzzServiceFromCertificate(f *testing.F) {
	for _, s := range []string{"spiffe://mantle/router", "spiffe://mantle/a/b", "spiffe://mantle/%2e%2e", "spiffe://x@mantle/r", "spiffe://mantle", "https://mantle/router", "spiffe://MANTLE/router"} {
		f.Add(s, "")
	}
	f.Add("spiffe://mantle/router", "spiffe://mantle/quota")
	f.Fuzz(func(t *testing.T, a, b string) {
		cert := &x509.Certificate{}
		for _, s := range []string{a, b} {
			if u, err := url.Parse(s); err == nil && s != "" {
				cert.URIs = append(cert.URIs, u)
			}
		}
		svc, err := ServiceFromCertificate(cert)
		if err != nil {
			return
		}
		u, err := ServiceURI(svc)
		if err != nil {
			t.Fatalf("accepted %q, which ServiceURI refuses: %v", svc, err)
		}
		back, err := ServiceFromCertificate(&x509.Certificate{URIs: []*url.URL{u}})
		if err != nil || back != svc {
			t.Fatalf("round trip of %q: %q, %v", svc, back, err)
		}
	})
}
