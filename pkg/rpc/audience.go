package rpc

import "fmt"

// Audience is the plane an RPC belongs to: who may call it. Every method of every mantle
// service has exactly one, declared in its service's Audiences table; the authentication
// interceptor refuses a method that has none.
type Audience int

const (
	audienceUnknown Audience = iota
	// AudienceTenant: the tenant plane (Complete, CountTokens, a tenant's own reviews...).
	// Tenants call it with their key; mesh services call it on a tenant's behalf; operators
	// call it for no tenant, so that what a tenant sees of its own (reviews, usage), an
	// operator sees of every tenant.
	AudienceTenant
	// AudienceService: the service plane (Reserve, ObserveUpstream, AcquireRetry, Store,
	// Verify...): only mesh services, never a tenant or operator key.
	AudienceService
	// AudienceOperator: the operator plane (rule reloads, draft rule approval): only
	// operator keys.
	AudienceOperator
)

func (a Audience) String() string {
	switch a {
	case AudienceTenant:
		return "tenant"
	case AudienceService:
		return "service"
	case AudienceOperator:
		return "operator"
	}
	return "unknown"
}

// Admits reports whether a caller of kind k may call a method of this audience.
func (a Audience) Admits(k CallerKind) bool {
	switch a {
	case AudienceTenant:
		return k == CallerTenant || k == CallerService || k == CallerOperator
	case AudienceService:
		return k == CallerService
	case AudienceOperator:
		return k == CallerOperator
	}
	return false
}

// Audiences maps full method names ("/mantle.quota.v1.QuotaService/Reserve") to their
// audience.
type Audiences map[string]Audience

// Merge returns one table with the methods of all; a method declared with two different
// audiences is an error.
func Merge(tables ...Audiences) (Audiences, error) {
	out := Audiences{}
	for _, t := range tables {
		for m, a := range t {
			if prev, dup := out[m]; dup && prev != a {
				return nil, fmt.Errorf("audience of %s declared twice: %s and %s", m, prev, a)
			}
			if a == audienceUnknown {
				return nil, fmt.Errorf("audience of %s: not tenant, service or operator", m)
			}
			out[m] = a
		}
	}
	return out, nil
}
