package rpc_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mantle-mesh/mantle/pkg/rpc"
)

func TestValidTenantID(t *testing.T) {
	t.Parallel()
	for id, want := range map[string]bool{
		"acme": true, "acme-eu_2": true, strings.Repeat("a", rpc.MaxTenantIDLength): true,
		"": false, "acme/x": false, "Acme": false, "acme.x": false, "acme:x": false, "a b": false,
		strings.Repeat("a", rpc.MaxTenantIDLength+1): false, "ünï": false,
	} {
		if got := rpc.ValidTenantID(id); got != want {
			t.Errorf("ValidTenantID(%q) = %v, want %v", id, got, want)
		}
	}
}

func TestNewAuthenticatorRefusesAmbiguousCallers(t *testing.T) {
	t.Parallel()
	env := map[string]string{"A": "sk-same", "B": "sk-same"}
	getenv := func(k string) string { return env[k] }
	tests := []struct {
		name    string
		tenants []rpc.TenantKey
		opts    []rpc.AuthOption
		wantErr string
	}{
		{"a tenant id with a slash", []rpc.TenantKey{{ID: "acme/x", KeySHA256: rpc.HashKey("k")}}, nil, "tenants[0].id"},
		{"an upper-case tenant id", []rpc.TenantKey{{ID: "Acme", KeySHA256: rpc.HashKey("k")}}, nil, "tenants[0].id"},
		{"a duplicate tenant id", []rpc.TenantKey{{ID: "acme", KeySHA256: rpc.HashKey("k1")}, {ID: "acme", KeySHA256: rpc.HashKey("k2")}}, nil, "tenants[1].id: tenant \"acme\" is configured twice"},
		{"one key for two tenants", []rpc.TenantKey{{ID: "a", KeySHA256: rpc.HashKey("k")}, {ID: "b", KeySHA256: rpc.HashKey("k")}}, nil, "tenants[1]: the same key"},
		{"one key from two variables", []rpc.TenantKey{{ID: "a", KeyEnv: "A"}, {ID: "b", KeyEnv: "B"}}, nil, "tenants[1]: the same key"},
		{"a tenant key that is an operator's", []rpc.TenantKey{{ID: "a", KeySHA256: rpc.HashKey("k")}},
			[]rpc.AuthOption{rpc.WithOperators([]rpc.TenantKey{{ID: "ops", KeySHA256: rpc.HashKey("k")}}, getenv)}, "operators[0]: the same key"},
		{"a short mesh secret", []rpc.TenantKey{{ID: "a", KeySHA256: rpc.HashKey("k")}}, []rpc.AuthOption{rpc.WithMeshSecret("short")}, "mesh_secret: want at least 32 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := rpc.NewAuthenticator(tt.tenants, getenv, tt.opts...)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("NewAuthenticator = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestCallers checks who a call is, and which planes admit it, through a real gRPC
// server with the chain: a probe method on each plane.
func TestCallers(t *testing.T) {
	t.Parallel()
	authn, err := rpc.NewAuthenticator([]rpc.TenantKey{{ID: "acme", KeySHA256: rpc.HashKey("sk-acme")}, {ID: "beta", KeySHA256: rpc.HashKey("sk-beta")}}, nil,
		rpc.WithOperators([]rpc.TenantKey{{ID: "ops", KeySHA256: rpc.HashKey("sk-ops")}}, nil), rpc.WithMeshSecret(meshSecret))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		audience rpc.Audience
		md       []string
		wantCode codes.Code
		wantWho  string // tenant as the handler sees it
	}{
		{"tenant on the tenant plane", rpc.AudienceTenant, []string{"authorization", "Bearer sk-acme"}, codes.OK, "acme"},
		{"tenant on the service plane", rpc.AudienceService, []string{"authorization", "Bearer sk-acme"}, codes.PermissionDenied, ""},
		{"tenant on the operator plane", rpc.AudienceOperator, []string{"authorization", "Bearer sk-acme"}, codes.PermissionDenied, ""},
		{"tenant claiming another tenant in service metadata", rpc.AudienceTenant,
			[]string{"authorization", "Bearer sk-acme", rpc.MetadataOnBehalfOf, "beta", rpc.MetadataService, "router"}, codes.OK, "acme"},
		{"operator on the operator plane", rpc.AudienceOperator, []string{"authorization", "Bearer sk-ops"}, codes.OK, ""},
		{"operator on the tenant plane acts for no tenant", rpc.AudienceTenant, []string{"authorization", "Bearer sk-ops"}, codes.OK, ""},
		{"operator on the service plane", rpc.AudienceService, []string{"authorization", "Bearer sk-ops"}, codes.PermissionDenied, ""},
		{"service on the service plane, for a tenant", rpc.AudienceService,
			[]string{rpc.MetadataMeshSecret, meshSecret, rpc.MetadataService, "router", rpc.MetadataOnBehalfOf, "beta"}, codes.OK, "beta"},
		{"service on the operator plane", rpc.AudienceOperator, []string{rpc.MetadataMeshSecret, meshSecret}, codes.PermissionDenied, ""},
		{"service for a tenant that is not configured", rpc.AudienceService,
			[]string{rpc.MetadataMeshSecret, meshSecret, rpc.MetadataOnBehalfOf, "nobody"}, codes.PermissionDenied, ""},
		{"wrong mesh secret, even with a tenant key", rpc.AudienceTenant,
			[]string{rpc.MetadataMeshSecret, meshSecret + "x", "authorization", "Bearer sk-acme"}, codes.Unauthenticated, ""},
		{"no credential", rpc.AudienceTenant, nil, codes.Unauthenticated, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := startServerWith(t, authn, nil, rpc.Audiences{probeCall: tt.audience, probeWatch: tt.audience})
			got, err := call(withMD(tt.md...), s.dial(t), "whoami")
			if status.Code(err) != tt.wantCode {
				t.Fatalf("code = %v (%v), want %v", status.Code(err), err, tt.wantCode)
			}
			if err == nil && !strings.HasPrefix(got, "tenant="+tt.wantWho+" ") {
				t.Errorf("handler saw %q, want tenant %q", got, tt.wantWho)
			}
		})
	}
}

func TestUnknownMethodIsRefused(t *testing.T) {
	t.Parallel()
	for _, authn := range []*rpc.Authenticator{nil, newAuth(t)} {
		s := startServerWith(t, authn, nil, rpc.Audiences{})
		_, err := call(withMD("authorization", "Bearer sk-acme"), s.dial(t), "whoami")
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("auth %v: a method without an audience = %v, want PERMISSION_DENIED", authn.Enabled(), err)
		}
	}
}

