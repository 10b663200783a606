package rpc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
)

// Tenant API keys are never kept in memory or config in the clear: config holds their
// SHA-256 and incoming keys are hashed before the lookup.

// TenantKey configures one tenant's API key.
type TenantKey struct {
	// ID is the tenant id, recorded in every QualityContext, quota bucket and cache key.
	ID string `yaml:"id"`
	// KeySHA256 is the hex SHA-256 of the key (printf %s "$KEY" | sha256sum); set exactly
	// one of key_sha256 and key_env.
	KeySHA256 string `yaml:"key_sha256,omitempty"`
	// KeyEnv names the environment variable that holds the key. It is hashed at start and
	// the variable's value never enters the configuration; the process refuses to start if
	// it is empty.
	KeyEnv string `yaml:"key_env,omitempty"`
}

// Authenticator maps API keys to tenants.
type Authenticator struct {
	byHash map[[sha256.Size]byte]string
}

// NewAuthenticator builds an Authenticator from tenant keys; getenv resolves KeyEnv.
// It returns nil (authentication disabled) when there are no keys.
func NewAuthenticator(keys []TenantKey, getenv func(string) string) (*Authenticator, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	a := &Authenticator{byHash: make(map[[sha256.Size]byte]string, len(keys))}
	for i, k := range keys {
		var sum [sha256.Size]byte
		switch {
		case k.KeySHA256 != "":
			raw, err := hex.DecodeString(k.KeySHA256)
			if err != nil || len(raw) != sha256.Size {
				return nil, fmt.Errorf("tenants[%d].key_sha256: want 64 hex characters", i)
			}
			copy(sum[:], raw)
		case k.KeyEnv != "":
			v := getenv(k.KeyEnv)
			if v == "" {
				return nil, fmt.Errorf("tenants[%d].key_env: environment variable %s is empty", i, k.KeyEnv)
			}
			sum = sha256.Sum256([]byte(v))
		default:
			return nil, fmt.Errorf("tenants[%d]: one of key_sha256 or key_env is required", i)
		}
		a.byHash[sum] = k.ID
	}
	return a, nil
}

// HashKey returns the hex SHA-256 of a key, the form config stores.
func HashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// Authenticate returns the tenant of key.
func (a *Authenticator) Authenticate(key string) (string, bool) {
	t, ok := a.byHash[sha256.Sum256([]byte(key))]
	return t, ok
}

// Enabled reports whether keys are checked at all.
func (a *Authenticator) Enabled() bool { return a != nil }

// BearerToken extracts the token of an "Authorization: Bearer <token>" value.
func BearerToken(header string) (string, bool) {
	const prefix = "bearer "
	if len(header) < len(prefix) || !strings.EqualFold(header[:len(prefix)], prefix) {
		return "", false
	}
	token := strings.TrimSpace(header[len(prefix):])
	return token, token != ""
}

// AuthenticateContext authenticates the bearer token in the incoming gRPC metadata and
// returns a context carrying the tenant and the credential (so calls to other services
// are made on the tenant's behalf).
func (a *Authenticator) AuthenticateContext(ctx context.Context) (context.Context, error) {
	if !a.Enabled() {
		return ctx, nil
	}
	values := metadata.ValueFromIncomingContext(ctx, "authorization")
	if len(values) == 0 {
		return nil, Status(codes.Unauthenticated, "auth.mantle", ReasonUnauthenticated, "missing API key: send authorization: Bearer <key>")
	}
	token, ok := BearerToken(values[0])
	if !ok {
		return nil, Status(codes.Unauthenticated, "auth.mantle", ReasonUnauthenticated, "malformed authorization header: want Bearer <key>")
	}
	return a.Login(ctx, token)
}

// Login checks a bearer token and returns a context carrying the tenant and credential.
func (a *Authenticator) Login(ctx context.Context, token string) (context.Context, error) {
	if !a.Enabled() {
		return ctx, nil
	}
	tenant, ok := a.Authenticate(token)
	if !ok {
		return nil, Status(codes.Unauthenticated, "auth.mantle", ReasonUnauthenticated, "invalid API key")
	}
	return withCredential(WithTenant(ctx, tenant), token), nil
}

type credentialKey struct{}

func withCredential(ctx context.Context, token string) context.Context {
	return context.WithValue(ctx, credentialKey{}, token)
}

func credential(ctx context.Context) string {
	c, _ := ctx.Value(credentialKey{}).(string)
	return c
}
