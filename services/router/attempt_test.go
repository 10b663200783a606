package router

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	cachev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/cache/v1"
	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/events"
)

// Classes used in the tables below.
const (
	classRateLimited = mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED
	classOverloaded  = mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED
	classTransient   = mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT
	classTimeout     = mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT
	classAuth        = mantlev1.ErrorClass_ERROR_CLASS_AUTH
	classHidden      = mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR
	classUnknown     = mantlev1.ErrorClass_ERROR_CLASS_UNKNOWN
	classContext     = mantlev1.ErrorClass_ERROR_CLASS_CONTEXT_LENGTH_EXCEEDED
	classMalformed   = mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT
	classRefusal     = mantlev1.ErrorClass_ERROR_CLASS_REFUSAL
	classVerify      = mantlev1.ErrorClass_ERROR_CLASS_VERIFICATION_FAILED
	classBadRequest  = mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST
	classFiltered    = mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED
)

const (
	levelPrimary  = mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY
	levelBackup   = mantlev1.FallbackLevel_FALLBACK_LEVEL_BACKUP_MODEL
	levelCached   = mantlev1.FallbackLevel_FALLBACK_LEVEL_CACHED_APPROXIMATE
	levelTemplate = mantlev1.FallbackLevel_FALLBACK_LEVEL_TEMPLATE
)

// twoKeys gives provider p the keys k1 and k2.
func twoKeys(c *Config) {
	c.Providers[0].Keys = []KeyConfig{{ID: "k1", Env: "K1"}, {ID: "k2", Env: "K2"}}
}

// noRetryBudget refuses every retry and failover (hedges have their own budget).
func noRetryBudget(c *Config) {
	c.RetryBudget = BudgetConfig{Ratio: 0, Floor: 0, Window: time.Minute, FormatOnlyAbove: 0.15}
}

