package rpc

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
)

// API keys and the mesh secret are never kept in memory or config in the clear: config
// holds their SHA-256 (or names where to read them, and they are hashed at load), and
// incoming credentials are hashed before the lookup.

// Metadata keys of the service plane. A mesh service calling another sends the mesh secret
// and its own name, and the tenant it acts for, if any. The tenant is believed only when
// the caller authenticated as a service: a tenant that sends it is still itself.
const (
	MetadataMeshSecret = "x-mantle-mesh-secret"
	MetadataService    = "x-mantle-service"
	MetadataOnBehalfOf = "x-mantle-on-behalf-of"
)

// Refusal reasons, as logged and counted (mantle_auth_refusals_total{reason}).
const (
	RefusalMissingCredential    = "missing_credential"
	RefusalMalformedCredential  = "malformed_credential"
	RefusalUnknownKey           = "unknown_key"
	RefusalBadServiceCredential = "bad_service_credential"
	RefusalUnknownTenant        = "unknown_on_behalf_tenant"
	RefusalUnknownMethod        = "unknown_method"
	RefusalWrongPlane           = "wrong_plane"
	RefusalTenantMismatch       = "tenant_mismatch"
)

// TenantKey configures one tenant's (or operator's) API key.
type TenantKey struct {
	// ID is the tenant's (or operator's) id, recorded in every QualityContext, quota
	// bucket and cache key: 1 to 64 characters of [a-z0-9_-], unique.
	ID string `yaml:"id"`
	// KeySHA256 is the hex SHA-256 of the key (printf %s "$KEY" | sha256sum); set exactly
	// one of key_sha256 and key_env. A key configured twice is an error.
	KeySHA256 string `yaml:"key_sha256,omitempty"`
	// KeyEnv names the environment variable that holds the key. It is hashed at start and
	// the variable's value never enters the configuration; the process refuses to start if
	// it is empty.
	KeyEnv string `yaml:"key_env,omitempty"`
}

// ServiceSource identifies the mesh service that made a call, from what the call
// carries. It reports ok=false when the call carries no credential of its kind, and an
// error when it carries one that is not valid (the call is then refused, not tried as a
// tenant).
//
// Sources are tried in order. The mesh secret (MetadataMeshSecret) is always one; a
// source that reads the service from the verified mTLS peer certificate (a SPIFFE URI SAN
// of the mesh CA, e.g. spiffe://mantle/router) plugs in through WithServiceSource, ahead
// of the secret. The audience check does not care which source identified the service.
type ServiceSource func(ctx context.Context) (service string, ok bool, err error)

// Authenticator establishes who calls: a tenant (API key), an operator (operator key) or
// a mesh service (mesh secret or mTLS peer certificate).
type Authenticator struct {
	tenants   map[[sha256.Size]byte]string
	tenantIDs map[string]bool
	operators map[[sha256.Size]byte]string
	// meshSecret is the SHA-256 of the mesh secret; secret is the secret itself, which
	// this process sends when its modules call other services. Empty: none configured.
	meshSecret [sha256.Size]byte
	secret     string
	// sources identify services before the mesh secret is looked at (mTLS).
	sources  []ServiceSource
	refusals *refusalReporter
}

// AuthOption configures an Authenticator beyond its tenants.
type AuthOption func(*Authenticator) error

// WithOperators adds operator keys: operators call the operator plane (rules, draft
// approval) and see every tenant's reviews.
func WithOperators(keys []TenantKey, getenv func(string) string) AuthOption {
	return func(a *Authenticator) error {
		for i, k := range keys {
			sum, err := keyHash(k, getenv)
			if err != nil {
				return fmt.Errorf("operators[%d]%w", i, err)
			}
			if !ValidTenantID(k.ID) {
				return fmt.Errorf("operators[%d].id: want 1 to %d characters of [a-z0-9_-], got %q", i, MaxTenantIDLength, k.ID)
			}
			if err := a.addKey(sum); err != nil {
				return fmt.Errorf("operators[%d]: %w", i, err)
			}
			a.operators[sum] = k.ID
		}
		return nil
	}
}

