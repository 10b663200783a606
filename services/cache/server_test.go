package cache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	cachev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/cache/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/app"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/cache/internal/embed"
	"github.com/mantle-mesh/mantle/services/cache/internal/vector"
)

// tenantHeader stands in for the app's auth interceptor: the tenant it names becomes the
// authenticated tenant of the call.
const tenantHeader = "x-test-tenant"

func fakeAuth(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get(tenantHeader)) > 0 {
		ctx = rpc.WithTenant(ctx, md.Get(tenantHeader)[0])
	}
	return handler(ctx, req)
}

// asTenant returns a context whose calls authenticate as tenant.
func asTenant(tenant string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), tenantHeader, tenant)
}

// serve runs a gRPC server over bufconn with the services register adds, and returns a
// client connection to it. Both are stopped when the test ends.
func serve(t *testing.T, register func(*grpc.Server)) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.UnaryInterceptor(fakeAuth))
	register(srv)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis) // returns when Stop closes the listener
	}()
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		srv.Stop()
		<-done
	})
	return conn
}

// startCache serves a cache over index with the default config and a fake clock.
func startCache(t *testing.T, index Index) (cachev1.CacheServiceClient, *clockwork.FakeClock) {
	t.Helper()
	clock := clockwork.NewFakeClockAt(epoch)
	svc, err := NewService(DefaultConfig(), Deps{Index: index, Embedder: embed.NewLexical(), Clock: clock, Metrics: prometheus.NewRegistry()})
	if err != nil {
		t.Fatalf("NewService: %v", err)
	}
	conn := serve(t, func(s *grpc.Server) {
		cachev1.RegisterCacheServiceServer(s, newServer(svc, clock, slog.New(slog.DiscardHandler)))
	})
	return cachev1.NewCacheServiceClient(conn), clock
}

func protoPrompt(user string) *cachev1.Prompt {
	temperature := 0.2
	return &cachev1.Prompt{
		Scenario:    "support",
		Model:       "gpt-4o-mini",
		Temperature: &temperature,
		MaxTokens:   512,
		Messages: []*mantlev1.ChatMessage{
			{Role: "system", Content: "You are a helpful support agent."},
			{Role: "user", Content: user},
		},
	}
}

func storeRequest(tenant string, prompt *cachev1.Prompt) *cachev1.StoreRequest {
	return &cachev1.StoreRequest{
		Quality: &mantlev1.QualityContext{
			RequestId:    "req-store",
			Tenant:       tenant,
			Verification: &mantlev1.Verification{L1Passed: true},
		},
		Prompt:       prompt,
		Content:      "Click “Forgot password” on the sign-in page.",
		SourceModel:  "gpt-4o-mini-2024-07-18",
		FinishReason: "stop",
		Usage:        &mantlev1.Usage{InputTokens: 20, OutputTokens: 12, TotalTokens: 32},
	}
}

