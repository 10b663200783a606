package app

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	quotav1 "github.com/mantle-mesh/mantle/pkg/api/mantle/quota/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/procusage"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// settleStub is a QuotaService whose Settle answers as the quota service does, with a
// response of the same shape (limits and two buckets), without the ledger: what is
// measured is the channel around it.
type settleStub struct {
	quotav1.UnimplementedQuotaServiceServer
}

func (settleStub) Settle(ctx context.Context, req *quotav1.SettleRequest) (*quotav1.SettleResponse, error) {
	tenant, err := rpc.CallTenant(ctx, req.GetQuality().GetTenant())
	if err != nil {
		return nil, err
	}
	return &quotav1.SettleResponse{
		RefundedTokens: 120,
		Limits: &quotav1.Limits{
			LimitRequests: 600, RemainingRequests: 598, LimitTokens: 100_000, RemainingTokens: 98_760,
			ResetRequests: durationpb.New(100 * time.Millisecond), ResetTokens: durationpb.New(740 * time.Millisecond),
		},
		ReservedTokens: 1200,
		Buckets: []*quotav1.BucketLevel{
			{Name: "tenant:" + tenant + ":rpm", Limit: 600, Remaining: 598, ResetAfter: durationpb.New(100 * time.Millisecond)},
			{Name: "tenant:" + tenant + ":tpm", Limit: 100_000, Remaining: 98_760, ResetAfter: durationpb.New(740 * time.Millisecond)},
		},
	}, nil
}

// routerQuality is a QualityContext as the router sends one to a hop (hopQuality): the
// request's identity and route, its deadline and usage so far, one verification.
func routerQuality(tenant string) *mantlev1.QualityContext {
	return &mantlev1.QualityContext{
		RequestId:       "req_3f9a0c1b2d4e5f60718293a4",
		TraceId:         "4bf92f3577b34da6a3ce929d0e0e4736",
		Tenant:          tenant,
		Scenario:        "chat",
		Priority:        mantlev1.Priority(2),
		Deadline:        timestamppb.New(time.Date(2026, 12, 4, 23, 0, 30, 0, time.UTC)),
		CurrentModel:    "gpt-4o-mini",
		CurrentProvider: "openai",
		FallbackLevel:   mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY,
		Verification:    &mantlev1.Verification{L1Passed: true, L2RulesApplied: []string{"mask-emails"}},
		QualityGrade:    mantlev1.QualityGrade(1),
		Usage:           &mantlev1.Usage{InputTokens: 912, OutputTokens: 168, TotalTokens: 1080},
		CostUsd:         0.000248,
		Route:           "chat-default",
	}
}

// BenchmarkLocalUnary is one in-process unary call through the chain as New builds it for
// a process that runs every module: the server's interceptors on a registry, the
// authenticator instrumented, with authentication off (the default configuration) and
// on (a tenant key, so the modules present the process's mesh secret), the log at error
// level. Besides the time a call takes, it reports the CPU time the process spent per
// call (cpu-ns/op, the garbage collector's included), which a busy shared machine
// disturbs far less than the elapsed time. The message is a quota Settle's, with the QualityContext a bare one and as the
// router sends it.
//
//	go test -run '^$' -bench BenchmarkLocalUnary -benchmem -count 6 ./pkg/app/
func BenchmarkLocalUnary(b *testing.B) {
	log := slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelError}))
	const tenant = "acme"
	conn := func(b *testing.B, auth bool) *localConn {
		var authn *rpc.Authenticator
		if auth {
			var err error
			if authn, err = rpc.NewAuthenticator([]rpc.TenantKey{{ID: tenant, KeySHA256: rpc.HashKey("sk-acme")}}, nil); err != nil {
				b.Fatal(err)
			}
			authn = authn.WithProcessSecret()
		}
		reg := prometheus.NewRegistry()
		authn, err := authn.Instrumented(log, reg, nil)
		if err != nil {
			b.Fatal(err)
		}
		audiences := rpc.Audiences{quotav1.QuotaService_Settle_FullMethodName: rpc.AudienceService}
		chain, err := rpc.ServerInterceptors(log, reg, authn, audiences)
		if err != nil {
			b.Fatal(err)
		}
		c := newLocalConn(chain, authn.ClientIdentity("router"), nil, nil)
		c.RegisterService(&quotav1.QuotaService_ServiceDesc, settleStub{})
		return c
	}
	for _, auth := range []struct {
		name string
		on   bool
	}{{"auth=off", false}, {"auth=on", true}} {
		c := conn(b, auth.on)
		client := quotav1.NewQuotaServiceClient(c)
		for _, msg := range []struct {
			name    string
			quality *mantlev1.QualityContext
		}{
			{"quality=bare", &mantlev1.QualityContext{RequestId: "req_3f9a0c1b2d4e5f60718293a4", Tenant: tenant}},
			{"quality=router", routerQuality(tenant)},
		} {
			b.Run(auth.name+"/"+msg.name, func(b *testing.B) {
				// The router's context: its request id and trace, and the tenant it acts for.
				ctx := rpc.WithTraceID(rpc.WithTenant(rpc.WithRequestID(context.Background(), msg.quality.RequestId), tenant), "4bf92f3577b34da6a3ce929d0e0e4736")
				ctx, cancel := context.WithTimeout(ctx, time.Hour)
				defer cancel()
				req := &quotav1.SettleRequest{Quality: msg.quality, ReservationId: "rsv_7c1e2a9b", Usage: &mantlev1.Usage{InputTokens: 912, OutputTokens: 168, TotalTokens: 1080}}
				b.ReportAllocs()
				cpuStart, cpuOK := procusage.CPU()
				for b.Loop() {
					resp, err := client.Settle(ctx, req)
					if err != nil {
						b.Fatal(err)
					}
					if resp.GetReservedTokens() != 1200 {
						b.Fatalf("reserved tokens = %d", resp.GetReservedTokens())
					}
				}
				if cpuEnd, ok := procusage.CPU(); ok && cpuOK {
					b.ReportMetric(float64(cpuEnd-cpuStart)/float64(b.N), "cpu-ns/op")
				}
			})
		}
	}
}