// TestServiceSourcePlugsIn: a second source of service identity (the mTLS peer
// certificate's, in production) is asked before the mesh secret; the planes do not
// change. A source's error refuses the call.
func TestServiceSourcePlugsIn(t *testing.T) {
	t.Parallel()
	fromHeader := func(ctx context.Context) (string, bool, error) {
		switch rpc.FirstIncoming(ctx, "x-test-peer") {
		case "":
			return "", false, nil
		case "forged":
			return "", false, errors.New("not signed by the mesh CA")
		default:
			return rpc.FirstIncoming(ctx, "x-test-peer"), true, nil
		}
	}
	authn, err := rpc.NewAuthenticator([]rpc.TenantKey{{ID: "acme", KeySHA256: rpc.HashKey("sk-acme")}}, nil,
		rpc.WithMeshSecret(meshSecret), rpc.WithServiceSource(fromHeader))
	if err != nil {
		t.Fatal(err)
	}
	if !authn.HasServiceIdentity() {
		t.Error("HasServiceIdentity = false with a source and a secret")
	}
	s := startServerWith(t, authn, nil, rpc.Audiences{probeCall: rpc.AudienceService, probeWatch: rpc.AudienceService})
	conn := s.dial(t)
	for _, c := range []struct {
		md   []string
		want codes.Code
	}{
		{[]string{"x-test-peer", "router", rpc.MetadataOnBehalfOf, "acme"}, codes.OK},
		{[]string{"x-test-peer", "forged", rpc.MetadataMeshSecret, meshSecret}, codes.Unauthenticated},
		{[]string{rpc.MetadataMeshSecret, meshSecret}, codes.OK},
		{[]string{"authorization", "Bearer sk-acme"}, codes.PermissionDenied},
	} {
		if _, err := call(withMD(c.md...), conn, "whoami"); status.Code(err) != c.want {
			t.Errorf("%q: %v, want %v", c.md, err, c.want)
		}
	}
}

func TestProcessSecret(t *testing.T) {
	t.Parallel()
	tenantOnly := newAuthWithout(t)
	if tenantOnly.HasServiceIdentity() {
		t.Fatal("HasServiceIdentity = true without a secret or source")
	}
	p := tenantOnly.WithProcessSecret()
	if !p.HasServiceIdentity() {
		t.Fatal("WithProcessSecret: no service identity")
	}
	// The process's own calls are services; the original authenticator accepts none.
	back := startServerWith(t, p, nil, rpc.Audiences{probeCall: rpc.AudienceService, probeWatch: rpc.AudienceService})
	front := startServerWith(t, p, back.dial(t, p.ClientIdentity("front").DialOptions()...), probeAudiences)
	got, err := call(withMD("authorization", "Bearer sk-acme"), front.dial(t), "forward")
	if err != nil || !strings.HasPrefix(got, "tenant=acme ") {
		t.Errorf("forward over the process secret = %q, %v; want the back-end to see acme", got, err)
	}
	other := startServerWith(t, tenantOnly, nil, rpc.Audiences{probeCall: rpc.AudienceService, probeWatch: rpc.AudienceService})
	front2 := startServerWith(t, p, other.dial(t, p.ClientIdentity("front").DialOptions()...), probeAudiences)
	if _, err := call(withMD("authorization", "Bearer sk-acme"), front2.dial(t), "forward"); status.Code(err) != codes.Unauthenticated {
		t.Errorf("a process secret at a process that does not know it = %v, want Unauthenticated", err)
	}
}