func TestServerLookupHitAndMiss(t *testing.T) {
	t.Parallel()
	client, clock := startCache(t, NewEmbeddedIndex(10, 0))
	ctx := asTenant("acme")

	// The scenario may come from the QualityContext alone.
	store := storeRequest("", protoPrompt("How do I reset my password?"))
	store.Prompt.Scenario, store.Quality.Scenario = "", "support"
	stored, err := client.Store(ctx, store)
	if err != nil {
		t.Fatalf("Store: %v", err)
	}
	if !stored.GetStored() || stored.GetEntryId() == "" || stored.GetSkippedReason() != "" {
		t.Fatalf("Store = %v, want stored with an id", stored)
	}
	clock.Advance(5 * time.Minute)

	t.Run("hit", func(t *testing.T) {
		resp, err := client.Lookup(ctx, &cachev1.LookupRequest{
			Quality: &mantlev1.QualityContext{RequestId: "req-1", Tenant: "acme"},
			Prompt:  protoPrompt("ＨＯＷ ＤＯ Ｉ ＲＥＳＥＴ ＭＹ ＰＡＳＳＷＯＲＤ？"),
		})
		if err != nil {
			t.Fatalf("Lookup: %v", err)
		}
		wantEntry := &cachev1.Entry{
			Id:           stored.GetEntryId(),
			Content:      "Click “Forgot password” on the sign-in page.",
			SourceModel:  "gpt-4o-mini-2024-07-18",
			Usage:        &mantlev1.Usage{InputTokens: 20, OutputTokens: 12, TotalTokens: 32},
			CreatedAt:    timestamppb.New(epoch),
			ExpiresAt:    timestamppb.New(epoch.Add(time.Hour)),
			FinishReason: "stop",
			Namespace:    "lexical-v1",
			StaleUntil:   timestamppb.New(epoch.Add(25 * time.Hour)),
		}
		if !resp.GetHit() || resp.GetSimilarity() != 1 || !proto.Equal(resp.GetEntry(), wantEntry) {
			t.Errorf("Lookup = hit %v, similarity %v, entry %v; want hit, 1, %v", resp.GetHit(), resp.GetSimilarity(), resp.GetEntry(), wantEntry)
		}
		q := resp.GetQuality()
		if q.GetRequestId() != "req-1" || !q.GetCacheHit() || q.GetCacheSimilarity() != 1 {
			t.Errorf("quality = %v, want request req-1 with cache_hit and similarity 1", q)
		}
		assertAuditStep(t, q, clock.Now(), "exact hit 1.000, entry "+stored.GetEntryId())
	})

	t.Run("miss", func(t *testing.T) {
		resp, err := client.Lookup(ctx, &cachev1.LookupRequest{
			Quality: &mantlev1.QualityContext{RequestId: "req-2"},
			Prompt:  protoPrompt("How do I change my email?"),
		})
		if err != nil {
			t.Fatalf("Lookup: %v (a miss is not an error)", err)
		}
		if resp.GetHit() || resp.GetEntry() != nil || resp.GetQuality().GetCacheHit() {
			t.Errorf("Lookup = %v, want a miss", resp)
		}
		assertAuditStep(t, resp.GetQuality(), clock.Now(), "miss")
	})
}

func assertAuditStep(t *testing.T, q *mantlev1.QualityContext, at time.Time, detailPrefix string) {
	t.Helper()
	if len(q.GetAudit()) != 1 {
		t.Fatalf("audit has %d steps, want 1", len(q.GetAudit()))
	}
	step := q.GetAudit()[0]
	if step.GetService() != "cache" || step.GetStep() != "lookup" || !strings.HasPrefix(step.GetDetail(), detailPrefix) ||
		!step.GetAt().AsTime().Equal(at) || step.GetDuration() == nil {
		t.Errorf("audit step = %v, want cache/lookup at %v, detail starting %q, with a duration", step, at, detailPrefix)
	}
}

func TestServerTenants(t *testing.T) {
	t.Parallel()
	client, _ := startCache(t, NewEmbeddedIndex(10, 0))
	// Stored without authentication, under the tenant the QualityContext names.
	if _, err := client.Store(context.Background(), storeRequest("acme", protoPrompt("hello"))); err != nil {
		t.Fatalf("Store: %v", err)
	}
	tests := []struct {
		name    string
		ctx     context.Context
		quality *mantlev1.QualityContext
		wantHit bool
	}{
		{"authenticated as the same tenant", asTenant("acme"), nil, true},
		{"authenticated, quality agrees", asTenant("acme"), &mantlev1.QualityContext{Tenant: "acme"}, true},
		{"unauthenticated, quality names the tenant", context.Background(), &mantlev1.QualityContext{Tenant: "acme"}, true},
		{"authenticated as another tenant", asTenant("globex"), nil, false},
		{"unauthenticated, quality names another tenant", context.Background(), &mantlev1.QualityContext{Tenant: "globex"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			resp, err := client.Lookup(tt.ctx, &cachev1.LookupRequest{Quality: tt.quality, Prompt: protoPrompt("hello")})
			if err != nil {
				t.Fatalf("Lookup: %v", err)
			}
			if resp.GetHit() != tt.wantHit {
				t.Errorf("hit = %v, want %v", resp.GetHit(), tt.wantHit)
			}
		})
	}
}