// TestAttemptDecisions checks every decision the attempt loop makes from the class of the
// last failure, the retry budget and the ladder below the route's models. The clock is fake:
// a test that expects a wait drives it (drive), and one that expects none finishes without
// any Advance (a wait would hang it, and await fails it).
func TestAttemptDecisions(t *testing.T) {
	t.Parallel()
	type want struct {
		code     codes.Code // codes.OK: an answer
		message  string     // substring of the status message on failure
		model    string
		level    mantlev1.FallbackLevel
		attempts []string       // model:class of each attempt
		keys     []string       // key of each attempt, when it matters
		calls    map[string]int // provider calls per provider name; missing means 0
	}
	tests := []struct {
		name    string
		cfg     func(*Config)
		results map[string][]result // by provider name: "model" or "model/key"
		h       func(*harness)      // before the router is built
		ready   func(*harness)      // after
		ctx     func() (context.Context, context.CancelFunc)
		drive   func(t *testing.T, h *harness)
		want    want
		check   func(t *testing.T, h *harness, d done)
	}{
		{
			name: "transient: the same model after full-jitter backoff on the clock",
			results: map[string][]result{"a": {
				failure(classTransient, "502"), failure(classTransient, "502"), reply("third time", 1, 1),
			}},
			h: func(h *harness) { h.rand = func() float64 { return 0.5 } },
			drive: func(t *testing.T, h *harness) {
				// Retry 1 waits half of base (300ms), retry 2 half of 2*base: full jitter over
				// an exponentially growing, capped window.
				for i, wait := range []time.Duration{150 * time.Millisecond, 300 * time.Millisecond} {
					h.blockUntil(t, 1)
					h.clock.Advance(wait - time.Millisecond)
					if got := h.calls("a"); got != i+1 {
						t.Fatalf("retry %d went after %s, before its backoff of %s (calls %d)", i+1, wait-time.Millisecond, wait, got)
					}
					h.clock.Advance(time.Millisecond)
				}
			},
			want: want{model: "a", level: levelPrimary,
				attempts: []string{"a:transient", "a:transient", "a:none"}, calls: map[string]int{"a": 3}},
		},
		{
			name: "hidden error and unknown failure are retried on the same model",
			results: map[string][]result{"a": {
				failure(classHidden, "error in a 200"), failure(classUnknown, "?"), reply("ok", 1, 1),
			}},
			want: want{model: "a", level: levelPrimary,
				attempts: []string{"a:hidden_error", "a:unknown", "a:none"}, calls: map[string]int{"a": 3}},
		},
		{
			name: "retries stop at max_retries, then the next candidate",
			cfg:  func(c *Config) { c.Retry.MaxRetries = 1 },
			results: map[string][]result{
				"a": {failure(classTransient, "502")},
				"b": {reply("from b", 1, 1)},
			},
			want: want{model: "b", level: levelBackup,
				attempts: []string{"a:transient", "a:transient", "b:none"}, calls: map[string]int{"a": 2, "b": 1}},
		},
		{
			name: "overloaded fails over at once, without a backoff",
			results: map[string][]result{
				"a": {failure(classOverloaded, "busy")},
				"b": {reply("from b", 1, 1)},
			},
			h: func(h *harness) { h.rand = func() float64 { return 0.9 } }, // any backoff would wait
			want: want{model: "b", level: levelBackup,
				attempts: []string{"a:overloaded", "b:none"}, calls: map[string]int{"a": 1, "b": 1}},
		},
		{
			name: "overloaded candidate is tried again only when nothing else is left",
			cfg:  func(c *Config) { c.Routes[0].Candidates = []string{"a", "b"} },
			results: map[string][]result{
				"a": {failure(classOverloaded, "busy"), reply("a recovered", 1, 1)},
				"b": {failure(classTransient, "502")},
			},
			want: want{model: "a", level: levelPrimary,
				attempts: []string{"a:overloaded", "b:transient", "b:transient", "b:transient", "a:none"},
				calls:    map[string]int{"a": 2, "b": 3}},
		},
		{
			name: "429 with another key: rotate at once, cool the first key, spare its breaker",
			cfg: func(c *Config) {
				twoKeys(c)
				c.Breaker.ConsecutiveFailures = 1 // a 429 counted as a failure would trip it
			},
			results: map[string][]result{
				"a/k1": {rateLimited(3 * time.Second)},
				"a/k2": {reply("from k2", 1, 1)},
			},
			want: want{model: "a", level: levelPrimary,
				attempts: []string{"a:rate_limited", "a:none"}, keys: []string{"k1", "k2"},
				calls: map[string]int{"a/k1": 1, "a/k2": 1}},
			check: func(t *testing.T, h *harness, _ done) {
				k1 := describeKey(t, h, "chat", "a", "k1")
				if got, want := k1.GetCooldownUntil().AsTime(), h.clock.Now().Add(3*time.Second); !got.Equal(want) {
					t.Errorf("k1 cooldown_until = %v, want now + 3s (%v)", got, want)
				}
				if k1.BreakerState != mantlev1.BreakerState_BREAKER_STATE_CLOSED {
					t.Errorf("k1 breaker = %v, want closed: a 429 is not a breaker failure", k1.BreakerState)
				}
				if k2 := describeKey(t, h, "chat", "a", "k2"); k2.CooldownUntil != nil {
					t.Errorf("k2 cooldown_until = %v, want none", k2.CooldownUntil)
				}
				// While k1 cools down, the next request does not call it at all.
				if _, err := h.router.Complete(context.Background(), ask("chat")); err != nil {
					t.Fatal(err)
				}
				if got := h.calls("a/k1"); got != 1 {
					t.Errorf("k1 called %d times, want 1: it cools down", got)
				}
			},
		},
		{
			name:    "429 whose Retry-After fits: wait for it on the clock, then the same key",
			results: map[string][]result{"a": {rateLimited(2 * time.Second), reply("after the wait", 1, 1)}},
			drive: func(t *testing.T, h *harness) {
				h.blockUntil(t, 1)
				h.clock.Advance(2*time.Second - time.Millisecond)
				if got := h.calls("a"); got != 1 {
					t.Fatalf("a called %d times before its Retry-After passed, want 1", got)
				}
				h.clock.Advance(time.Millisecond)
			},
			want: want{model: "a", level: levelPrimary,
				attempts: []string{"a:rate_limited", "a:none"}, calls: map[string]int{"a": 2}},
		},
		{
			name: "429 whose Retry-After is over max_retry_after: fail over at once",
			results: map[string][]result{
				"a": {rateLimited(10 * time.Second)},
				"b": {reply("from b", 1, 1)},
			},
			want: want{model: "b", level: levelBackup,
				attempts: []string{"a:rate_limited", "b:none"}, calls: map[string]int{"a": 1, "b": 1}},
			check: func(t *testing.T, h *harness, _ done) {
				k := describeKey(t, h, "chat", "a", "sim")
				if got, want := k.GetCooldownUntil().AsTime(), h.clock.Now().Add(10*time.Second); !got.Equal(want) {
					t.Errorf("cooldown_until = %v, want the hint (%v)", got, want)
				}
			},
		},
		{
			name: "429 whose Retry-After does not fit in the deadline budget: fail over at once",
			cfg:  func(c *Config) { c.Routes[0].Budget = time.Second },
			results: map[string][]result{
				"a": {rateLimited(2 * time.Second)},
				"b": {reply("from b", 1, 1)},
			},
			want: want{model: "b", level: levelBackup,
				attempts: []string{"a:rate_limited", "b:none"}, calls: map[string]int{"a": 1, "b": 1}},
		},
		{
			name: "429 without a hint and no other key: fail over at once",
			results: map[string][]result{
				"a": {rateLimited(0)},
				"b": {reply("from b", 1, 1)},
			},
			want: want{model: "b", level: levelBackup,
				attempts: []string{"a:rate_limited", "b:none"}, calls: map[string]int{"a": 1, "b": 1}},
		},
		{
			name: "timeout: the silent key is not asked again in this request",
			cfg:  twoKeys,
			results: map[string][]result{
				"a/k1": {failure(classTimeout, "deadline")},
				"a/k2": {failure(classTimeout, "deadline")},
				"b":    {reply("from b", 1, 1)},
			},
			want: want{model: "b", level: levelBackup,
				attempts: []string{"a:timeout", "a:timeout", "b:none"}, keys: []string{"k1", "k2", "k1"},
				calls: map[string]int{"a/k1": 1, "a/k2": 1, "b": 1}},
		},
		{
			name: "a provider that never answers costs its per-try timeout, not the budget",
			cfg:  func(c *Config) { c.Providers[0].Timeout = 50 * time.Millisecond }, // real time: contexts
			results: map[string][]result{
				"a": {hang()},
				"b": {reply("from b", 1, 1)},
			},
			want: want{model: "b", level: levelBackup,
				attempts: []string{"a:timeout", "b:none"}, calls: map[string]int{"a": 1, "b": 1}},
		},
		{
			name: "auth failure: another key of the same model",
			cfg:  twoKeys,
			results: map[string][]result{
				"a/k1": {failure(classAuth, "invalid key")},
				"a/k2": {reply("from k2", 1, 1)},
			},
			want: want{model: "a", level: levelPrimary,
				attempts: []string{"a:auth", "a:none"}, keys: []string{"k1", "k2"}, calls: map[string]int{"a/k1": 1, "a/k2": 1}},
		},
		{
			name: "context length exceeded: only a larger context window",
			cfg: func(c *Config) {
				c.Models[0].ContextWindow, c.Models[1].ContextWindow, c.Models[2].ContextWindow = 8000, 4000, 32000
			},
			results: map[string][]result{"a": {failure(classContext, "maximum context length")}},
			want: want{model: "c", level: levelBackup,
				attempts: []string{"a:context_length_exceeded", "c:none"}, calls: map[string]int{"a": 1, "c": 1}},
		},
		{
			name: "context length exceeded with no larger window: no other model is tried",
			cfg: func(c *Config) {
				c.Models[0].ContextWindow, c.Models[1].ContextWindow, c.Models[2].ContextWindow = 8000, 4000, 8000
			},
			results: map[string][]result{"a": {failure(classContext, "maximum context length")}},
			want: want{code: codes.Unavailable, message: "context length exceeded",
				attempts: []string{"a:context_length_exceeded"}, calls: map[string]int{"a": 1}},
		},
		{
			name: "malformed output: the most format-stable candidate next",
			cfg: func(c *Config) {
				c.Models[1].FormatStability, c.Models[2].FormatStability = 0.5, 0.9
			},
			results: map[string][]result{"a": {failure(classMalformed, "not JSON")}},
			want: want{model: "c", level: levelBackup,
				attempts: []string{"a:malformed_output", "c:none"}, calls: map[string]int{"a": 1, "c": 1}},
		},
		{
			name: "refusal: the most format-stable candidate next",
			cfg: func(c *Config) {
				c.Models[1].FormatStability, c.Models[2].FormatStability = 0.95, 0.9
			},
			results: map[string][]result{"a": {failure(classRefusal, "I can't help")}},
			want: want{model: "b", level: levelBackup,
				attempts: []string{"a:refusal", "b:none"}, calls: map[string]int{"a": 1, "b": 1}},
		},
		{
			name: "failed business check: the freshest candidate next",
			cfg: func(c *Config) {
				c.Models[1].Freshness, c.Models[2].Freshness = 1, 3
				c.Models[1].FormatStability = 1 // format stability does not matter here
			},
			results: map[string][]result{"a": {reply("stale price", 1, 1)}},
			h: func(h *harness) {
				h.verifier.verdict = failVerification("stale price", classVerify)
			},
			want: want{model: "c", level: levelBackup,
				attempts: []string{"a:verification_failed", "c:none"}, calls: map[string]int{"a": 1, "c": 1}},
		},
		{
			name:    "bad request: no other attempt",
			results: map[string][]result{"a": {failure(classBadRequest, "temperature must be <= 2")}},
			want: want{code: codes.InvalidArgument, message: "temperature must be <= 2",
				attempts: []string{"a:bad_request"}, calls: map[string]int{"a": 1}},
		},
		{
			name:    "content filter: no other attempt, the provider's reason goes to the caller",
			results: map[string][]result{"a": {failure(classFiltered, "flagged: self-harm")}},
			want: want{code: codes.FailedPrecondition, message: "flagged: self-harm",
				attempts: []string{"a:content_filtered"}, calls: map[string]int{"a": 1}},
		},
		{
			name: "retry budget spent: no retry, L2 answers with the closest cached answer",
			cfg: func(c *Config) {
				noRetryBudget(c)
				c.Routes[0].Ladder = LadderConfig{Cache: true, Template: "later"}
			},
			results: map[string][]result{"a": {failure(classTransient, "502")}},
			h: func(h *harness) {
				h.cache.hit, h.cache.approximateOnly = &cachev1.Entry{Id: "e1", Content: "a related answer", SourceModel: "b"}, true
			},
			want: want{model: "b", level: levelCached, attempts: []string{"a:transient"}, calls: map[string]int{"a": 1}},
			check: func(t *testing.T, h *harness, d done) {
				q := d.resp.GetQuality()
				if d.resp.GetMessage().GetContent() != "a related answer" || !q.CacheHit || q.UserNotice == "" {
					t.Errorf("content %q cache hit %t notice %q, want the related answer, marked, with a notice",
						d.resp.GetMessage().GetContent(), q.CacheHit, q.UserNotice)
				}
				if !strings.Contains(q.DegradationReason, "retry budget exhausted") {
					t.Errorf("degradation reason = %q, want the retry budget named", q.DegradationReason)
				}
				if got := counterValue(t, h.router.deps.Metrics.budgetDenied); got != 1 {
					t.Errorf("budget rejections = %v, want 1", got)
				}
				wantDegradation(t, h, levelCached, "b")
				if n := len(h.events.on(events.SubjectReview)); n != 0 {
					t.Errorf("%d review events, want none: L2 answered", n)
				}
			},
		},
		{
			name: "retry budget spent, no L2: L3 template with a notice and a review event",
			cfg: func(c *Config) {
				noRetryBudget(c)
				c.Routes[0].Ladder = LadderConfig{Template: "We will get back to you.", Notice: "Answers are delayed."}
			},
			results: map[string][]result{"a": {failure(classTransient, "502")}},
			want:    want{model: templateModel, level: levelTemplate, attempts: []string{"a:transient"}, calls: map[string]int{"a": 1}},
			check: func(t *testing.T, h *harness, d done) {
				q := d.resp.GetQuality()
				if d.resp.GetMessage().GetContent() != "We will get back to you." || q.UserNotice != "Answers are delayed." {
					t.Errorf("content %q notice %q, want the template and the route's notice", d.resp.GetMessage().GetContent(), q.UserNotice)
				}
				reviews := h.events.on(events.SubjectReview)
				if len(reviews) != 1 {
					t.Fatalf("%d review events, want 1", len(reviews))
				}
				if ev := reviews[0].(*eventsv1.ReviewRequestEvent); ev.RequestId != d.resp.Id || !strings.Contains(ev.Reason, "retry budget exhausted") {
					t.Errorf("review event for %q with reason %q, want this request and the retry budget named", ev.RequestId, ev.Reason)
				}
				wantDegradation(t, h, levelTemplate, templateModel)
			},
		},
		{
			name:    "retry budget spent, no ladder: an unavailable error, not a deadline",
			cfg:     noRetryBudget,
			results: map[string][]result{"a": {failure(classTransient, "502")}},
			want: want{code: codes.Unavailable, message: "retry budget exhausted (tried a)",
				attempts: []string{"a:transient"}, calls: map[string]int{"a": 1}},
		},
		{
			name:    "the shared retry budget (quota) refuses: no retry, across replicas",
			results: map[string][]result{"a": {failure(classTransient, "502")}},
			h:       func(h *harness) { h.quota.refuseRetries = true },
			want: want{code: codes.Unavailable, message: "retry budget exhausted",
				attempts: []string{"a:transient"}, calls: map[string]int{"a": 1}},
			check: func(t *testing.T, h *harness, _ done) {
				asked := h.quota.retryRequests()
				if len(asked) != 1 || asked[0].UpstreamKeyId != "sim" || asked[0].FormatRetry {
					t.Errorf("AcquireRetry requests %v, want one for key sim, not a format retry", asked)
				}
			},
		},
		{
			name:    "the shared retry budget is unreachable: the local budget decides",
			results: map[string][]result{"a": {failure(classTransient, "502"), reply("second try", 1, 1)}},
			h:       func(h *harness) { h.quota.retryErr = status.Error(codes.Unavailable, "quota down") },
			want: want{model: "a", level: levelPrimary,
				attempts: []string{"a:transient", "a:none"}, calls: map[string]int{"a": 2}},
			check: func(t *testing.T, h *harness, _ done) {
				if asked := h.quota.retryRequests(); len(asked) != 1 || asked[0].FormatRetry {
					t.Errorf("AcquireRetry requests %v, want one, not a format retry", asked)
				}
			},
		},
		{
			name: "a failover to a healthy model needs no retry budget, here or shared",
			cfg: func(c *Config) {
				c.RetryBudget = BudgetConfig{Ratio: 1, Floor: 1, Window: time.Minute, FormatOnlyAbove: 0.15}
			},
			ready:   spendOverallBudget,
			results: map[string][]result{"a": {failure(classOverloaded, "busy")}},
			h:       func(h *harness) { h.quota.refuseRetries = true },
			want: want{model: "b", level: levelBackup,
				attempts: []string{"a:overloaded", "b:none"}, calls: map[string]int{"a": 1, "b": 1}},
			check: func(t *testing.T, h *harness, _ done) {
				if asked := h.quota.retryRequests(); len(asked) != 0 {
					t.Errorf("AcquireRetry requests %v, want none for a failover to a closed breaker", asked)
				}
			},
		},
		{
			name: "retry rate over format_only_above: a format retry still goes",
			cfg: func(c *Config) {
				c.RetryBudget = BudgetConfig{Ratio: 1, Floor: 1, Window: time.Minute, FormatOnlyAbove: 0.15}
			},
			ready:   spendOverallBudget,
			results: map[string][]result{"a": {failure(classMalformed, "not JSON")}},
			want: want{model: "b", level: levelBackup,
				attempts: []string{"a:malformed_output", "b:none"}, calls: map[string]int{"a": 1, "b": 1}},
		},
		{
			name: "retry rate over format_only_above: any other retry is refused",
			cfg: func(c *Config) {
				c.RetryBudget = BudgetConfig{Ratio: 1, Floor: 1, Window: time.Minute, FormatOnlyAbove: 0.15}
			},
			ready:   spendOverallBudget,
			results: map[string][]result{"a": {failure(classTransient, "502")}},
			want: want{code: codes.Unavailable, message: "retry budget exhausted",
				attempts: []string{"a:transient"}, calls: map[string]int{"a": 1}},
		},
		{
			name: "every candidate failed: L1 smaller model",
			cfg: func(c *Config) {
				c.Routes[0].Candidates = []string{"a", "b"}
				c.Routes[0].Ladder.Smaller = []string{"c"}
			},
			results: map[string][]result{
				"a": {failure(classMalformed, "x")},
				"b": {failure(classMalformed, "x")},
				"c": {reply("small but fine", 1, 1)},
			},
			want: want{model: "c", level: levelBackup,
				attempts: []string{"a:malformed_output", "b:malformed_output", "c:none"}, calls: map[string]int{"a": 1, "b": 1, "c": 1}},
		},
		{
			name: "deadline too short to try: L3 template",
			cfg:  func(c *Config) { c.Routes[0].Ladder.Template = "later" },
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 100*time.Millisecond) // under hop_reserve
			},
			want: want{model: templateModel, level: levelTemplate},
			check: func(t *testing.T, h *harness, d done) {
				if r := d.resp.GetQuality().GetDegradationReason(); !strings.Contains(r, "deadline budget ran out") {
					t.Errorf("degradation reason = %q, want the deadline named", r)
				}
			},
		},
		{
			name: "forced cache level: L2 without calling a provider",
			cfg: func(c *Config) {
				c.Routes[0].Ladder = LadderConfig{Cache: true, ForceLevel: ForceCache, Template: "later"}
			},
			h: func(h *harness) {
				h.cache.hit, h.cache.approximateOnly = &cachev1.Entry{Id: "e1", Content: "a related answer", SourceModel: "b"}, true
			},
			want: want{model: "b", level: levelCached},
			check: func(t *testing.T, h *harness, d done) {
				if r := d.resp.GetQuality().GetDegradationReason(); r != "route forced to the cache level" {
					t.Errorf("degradation reason = %q, want the forced level named", r)
				}
			},
		},
		{
			name: "forced template level: L3 without calling a provider",
			cfg: func(c *Config) {
				c.Routes[0].Ladder = LadderConfig{Cache: true, ForceLevel: ForceTemplate, Template: "later"}
			},
			h: func(h *harness) {
				h.cache.hit, h.cache.approximateOnly = &cachev1.Entry{Id: "e1", Content: "a related answer", SourceModel: "b"}, true
			},
			want: want{model: templateModel, level: levelTemplate},
			check: func(t *testing.T, h *harness, _ done) {
				if n := len(h.events.on(events.SubjectReview)); n != 1 {
					t.Errorf("%d review events, want 1", n)
				}
			},
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
			for name, rs := range tt.results {
				h.providers[name] = newFakeProvider(rs...)
			}
			h.quota, h.cache, h.verifier = &fakeQuota{}, &fakeCache{}, &fakeVerifier{}
			if tt.h != nil {
				tt.h(h)
			}
			h = newHarness(t, cfg, h)
			if tt.ready != nil {
				tt.ready(h)
			}
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if tt.ctx != nil {
				ctx, cancel = tt.ctx()
			}
			defer cancel()

			ch := h.start(ctx, ask("chat"))
			if tt.drive != nil {
				tt.drive(t, h)
			}
			d := await(t, ch)

			st := status.Convert(toStatus(d.err))
			if st.Code() != tt.want.code {
				t.Fatalf("code = %v (%v), want %v", st.Code(), d.err, tt.want.code)
			}
			var qc *mantlev1.QualityContext
			if d.err != nil {
				if !strings.Contains(st.Message(), tt.want.message) {
					t.Errorf("message = %q, want it to contain %q", st.Message(), tt.want.message)
				}
				qc = FailedQuality(d.err)
			} else {
				qc = d.resp.GetQuality()
				if d.resp.GetModel() != tt.want.model || qc.GetFallbackLevel() != tt.want.level {
					t.Errorf("answered by %s at %v, want %s at %v", d.resp.GetModel(), qc.GetFallbackLevel(), tt.want.model, tt.want.level)
				}
			}
			if diff := cmp.Diff(tt.want.attempts, attemptsOf(qc)); diff != "" {
				t.Errorf("attempts (-want +got):\n%s", diff)
			}
			if tt.want.keys != nil {
				var keys []string
				for _, a := range qc.GetAttempts() {
					keys = append(keys, a.KeyId)
				}
				if diff := cmp.Diff(tt.want.keys, keys); diff != "" {
					t.Errorf("attempt keys (-want +got):\n%s", diff)
				}
			}
			for name, p := range h.providers {
				if p.calls() != tt.want.calls[name] {
					t.Errorf("provider %s called %d times, want %d", name, p.calls(), tt.want.calls[name])
				}
			}
			if tt.check != nil {
				tt.check(t, h, d)
			}
		})
	}
}

