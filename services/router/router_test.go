package router

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	cachev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/cache/v1"
	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/pkg/events"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

func TestRouterComplete(t *testing.T) {
	t.Parallel()
	type want struct {
		code    codes.Code
		reason  string // ErrorInfo reason on failure
		message string // substring of the status message on failure
		model   string
		level   mantlev1.FallbackLevel
		classes []mantlev1.ErrorClass // attempts, from the settled QualityContext
		calls   map[string]int        // provider calls per model; missing means 0
		settle  *mantlev1.Usage       // nil: Settle is not called
		events  int                   // degradation events published
		stored  int                   // answers stored in the cache
	}
	tests := []struct {
		name    string
		model   string // "" means route chat
		cfg     func(*Config)
		results map[string][]result
		h       func(*harness) // collaborators' behaviour
		ctx     func() (context.Context, context.CancelFunc)
		want    want
		check   func(t *testing.T, h *harness, resp *routerv1.CompleteResponse, err error)
	}{
		{
			name:    "first choice answers",
			results: map[string][]result{"a": {reply("A breaker stops calls.", 10, 5)}},
			want: want{model: "a", level: mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY,
				classes: []mantlev1.ErrorClass{mantlev1.ErrorClass_ERROR_CLASS_NONE}, calls: map[string]int{"a": 1},
				settle: usage(10, 5), stored: 1},
			check: func(t *testing.T, h *harness, resp *routerv1.CompleteResponse, _ error) {
				if got := resp.GetMessage().GetContent(); got != "A breaker stops calls." {
					t.Errorf("content = %q", got)
				}
				req := h.providers["a"].reqs[0]
				if req.Model != "a-upstream" || req.IdempotencyKey != resp.Id {
					t.Errorf("provider request model %q idempotency key %q, want a-upstream and the request id %q", req.Model, req.IdempotencyKey, resp.Id)
				}
				if q := resp.GetQuality(); q.Tenant != defaultTenant || q.Scenario != "support" || q.CostUsd != (10*1+5*2)/1e6 {
					t.Errorf("quality tenant %q scenario %q cost %v, want default, support, 2e-5", q.Tenant, q.Scenario, q.CostUsd)
				}
				if resp.GetRateLimit().GetRemainingRequests() != 9 {
					t.Errorf("rate limit = %v, want quota's limits", resp.GetRateLimit())
				}
			},
		},
		{
			name: "overloaded fails over to the backup model",
			results: map[string][]result{
				"a": {failure(mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, "overloaded")},
				"b": {reply("from b", 3, 4)},
			},
			want: want{model: "b", level: mantlev1.FallbackLevel_FALLBACK_LEVEL_BACKUP_MODEL,
				classes: []mantlev1.ErrorClass{mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, mantlev1.ErrorClass_ERROR_CLASS_NONE},
				calls:   map[string]int{"a": 1, "b": 1}, settle: usage(3, 4), events: 1, stored: 1},
			check: func(t *testing.T, h *harness, resp *routerv1.CompleteResponse, _ error) {
				if resp.GetQuality().GetRetryCount() != 1 {
					t.Errorf("retry count = %d, want 1", resp.GetQuality().GetRetryCount())
				}
				ev := h.events.events[0]
				want := &eventsv1.DegradationEvent{RequestId: resp.Id, Tenant: defaultTenant, Scenario: "support", Route: "chat",
					Level: mantlev1.FallbackLevel_FALLBACK_LEVEL_BACKUP_MODEL, Reason: "a failed: overloaded", AnsweredBy: "b", FailedModels: []string{"a"}}
				if ev.subject != events.SubjectDegradation {
					t.Errorf("subject = %s, want %s", ev.subject, events.SubjectDegradation)
				}
				if diff := cmp.Diff(want, ev.msg, protocmp.Transform(), protocmp.IgnoreFields(&eventsv1.DegradationEvent{}, "at")); diff != "" {
					t.Errorf("degradation event (-want +got):\n%s", diff)
				}
			},
		},
		{
			name:    "bad request is not retried elsewhere",
			results: map[string][]result{"a": {failure(mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST, "max_tokens is too large")}},
			want: want{code: codes.InvalidArgument, reason: ReasonUpstreamRejected, message: "max_tokens is too large",
				classes: []mantlev1.ErrorClass{mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST}, calls: map[string]int{"a": 1}, settle: usage(0, 0)},
		},
		{
			name:    "content filter is not retried and keeps the provider's reason",
			results: map[string][]result{"a": {failure(mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED, "flagged: violence")}},
			want: want{code: codes.FailedPrecondition, reason: ReasonContentFiltered,
				classes: []mantlev1.ErrorClass{mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED}, calls: map[string]int{"a": 1}, settle: usage(0, 0)},
			check: func(t *testing.T, _ *harness, _ *routerv1.CompleteResponse, err error) {
				if msg := status.Convert(toStatus(err)).Message(); msg != "flagged: violence" {
					t.Errorf("message = %q, want the provider's reason", msg)
				}
			},
		},
		{
			name: "malformed output moves to the next candidate and usage is summed",
			results: map[string][]result{
				"a": {reply("{not json", 10, 5)},
				"b": {reply(`{"ok":true}`, 20, 7)},
			},
			h: func(h *harness) {
				h.verifier.verdict = failVerification("{not json", mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT)
			},
			want: want{model: "b", level: mantlev1.FallbackLevel_FALLBACK_LEVEL_BACKUP_MODEL,
				classes: []mantlev1.ErrorClass{mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT, mantlev1.ErrorClass_ERROR_CLASS_NONE},
				calls:   map[string]int{"a": 1, "b": 1}, settle: usage(30, 12), events: 1, stored: 1},
			check: func(t *testing.T, _ *harness, resp *routerv1.CompleteResponse, _ error) {
				if got := resp.GetMessage().GetContent(); got != `{"ok":true}` {
					t.Errorf("content = %q, want b's", got)
				}
				if diff := cmp.Diff(usage(20, 7), resp.GetUsage(), protocmp.Transform()); diff != "" {
					t.Errorf("response usage is the answering attempt's (-want +got):\n%s", diff)
				}
			},
		},
		{
			name:    "verifier unreachable: the answer goes out unverified",
			results: map[string][]result{"a": {reply("hi", 1, 1)}},
			h: func(h *harness) {
				h.verifier.verdict = func(*verifierv1.VerifyRequest) (*verifierv1.VerifyResponse, error) {
					return nil, status.Error(codes.Unavailable, "connection refused")
				}
			},
			want: want{model: "a", level: mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY,
				classes: []mantlev1.ErrorClass{mantlev1.ErrorClass_ERROR_CLASS_NONE}, calls: map[string]int{"a": 1}, settle: usage(1, 1)},
			check: func(t *testing.T, _ *harness, resp *routerv1.CompleteResponse, _ error) {
				q := resp.GetQuality()
				if q.GetVerification() != nil || q.GetQualityGrade() != mantlev1.QualityGrade_QUALITY_GRADE_UNSPECIFIED {
					t.Errorf("verification %v grade %v, want none: the answer was not verified", q.GetVerification(), q.GetQualityGrade())
				}
				if resp.GetMessage().GetContent() != "hi" {
					t.Errorf("content = %q, want hi", resp.GetMessage().GetContent())
				}
			},
		},
		{
			name: "verifier unreachable after a failed verification: no stale verdict",
			results: map[string][]result{
				"a": {reply("{not json", 1, 1)},
				"b": {reply("fine", 1, 1)},
			},
			h: func(h *harness) {
				h.verifier.verdict = func(in *verifierv1.VerifyRequest) (*verifierv1.VerifyResponse, error) {
					if in.Content == "{not json" {
						return failVerification(in.Content, mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT)(in)
					}
					return nil, status.Error(codes.Unavailable, "connection refused")
				}
			},
			want: want{model: "b", level: mantlev1.FallbackLevel_FALLBACK_LEVEL_BACKUP_MODEL,
				classes: []mantlev1.ErrorClass{mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT, mantlev1.ErrorClass_ERROR_CLASS_NONE},
				calls:   map[string]int{"a": 1, "b": 1}, settle: usage(2, 2), events: 1},
			check: func(t *testing.T, _ *harness, resp *routerv1.CompleteResponse, _ error) {
				if v := resp.GetQuality().GetVerification(); v != nil {
					t.Errorf("verification = %v, want none: b's answer was not verified", v)
				}
			},
		},
		{
			name: "quota exhausted passes through with its retry delay",
			h: func(h *harness) {
				h.quota.reserveErr = rpc.ResourceExhausted("quota.mantle", "tenant:default", "tenant default is over its TPM", 7*time.Second)
			},
			want: want{code: codes.ResourceExhausted, reason: rpc.ReasonQuotaExhausted, message: "over its TPM"},
			check: func(t *testing.T, _ *harness, _ *routerv1.CompleteResponse, err error) {
				if d, ok := rpc.RetryDelay(toStatus(err)); !ok || d != 7*time.Second {
					t.Errorf("RetryDelay = %v, %t; want 7s", d, ok)
				}
			},
		},
		{
			name:    "quota unavailable fails open",
			results: map[string][]result{"a": {reply("hi", 1, 1)}},
			h:       func(h *harness) { h.quota.reserveErr = status.Error(codes.Unavailable, "connection refused") },
			want: want{model: "a", level: mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY,
				classes: nil, calls: map[string]int{"a": 1}, stored: 1},
			check: func(t *testing.T, _ *harness, resp *routerv1.CompleteResponse, _ error) {
				if resp.GetRateLimit() != nil {
					t.Errorf("rate limit = %v, want none without a reservation", resp.GetRateLimit())
				}
			},
		},
		{
			name: "quota unavailable fails closed when configured",
			cfg:  func(c *Config) { c.QuotaFailOpen = false },
			h:    func(h *harness) { h.quota.reserveErr = status.Error(codes.Unavailable, "connection refused") },
			want: want{code: codes.Unavailable, message: "connection refused"},
		},
		{
			name: "cache hit skips the provider and settles nothing",
			h: func(h *harness) {
				h.cache.hit = &cachev1.Entry{Id: "e1", Content: "cached answer", SourceModel: "b"}
			},
			want: want{model: "b", level: mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY, settle: usage(0, 0)},
			check: func(t *testing.T, _ *harness, resp *routerv1.CompleteResponse, _ error) {
				q := resp.GetQuality()
				if !q.GetCacheHit() || resp.GetMessage().GetContent() != "cached answer" || len(q.GetAttempts()) != 0 {
					t.Errorf("cache hit %t content %q attempts %d, want a hit with the cached content and no attempts",
						q.GetCacheHit(), resp.GetMessage().GetContent(), len(q.GetAttempts()))
				}
			},
		},
		{
			// a is overloaded: fail over at once, come back to it (with backoff) only when
			// nothing else is left. b's 429 has no hint and b has no other key: move on. c's
			// transient failure is retried on c, max_retries (2) times. Then a again.
			name: "every candidate fails",
			results: map[string][]result{
				"a": {failure(mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, "busy")},
				"b": {failure(mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, "slow down")},
				"c": {failure(mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT, "502")},
			},
			want: want{code: codes.Unavailable, reason: ReasonAllCandidatesFailed, message: "tried a, b, c, c, c, a, a",
				classes: []mantlev1.ErrorClass{mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED,
					mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT, mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT, mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT,
					mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED},
				calls: map[string]int{"a": 3, "b": 1, "c": 3}, settle: usage(0, 0), events: 1},
		},
		{
			name: "deadline already passed",
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
			},
			want: want{code: codes.DeadlineExceeded, reason: ReasonDeadlineExceeded, settle: usage(0, 0), events: 1},
		},
		{
			name: "route budget below the hop reserve", // Validate refuses it; a caller's deadline can be as short
			cfg:  func(c *Config) { c.Routes[0].Budget = c.HopReserve / 2 },
			want: want{code: codes.DeadlineExceeded, reason: ReasonDeadlineExceeded, settle: usage(0, 0), events: 1},
		},
		{
			name: "caller cancelled",
			ctx: func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return ctx, cancel
			},
			// Nobody degraded and no provider is called for a caller that left, so no
			// event is published either.
			want: want{code: codes.Canceled, settle: usage(0, 0), events: 0},
		},
		{
			name:  "unknown route",
			model: "nope",
			want:  want{code: codes.NotFound, reason: ReasonUnknownRoute, message: `"nope"`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig()
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			h := &harness{providers: map[string]*fakeProvider{}}
			for model, rs := range tt.results {
				h.providers[model] = newFakeProvider(rs...)
			}
			h.quota, h.cache, h.verifier = &fakeQuota{}, &fakeCache{}, &fakeVerifier{}
			if tt.h != nil {
				tt.h(h)
			}
			h = newHarness(t, cfg, h)
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if tt.ctx != nil {
				ctx, cancel = tt.ctx()
			}
			defer cancel()
			model := tt.model
			if model == "" {
				model = "chat"
			}

			resp, err := h.router.Complete(ctx, ask(model))

			st := status.Convert(toStatus(err))
			if st.Code() != tt.want.code {
				t.Fatalf("code = %v (%v), want %v", st.Code(), err, tt.want.code)
			}
			if err != nil {
				if got := rpc.ErrorInfo(toStatus(err)).GetReason(); got != tt.want.reason {
					t.Errorf("reason = %q, want %q", got, tt.want.reason)
				}
				if !strings.Contains(st.Message(), tt.want.message) {
					t.Errorf("message = %q, want it to contain %q", st.Message(), tt.want.message)
				}
			} else if resp.GetModel() != tt.want.model || resp.GetQuality().GetFallbackLevel() != tt.want.level {
				t.Errorf("answered by %s at %v, want %s at %v", resp.GetModel(), resp.GetQuality().GetFallbackLevel(), tt.want.model, tt.want.level)
			}
			for model, p := range h.providers {
				if p.calls() != tt.want.calls[model] {
					t.Errorf("provider %s called %d times, want %d", model, p.calls(), tt.want.calls[model])
				}
			}
			if tt.want.settle == nil {
				if len(h.quota.settles) != 0 {
					t.Errorf("Settle called %d times, want none", len(h.quota.settles))
				}
			} else if len(h.quota.settles) != 1 {
				t.Errorf("Settle called %d times, want once", len(h.quota.settles))
			} else {
				s := h.quota.settles[0]
				if s.ReservationId != "res-1" {
					t.Errorf("settled reservation %q, want res-1", s.ReservationId)
				}
				if diff := cmp.Diff(tt.want.settle, s.Usage, protocmp.Transform()); diff != "" {
					t.Errorf("settled usage (-want +got):\n%s", diff)
				}
				qc := resp.GetQuality()
				if err != nil {
					// A failed request's QualityContext travels in its status details.
					qc = FailedQuality(status.Convert(toStatus(err)).Err())
				}
				var classes []mantlev1.ErrorClass
				for _, a := range qc.GetAttempts() {
					classes = append(classes, a.ErrorClass)
				}
				if diff := cmp.Diff(tt.want.classes, classes); diff != "" {
					t.Errorf("attempt classes (-want +got):\n%s", diff)
				}
			}
			if len(h.events.events) != tt.want.events {
				t.Errorf("%d degradation events, want %d", len(h.events.events), tt.want.events)
			}
			if len(h.cache.stores) != tt.want.stored {
				t.Errorf("%d cache stores, want %d", len(h.cache.stores), tt.want.stored)
			}
			if tt.check != nil {
				tt.check(t, h, resp, err)
			}
		})
	}
}

