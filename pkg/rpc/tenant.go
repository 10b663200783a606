package rpc

import "context"

type tenantKey struct{}

// WithTenant returns a context that carries the authenticated tenant.
func WithTenant(ctx context.Context, tenant string) context.Context {
	return context.WithValue(ctx, tenantKey{}, tenant)
}

// Tenant returns the tenant authenticated for this call, or "" when none was.
func Tenant(ctx context.Context) string {
	t, _ := ctx.Value(tenantKey{}).(string)
	return t
}