func TestServerStoreSkips(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		change func(r *cachev1.StoreRequest)
		want   SkipReason
	}{
		{"finish reason", func(r *cachev1.StoreRequest) { r.FinishReason = "length" }, SkipFinishReason},
		{"white space", func(r *cachev1.StoreRequest) { r.Content = "  " }, SkipEmpty},
		{"volatile prompt", func(r *cachev1.StoreRequest) { r.Prompt.Messages[1].Content = "现在几点" }, SkipVolatilePrompt},
		{"high temperature", func(r *cachev1.StoreRequest) { r.Prompt.Temperature = nil }, SkipHighTemperature},
		{"failed verification", func(r *cachev1.StoreRequest) {
			r.Quality.Verification = &mantlev1.Verification{L1Passed: false, L1Failures: []string{"json_parse"}}
		}, SkipNotVerified},
		{"no verification", func(r *cachev1.StoreRequest) { r.Quality.Verification = nil }, SkipNotVerified},
		{"template answer", func(r *cachev1.StoreRequest) {
			r.Quality.FallbackLevel = mantlev1.FallbackLevel_FALLBACK_LEVEL_TEMPLATE
		}, SkipDegraded},
		{"approximate cached answer", func(r *cachev1.StoreRequest) {
			r.Quality.FallbackLevel = mantlev1.FallbackLevel_FALLBACK_LEVEL_CACHED_APPROXIMATE
		}, SkipDegraded},
		{"cache hit", func(r *cachev1.StoreRequest) { r.Quality.CacheHit = true }, SkipCacheHit},
		{"backup model is fine (control)", func(r *cachev1.StoreRequest) {
			r.Quality.FallbackLevel = mantlev1.FallbackLevel_FALLBACK_LEVEL_BACKUP_MODEL
			r.Quality.Verification = &mantlev1.Verification{L1Passed: true}
		}, ""},
	}
	client, _ := startCache(t, NewEmbeddedIndex(10, 0))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			req := storeRequest("", protoPrompt("question for "+tt.name))
			tt.change(req)
			resp, err := client.Store(asTenant("acme"), req)
			if err != nil {
				t.Fatalf("Store: %v (a policy skip is not an error)", err)
			}
			if resp.GetStored() != (tt.want == "") || resp.GetSkippedReason() != string(tt.want) {
				t.Errorf("Store = %v, want skipped_reason %q", resp, tt.want)
			}
		})
	}
}

func TestServerInvalidate(t *testing.T) {
	t.Parallel()
	client, _ := startCache(t, NewEmbeddedIndex(10, 0))
	var ids []string
	for _, q := range []string{"one", "two", "three"} {
		resp, err := client.Store(asTenant("acme"), storeRequest("", protoPrompt(q)))
		if err != nil {
			t.Fatalf("Store: %v", err)
		}
		ids = append(ids, resp.GetEntryId())
	}
	if _, err := client.Store(asTenant("globex"), storeRequest("", protoPrompt("one"))); err != nil {
		t.Fatalf("Store: %v", err)
	}

	steps := []struct {
		req  *cachev1.InvalidateRequest
		want int64
	}{
		{&cachev1.InvalidateRequest{EntryId: ids[0]}, 1},
		{&cachev1.InvalidateRequest{Scenario: "sales"}, 0},
		{&cachev1.InvalidateRequest{All: true}, 2},
	}
	for _, s := range steps {
		resp, err := client.Invalidate(asTenant("acme"), s.req)
		if err != nil {
			t.Fatalf("Invalidate(%v): %v", s.req, err)
		}
		if resp.GetRemoved() != s.want {
			t.Errorf("Invalidate(%v) removed %d, want %d", s.req, resp.GetRemoved(), s.want)
		}
	}
	resp, err := client.Lookup(asTenant("globex"), &cachev1.LookupRequest{Prompt: protoPrompt("one")})
	if err != nil || !resp.GetHit() {
		t.Errorf("globex Lookup = (%v, %v), want its entry untouched", resp, err)
	}
}

