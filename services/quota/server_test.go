package quota

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	quotav1 "github.com/mantle-mesh/mantle/pkg/api/mantle/quota/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/quota/internal/ledger"
)

// testTenantHeader stands in for the auth interceptor: the server test authenticates a
// call as the tenant this header names.
const testTenantHeader = "x-test-tenant"

func authenticateFromHeader(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get(testTenantHeader)) > 0 {
		ctx = rpc.WithTenant(ctx, md.Get(testTenantHeader)[0])
	}
	return handler(ctx, req)
}

// startServer serves f.svc over bufconn and returns a client of the generated API.
func startServer(t *testing.T, f *fixture) quotav1.QuotaServiceClient {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.UnaryInterceptor(authenticateFromHeader))
	quotav1.RegisterQuotaServiceServer(srv, newServer(f.svc))
	go func() { _ = srv.Serve(lis) }() // returns when Stop closes the listener
	t.Cleanup(srv.Stop)
	return dialBufconn(t, lis)
}

// dialBufconn returns a client of the quota service listening on lis, closed when the
// test ends.
func dialBufconn(t *testing.T, lis *bufconn.Listener) quotav1.QuotaServiceClient {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return quotav1.NewQuotaServiceClient(conn)
}

func asTenant(tenant string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), testTenantHeader, tenant)
}

func quality(tenant string) *mantlev1.QualityContext {
	return &mantlev1.QualityContext{RequestId: "req-1", Tenant: tenant}
}

func TestServerReserveGrants(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testConfig())
	client := startServer(t, f)
	earlier := &mantlev1.AuditStep{Service: "router", Step: "route"}
	resp, err := client.Reserve(context.Background(), &quotav1.ReserveRequest{
		Quality:         &mantlev1.QualityContext{RequestId: "req-1", Tenant: "acme", Audit: []*mantlev1.AuditStep{earlier}},
		Model:           "gpt-4o",
		InputTokens:     900,
		MaxOutputTokens: 100,
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetReservationId() == "" || resp.GetReservedTokens() != 1000 || !resp.GetExpiresAt().AsTime().Equal(t0.Add(2*time.Minute)) {
		t.Errorf("reservation = %q, %d tokens, expires %v", resp.GetReservationId(), resp.GetReservedTokens(), resp.GetExpiresAt().AsTime())
	}
	wantLimits := &quotav1.Limits{
		LimitRequests: 60, RemainingRequests: 59, ResetRequests: durationpb.New(time.Second),
		LimitTokens: 6000, RemainingTokens: 5000, ResetTokens: durationpb.New(10 * time.Second),
	}
	if !proto.Equal(resp.GetLimits(), wantLimits) {
		t.Errorf("limits = %v, want %v", resp.GetLimits(), wantLimits)
	}
	audit := resp.GetQuality().GetAudit()
	if len(audit) != 2 || !proto.Equal(audit[0], earlier) {
		t.Fatalf("audit = %v, want the router's step followed by quota's", audit)
	}
	step := audit[1]
	if step.GetService() != "quota" || step.GetStep() != "reserve" || !step.GetAt().AsTime().Equal(t0) ||
		!strings.Contains(step.GetDetail(), "reserved 1000 tokens (900 input + 100 max output)") {
		t.Errorf("audit step = %v", step)
	}
	if resp.GetQuality().GetRequestId() != "req-1" {
		t.Errorf("quality lost its request id: %v", resp.GetQuality())
	}
}

func TestServerTenantResolution(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name          string
		ctx           context.Context
		claimed       string
		wantCode      codes.Code
		wantReason    string
		wantFields    []string
		wantTenantOut string
	}{
		{"authenticated tenant fills an empty claim", asTenant("acme"), "", codes.OK, "", nil, "acme"},
		{"matching claim", asTenant("acme"), "acme", codes.OK, "", nil, "acme"},
		{"unauthenticated call uses the claim", context.Background(), "acme", codes.OK, "", nil, "acme"},
		{"mismatch is denied", asTenant("acme"), "beta", codes.PermissionDenied, rpc.ReasonPermissionDenied, nil, ""},
		{"no tenant at all", context.Background(), "", codes.InvalidArgument, rpc.ReasonInvalidRequest, []string{"quality.tenant"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, testConfig())
			client := startServer(t, f)
			resp, err := client.Reserve(tt.ctx, &quotav1.ReserveRequest{Quality: quality(tt.claimed), Model: "m", InputTokens: 1})
			assertStatus(t, err, tt.wantCode, tt.wantReason)
			if got := rpc.BadRequestFields(err); !slices.Equal(got, tt.wantFields) {
				t.Errorf("BadRequest fields = %v, want %v", got, tt.wantFields)
			}
			if got := resp.GetQuality().GetTenant(); got != tt.wantTenantOut {
				t.Errorf("quality.tenant = %q, want %q", got, tt.wantTenantOut)
			}
		})
	}
}

func TestServerReserveErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		req          *quotav1.ReserveRequest
		wantCode     codes.Code
		wantReason   string
		wantFields   []string
		wantSubjects []string
		wantRetry    time.Duration // 0: no RetryInfo
	}{
		{
			name:     "exhausted",
			req:      &quotav1.ReserveRequest{Quality: quality("acme"), Model: "m", InputTokens: 249, MaxOutputTokens: 1},
			wantCode: codes.ResourceExhausted, wantReason: "QUOTA_EXHAUSTED",
			wantSubjects: []string{"tenant:acme:tpm"}, wantRetry: 2500 * time.Millisecond,
		},
		{
			name:     "too large",
			req:      &quotav1.ReserveRequest{Quality: quality("acme"), Model: "m", InputTokens: 100, MaxOutputTokens: 6000},
			wantCode: codes.FailedPrecondition, wantReason: "REQUEST_TOO_LARGE",
			wantFields: []string{"max_output_tokens"}, wantSubjects: []string{"tenant:acme:tpm"},
		},
		{
			name:     "invalid",
			req:      &quotav1.ReserveRequest{Quality: quality("acme"), InputTokens: -1},
			wantCode: codes.InvalidArgument, wantReason: "INVALID_REQUEST",
			wantFields: []string{"model", "input_tokens"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, testConfig())
			client := startServer(t, f)
			// Drain the bucket so "exhausted" has something to wait for.
			f.reserve(t, "acme", 5999, 1)

			_, err := client.Reserve(context.Background(), tt.req)
			assertStatus(t, err, tt.wantCode, tt.wantReason)
			if got := rpc.BadRequestFields(err); !slices.Equal(got, tt.wantFields) {
				t.Errorf("BadRequest fields = %v, want %v", got, tt.wantFields)
			}
			if got := quotaFailureSubjects(err); !slices.Equal(got, tt.wantSubjects) {
				t.Errorf("QuotaFailure subjects = %v, want %v", got, tt.wantSubjects)
			}
			retry, hasRetry := rpc.RetryDelay(err)
			if hasRetry != (tt.wantRetry > 0) || retry != tt.wantRetry {
				t.Errorf("RetryInfo = %v (present %v), want %v", retry, hasRetry, tt.wantRetry)
			}
			if tt.wantCode == codes.ResourceExhausted && errorCause(err) != "bucket" {
				t.Errorf("ErrorInfo cause = %q, want bucket", errorCause(err))
			}
		})
	}
}

func TestServerSettle(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testConfig())
	client := startServer(t, f)
	ctx := asTenant("acme")
	r, err := client.Reserve(ctx, &quotav1.ReserveRequest{Quality: quality(""), Model: "m", InputTokens: 900, MaxOutputTokens: 100})
	if err != nil {
		t.Fatal(err)
	}
	settle := func(ctx context.Context, q *mantlev1.QualityContext, id string, usage *mantlev1.Usage) (*quotav1.SettleResponse, error) {
		return client.Settle(ctx, &quotav1.SettleRequest{Quality: q, ReservationId: id, Usage: usage})
	}

	steps := []struct {
		name         string
		call         func() (*quotav1.SettleResponse, error)
		wantCode     codes.Code
		wantReason   string
		wantFields   []string
		wantRefunded int64
	}{
		{"missing usage", func() (*quotav1.SettleResponse, error) { return settle(ctx, nil, r.GetReservationId(), nil) },
			codes.InvalidArgument, "INVALID_REQUEST", []string{"usage"}, 0},
		{"another tenant's claim", func() (*quotav1.SettleResponse, error) {
			return settle(ctx, quality("beta"), r.GetReservationId(), &mantlev1.Usage{})
		}, codes.PermissionDenied, "PERMISSION_DENIED", nil, 0},
		{"another authenticated tenant", func() (*quotav1.SettleResponse, error) {
			return settle(asTenant("beta"), nil, r.GetReservationId(), &mantlev1.Usage{})
		}, codes.NotFound, "RESERVATION_NOT_FOUND", nil, 0},
		{"refund", func() (*quotav1.SettleResponse, error) {
			return settle(ctx, nil, r.GetReservationId(), &mantlev1.Usage{InputTokens: 300, OutputTokens: 100})
		}, codes.OK, "", nil, 600},
		{"twice", func() (*quotav1.SettleResponse, error) {
			return settle(ctx, nil, r.GetReservationId(), &mantlev1.Usage{InputTokens: 300, OutputTokens: 100})
		}, codes.NotFound, "RESERVATION_NOT_FOUND", nil, 0},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			resp, err := s.call()
			assertStatus(t, err, s.wantCode, s.wantReason)
			if got := rpc.BadRequestFields(err); !slices.Equal(got, s.wantFields) {
				t.Errorf("BadRequest fields = %v, want %v", got, s.wantFields)
			}
			if resp.GetRefundedTokens() != s.wantRefunded {
				t.Errorf("refunded = %d, want %d", resp.GetRefundedTokens(), s.wantRefunded)
			}
			if err == nil && resp.GetLimits().GetRemainingTokens() != 5600 {
				t.Errorf("remaining tokens = %d, want 5600", resp.GetLimits().GetRemainingTokens())
			}
		})
	}
}

