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
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", fmt.Errorf("%w: no peer in the context", ErrNoServiceIdentity)
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return "", fmt.Errorf("%w: the call did not come over TLS", ErrNoServiceIdentity)
	}
	chains := info.State.VerifiedChains
	if len(chains) == 0 || len(chains[0]) == 0 {
		return "", fmt.Errorf("%w: no client certificate verified by the mesh CA", ErrNoServiceIdentity)
	}
	svc, err := tlsconfig.ServiceFromCertificate(chains[0][0])
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrNoServiceIdentity, err)
	}
	return svc, nil
}