func TestServerErrors(t *testing.T) {
	t.Parallel()
	client, _ := startCache(t, NewEmbeddedIndex(10, 0))
	lookup := func(ctx context.Context, quality *mantlev1.QualityContext, prompt *cachev1.Prompt) error {
		_, err := client.Lookup(ctx, &cachev1.LookupRequest{Quality: quality, Prompt: prompt})
		return err
	}
	acme := &mantlev1.QualityContext{Tenant: "acme"}
	tests := []struct {
		name       string
		call       func() error
		wantCode   codes.Code
		wantReason string
		wantFields []string
	}{
		{
			name: "lookup for another tenant than authenticated",
			call: func() error {
				return lookup(asTenant("acme"), &mantlev1.QualityContext{Tenant: "globex"}, protoPrompt("hi"))
			},
			wantCode: codes.PermissionDenied, wantReason: rpc.ReasonPermissionDenied,
		},
		{
			name: "store for another tenant than authenticated",
			call: func() error {
				_, err := client.Store(asTenant("acme"), storeRequest("globex", protoPrompt("hi")))
				return err
			},
			wantCode: codes.PermissionDenied, wantReason: rpc.ReasonPermissionDenied,
		},
		{
			name:     "no tenant anywhere",
			call:     func() error { return lookup(context.Background(), &mantlev1.QualityContext{}, protoPrompt("hi")) },
			wantCode: codes.InvalidArgument, wantReason: rpc.ReasonInvalidRequest, wantFields: []string{"quality.tenant"},
		},
		{
			name:     "no prompt",
			call:     func() error { return lookup(context.Background(), acme, nil) },
			wantCode: codes.InvalidArgument, wantReason: rpc.ReasonInvalidRequest, wantFields: []string{"prompt"},
		},
		{
			name:     "no messages",
			call:     func() error { return lookup(context.Background(), acme, &cachev1.Prompt{Model: "m"}) },
			wantCode: codes.InvalidArgument, wantReason: rpc.ReasonInvalidRequest, wantFields: []string{"prompt.messages"},
		},
		{
			name: "last message not from the user",
			call: func() error {
				p := protoPrompt("hi")
				p.Messages[1].Role = "assistant"
				return lookup(context.Background(), acme, p)
			},
			wantCode: codes.InvalidArgument, wantReason: rpc.ReasonInvalidRequest, wantFields: []string{"prompt.messages[1].role"},
		},
		{
			name: "store without content, with a negative ttl",
			call: func() error {
				req := storeRequest("acme", protoPrompt("hi"))
				req.Content, req.Ttl = "", durationpb.New(-time.Minute)
				_, err := client.Store(context.Background(), req)
				return err
			},
			wantCode: codes.InvalidArgument, wantReason: rpc.ReasonInvalidRequest, wantFields: []string{"content", "ttl"},
		},
		{
			name: "invalidate selecting nothing",
			call: func() error {
				_, err := client.Invalidate(asTenant("acme"), &cachev1.InvalidateRequest{})
				return err
			},
			wantCode: codes.InvalidArgument, wantReason: rpc.ReasonInvalidRequest, wantFields: []string{"all"},
		},
		{
			name: "invalidate without an authenticated tenant",
			call: func() error {
				_, err := client.Invalidate(context.Background(), &cachev1.InvalidateRequest{All: true})
				return err
			},
			wantCode: codes.Unauthenticated, wantReason: rpc.ReasonUnauthenticated,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			assertStatus(t, tt.call(), tt.wantCode, tt.wantReason, tt.wantFields)
		})
	}
}

func assertStatus(t *testing.T, err error, code codes.Code, reason string, fields []string) {
	t.Helper()
	if got := status.Code(err); got != code {
		t.Fatalf("code = %v (err %v), want %v", got, err, code)
	}
	if info := rpc.ErrorInfo(err); info.GetReason() != reason || info.GetDomain() != "cache.mantle" {
		t.Errorf("ErrorInfo = %v, want reason %q in domain cache.mantle", info, reason)
	}
	if got := rpc.BadRequestFields(err); !slices.Equal(got, fields) {
		t.Errorf("BadRequest fields = %v, want %v", got, fields)
	}
	// Nothing the cache refuses gets better by waiting: no RetryInfo.
	if delay, ok := rpc.RetryDelay(err); ok {
		t.Errorf("RetryInfo delay %v present, want none", delay)
	}
}