// WithMeshSecret sets the secret mesh services present to each other when their calls
// carry no mTLS identity. It must be at least 32 bytes.
func WithMeshSecret(secret string) AuthOption {
	return func(a *Authenticator) error {
		if len(secret) < minMeshSecret {
			return fmt.Errorf("mesh_secret: want at least %d bytes, got %d", minMeshSecret, len(secret))
		}
		a.secret = secret
		a.meshSecret = sha256.Sum256([]byte(secret))
		return nil
	}
}

// WithServiceSource adds a way to identify mesh services, tried before the mesh secret.
// This is where a source that reads the service from the mTLS peer certificate plugs in.
func WithServiceSource(src ServiceSource) AuthOption {
	return func(a *Authenticator) error {
		a.sources = append(a.sources, src)
		return nil
	}
}

// minMeshSecret is the shortest mesh secret accepted: 256 bits.
const minMeshSecret = 32

// NewAuthenticator builds an Authenticator from tenant keys and options; getenv resolves
// KeyEnv. It returns nil (authentication disabled) when there are neither tenant nor
// operator keys. Tenant ids must be valid (ValidTenantID) and unique, and no key may be
// configured twice, for tenants and operators alike.
func NewAuthenticator(keys []TenantKey, getenv func(string) string, opts ...AuthOption) (*Authenticator, error) {
	a := &Authenticator{
		tenants:   make(map[[sha256.Size]byte]string, len(keys)),
		tenantIDs: make(map[string]bool, len(keys)),
		operators: map[[sha256.Size]byte]string{},
	}
	for i, k := range keys {
		if !ValidTenantID(k.ID) {
			return nil, fmt.Errorf("tenants[%d].id: want 1 to %d characters of [a-z0-9_-], got %q", i, MaxTenantIDLength, k.ID)
		}
		if a.tenantIDs[k.ID] {
			return nil, fmt.Errorf("tenants[%d].id: tenant %q is configured twice", i, k.ID)
		}
		sum, err := keyHash(k, getenv)
		if err != nil {
			return nil, fmt.Errorf("tenants[%d]%w", i, err)
		}
		if err := a.addKey(sum); err != nil {
			return nil, fmt.Errorf("tenants[%d]: %w", i, err)
		}
		a.tenants[sum] = k.ID
		a.tenantIDs[k.ID] = true
	}
	for _, o := range opts {
		if err := o(a); err != nil {
			return nil, err
		}
	}
	if len(a.tenants) == 0 && len(a.operators) == 0 {
		return nil, nil
	}
	return a, nil
}

// addKey refuses a key that is already some tenant's or operator's: one key, one caller.
func (a *Authenticator) addKey(sum [sha256.Size]byte) error {
	_, t := a.tenants[sum]
	_, o := a.operators[sum]
	if t || o {
		return errors.New("the same key is configured for another tenant or operator")
	}
	return nil
}

func keyHash(k TenantKey, getenv func(string) string) ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	switch {
	case k.KeySHA256 != "" && k.KeyEnv != "":
		return sum, errors.New(": set one of key_sha256 or key_env, not both")
	case k.KeySHA256 != "":
		raw, err := hex.DecodeString(k.KeySHA256)
		if err != nil || len(raw) != sha256.Size {
			return sum, errors.New(".key_sha256: want 64 hex characters")
		}
		copy(sum[:], raw)
	case k.KeyEnv != "":
		v := getenv(k.KeyEnv)
		if v == "" {
			return sum, fmt.Errorf(".key_env: environment variable %s is empty", k.KeyEnv)
		}
		sum = sha256.Sum256([]byte(v))
	default:
		return sum, errors.New(": one of key_sha256 or key_env is required")
	}
	return sum, nil
}

// HashKey returns the hex SHA-256 of a key, the form config stores.
func HashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// NewMeshSecret returns a random mesh secret (64 hex digits), for `mantle dev` and for a
// process whose modules all run in it and that has none configured.
func NewMeshSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b)
}

// Authenticate returns the tenant of a tenant key.
func (a *Authenticator) Authenticate(key string) (string, bool) {
	t, ok := a.tenants[sha256.Sum256([]byte(key))]
	return t, ok
}

// Enabled reports whether credentials are checked at all.
func (a *Authenticator) Enabled() bool { return a != nil }

