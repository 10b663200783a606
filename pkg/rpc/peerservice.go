package rpc

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/mantle-mesh/mantle/pkg/tlsconfig"
)

// ErrNoServiceIdentity says that a call carries no mesh service identity: it came without
// TLS, without a client certificate, or with a certificate that names no service.
var ErrNoServiceIdentity = errors.New("no service identity")

// PeerService returns the mesh service that made the call, as named by the URI SAN
// (spiffe://mantle/<service>) of the client certificate the TLS handshake verified
// against the mesh CA. Only a verified chain counts: a listener that does not ask for
// client certificates, or one that was given none, yields ErrNoServiceIdentity, as do
// plaintext and in-process calls. Errors wrap ErrNoServiceIdentity and say why.
func PeerService(ctx context.Context) (string, error) {
	svc, ok, err := PeerCertificateService(ctx)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrNoServiceIdentity, err)
	}
	if !ok {
		return "", fmt.Errorf("%w: no client certificate verified by the mesh CA", ErrNoServiceIdentity)
	}
	return svc, nil
}

// PeerCertificateService is PeerService for a caller that tells the two failures apart:
// ok is false when the call carries no verified client certificate (plaintext,
// in-process, no certificate given, a listener that asks for none), and err is set when it
// carries a certificate of the mesh CA that does not name exactly one service, which a
// caller should refuse rather than treat as anonymous.
func PeerCertificateService(ctx context.Context) (service string, ok bool, err error) {
	p, found := peer.FromContext(ctx)
	if !found {
		return "", false, nil
	}
	info, isTLS := p.AuthInfo.(credentials.TLSInfo)
	if !isTLS {
		return "", false, nil
	}
	chains := info.State.VerifiedChains
	if len(chains) == 0 || len(chains[0]) == 0 {
		return "", false, nil
	}
	svc, err := tlsconfig.ServiceFromCertificate(chains[0][0])
	if err != nil {
		return "", false, fmt.Errorf("client certificate: %w", err)
	}
	return svc, true, nil
}