// failingIndex fails every call with err.
type failingIndex struct{ err error }

func (f failingIndex) Get(context.Context, string, Key, time.Time) (Entry, bool, error) {
	return Entry{}, false, f.err
}
func (f failingIndex) Search(context.Context, Query) ([]Candidate, error)            { return nil, f.err }
func (f failingIndex) Put(context.Context, Entry, vector.Vector, *vector.Near) error { return f.err }
func (f failingIndex) Delete(context.Context, Filter) (int, error)                   { return 0, f.err }

func TestServerBackendErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		err        error
		wantCode   codes.Code
		wantReason string
	}{
		{"unknown error is internal", errors.New("qdrant: disk on fire"), codes.Internal, rpc.ReasonInternal},
		{"deadline keeps its code", fmt.Errorf("qdrant search: %w", context.DeadlineExceeded), codes.DeadlineExceeded, ""},
		{"cancellation keeps its code", fmt.Errorf("qdrant search: %w", context.Canceled), codes.Canceled, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			client, _ := startCache(t, failingIndex{err: tt.err})
			// A lookup is a miss whatever the backend did: the request goes on to a model.
			resp, err := client.Lookup(asTenant("acme"), &cachev1.LookupRequest{Prompt: protoPrompt("hi")})
			if err != nil || resp.GetHit() || resp.GetMissReason() != MissBackendError {
				t.Errorf("Lookup = (%v, %v), want a miss with reason %s", resp, err, MissBackendError)
			}
			calls := map[string]func() error{
				"store": func() error {
					_, err := client.Store(asTenant("acme"), storeRequest("", protoPrompt("hi")))
					return err
				},
				"invalidate": func() error {
					_, err := client.Invalidate(asTenant("acme"), &cachev1.InvalidateRequest{All: true})
					return err
				},
			}
			for name, call := range calls {
				err := call()
				if status.Code(err) != tt.wantCode {
					t.Errorf("%s: code = %v (err %v), want %v", name, status.Code(err), err, tt.wantCode)
				}
				if got := rpc.ErrorInfo(err).GetReason(); got != tt.wantReason {
					t.Errorf("%s: ErrorInfo reason = %q, want %q", name, got, tt.wantReason)
				}
				if strings.Contains(status.Convert(err).Message(), "disk on fire") {
					t.Errorf("%s: message %q leaks the internal error", name, status.Convert(err).Message())
				}
			}
		})
	}
}

func TestServerSemanticLookupAndRejection(t *testing.T) {
	t.Parallel()
	client, clock := startCache(t, NewEmbeddedIndex(10, 0))
	stored, err := client.Store(asTenant("acme"), storeRequest("", protoPrompt("How do I return an iPhone 15 that I bought online?")))
	if err != nil || !stored.GetStored() {
		t.Fatalf("Store = (%v, %v)", stored, err)
	}
	clock.Advance(2 * time.Minute)

	resp, err := client.Lookup(asTenant("acme"), &cachev1.LookupRequest{Prompt: protoPrompt("how can I return an iPhone 15 that I bought online")})
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	if !resp.GetHit() || resp.GetMatch() != cachev1.MatchKind_MATCH_KIND_SEMANTIC || resp.GetSimilarity() >= 1 ||
		resp.GetAge().AsDuration() != 2*time.Minute || resp.GetNamespace() != "lexical-v1" || resp.GetEntry().GetNamespace() != "lexical-v1" ||
		resp.GetQuality().GetCacheSimilarity() != resp.GetSimilarity() {
		t.Errorf("Lookup = %v; want a semantic hit aged 2m in lexical-v1 whose similarity is in the QualityContext", resp)
	}
	assertAuditStep(t, resp.GetQuality(), clock.Now(), "semantic hit")

	// Close, but under the threshold: reported, not served.
	resp, err = client.Lookup(asTenant("acme"), &cachev1.LookupRequest{Prompt: protoPrompt("How do I return an iPhone 15 that I bought in the online shop?")})
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	r := resp.GetRejected()
	if resp.GetHit() || r.GetEntryId() != stored.GetEntryId() || r.GetReason() != "below_threshold" || r.GetDetail() == "" || r.GetSimilarity() < 0.89 {
		t.Errorf("Lookup = %v; want a miss that names the rejected entry and why", resp)
	}
	if !strings.Contains(resp.GetQuality().GetAudit()[0].GetDetail(), "rejected "+stored.GetEntryId()) {
		t.Errorf("audit %q does not mention the rejection", resp.GetQuality().GetAudit()[0].GetDetail())
	}
}