func TestDescribeCountsCalls(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(), &harness{providers: map[string]*fakeProvider{
		"a": newFakeProvider(failure(mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, "busy")),
	}})
	if _, err := h.router.Complete(context.Background(), ask("chat")); err != nil {
		t.Fatal(err)
	}
	resp, err := h.router.Describe("chat")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Routes) != 1 || len(resp.Routes[0].Candidates) != 3 {
		t.Fatalf("Describe(chat) = %v, want one route with three candidates", resp)
	}
	var got [][2]int64
	for _, c := range resp.Routes[0].Candidates {
		k := c.Keys[0]
		got = append(got, [2]int64{k.Calls, k.Failures})
	}
	if diff := cmp.Diff([][2]int64{{1, 1}, {1, 0}, {0, 0}}, got); diff != "" {
		t.Errorf("calls and failures per candidate (-want +got):\n%s", diff)
	}
	levels := []mantlev1.FallbackLevel{resp.Routes[0].Candidates[0].Level, resp.Routes[0].Candidates[1].Level}
	if levels[0] != mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY || levels[1] != mantlev1.FallbackLevel_FALLBACK_LEVEL_BACKUP_MODEL {
		t.Errorf("candidate levels = %v, want primary then backup", levels)
	}
	if _, err := h.router.Describe("nope"); status.Code(err) != codes.NotFound {
		t.Errorf("Describe(nope) = %v, want NotFound", err)
	}
	all, _ := h.router.Describe("")
	var names []string
	for _, r := range all.Routes {
		names = append(names, r.Name)
	}
	if diff := cmp.Diff([]string{"a", "b", "c", "chat"}, names); diff != "" {
		t.Errorf("Describe(\"\") routes (-want +got):\n%s", diff)
	}
}