// spendOverallBudget puts the router's overall retry budget at its floor with a retry rate
// of 100%, so only format retries may go (above 15%, stop all but format retries).
func spendOverallBudget(h *harness) {
	h.router.budget.Request()
	if !h.router.budget.TryRetry(false) {
		panic("the budget refused the retry that sets up the test")
	}
}

// describeKey returns the live state of one key of one candidate of a route.
func describeKey(t *testing.T, h *harness, route, model, key string) *routerv1.KeyState {
	t.Helper()
	resp, err := h.router.Describe(route)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range resp.GetRoutes()[0].GetCandidates() {
		if c.Model != model {
			continue
		}
		for _, k := range c.Keys {
			if k.KeyId == key {
				return k
			}
		}
	}
	t.Fatalf("route %s has no key %s/%s", route, model, key)
	return nil
}

// wantDegradation checks that exactly one degradation event was published, at level and
// answered by answeredBy.
func wantDegradation(t *testing.T, h *harness, level mantlev1.FallbackLevel, answeredBy string) {
	t.Helper()
	evs := h.events.on(events.SubjectDegradation)
	if len(evs) != 1 {
		t.Fatalf("%d degradation events, want 1", len(evs))
	}
	ev := evs[0].(*eventsv1.DegradationEvent)
	if ev.Level != level || ev.AnsweredBy != answeredBy {
		t.Errorf("degradation event level %v answered by %q, want %v and %q", ev.Level, ev.AnsweredBy, level, answeredBy)
	}
}