func TestServerModesAndInvalidNamespace(t *testing.T) {
	t.Parallel()
	client, clock := startCache(t, NewEmbeddedIndex(10, 0))
	if _, err := client.Store(asTenant("acme"), storeRequest("", protoPrompt("How do I reset my password?"))); err != nil {
		t.Fatalf("Store: %v", err)
	}
	clock.Advance(2 * time.Hour) // past the 1h TTL, within the 24h staleness
	lookup := func(mode cachev1.LookupMode) (*cachev1.LookupResponse, error) {
		return client.Lookup(asTenant("acme"), &cachev1.LookupRequest{Prompt: protoPrompt("how do i reset my password"), Mode: mode})
	}
	if resp, err := lookup(cachev1.LookupMode_LOOKUP_MODE_UNSPECIFIED); err != nil || resp.GetHit() {
		t.Errorf("normal lookup of a stale entry = (%v, %v), want a miss", resp, err)
	}
	resp, err := lookup(cachev1.LookupMode_LOOKUP_MODE_CACHE_ONLY)
	if err != nil || !resp.GetHit() || !resp.GetStale() || resp.GetApproximate() {
		t.Errorf("cache-only lookup of a stale entry = (%v, %v), want a stale hit", resp, err)
	}
	if resp.GetEntry().GetStaleUntil().AsTime() != epoch.Add(25*time.Hour) {
		t.Errorf("stale_until = %v, want %v", resp.GetEntry().GetStaleUntil().AsTime(), epoch.Add(25*time.Hour))
	}
	_, err = lookup(cachev1.LookupMode(42))
	assertStatus(t, err, codes.InvalidArgument, rpc.ReasonInvalidRequest, []string{"mode"})

	removed, err := client.Invalidate(asTenant("acme"), &cachev1.InvalidateRequest{Namespace: "lexical-v1"})
	if err != nil || removed.GetRemoved() != 1 {
		t.Errorf("Invalidate(namespace) = (%v, %v), want 1 removed", removed, err)
	}
}

