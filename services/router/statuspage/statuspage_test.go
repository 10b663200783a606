package statuspage

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/agent/v1"
	cachev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/cache/v1"
	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	quotav1 "github.com/mantle-mesh/mantle/pkg/api/mantle/quota/v1"
	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// fakeRoutes is one route over one model with one key in the given breaker state.
type fakeRoutes struct {
	state  mantlev1.BreakerState
	reason string
	events []*eventsv1.DegradationEvent
}

func (f fakeRoutes) Describe(string) (*routerv1.DescribeRoutesResponse, error) {
	key := &routerv1.KeyState{KeyId: "openai-1", BreakerState: f.state, BreakerReason: f.reason,
		LatencyP50: durationpb.New(120 * time.Millisecond), LatencyP95: durationpb.New(900 * time.Millisecond), LatencyP99: durationpb.New(2 * time.Second),
		Calls: 40, Failures: 25}
	level := mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY
	if f.state == mantlev1.BreakerState_BREAKER_STATE_OPEN {
		key.NextProbeAt = timestamppb.New(now.Add(29 * time.Second))
		level = mantlev1.FallbackLevel_FALLBACK_LEVEL_BACKUP_MODEL
	}
	return &routerv1.DescribeRoutesResponse{Routes: []*routerv1.Route{{
		Name: "chat", Scenario: "support", LadderLevel: level, DefaultBudget: durationpb.New(3 * time.Second),
		Candidates: []*routerv1.Candidate{{Model: "gpt-4o", Provider: "openai", Level: mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY, Keys: []*routerv1.KeyState{key}}},
	}}}, nil
}

func (f fakeRoutes) RecentDegradations() []*eventsv1.DegradationEvent { return f.events }

type fakeQuota struct{ err error }

func (f fakeQuota) DescribeUsage(ctx context.Context, _ *quotav1.DescribeUsageRequest, _ ...grpc.CallOption) (*quotav1.DescribeUsageResponse, error) {
	if f.err != nil {
		return nil, f.err
	}
	// Scoped like the quota service: an authenticated caller gets its own tenant only.
	tenants := []string{"acme", "beta"}
	if t := rpc.Tenant(ctx); t != "" {
		tenants = []string{t}
	}
	resp := &quotav1.DescribeUsageResponse{}
	for _, t := range tenants {
		resp.Tenants = append(resp.Tenants, &quotav1.TenantUsage{Tenant: t,
			Requests: &quotav1.BucketLevel{Name: "tenant:" + t + ":rpm", Limit: 600, Remaining: 588},
			Tokens:   &quotav1.BucketLevel{Name: "tenant:" + t + ":tpm", Limit: 200000, Remaining: 150000}})
	}
	return resp, nil
}

type fakeCache struct{ err error }

func (f fakeCache) DescribeStats(context.Context, *cachev1.DescribeStatsRequest, ...grpc.CallOption) (*cachev1.DescribeStatsResponse, error) {
	if f.err != nil {
		return nil, f.err
	}
	return &cachev1.DescribeStatsResponse{Since: timestamppb.New(now.Add(-time.Hour)), Lookups: 8, Hits: 2,
		Scenarios: []*cachev1.ScenarioStats{{Scenario: "support", Lookups: 8, Hits: 2}}}, nil
}

// fakeTools answers ListTools with one healthy query and one action whose breaker is open;
// with hang set it answers only when its context ends, as an agent that accepted the
// connection and never answers.
type fakeTools struct {
	err  error
	hang bool
}