func TestServerCountTokens(t *testing.T) {
	t.Parallel()
	client := startServer(t, newFixture(t, testConfig()))
	resp, err := client.CountTokens(context.Background(), &quotav1.CountTokensRequest{
		Model:    "deepseek-chat",
		Messages: []*mantlev1.ChatMessage{{Role: "user", Content: "我们今天讨论令牌计数"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := &quotav1.CountTokensResponse{Tokens: 3 + 5 + 6, Tokenizer: "estimate/deepseek", Exact: false, Correction: 1}
	if !proto.Equal(resp, want) {
		t.Errorf("got %v, want %v", resp, want)
	}

	_, err = client.CountTokens(context.Background(), &quotav1.CountTokensRequest{Model: "gpt-4"})
	assertStatus(t, err, codes.InvalidArgument, "INVALID_REQUEST")
	if got := rpc.BadRequestFields(err); !slices.Equal(got, []string{"messages"}) {
		t.Errorf("BadRequest fields = %v, want [messages]", got)
	}
}

func TestToStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		err        error
		wantCode   codes.Code
		wantReason string // "" when no ErrorInfo is expected
		wantMsg    string
		wantLogged bool
	}{
		{"canceled keeps its code", fmt.Errorf("reserve: %w", context.Canceled), codes.Canceled, "", "reserve: context canceled", false},
		{"deadline keeps its code", fmt.Errorf("settle: %w", context.DeadlineExceeded), codes.DeadlineExceeded, "", "settle: context deadline exceeded", false},
		{"not found", fmt.Errorf("settle x: %w", ledger.ErrReservationNotFound), codes.NotFound, "RESERVATION_NOT_FOUND", "settle x: reservation not found", false},
		{"unknown becomes a generic internal error", errors.New("redis: connection refused to 10.0.0.7"), codes.Internal, "INTERNAL", "internal error", true},
		{"money fails closed", fmt.Errorf("reserve: %w", errBudgetUnavailable), codes.Unavailable, "BUDGET_UNAVAILABLE", errBudgetUnavailable.Error(), false},
		{"unreachable state", fmt.Errorf("settle: %w", errStoreUnavailable), codes.Unavailable, "UNAVAILABLE", "settle: quota state unavailable", false},
		{"tenant mismatch", rpc.ErrTenantMismatch, codes.PermissionDenied, "PERMISSION_DENIED", rpc.ErrTenantMismatch.Error(), false},
		{"shutting down", errShuttingDown, codes.Unavailable, "UNAVAILABLE", "quota service is shutting down", false},
		{"no price", &priceUnknownError{Model: "x"}, codes.FailedPrecondition, "PRICE_UNKNOWN", (&priceUnknownError{Model: "x"}).Error(), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var logs bytes.Buffer
			s := &server{log: slog.New(slog.NewTextHandler(&logs, nil))}
			err := s.toStatus(tt.err)
			assertStatus(t, err, tt.wantCode, tt.wantReason)
			if got := status.Convert(err).Message(); got != tt.wantMsg {
				t.Errorf("message = %q, want %q", got, tt.wantMsg)
			}
			logged := strings.Count(logs.String(), "connection refused")
			if tt.wantLogged && logged != 1 {
				t.Errorf("the real error was logged %d times, want once:\n%s", logged, logs.String())
			}
			if !tt.wantLogged && logs.Len() > 0 {
				t.Errorf("logged %q for an expected error", logs.String())
			}
		})
	}
}

// assertStatus checks the code and, when wantReason is set, the ErrorInfo.
func assertStatus(t *testing.T, err error, wantCode codes.Code, wantReason string) {
	t.Helper()
	if got := status.Code(err); got != wantCode {
		t.Fatalf("code = %v, want %v (err %v)", got, wantCode, err)
	}
	info := rpc.ErrorInfo(err)
	if wantReason == "" {
		if info != nil {
			t.Errorf("ErrorInfo = %v, want none", info)
		}
		return
	}
	if info.GetReason() != wantReason || info.GetDomain() != "quota.mantle" {
		t.Errorf("ErrorInfo = %v, want reason %s in domain quota.mantle", info, wantReason)
	}
}

func errorCause(err error) string {
	return rpc.ErrorInfo(err).GetMetadata()["cause"]
}

func quotaFailureSubjects(err error) []string {
	var subjects []string
	for _, d := range status.Convert(err).Details() {
		if qf, ok := d.(*errdetails.QuotaFailure); ok {
			for _, v := range qf.GetViolations() {
				subjects = append(subjects, v.GetSubject())
			}
		}
	}
	return subjects
}

func TestServerReserveReportsEveryBucket(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.UpstreamKeys = map[string]RateLimits{"k1": {RPM: 100, TPM: 10_000, Shadow: true}}
	cfg.Budgets = BudgetsConfig{Tenants: map[string]Budget{"acme": {DailyUSD: 2}}, Prices: map[string]Price{"gpt-4o": {InputPerMillion: 2.5, OutputPerMillion: 10}}}
	f := newFixture(t, cfg)
	client := startServer(t, f)
	resp, err := client.Reserve(context.Background(), &quotav1.ReserveRequest{
		Quality:       quality("acme"),
		Model:         "gpt-4o",
		Messages:      []*mantlev1.ChatMessage{{Role: "user", Content: "the cat sat on the mat"}},
		UpstreamKeyId: "k1",
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetInputTokens() != 13 || resp.GetReservedTokens() != 113 || resp.GetWaited().AsDuration() != 0 {
		t.Errorf("input %d, reserved %d, waited %v; want 13, 113, 0", resp.GetInputTokens(), resp.GetReservedTokens(), resp.GetWaited().AsDuration())
	}
	var names []string
	for _, b := range resp.GetBuckets() {
		names = append(names, fmt.Sprintf("%s shadow=%v", b.GetName(), b.GetShadow()))
	}
	want := []string{"tenant:acme:rpm shadow=false", "tenant:acme:tpm shadow=false", "key:k1:rpm shadow=true", "key:k1:tpm shadow=true"}
	if !slices.Equal(names, want) {
		t.Errorf("buckets = %v, want %v", names, want)
	}
	// 13 input tokens at 2.5/M and 100 output at 10/M: 32,500 + 1,000,000 nano-USD.
	wantBudget := &quotav1.Budget{LimitUsd: 2, SpentUsd: 0.0010325, ResetAfter: durationpb.New(12 * time.Hour)}
	if !proto.Equal(resp.GetBudget(), wantBudget) {
		t.Errorf("budget = %v, want %v", resp.GetBudget(), wantBudget)
	}
	st, err := client.Settle(context.Background(), &quotav1.SettleRequest{Quality: quality("acme"), ReservationId: resp.GetReservationId(), Usage: &mantlev1.Usage{InputTokens: 13, OutputTokens: 7}})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetReservedTokens() != 113 || st.GetRefundedTokens() != 93 || st.GetCostUsd() != 0.0001025 || len(st.GetBuckets()) != 4 {
		t.Errorf("settle = %v, want 113 reserved, 93 refunded, cost 0.0001025 and 4 buckets", st)
	}
}

func TestServerQueueRefusalsCarryTheirCause(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Queue.Size = 1
	q := runningQueue(t, cfg)
	client := startServer(t, q.fixture)
	q.reserve(t, "acme", 5999, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	q.enqueue(t, ctx, req("w", "acme", mantlev1.Priority_PRIORITY_CRITICAL, 100), 1)
	_, err := client.Reserve(ctx, &quotav1.ReserveRequest{Quality: &mantlev1.QualityContext{Tenant: "acme", Priority: mantlev1.Priority_PRIORITY_BATCH}, Model: "m", InputTokens: 10})
	assertStatus(t, err, codes.ResourceExhausted, "QUOTA_EXHAUSTED")
	if errorCause(err) != "queue_full" || !slices.Equal(quotaFailureSubjects(err), []string{"queue"}) {
		t.Errorf("cause %q, subjects %v; want queue_full on queue", errorCause(err), quotaFailureSubjects(err))
	}
	if w, ok := rpc.ErrorInfo(err).GetMetadata()["waited_ms"]; ok {
		t.Errorf("waited_ms %q on a refusal that did not wait", w)
	}
	// A refusal after a wait says how long, so that callers do not count it as quota's.
	waited := exhaustedStatus(&ledger.ExhaustedError{Bucket: "queue", Cause: ledger.CauseShed, Waited: 1500 * time.Millisecond})
	if w := rpc.ErrorInfo(waited).GetMetadata()["waited_ms"]; w != "1500" {
		t.Errorf("waited_ms = %q, want 1500", w)
	}
	if d, ok := rpc.RetryDelay(err); !ok || d <= 0 {
		t.Errorf("RetryInfo = %v, %v; want a delay", d, ok)
	}
}

func TestServerObserveUpstream(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.UpstreamKeys = map[string]RateLimits{"openai-1": {RPM: 60, TPM: 6000}}
	client := startServer(t, newFixture(t, cfg))
	resp, err := client.ObserveUpstream(context.Background(), &quotav1.ObserveUpstreamRequest{
		UpstreamKeyId: "openai-1", RemainingRequests: -1, RemainingTokens: 1500, ResetTokens: durationpb.New(6 * time.Second),
	})
	if err != nil {
		t.Fatal(err)
	}
	want := &quotav1.ObserveUpstreamResponse{Applied: true, Limits: &quotav1.Limits{
		LimitRequests: 60, RemainingRequests: 60, ResetRequests: durationpb.New(0),
		LimitTokens: 6000, RemainingTokens: 1500, ResetTokens: durationpb.New(45 * time.Second),
	}}
	if !proto.Equal(resp, want) {
		t.Errorf("got %v, want %v", resp, want)
	}
	resp, err = client.ObserveUpstream(context.Background(), &quotav1.ObserveUpstreamRequest{UpstreamKeyId: "unknown", RemainingRequests: 0, RemainingTokens: 0})
	if err != nil || resp.GetApplied() || resp.GetLimits() != nil {
		t.Errorf("unknown key: %v, %v; want not applied", resp, err)
	}
	_, err = client.ObserveUpstream(context.Background(), &quotav1.ObserveUpstreamRequest{RemainingRequests: -3})
	assertStatus(t, err, codes.InvalidArgument, "INVALID_REQUEST")
	if got := rpc.BadRequestFields(err); !slices.Equal(got, []string{"upstream_key_id", "remaining_requests"}) {
		t.Errorf("fields = %v", got)
	}
}

func TestServerAcquireRetry(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.RetryBudget.Floor = 1
	client := startServer(t, newFixture(t, cfg))
	ctx := context.Background()
	first, err := client.AcquireRetry(ctx, &quotav1.AcquireRetryRequest{Quality: quality("acme"), UpstreamKeyId: "k1"})
	if err != nil || !first.GetGranted() || first.GetBudget() != "" || first.GetRetries() != 1 {
		t.Fatalf("first retry: %v, %v; want granted by the floor", first, err)
	}
	second, err := client.AcquireRetry(ctx, &quotav1.AcquireRetryRequest{Quality: quality("acme"), UpstreamKeyId: "k1"})
	if err != nil || second.GetGranted() || second.GetBudget() != "retry:overall" {
		t.Fatalf("second retry: %v, %v; want refused by retry:overall", second, err)
	}
}

func TestServerReserveUpstreamScope(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.UpstreamKeys = map[string]RateLimits{"backup": {TPM: 3000}}
	client := startServer(t, newFixture(t, cfg))
	resp, err := client.Reserve(context.Background(), &quotav1.ReserveRequest{
		Quality: quality("acme"), Model: "m", InputTokens: 99, MaxOutputTokens: 1,
		UpstreamKeyId: "backup", Scope: quotav1.ReserveScope_RESERVE_SCOPE_UPSTREAM_KEY,
	})
	if err != nil {
		t.Fatal(err)
	}
	if l := resp.GetLimits(); l.GetLimitTokens() != 3000 || l.GetRemainingTokens() != 2900 || len(resp.GetBuckets()) != 1 {
		t.Errorf("limits %v, buckets %v; want the key's tpm only", l, resp.GetBuckets())
	}
	_, err = client.Reserve(context.Background(), &quotav1.ReserveRequest{Quality: quality("acme"), Model: "m", Scope: quotav1.ReserveScope_RESERVE_SCOPE_UPSTREAM_KEY})
	assertStatus(t, err, codes.InvalidArgument, "INVALID_REQUEST")
}

// TestLevelsMatchTheWellKnownTypes: the limits and bucket levels, made with their
// durations in one allocation, are the messages durationpb.New would give, and a
// reserve's times are timestamppb.New's.
func TestLevelsMatchTheWellKnownTypes(t *testing.T) {
	t.Parallel()
	durations := []time.Duration{0, time.Nanosecond, 1500 * time.Millisecond, -1500 * time.Millisecond, -time.Nanosecond, time.Duration(math.MaxInt64), time.Duration(math.MinInt64)}
	for i, d := range durations {
		other := durations[(i+1)%len(durations)]
		pair := levelPair{
			Requests: ledger.BucketLevel{Limit: 10, Remaining: 3, Reset: d},
			Tokens:   ledger.BucketLevel{Limit: 1000, Remaining: 999, Reset: other},
		}
		want := &quotav1.Limits{LimitRequests: 10, RemainingRequests: 3, LimitTokens: 1000, RemainingTokens: 999,
			ResetRequests: durationpb.New(d), ResetTokens: durationpb.New(other)}
		if got := limitsToProto(pair); !proto.Equal(got, want) {
			t.Errorf("limitsToProto(%v, %v) = %v, want %v", d, other, got, want)
		}
		levels := []ledger.BucketLevel{
			{Name: "tenant:tokens", Limit: 5, Remaining: 1, Reset: d, Shadow: true, ShadowRefused: true},
			{Name: "model:requests", Limit: 7, Reset: other},
		}
		got := bucketsToProto(levels)
		for j, l := range levels {
			want := &quotav1.BucketLevel{Name: l.Name, Limit: l.Limit, Remaining: l.Remaining, ResetAfter: durationpb.New(l.Reset), Shadow: l.Shadow, ShadowRefused: l.ShadowRefused}
			if len(got) != len(levels) || !proto.Equal(got[j], want) {
				t.Errorf("bucketsToProto(%v)[%d] = %v, want %v", levels, j, got, want)
			}
		}
	}
}

// TestReserveDetailMatchesFmt: the reserve's audit detail, appended number by number,
// reads as the fmt.Sprintf it replaced.
func TestReserveDetailMatchesFmt(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		got   reserveOutcome
		model string
	}{
		{reserveOutcome{ReservedTokens: 1000, InputTokens: 900, MaxOutputTokens: 100,
			Levels: levelPair{Requests: ledger.BucketLevel{Limit: 60, Remaining: 59}, Tokens: ledger.BucketLevel{Limit: 10000, Remaining: 9000}}}, "gpt-4o"},
		{reserveOutcome{ReservedTokens: 7, Waited: 1500 * time.Millisecond, Levels: levelPair{Tokens: ledger.BucketLevel{Remaining: -3}}}, ""},
		{reserveOutcome{ReservedTokens: math.MaxInt64, InputTokens: math.MinInt64, Waited: -time.Second}, strings.Repeat("a-very-long-model-name/", 20)},
	} {
		want := fmt.Sprintf("reserved %d tokens (%d input + %d max output) for %s; %d/%d tokens and %d/%d requests left",
			tt.got.ReservedTokens, tt.got.InputTokens, tt.got.MaxOutputTokens, tt.model,
			tt.got.Levels.Tokens.Remaining, tt.got.Levels.Tokens.Limit, tt.got.Levels.Requests.Remaining, tt.got.Levels.Requests.Limit)
		if tt.got.Waited > 0 {
			want += fmt.Sprintf("; waited %s", tt.got.Waited)
		}
		if got := reserveDetail(tt.got, tt.model); got != want {
			t.Errorf("reserveDetail = %q, want %q", got, want)
		}
	}
}