func TestServerCoalescing(t *testing.T) {
	t.Parallel()
	client, clock := startCache(t, NewEmbeddedIndex(10, 0))
	lookup := func(ctx context.Context) (*cachev1.LookupResponse, error) {
		return client.Lookup(ctx, &cachev1.LookupRequest{Prompt: protoPrompt("How do I reset my password?"), Coalesce: true})
	}
	first, err := lookup(asTenant("acme"))
	if err != nil || first.GetHit() || first.GetLease().GetId() == "" || !first.GetLease().GetExpiresAt().AsTime().Equal(epoch.Add(30*time.Second)) {
		t.Fatalf("first Lookup = (%v, %v), want a miss with a lease expiring in 30s", first, err)
	}
	type result struct {
		resp *cachev1.LookupResponse
		err  error
	}
	waiter := make(chan result, 1)
	go func() {
		resp, err := lookup(asTenant("acme"))
		waiter <- result{resp, err}
	}()
	// The second lookup waits on a timer of the cache's clock until the answer arrives.
	if err := clock.BlockUntilContext(t.Context(), 1); err != nil {
		t.Fatalf("the second lookup never waited: %v", err)
	}
	clock.Advance(1500 * time.Millisecond) // the first request's model call
	store := storeRequest("", protoPrompt("How do I reset my password?"))
	store.LeaseId = first.GetLease().GetId()
	stored, err := client.Store(asTenant("acme"), store)
	if err != nil || !stored.GetStored() {
		t.Fatalf("Store = (%v, %v)", stored, err)
	}
	got := <-waiter
	if got.err != nil || !got.resp.GetHit() || got.resp.GetMatch() != cachev1.MatchKind_MATCH_KIND_COALESCED || got.resp.GetEntry().GetId() != stored.GetEntryId() {
		t.Errorf("waiting Lookup = (%v, %v), want the stored answer, coalesced", got.resp, got.err)
	}
	if w := got.resp.GetWaited().AsDuration(); w != 1500*time.Millisecond || first.GetWaited() != nil {
		t.Errorf("waited %v (first lookup %v), want 1.5s (and none)", w, first.GetWaited())
	}

	// Release: another tenant cannot; the holder can, once.
	second, err := client.Lookup(asTenant("acme"), &cachev1.LookupRequest{Prompt: protoPrompt("What is your refund policy?"), Coalesce: true})
	if err != nil || second.GetLease() == nil {
		t.Fatalf("Lookup = (%v, %v), want a lease", second, err)
	}
	for _, c := range []struct {
		ctx  context.Context
		want bool
	}{{asTenant("globex"), false}, {asTenant("acme"), true}, {asTenant("acme"), false}} {
		resp, err := client.Release(c.ctx, &cachev1.ReleaseRequest{LeaseId: second.GetLease().GetId()})
		if err != nil || resp.GetReleased() != c.want {
			t.Errorf("Release = (%v, %v), want released %v", resp, err, c.want)
		}
	}
	_, err = client.Release(asTenant("acme"), &cachev1.ReleaseRequest{})
	assertStatus(t, err, codes.InvalidArgument, rpc.ReasonInvalidRequest, []string{"lease_id"})
}

func TestModule(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	var runnable app.Runnable
	conn := serve(t, func(s *grpc.Server) {
		env := app.Env{
			GRPC:    s,
			HTTP:    http.NewServeMux(),
			Log:     slog.New(slog.DiscardHandler),
			Metrics: reg,
			Clock:   clockwork.NewFakeClockAt(epoch),
		}
		m := Module(DefaultConfig())
		if m.Name != "cache" || len(m.Deps) != 0 {
			t.Errorf("Module = %q with deps %v, want cache without deps", m.Name, m.Deps)
		}
		var err error
		if runnable, err = m.New(context.Background(), env); err != nil {
			t.Fatalf("New: %v", err)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runnable.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	client := cachev1.NewCacheServiceClient(conn)

	if _, err := client.Store(asTenant("acme"), storeRequest("", protoPrompt("hello"))); err != nil {
		t.Fatalf("Store: %v", err)
	}
	resp, err := client.Lookup(asTenant("acme"), &cachev1.LookupRequest{Prompt: protoPrompt("hello")})
	if err != nil || !resp.GetHit() {
		t.Fatalf("Lookup = (%v, %v), want a hit", resp, err)
	}
	if got := metricValue(t, reg, "mantle_cache_entries", nil); got != 1 {
		t.Errorf("mantle_cache_entries = %v, want 1", got)
	}
	if got := metricValue(t, reg, "mantle_cache_lookups_total", map[string]string{"result": "hit"}); got != 1 {
		t.Errorf("lookups{result=hit} = %v, want 1", got)
	}
}

func TestModuleRejectsInvalidConfig(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.MaxEntries = 0
	_, err := Module(cfg).New(context.Background(), app.Env{
		GRPC:    grpc.NewServer(),
		Log:     slog.New(slog.DiscardHandler),
		Metrics: prometheus.NewRegistry(),
		Clock:   clockwork.NewFakeClockAt(epoch),
	})
	if err == nil || !strings.Contains(err.Error(), "max_entries") {
		t.Errorf("New error = %v, want one naming max_entries", err)
	}
}