func (f *fakeTools) ListTools(ctx context.Context, req *agentv1.ListToolsRequest, _ ...grpc.CallOption) (*agentv1.ListToolsResponse, error) {
	if f.hang {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if f.err != nil {
		return nil, f.err
	}
	if !req.GetIncludeHealth() {
		return nil, status.Error(codes.InvalidArgument, "the page must ask for health")
	}
	return &agentv1.ListToolsResponse{Tools: []*agentv1.ToolInfo{
		{Name: "lookup", Kind: agentv1.ToolKind_TOOL_KIND_QUERY, Health: &agentv1.ToolHealth{
			Breaker: mantlev1.BreakerState_BREAKER_STATE_CLOSED, Calls: 9, StaleAnswers: 1, RecentOutcomes: []string{"ok", "stale", "cached"}}},
		{Name: "order", Kind: agentv1.ToolKind_TOOL_KIND_ACTION, Health: &agentv1.ToolHealth{
			Breaker: mantlev1.BreakerState_BREAKER_STATE_OPEN, BreakerUntil: timestamppb.New(now.Add(29 * time.Second)), Calls: 4, Failures: 3,
			RecentOutcomes: []string{"ok", "unavailable", "pending_confirmation"}}},
		{Name: "probe", Kind: agentv1.ToolKind_TOOL_KIND_EXTERNAL, Health: &agentv1.ToolHealth{Breaker: mantlev1.BreakerState_BREAKER_STATE_HALF_OPEN}},
	}}, nil
}

func degradation(tenant, reason string) *eventsv1.DegradationEvent {
	return &eventsv1.DegradationEvent{At: timestamppb.New(now.Add(-90 * time.Second)), RequestId: "req-" + tenant, Tenant: tenant,
		Scenario: "support", Route: "chat", Level: mantlev1.FallbackLevel_FALLBACK_LEVEL_BACKUP_MODEL, Reason: reason, AnsweredBy: "claude"}
}

func TestPage(t *testing.T) {
	t.Parallel()
	const key = "sk-acme-secret"
	auth, err := rpc.NewAuthenticator([]rpc.TenantKey{{ID: "acme", KeySHA256: rpc.HashKey(key)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	unavailable := status.Error(codes.Unavailable, "connection error: desc = \"transport: dial tcp 127.0.0.1:1: connect: connection refused\"\nmore detail")
	open := fakeRoutes{state: mantlev1.BreakerState_BREAKER_STATE_OPEN, reason: "error rate 62% over 40 calls (scenario support)",
		events: []*eventsv1.DegradationEvent{degradation("acme", "gpt-4o failed: overloaded"), degradation("beta", "gpt-4o failed: timeout")}}

	tests := []struct {
		name     string
		routes   fakeRoutes
		quota    fakeQuota
		cache    fakeCache
		tools    *fakeTools
		auth     *rpc.Authenticator
		timeout  time.Duration // Deps.CallTimeout; 0 for the default
		url      string
		setup    func(r *http.Request)
		wantCode int
		want     []string // substrings of the body
		notWant  []string
	}{
		{
			name: "open breaker, degradations, cache and quota", routes: open, url: "/status", tools: &fakeTools{},
			wantCode: http.StatusOK,
			want: []string{
				`<meta http-equiv="refresh" content="5">`,
				`data-model="gpt-4o" data-key="openai-1" data-breaker="open"`,
				`error rate 62% over 40 calls (scenario support)`,
				`12:00:29 <span class="muted">(in 29s)</span>`,
				`<span class="badge L1">L1 backup model</span>`,
				`data-request-id="req-acme"`, `data-request-id="req-beta"`, `(1m30s ago)`,
				`id="cache-hit-rate">25.0%`,
				`data-tenant="acme" data-rpm-used="12" data-rpm-limit="600" data-tpm-used="50000" data-tpm-limit="200000"`,
				`all tenants`,
				`data-tool="lookup" data-kind="query" data-breaker="closed" data-calls="9"`,
				`<span class="badge outcome outcome-stale">stale</span>`,
				`data-tool="order" data-kind="action" data-breaker="open" data-calls="4"`,
				`<span class="badge outcome outcome-pending_confirmation">pending_confirmation</span>`,
				`id="open-tool-breakers">1<`,
			},
			notWant: []string{"unavailable:", "tools are off"},
		},
		{
			name: "tools off: said plainly, not as a failure", routes: open, url: "/status", wantCode: http.StatusOK,
			want:    []string{`id="tools-off">tools are off here: router.agent_address is off`, `id="open-tool-breakers">0<`},
			notWant: []string{"unavailable:", `class="tool `},
		},
		{
			name: "closed and half-open breakers have no probe time", routes: fakeRoutes{state: mantlev1.BreakerState_BREAKER_STATE_HALF_OPEN, reason: "open period elapsed"},
			url: "/status", wantCode: http.StatusOK,
			want:    []string{`data-breaker="half_open"`, `<span class="badge L0">L0 primary</span>`, `no degradations recorded`, `class="probe nowrap"><span class="muted">-</span>`},
			notWant: []string{`data-breaker="open"`},
		},
		{
			name: "reasons are escaped", routes: fakeRoutes{state: mantlev1.BreakerState_BREAKER_STATE_OPEN, reason: `<script>alert("x")</script>`,
				events: []*eventsv1.DegradationEvent{degradation("acme", `<img src=x onerror=alert(1)>`)}},
			url: "/status", wantCode: http.StatusOK,
			want:    []string{`&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;`, `&lt;img src=x onerror=alert(1)&gt;`},
			notWant: []string{`<script>`, `<img`},
		},
		{
			name: "dependencies unreachable: their sections say so, the page still renders", routes: open,
			quota: fakeQuota{err: unavailable}, cache: fakeCache{err: status.Error(codes.DeadlineExceeded, "context deadline exceeded")},
			tools: &fakeTools{err: status.Error(codes.PermissionDenied, "no")},
			url:   "/status", wantCode: http.StatusOK,
			want: []string{
				`id="quota-unavailable">quota unavailable: Unavailable: connection error: desc = &#34;transport: dial tcp 127.0.0.1:1: connect: connection refused&#34;</div>`,
				`id="cache-unavailable">cache unavailable: DeadlineExceeded: context deadline exceeded</div>`,
				`cache hit rate <b>n/a</b>`,
				`id="tools-unavailable">tools unavailable: PermissionDenied: no</div>`,
				`data-breaker="open"`,
			},
			notWant: []string{"more detail"},
		},
		{
			name: "an agent that never answers: the tools section says so within the call timeout", routes: open,
			tools: &fakeTools{hang: true}, timeout: 20 * time.Millisecond, url: "/status", wantCode: http.StatusOK,
			want: []string{
				`id="tools-unavailable">tools unavailable: DeadlineExceeded: context deadline exceeded</div>`,
				`data-breaker="open"`, `id="cache-hit-rate">25.0%`,
			},
			notWant: []string{`class="tool `},
		},
		{
			name: "a tool of each kind, no calls yet", routes: open, url: "/status", wantCode: http.StatusOK,
			tools: &fakeTools{},
			want: []string{
				`<td class="mono">lookup</td>
  <td>query</td>
  <td><span class="badge closed">closed</span></td>
  <td class="probe nowrap"><span class="muted">-</span></td>`,
				`<td class="mono">order</td>
  <td>action</td>
  <td><span class="badge open">open</span></td>
  <td class="probe nowrap">12:00:29 <span class="muted">(in 29s)</span></td>`,
				`data-tool="probe" data-kind="external" data-breaker="half_open" data-calls="0"`,
				`<span class="muted">no calls yet</span>`,
				`tools <b>3</b>`,
			},
		},
		{
			name: "auto-refresh can be turned off", routes: open, url: "/status?refresh=0", wantCode: http.StatusOK,
			want: []string{"auto-refresh off"}, notWant: []string{`http-equiv="refresh"`},
		},
		{
			name: "a bad refresh is refused", routes: open, url: "/status?refresh=soon", wantCode: http.StatusBadRequest,
			want: []string{"refresh: want a number of seconds"},
		},
		{
			name: "with keys configured a key is required", routes: open, auth: auth, url: "/status", wantCode: http.StatusUnauthorized,
			want: []string{"missing API key"},
		},
		{
			name: "a wrong key is refused", routes: open, auth: auth, url: "/status", wantCode: http.StatusUnauthorized,
			setup: func(r *http.Request) { r.Header.Set("Authorization", "Bearer sk-wrong") },
			want:  []string{"invalid API key"}, notWant: []string{"sk-wrong"},
		},
		{
			name: "a browser's Basic password: the tenant sees its own quota and degradations only", routes: open, auth: auth, url: "/status", wantCode: http.StatusOK,
			setup:   func(r *http.Request) { r.SetBasicAuth("", key) },
			want:    []string{`tenant <b id="tenant">acme</b>`, `data-request-id="req-acme"`, `data-tenant="acme"`, `data-breaker="open"`},
			notWant: []string{`data-request-id="req-beta"`, `data-tenant="beta"`, key},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			deps := Deps{Routes: tt.routes, Quota: tt.quota, Cache: tt.cache, Auth: tt.auth, Clock: clockwork.NewFakeClockAt(now),
				Log: slog.New(slog.DiscardHandler), Refresh: func() time.Duration { return 5 * time.Second }, CallTimeout: tt.timeout}
			if tt.tools != nil {
				deps.Tools = tt.tools
			}
			h := New(deps)
			mux := http.NewServeMux()
			h.Register(mux)
			req := httptest.NewRequest(http.MethodGet, tt.url, nil)
			if tt.setup != nil {
				tt.setup(req)
			}
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, req)
			body, _ := io.ReadAll(rec.Body)
			if rec.Code != tt.wantCode {
				t.Fatalf("status %d, want %d; body:\n%s", rec.Code, tt.wantCode, body)
			}
			if tt.wantCode == http.StatusUnauthorized && !strings.HasPrefix(rec.Header().Get("WWW-Authenticate"), "Basic ") {
				t.Errorf("WWW-Authenticate = %q, want a Basic challenge so browsers prompt", rec.Header().Get("WWW-Authenticate"))
			}
			for _, w := range tt.want {
				if !strings.Contains(string(body), w) {
					t.Errorf("body lacks %q; body:\n%s", w, body)
				}
			}
			for _, w := range tt.notWant {
				if strings.Contains(string(body), w) {
					t.Errorf("body has %q", w)
				}
			}
		})
	}
}

func TestPageJSON(t *testing.T) {
	t.Parallel()
	h := New(Deps{Routes: fakeRoutes{state: mantlev1.BreakerState_BREAKER_STATE_OPEN, reason: "2 consecutive failures",
		events: []*eventsv1.DegradationEvent{degradation("acme", "gpt-4o failed: overloaded")}},
		Quota: fakeQuota{err: status.Error(codes.Unavailable, "connection refused")}, Cache: fakeCache{}, Tools: &fakeTools{},
		Clock: clockwork.NewFakeClockAt(now), Log: slog.New(slog.DiscardHandler)})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/status?format=json", nil))
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, content type %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	var snap Snapshot
	if err := json.Unmarshal(rec.Body.Bytes(), &snap); err != nil {
		t.Fatal(err)
	}
	key := snap.Routes[0].Candidates[0].Keys[0]
	if key.Breaker != "open" || key.NextProbeAt == nil || !key.NextProbeAt.Equal(now.Add(29*time.Second)) || key.P95Ms != 900 {
		t.Errorf("key = %+v, want open with the next probe at now+29s and p95 900ms", key)
	}
	if snap.Summary.OpenBreakers != 1 || snap.Summary.DegradedRoutes != 1 {
		t.Errorf("summary = %+v, want 1 open breaker and 1 degraded route", snap.Summary)
	}
	if len(snap.Degradations) != 1 || snap.Degradations[0].Level != "L1" || snap.Degradations[0].RequestID != "req-acme" {
		t.Errorf("degradations = %+v", snap.Degradations)
	}
	if snap.Quota.Available || snap.Quota.Error != "Unavailable: connection refused" {
		t.Errorf("quota = %+v, want unavailable with the error", snap.Quota)
	}
	if !snap.Cache.Available || snap.Cache.HitRate != 0.25 {
		t.Errorf("cache = %+v, want available at 25%%", snap.Cache)
	}
	if !snap.Tools.Available || len(snap.Tools.Tools) != 3 || snap.Summary.OpenToolBreakers != 1 {
		t.Fatalf("tools = %+v, open tool breakers %d; want 3 tools, 1 open", snap.Tools, snap.Summary.OpenToolBreakers)
	}
	order, probe := snap.Tools.Tools[1], snap.Tools.Tools[2]
	if order.Name != "order" || order.Kind != "action" || order.Breaker != "open" || order.NextProbeAt == nil || !order.NextProbeAt.Equal(now.Add(29*time.Second)) ||
		order.Failures != 3 || strings.Join(order.Recent, ",") != "ok,unavailable,pending_confirmation" {
		t.Errorf("order = %+v, want an open action with its probe at now+29s, 3 failures and its recent outcomes", order)
	}
	if probe.Kind != "external" || probe.Breaker != "half_open" || probe.Recent == nil {
		t.Errorf("probe = %+v, want a half-open external tool with an empty (not null) list of outcomes", probe)
	}
}
