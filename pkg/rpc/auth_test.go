package rpc_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mantle-mesh/mantle/pkg/rpc"
)

func TestHashKey(t *testing.T) {
	t.Parallel()
	// SHA-256("abc") from FIPS 180-2, appendix B.1.
	const want = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
	if got := rpc.HashKey("abc"); got != want {
		t.Errorf("HashKey(abc) = %s, want %s", got, want)
	}
}

func TestNewAuthenticator(t *testing.T) {
	t.Parallel()
	env := map[string]string{"ACME_KEY": "sk-acme", "EMPTY": ""}
	getenv := func(k string) string { return env[k] }

	tests := []struct {
		name    string
		keys    []rpc.TenantKey
		wantErr string // substring; empty means success
		// checks are run only on success: key -> tenant ("" means rejected)
		checks map[string]string
	}{
		{
			name:   "hashed key",
			keys:   []rpc.TenantKey{{ID: "acme", KeySHA256: rpc.HashKey("sk-acme")}},
			checks: map[string]string{"sk-acme": "acme", "sk-other": "", "": ""},
		},
		{
			name:   "upper-case hex is accepted",
			keys:   []rpc.TenantKey{{ID: "acme", KeySHA256: strings.ToUpper(rpc.HashKey("sk-acme"))}},
			checks: map[string]string{"sk-acme": "acme"},
		},
		{
			name:   "key_env resolved through getenv",
			keys:   []rpc.TenantKey{{ID: "acme", KeyEnv: "ACME_KEY"}, {ID: "beta", KeySHA256: rpc.HashKey("sk-beta")}},
			checks: map[string]string{"sk-acme": "acme", "sk-beta": "beta", "ACME_KEY": ""},
		},
		{
			name:    "empty env",
			keys:    []rpc.TenantKey{{ID: "acme", KeyEnv: "EMPTY"}},
			wantErr: "tenants[0].key_env: environment variable EMPTY is empty",
		},
		{
			name:    "unset env",
			keys:    []rpc.TenantKey{{ID: "acme", KeySHA256: rpc.HashKey("x")}, {ID: "b", KeyEnv: "UNSET"}},
			wantErr: "tenants[1].key_env",
		},
		{
			name:    "bad hex names the index",
			keys:    []rpc.TenantKey{{ID: "acme", KeySHA256: rpc.HashKey("x")}, {ID: "b", KeySHA256: "zz" + rpc.HashKey("x")[2:]}},
			wantErr: "tenants[1].key_sha256",
		},
		{
			name:    "short hex",
			keys:    []rpc.TenantKey{{ID: "acme", KeySHA256: "abcd"}},
			wantErr: "tenants[0].key_sha256: want 64 hex characters",
		},
		{
			name:    "neither hash nor env",
			keys:    []rpc.TenantKey{{ID: "acme"}},
			wantErr: "tenants[0]: one of key_sha256 or key_env is required",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a, err := rpc.NewAuthenticator(tt.keys, getenv)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("NewAuthenticator error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("NewAuthenticator: %v", err)
			}
			if !a.Enabled() {
				t.Fatal("Enabled() = false, want true with keys configured")
			}
			for key, want := range tt.checks {
				got, ok := a.Authenticate(key)
				if got != want || ok != (want != "") {
					t.Errorf("Authenticate(%q) = %q, %t; want %q, %t", key, got, ok, want, want != "")
				}
			}
		})
	}
}

func TestNewAuthenticatorWithoutKeysIsDisabled(t *testing.T) {
	t.Parallel()
	a, err := rpc.NewAuthenticator(nil, func(string) string { t.Error("getenv called without keys"); return "" })
	if err != nil {
		t.Fatalf("NewAuthenticator(nil): %v", err)
	}
	if a.Enabled() {
		t.Error("Enabled() = true, want false without keys")
	}
	// A disabled authenticator lets every call through, with no tenant.
	ctx, err := a.Login(context.Background(), "anything")
	if err != nil || rpc.Tenant(ctx) != "" {
		t.Errorf("Login on disabled = tenant %q, %v; want no tenant, nil", rpc.Tenant(ctx), err)
	}
}

func TestLogin(t *testing.T) {
	t.Parallel()
	a, err := rpc.NewAuthenticator([]rpc.TenantKey{{ID: "acme", KeySHA256: rpc.HashKey("sk-acme")}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := a.Login(context.Background(), "sk-acme")
	if err != nil {
		t.Fatalf("Login(valid): %v", err)
	}
	if got := rpc.Tenant(ctx); got != "acme" {
		t.Errorf("Tenant = %q, want acme", got)
	}
	_, err = a.Login(context.Background(), "sk-wrong")
	if status.Code(err) != codes.Unauthenticated || rpc.ErrorInfo(err).GetReason() != rpc.ReasonUnauthenticated {
		t.Errorf("Login(wrong) = %v, want Unauthenticated with reason %s", err, rpc.ReasonUnauthenticated)
	}
}

func TestBearerToken(t *testing.T) {
	t.Parallel()
	tests := []struct {
		header string
		token  string
		ok     bool
	}{
		{"Bearer sk-1", "sk-1", true},
		{"bearer sk-1", "sk-1", true},
		{"BEARER sk-1", "sk-1", true},
		{"Bearer   sk-1  ", "sk-1", true},
		{"Bearer ", "", false},
		{"Bearer", "", false},
		{"Bearer    ", "", false},
		{"", "", false},
		{"Basic dXNlcjpwYXNz", "", false},
		{"Token sk-1", "", false},
		{"Bearersk-1", "", false},
		{"sk-1", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.header, func(t *testing.T) {
			t.Parallel()
			token, ok := rpc.BearerToken(tt.header)
			if token != tt.token || ok != tt.ok {
				t.Errorf("BearerToken(%q) = %q, %t; want %q, %t", tt.header, token, ok, tt.token, tt.ok)
			}
		})
	}
}