// HasServiceIdentity reports whether this process can prove to other processes that it
// is a mesh service: a mesh secret, or another ServiceSource (mTLS), is configured.
func (a *Authenticator) HasServiceIdentity() bool {
	return a != nil && (a.secret != "" || len(a.sources) > 0)
}

// HasMeshSecret reports whether a mesh secret is configured.
func (a *Authenticator) HasMeshSecret() bool { return a != nil && a.secret != "" }

// WithProcessSecret returns a copy of a with a fresh random mesh secret, for a process
// whose modules all run in it: their calls to each other still present a service
// credential, and no other process knows it.
func (a *Authenticator) WithProcessSecret() *Authenticator {
	if a == nil {
		return nil
	}
	c := *a
	c.secret = NewMeshSecret()
	c.meshSecret = sha256.Sum256([]byte(c.secret))
	return &c
}

// BearerToken extracts the token of an "Authorization: Bearer <token>" value.
func BearerToken(header string) (string, bool) {
	const prefix = "bearer "
	if len(header) < len(prefix) || !strings.EqualFold(header[:len(prefix)], prefix) {
		return "", false
	}
	token := strings.TrimSpace(header[len(prefix):])
	return token, token != ""
}

// authError is a refusal: the status the caller gets and the reason it is counted under.
type authError struct {
	code    codes.Code
	reason  string
	message string
}

func (e *authError) Error() string { return e.message }

func (e *authError) status() error {
	r := ReasonUnauthenticated
	if e.code == codes.PermissionDenied {
		r = ReasonPermissionDenied
	}
	return Status(e.code, "auth.mantle", r, e.message)
}

func unauthenticated(reason, msg string) *authError {
	return &authError{code: codes.Unauthenticated, reason: reason, message: msg}
}

func denied(reason, msg string) *authError {
	return &authError{code: codes.PermissionDenied, reason: reason, message: msg}
}

// identify establishes the caller of a gRPC call from its metadata (and, through the
// service sources, its transport).
func (a *Authenticator) identify(ctx context.Context) (Caller, *authError) {
	service, ok, err := a.service(ctx)
	if err != nil {
		return Caller{}, unauthenticated(RefusalBadServiceCredential, "invalid service credential")
	}
	if ok {
		c := Caller{Kind: CallerService, Service: service}
		if t := firstValue(ctx, MetadataOnBehalfOf); t != "" {
			if !a.tenantIDs[t] {
				return Caller{}, denied(RefusalUnknownTenant, "the call names a tenant that is not configured")
			}
			c.Tenant = t
		}
		return c, nil
	}
	values := metadata.ValueFromIncomingContext(ctx, "authorization")
	if len(values) == 0 {
		return Caller{}, unauthenticated(RefusalMissingCredential, "missing API key: send authorization: Bearer <key>")
	}
	token, ok := BearerToken(values[0])
	if !ok {
		return Caller{}, unauthenticated(RefusalMalformedCredential, "malformed authorization header: want Bearer <key>")
	}
	return a.keyCaller(token)
}

// service asks the configured sources, then the mesh secret, which service made the call.
func (a *Authenticator) service(ctx context.Context) (string, bool, error) {
	for _, src := range a.sources {
		if service, ok, err := src(ctx); err != nil || ok {
			return service, ok, err
		}
	}
	return a.meshSecretSource(ctx)
}

func (a *Authenticator) keyCaller(token string) (Caller, *authError) {
	sum := sha256.Sum256([]byte(token))
	if t, ok := a.tenants[sum]; ok {
		return Caller{Kind: CallerTenant, Tenant: t}, nil
	}
	if o, ok := a.operators[sum]; ok {
		return Caller{Kind: CallerOperator, Name: o}, nil
	}
	return Caller{}, unauthenticated(RefusalUnknownKey, "invalid API key")
}