// TestStepTimesMatchTheWellKnownTypes: an audit step's time and duration, set in place
// in the step's own allocation, are the messages timestamppb.New and durationpb.New make.
func TestStepTimesMatchTheWellKnownTypes(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		at time.Time
		d  time.Duration
	}{
		{time.Date(2026, 12, 4, 17, 0, 0, 123456789, time.UTC), 1500 * time.Millisecond},
		{time.Unix(0, 0), 0},
		{time.Date(1969, 12, 31, 23, 59, 59, 999999999, time.UTC), -1500 * time.Millisecond},
		{time.Date(2026, 1, 1, 0, 0, 0, 1, time.FixedZone("x", 3600)), -time.Nanosecond},
		{time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC), time.Duration(math.MaxInt64)},
		{time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), time.Duration(math.MinInt64)},
	} {
		r := &Router{deps: Deps{Clock: clockwork.NewFakeClockAt(tt.at)}}
		s := r.step("admit", "detail", tt.d)
		want := &mantlev1.AuditStep{At: timestamppb.New(tt.at), Service: "router", Step: "admit", Detail: "detail", Duration: durationpb.New(tt.d)}
		if !proto.Equal(s, want) {
			t.Errorf("step at %v for %v = %v, want %v", tt.at, tt.d, s, want)
		}
	}
}
