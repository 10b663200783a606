package quota

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	quotav1 "github.com/mantle-mesh/mantle/pkg/api/mantle/quota/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// TestServerDescribeUsage: usage is read without being charged, an authenticated caller
// sees only its own tenant, and an unauthenticated one the configured tenants plus those
// admitted, on every backend.
func TestServerDescribeUsage(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b backend) {
		cfg := testConfig()
		cfg.Tenants = map[string]RateLimits{"beta": {RPM: 10, TPM: 1000}}
		f := newFixtureOn(t, b, cfg)
		client := startServer(t, f)
		if _, err := client.Reserve(context.Background(), &quotav1.ReserveRequest{Quality: quality("acme"), Model: "m", InputTokens: 900, MaxOutputTokens: 100}); err != nil {
			t.Fatal(err)
		}
		line := func(u *quotav1.TenantUsage) string {
			return fmt.Sprintf("%s rpm %d/%d tpm %d/%d", u.GetTenant(),
				u.GetRequests().GetLimit()-u.GetRequests().GetRemaining(), u.GetRequests().GetLimit(),
				u.GetTokens().GetLimit()-u.GetTokens().GetRemaining(), u.GetTokens().GetLimit())
		}
		tests := []struct {
			name     string
			ctx      context.Context
			tenants  []string
			want     string
			wantCode codes.Code
		}{
			{"unauthenticated: configured and admitted tenants", context.Background(), nil, "acme rpm 1/60 tpm 1000/6000; beta rpm 0/10 tpm 0/1000", codes.OK},
			{"unauthenticated, one tenant", context.Background(), []string{"beta"}, "beta rpm 0/10 tpm 0/1000", codes.OK},
			{"authenticated: its own tenant only", asTenant("acme"), nil, "acme rpm 1/60 tpm 1000/6000", codes.OK},
			{"authenticated, asking for another tenant", asTenant("acme"), []string{"beta"}, "", codes.PermissionDenied},
			// A second read finds the same levels: describing charges nothing.
			{"read again", context.Background(), []string{"acme"}, "acme rpm 1/60 tpm 1000/6000", codes.OK},
		}
		for _, tt := range tests {
			resp, err := client.DescribeUsage(tt.ctx, &quotav1.DescribeUsageRequest{Tenants: tt.tenants})
			if tt.wantCode != codes.OK {
				assertStatus(t, err, tt.wantCode, rpc.ReasonPermissionDenied)
				continue
			}
			if err != nil {
				t.Fatalf("%s: %v", tt.name, err)
			}
			var lines []string
			for _, u := range resp.GetTenants() {
				lines = append(lines, line(u))
			}
			if got := strings.Join(lines, "; "); got != tt.want {
				t.Errorf("%s:\n got %s\nwant %s", tt.name, got, tt.want)
			}
		}
	})
}

func TestSeenTenantsIsBounded(t *testing.T) {
	t.Parallel()
	var s seenTenants
	for i := range maxSeenTenants + 10 {
		s.add(fmt.Sprintf("t%04d", i), t0.Add(time.Duration(i)*time.Second))
	}
	got := s.list()
	if len(got) != maxSeenTenants {
		t.Fatalf("remembered %d tenants, want %d", len(got), maxSeenTenants)
	}
	for _, tenant := range got {
		if tenant < "t0010" {
			t.Errorf("kept %s, one of the 10 seen longest ago", tenant)
		}
	}
}