// meshSecretSource is the ServiceSource of the mesh secret: a call that carries
// MetadataMeshSecret is a service's, refused when the secret is wrong.
func (a *Authenticator) meshSecretSource(ctx context.Context) (string, bool, error) {
	got := firstValue(ctx, MetadataMeshSecret)
	if got == "" {
		return "", false, nil
	}
	// Hashed from a stack buffer: the conversion []byte(got) would put the secret on the
	// heap, once a call.
	var buf [128]byte
	sum := sha256.Sum256(append(buf[:0], got...))
	// Both sides are hashes of equal length, so the comparison's time says nothing about
	// the secret; a process without a secret accepts none.
	if a.secret == "" || subtle.ConstantTimeCompare(sum[:], a.meshSecret[:]) != 1 {
		return "", false, errors.New("wrong mesh secret")
	}
	service := firstValue(ctx, MetadataService)
	if !ValidTenantID(service) {
		service = "unnamed"
	}
	return service, true, nil
}

// FirstIncoming returns the first value of an incoming metadata key, or "".
func FirstIncoming(ctx context.Context, key string) string { return firstValue(ctx, key) }

func firstValue(ctx context.Context, key string) string {
	if v := metadata.ValueFromIncomingContext(ctx, key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// authorize establishes the caller of a call to method and checks that its audience
// admits it. A method without an audience is refused, whoever calls.
func (a *Authenticator) authorize(ctx context.Context, method string, audiences Audiences) (context.Context, error) {
	aud, known := audiences[method]
	if !known {
		err := denied(RefusalUnknownMethod, "the method has no declared audience")
		a.refused(ctx, method, Caller{}, err)
		return nil, err.status()
	}
	if !a.Enabled() {
		return ctx, nil
	}
	c, aerr := a.identify(ctx)
	if aerr == nil && !aud.Admits(c.Kind) {
		aerr = denied(RefusalWrongPlane, fmt.Sprintf("%s credentials cannot call a %s RPC", c.Kind, aud))
	}
	if aerr != nil {
		a.refused(ctx, method, c, aerr)
		return nil, aerr.status()
	}
	return WithCaller(ctx, c), nil
}

// Login checks a tenant API key (the HTTP front door's) and returns a context carrying
// the tenant. Operator keys are not tenant keys and are refused here.
func (a *Authenticator) Login(ctx context.Context, token string) (context.Context, error) {
	if !a.Enabled() {
		return ctx, nil
	}
	tenant, ok := a.Authenticate(token)
	if !ok {
		return nil, unauthenticated(RefusalUnknownKey, "invalid API key").status()
	}
	return WithTenant(ctx, tenant), nil
}

// LoginHTTP checks an HTTP request's Authorization header as Login does, and logs and
// counts a refusal under route (e.g. "POST /v1/chat/completions").
func (a *Authenticator) LoginHTTP(ctx context.Context, header, route string) (context.Context, error) {
	if !a.Enabled() {
		return ctx, nil
	}
	token, ok := BearerToken(header)
	if !ok {
		reason, msg := RefusalMissingCredential, "missing API key: send Authorization: Bearer <key>"
		if header != "" {
			reason, msg = RefusalMalformedCredential, "malformed Authorization header: want Bearer <key>"
		}
		err := unauthenticated(reason, msg)
		a.refused(ctx, route, Caller{}, err)
		return nil, err.status()
	}
	tenant, ok := a.Authenticate(token)
	if !ok {
		err := unauthenticated(RefusalUnknownKey, "invalid API key")
		a.refused(ctx, route, Caller{}, err)
		return nil, err.status()
	}
	return WithTenant(ctx, tenant), nil
}

// LoginOperatorHTTP checks that an HTTP request's Authorization header carries an operator
// key, for the operator endpoints outside gRPC (the debug listener); route names the
// refusal in the log and the counter. A tenant key is refused as PERMISSION_DENIED, no or
// an unknown key as UNAUTHENTICATED. With authentication off it lets everyone through.
func (a *Authenticator) LoginOperatorHTTP(ctx context.Context, header, route string) error {
	if !a.Enabled() {
		return nil
	}
	token, ok := BearerToken(header)
	if !ok {
		reason, msg := RefusalMissingCredential, "missing operator key: send Authorization: Bearer <key>"
		if header != "" {
			reason, msg = RefusalMalformedCredential, "malformed Authorization header: want Bearer <key>"
		}
		err := unauthenticated(reason, msg)
		a.refused(ctx, route, Caller{}, err)
		return err.status()
	}
	c, aerr := a.keyCaller(token)
	if aerr == nil && c.Kind != CallerOperator {
		aerr = denied(RefusalWrongPlane, fmt.Sprintf("%s credentials cannot call an operator endpoint", c.Kind))
	}
	if aerr != nil {
		a.refused(ctx, route, c, aerr)
		return aerr.status()
	}
	return nil
}

// RefuseTenant logs and counts a handler's refusal of a call whose claimed tenant is not
// the caller's (PERMISSION_DENIED), like the interceptor's own refusals.
func (a *Authenticator) RefuseTenant(ctx context.Context, method string) {
	a.refused(ctx, method, CallerOf(ctx), denied(RefusalTenantMismatch, "tenant mismatch"))
}

// refusalReporter logs and counts refusals; one per process.
type refusalReporter struct {
	log     *slog.Logger
	counter *prometheus.CounterVec
	clock   clockwork.Clock

	mu sync.Mutex
	// lines limits the log lines per reason (a fixed set, so the map is bounded): a caller
	// hammering the port with bad keys must not flood the log. The counter counts every
	// refusal.
	lines map[string]*refusalLines
}

// refusalLines is one reason's log limiter and the lines it held back since the last one
// it let through.
type refusalLines struct {
	limiter    *rate.Limiter
	suppressed int
}

// Refusal lines per reason: a burst of refusalLogBurst, then one every refusalLogEvery.
const (
	refusalLogBurst = 10
	refusalLogEvery = time.Second
)

// allow reports whether a line for reason may be written now, and how many were held back
// since the last one written.
func (r *refusalReporter) allow(reason string) (bool, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.lines[reason]
	if l == nil {
		l = &refusalLines{limiter: rate.NewLimiter(rate.Every(refusalLogEvery), refusalLogBurst)}
		r.lines[reason] = l
	}
	if !l.limiter.AllowN(r.clock.Now(), 1) {
		l.suppressed++
		return false, 0
	}
	n := l.suppressed
	l.suppressed = 0
	return true, n
}

// Instrumented returns a copy of a that logs and counts every refusal on log and reg:
// one warn line with the reason, the method and the caller as far as it is known (never
// the key), and mantle_auth_refusals_total{reason,code}. Lines are limited per reason (a
// burst of 10, then one a second, on clock; nil means the real clock); the line that
// resumes after a pause says how many were suppressed. The counter counts every refusal.
// Call it once per registry.
func (a *Authenticator) Instrumented(log *slog.Logger, reg prometheus.Registerer, clock clockwork.Clock) (*Authenticator, error) {
	if a == nil {
		return nil, nil
	}
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mantle_auth_refusals_total",
		Help: "Calls refused by authentication (Unauthenticated) or by their plane (PermissionDenied), by reason.",
	}, []string{"reason", "code"})
	if err := reg.Register(c); err != nil {
		return nil, fmt.Errorf("register auth refusals: %w", err)
	}
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	cp := *a
	cp.refusals = &refusalReporter{log: log, counter: c, clock: clock, lines: map[string]*refusalLines{}}
	return &cp, nil
}

func (a *Authenticator) refused(ctx context.Context, method string, c Caller, err *authError) {
	if a == nil || a.refusals == nil {
		return
	}
	a.refusals.counter.WithLabelValues(err.reason, err.code.String()).Inc()
	ok, suppressed := a.refusals.allow(err.reason)
	if !ok {
		return
	}
	attrs := []any{"reason", err.reason, "code", err.code.String(), "method", method}
	if suppressed > 0 {
		attrs = append(attrs, "suppressed", suppressed)
	}
	if c.Kind != CallerNone {
		attrs = append(attrs, "caller", c.Kind.String())
	}
	if c.Tenant != "" {
		attrs = append(attrs, "tenant", c.Tenant)
	}
	if c.Service != "" {
		attrs = append(attrs, "service", c.Service)
	}
	if c.Name != "" {
		attrs = append(attrs, "operator", c.Name)
	}
	if id := RequestID(ctx); id != "" {
		attrs = append(attrs, "request_id", id)
	}
	a.refusals.log.WarnContext(ctx, "call refused", attrs...)
}