func newAuthWithout(t *testing.T) *rpc.Authenticator {
	t.Helper()
	a, err := rpc.NewAuthenticator([]rpc.TenantKey{{ID: "acme", KeySHA256: rpc.HashKey("sk-acme")}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestRefusalsAreLoggedAndCounted: 401s and 403s left no trace. Each is one warn line
// with the reason and method (and the tenant when known), never the key, and a count by
// reason.
func TestRefusalsAreLoggedAndCounted(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	reg := prometheus.NewRegistry()
	authn, err := newAuth(t).Instrumented(slog.New(slog.NewTextHandler(logs, nil)), reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := startServerWith(t, authn, nil, rpc.Audiences{probeCall: rpc.AudienceService, probeWatch: rpc.AudienceService})
	conn := s.dial(t)
	for _, md := range [][]string{
		{"authorization", "Bearer sk-acme"},
		{"authorization", "Bearer sk-wrong-key"},
		nil,
	} {
		if _, err := call(withMD(md...), conn, "whoami"); err == nil {
			t.Fatalf("%q: call admitted", md)
		}
	}
	for _, want := range []string{
		`msg="call refused" reason=wrong_plane code=PermissionDenied method=` + probeCall + ` caller=tenant tenant=acme`,
		`msg="call refused" reason=unknown_key code=Unauthenticated method=` + probeCall,
		`msg="call refused" reason=missing_credential code=Unauthenticated method=` + probeCall,
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no log line %q in:\n%s", want, logs.String())
		}
	}
	if out := logs.String(); strings.Contains(out, "sk-wrong-key") || strings.Contains(out, "sk-acme") {
		t.Errorf("a key reached the log:\n%s", out)
	}
	for reason, want := range map[string]float64{"wrong_plane": 1, "unknown_key": 1, "missing_credential": 1} {
		if got := refusals(t, reg, reason); got != want {
			t.Errorf("mantle_auth_refusals_total{reason=%q} = %v, want %v", reason, got, want)
		}
	}
}

// TestRefusalLinesAreRateLimited: a caller hammering the port with bad keys must not flood
// the log. Lines are limited per reason (a burst of 10, then one a second); the line that
// resumes says how many were suppressed; another reason has its own allowance; the
// counter counts every refusal.
func TestRefusalLinesAreRateLimited(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	reg := prometheus.NewRegistry()
	clock := clockwork.NewFakeClock()
	authn, err := newAuth(t).Instrumented(slog.New(slog.NewTextHandler(logs, nil)), reg, clock)
	if err != nil {
		t.Fatal(err)
	}
	s := startServerWith(t, authn, nil, rpc.Audiences{probeCall: rpc.AudienceService, probeWatch: rpc.AudienceService})
	conn := s.dial(t)
	refuse := func(n int, md ...string) {
		t.Helper()
		for range n {
			if _, err := call(withMD(md...), conn, "whoami"); status.Code(err) != codes.Unauthenticated {
				t.Fatalf("call with %q: %v, want Unauthenticated", md, err)
			}
		}
	}
	lines := func(reason string) []string {
		var out []string
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "reason="+reason+" ") {
				out = append(out, l)
			}
		}
		return out
	}
	refuse(25, "authorization", "Bearer sk-wrong-key")
	if got := len(lines("unknown_key")); got != 10 {
		t.Errorf("%d lines for 25 refusals at once, want the burst of 10", got)
	}
	refuse(1) // another reason is not held back by the first
	if got := len(lines("missing_credential")); got != 1 {
		t.Errorf("%d lines for a refusal of another reason, want 1", got)
	}
	clock.Advance(time.Second)
	refuse(1, "authorization", "Bearer sk-wrong-key")
	got := lines("unknown_key")
	if len(got) != 11 || !strings.Contains(got[10], "suppressed=15") {
		t.Errorf("after a second: lines %q, want an 11th saying suppressed=15", got[min(10, len(got)-1):])
	}
	if n := refusals(t, reg, "unknown_key"); n != 26 {
		t.Errorf("mantle_auth_refusals_total{reason=unknown_key} = %v, want every one of 26", n)
	}
}

func refusals(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "mantle_auth_refusals_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
