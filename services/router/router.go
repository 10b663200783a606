package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
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
	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/pkg/app"
	"github.com/mantle-mesh/mantle/pkg/events"
	"github.com/mantle-mesh/mantle/pkg/formatcheck"
	"github.com/mantle-mesh/mantle/pkg/pbtime"
	"github.com/mantle-mesh/mantle/pkg/procusage"
	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/pkg/resilience"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/router/internal/overload"
)

// defaultTenant names callers when authentication is disabled.
const defaultTenant = "default"

// upstream is one model reachable through one provider with one or more keys.
type upstream struct {
	model    ModelConfig
	provider string
	timeout  time.Duration
	keys     []*upstreamKey
	next     atomic.Uint32 // round-robin position over keys
	bulkhead *resilience.Bulkhead
}

// upstreamKey is one API key of an upstream, with its own health: a breaker per scenario
// (the unit the design names is provider x model x key x scenario), a 429 cooldown, a retry
// budget and latency statistics.
type upstreamKey struct {
	id       string
	client   provider.Provider
	stats    *keyStats
	cooldown *resilience.Cooldown
	budget   *resilience.Budget

	mu       sync.Mutex
	breakers map[string]*resilience.Breaker
}

// upstreamModel is the provider's name for the model.
func (u *upstream) upstreamModel() string {
	if u.model.Upstream != "" {
		return u.model.Upstream
	}
	return u.model.Name
}

func (u *upstream) cost(usage provider.Usage) float64 {
	return (float64(usage.InputTokens)*u.model.InputPricePerMillion + float64(usage.OutputTokens)*u.model.OutputPricePerMillion) / 1e6
}

// route is a name callers use and its candidates, first choice first.
type route struct {
	name              string
	scenario          string
	budget            time.Duration
	candidates        []*upstream
	smaller           []*upstream // ladder L1
	fast              *upstream   // the fast-answer rung's model, nil when off
	compressor        *upstream   // context_compression's model, nil when off
	hedge             HedgeConfig
	ladder            LadderConfig
	firstTokenTimeout time.Duration
	stallTimeout      time.Duration
	// cacheToolCalls: answers with tool calls may be stored (cache.tool_calls).
	cacheToolCalls bool
	compression    ContextCompressionConfig
}

// admissionKeyID is the key a request on rt is admitted and counted under in quota: the
// first key of the route's first choice, which answers when nothing goes wrong. The shared
// retry budget asks about the same key (plan.sharedKey).
func (rt *route) admissionKeyID() string { return rt.candidates[0].keys[0].id }

// Deps are the router's collaborators. The service clients are the generated interfaces,
// so the router never depends on how (or where) the other services run.
type Deps struct {
	Quota    quotav1.QuotaServiceClient
	Cache    cachev1.CacheServiceClient
	Verifier verifierv1.VerifierServiceClient
	// Tools reaches the agent's tool gateway; nil serves no tools.
	Tools   agentv1.ToolServiceClient
	Events  app.Publisher
	Clock   clockwork.Clock
	Log     *slog.Logger
	Metrics *metrics
	// Rand returns uniform numbers in [0,1) for jitter; injected so tests are repeatable.
	Rand func() float64
	// Tracer starts the spans of provider attempts and of the HTTP front door; nil records
	// nothing.
	Tracer trace.Tracer
	// Idempotency keeps request records; nil disables replay protection.
	Idempotency idempotencyStore
	// Checker runs the L1 format checks in the router when the verifier cannot be reached
	// (the library the verifier serves them from); nil lets such answers through unchecked.
	Checker *formatcheck.Checker
	// Sessions keeps agent sessions (the agent's SessionService): the router opens and
	// ends their model steps and serves /v1/sessions; nil refuses requests that name a
	// session.
	Sessions agentv1.SessionServiceClient
	// SchedulingDelay returns the P90 wait for a CPU since its previous call, the overload
	// shedder's signal; nil reads the Go runtime's (overload.SchedulingDelay).
	SchedulingDelay func() time.Duration
	// ProcessCPU returns the CPU time the process has used so far and whether it was
	// measured, from which the shedder learns what a request costs and how many it can
	// serve; nil reads the system's (procusage.CPU).
	ProcessCPU func() (time.Duration, bool)
}

// Router executes requests.
type Router struct {
	deps Deps
	// tracing is false when deps.Tracer records nothing: the spans' attributes, which
	// nothing would read, are then not built.
	tracing bool
	// cfg and the routing table are swapped whole on reload; a request reads each once per
	// use, so it never sees half of a new configuration.
	cfg      atomic.Pointer[Config]
	tab      atomic.Pointer[routeTable]
	reloadMu sync.Mutex // serialises reloads

	upstreams map[string]*upstream // by model name; fixed for the process's life
	budget    *resilience.Budget
	// hedgeBudget bounds hedges apart from budget (Config.HedgeBudget).
	hedgeBudget *resilience.Budget
	// fallbackLimiter admits requests while the quota service is unreachable.
	fallbackLimiter *localLimiter
	// embedCache holds embeddings answers (Config.EmbeddingsCache; sized at start).
	embedCache *embedCache
	// degradations are the last degradation events, for the status page.
	degradations degradationRing
	// shedder refuses a share of new requests while the process is short of CPU; its
	// configuration is fixed for the process's life.
	shedder *overload.Shedder
	// schemas compiles requests' JSON Schemas to refuse an unusable one up front:
	// deps.Checker when there is one, so the local L1 check finds them cached.
	schemas *formatcheck.Checker
	// scouts are the side scouts in flight (see sideScout); scoutCtx ends them at shutdown.
	scouts     sync.WaitGroup
	scoutCtx   context.Context
	stopScouts context.CancelFunc
	// stores make the cache stores that come after their answers (see store).
	stores *storeWorkers
}

// routeTable is the routes callers can name, in config order: models first, then aliases.
type routeTable struct {
	routes map[string]*route
	names  []string
	// scenarios are the routes' scenarios: the values the metrics' scenario label may take.
	scenarios map[string]bool
}

func (r *Router) conf() *Config      { return r.cfg.Load() }
func (r *Router) table() *routeTable { return r.tab.Load() }

// New builds the routing table. clients maps provider name and key id to a client.
func New(cfg Config, deps Deps, clients func(p ProviderConfig, m ModelConfig, keyID string) (provider.Provider, error)) (*Router, error) {
	if deps.Rand == nil {
		deps.Rand = rand.Float64
	}
	if deps.Tracer == nil {
		deps.Tracer = noop.NewTracerProvider().Tracer(TracerName)
	}
	r := &Router{deps: deps, upstreams: map[string]*upstream{},
		budget:          resilience.NewBudget(cfg.RetryBudget, deps.Clock),
		hedgeBudget:     resilience.NewBudget(cfg.HedgeBudget.budget(), deps.Clock),
		fallbackLimiter: newLocalLimiter(cfg.QuotaFallbackRPM),
		embedCache:      newEmbedCache(cfg.EmbeddingsCache),
	}
	r.stores = newStoreWorkers(cfg.MaxAsyncCacheStores, r.sendStore)
	_, off := deps.Tracer.(noop.Tracer)
	r.tracing = !off
	r.scoutCtx, r.stopScouts = context.WithCancel(context.Background())
	r.schemas = deps.Checker
	if r.schemas == nil {
		var err error
		if r.schemas, err = formatcheck.New(formatcheck.DefaultConfig()); err != nil {
			return nil, err
		}
	}
	delay := deps.SchedulingDelay
	if delay == nil {
		delay = overload.NewSchedulingDelay(0.9).Read
	}
	cpu := deps.ProcessCPU
	if cpu == nil {
		cpu = procusage.CPU
	}
	r.shedder = overload.New(cfg.Overload, overload.Signals{Delay: delay, CPU: cpu}, deps.Clock, deps.Rand, r.overloadChanged)
	providers := map[string]ProviderConfig{}
	for _, p := range cfg.Providers {
		providers[p.Name] = p
	}
	for _, m := range cfg.Models {
		p := providers[m.Provider]
		limit := p.MaxConcurrency
		if m.MaxConcurrency > 0 {
			limit = m.MaxConcurrency
		}
		u := &upstream{model: m, provider: p.Name, timeout: p.Timeout, bulkhead: resilience.NewBulkhead(limit)}
		keyIDs := []string{"sim"}
		if len(p.Keys) > 0 {
			keyIDs = keyIDs[:0]
			for _, k := range p.Keys {
				keyIDs = append(keyIDs, k.ID)
			}
		}
		for _, id := range keyIDs {
			c, err := clients(p, m, id)
			if err != nil {
				return nil, fmt.Errorf("model %s key %s: %w", m.Name, id, err)
			}
			u.keys = append(u.keys, &upstreamKey{
				id: id, client: c,
				stats:    newKeyStats(deps.Clock),
				cooldown: resilience.NewCooldown(deps.Clock),
				budget:   resilience.NewBudget(cfg.RetryBudget, deps.Clock),
				breakers: map[string]*resilience.Breaker{},
			})
		}
		r.upstreams[m.Name] = u
	}
	r.cfg.Store(&cfg)
	r.tab.Store(r.buildTable(&cfg))
	return r, nil
}

// buildTable makes the routes of cfg over the router's upstreams.
func (r *Router) buildTable(cfg *Config) *routeTable {
	t := &routeTable{routes: map[string]*route{}, scenarios: map[string]bool{}}
	add := func(rt *route) {
		if rt.budget == 0 {
			rt.budget = cfg.DefaultBudget
		}
		if rt.scenario == "" {
			rt.scenario = "default"
		}
		if rt.firstTokenTimeout == 0 {
			rt.firstTokenTimeout = cfg.FirstTokenTimeout
		}
		if rt.stallTimeout == 0 {
			rt.stallTimeout = cfg.StallTimeout
		}
		r.clampStreamLimits(cfg, rt)
		t.routes[rt.name] = rt
		t.names = append(t.names, rt.name)
		t.scenarios[rt.scenario] = true
	}
	for _, m := range cfg.Models {
		add(&route{name: m.Name, candidates: []*upstream{r.upstreams[m.Name]}})
	}
	for _, rc := range cfg.Routes {
		rt := &route{name: rc.Name, scenario: rc.Scenario, budget: rc.Budget, hedge: rc.Hedge, ladder: rc.Ladder,
			firstTokenTimeout: rc.FirstTokenTimeout, stallTimeout: rc.StallTimeout, cacheToolCalls: rc.Cache.ToolCalls}
		for _, name := range rc.Candidates {
			rt.candidates = append(rt.candidates, r.upstreams[name])
		}
		for _, name := range rc.Ladder.Smaller {
			rt.smaller = append(rt.smaller, r.upstreams[name])
		}
		if name := rc.Ladder.FastAnswer.Model; name != "" {
			rt.fast = r.upstreams[name]
		}
		if name := rc.ContextCompression.Model; name != "" {
			rt.compressor = r.upstreams[name]
		}
		rt.compression = rc.ContextCompression
		add(rt)
	}
	return t
}

// clampStreamLimits lowers a route's first-token and stall limits that would leave less
// than stream_rescue_share of its budget to finish a broken stream on a fallback (a stall
// limit equal to the budget ends every stall in an error), and says so.
func (r *Router) clampStreamLimits(cfg *Config, rt *route) {
	ceiling := rescueCeiling(rt.budget-cfg.HopReserve, cfg.StreamRescueShare)
	for _, l := range []struct {
		name  string
		limit *time.Duration
	}{{"first_token_timeout", &rt.firstTokenTimeout}, {"stall_timeout", &rt.stallTimeout}} {
		if *l.limit > ceiling {
			r.deps.Log.Warn("a stream limit leaves no time to rescue a broken stream inside the route's budget; clamped",
				"route", rt.name, "limit", l.name, "configured", *l.limit, "clamped_to", ceiling, "budget", rt.budget, "stream_rescue_share", cfg.StreamRescueShare)
			*l.limit = ceiling
		}
	}
}

// rescueCeiling is the most a stream limit may take of the time left, keeping share of it
// for a fallback; no ceiling when share is 0.
func rescueCeiling(left time.Duration, share float64) time.Duration {
	if share <= 0 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(float64(max(left, 0)) * (1 - share))
}

// Reload applies a new router block without a restart: routes, ladders (including forced
// levels), hedging, streaming limits, retry policy and the other scalar settings. Providers
// and models hold connections, keys, breakers and statistics, so changing them needs a
// restart; breakers keep their state and settings across a reload, so an operator who
// forces cache-only mode during an incident does not also close every open breaker.
func (r *Router) Reload(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	r.reloadMu.Lock()
	defer r.reloadMu.Unlock()
	old := r.conf()
	if !reflect.DeepEqual(old.Providers, cfg.Providers) || !reflect.DeepEqual(old.Models, cfg.Models) ||
		!reflect.DeepEqual(old.SimProfiles, cfg.SimProfiles) {
		return errors.New("providers, models and sim profiles change only with a restart")
	}
	if !reflect.DeepEqual(old.RetryBudget, cfg.RetryBudget) || old.HedgeBudget != cfg.HedgeBudget || !reflect.DeepEqual(old.Breaker, cfg.Breaker) ||
		old.QuotaFallbackRPM != cfg.QuotaFallbackRPM || old.Idempotency != cfg.Idempotency ||
		old.QuotaAddress != cfg.QuotaAddress || old.CacheAddress != cfg.CacheAddress || old.VerifierAddress != cfg.VerifierAddress || old.AgentAddress != cfg.AgentAddress ||
		old.EmbeddingsCache != cfg.EmbeddingsCache {
		r.deps.Log.Warn("retry_budget, hedge_budget, breaker, quota_fallback_rpm, idempotency, embeddings_cache and the service addresses keep their running values until a restart")
	}
	r.tab.Store(r.buildTable(&cfg))
	r.cfg.Store(&cfg)
	r.stores.setMax(cfg.MaxAsyncCacheStores)
	r.deps.Log.Info("router configuration reloaded", "routes", len(cfg.Routes))
	return nil
}

// Delta is a piece of a streamed answer and where it comes from. Everything but Content
// is the same for every delta of one answer: failover happens before the first token.
type Delta struct {
	Content string
	Model   string
	Level   mantlev1.FallbackLevel
	Cached  bool
	// Stale: the cached answer is past its time to live (see QualityContext.cache_stale).
	Stale bool
	// ToolCalls are pieces of tool calls, as the provider streamed them.
	ToolCalls []provider.ToolCallDelta
	// Logprobs is the provider's logprobs object for this piece, when asked for.
	Logprobs []byte
	// Replayed: the answer is an agent session step's recorded result.
	Replayed bool
	// More: the next delta follows at once (it arrived from the provider with this one),
	// so a sink that writes to a connection may hold its flush for it, as a proxy flushes
	// once per read rather than once per event. The stream's end always comes after a
	// delta without More or is flushed by the sink itself.
	More bool
}

// Sink receives streamed content. A nil Sink asks for a unary answer.
type Sink func(Delta) error

// Complete answers one request.
func (r *Router) Complete(ctx context.Context, req *routerv1.Request) (*routerv1.CompleteResponse, error) {
	return r.execute(ctx, req, nil)
}

// Stream answers one request as deltas sent to sink and returns the final message.
func (r *Router) Stream(ctx context.Context, req *routerv1.Request, sink Sink) (*routerv1.CompleteResponse, error) {
	return r.execute(ctx, req, sink)
}

func (r *Router) execute(ctx context.Context, req *routerv1.Request, sink Sink) (*routerv1.CompleteResponse, error) {
	start := arrivalOf(ctx, r.deps.Clock.Now())
	rt, err := r.validate(ctx, req)
	if err != nil {
		return nil, err
	}
	clientID := rpc.CallerRequestID(ctx)
	qc := r.newQualityContext(ctx, req, rt)
	if rpc.RequestID(ctx) != qc.RequestId { // made up by newQualityContext
		ctx = rpc.WithRequestID(ctx, qc.RequestId)
	}
	ctx, cancel := context.WithDeadline(ctx, qc.Deadline.AsTime())
	defer cancel()

	resp, err := r.inSession(ctx, req, rt, qc, sink, func(ctx context.Context) (*routerv1.CompleteResponse, error) {
		return r.once(ctx, req, rt, qc, sink, idempotencyKey(qc.Tenant, req.IdempotencyKey, clientID))
	})
	end := r.deps.Clock.Now()
	r.timeRequest(rt.name, qc, resp, start, end)
	traceRequest(ctx, qc)
	outcome, level := "ok", ShortLevel(qc.FallbackLevel)
	if err != nil {
		outcome = status.Code(err).String()
		err = &failedRequest{err: err, quality: qc}
	}
	scenario := r.scenarioLabel(qc.Scenario)
	series := r.deps.Metrics.request(rt.name, scenario, outcome, level)
	series.requests.Inc()
	series.duration.Observe(end.Sub(start).Seconds())
	return resp, err
}

func (r *Router) serve(ctx context.Context, req *routerv1.Request, rt *route, qc *mantlev1.QualityContext, sink Sink) (*routerv1.CompleteResponse, error) {
	granted, err := r.reserve(ctx, req, rt, qc)
	if err != nil {
		return nil, err
	}
	reservation, limits := granted.id, granted.limits
	found, lease, storeDeclined := r.lookup(ctx, req, rt, qc)
	if found != nil {
		// The rules of the request's scenario judge a cached answer as they judge a fresh
		// one; one they refuse is not served, and the models are asked instead.
		if v, content, ok := r.ruleCached(ctx, req, qc, found, mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY); ok {
			qc.FallbackLevel = mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY
			hit := r.serveCached(qc, found, v, content)
			r.settle(ctx, qc, reservation, &mantlev1.Usage{})
			hit.RateLimit = limits
			return hit, sendWhole(sink, hit)
		}
	}
	stored := false
	if lease != "" {
		defer func() {
			if !stored {
				r.release(ctx, qc, lease)
			}
		}()
	}

	var ans *answer
	switch rt.ladder.ForceLevel {
	case ForceCache, ForceTemplate:
		// An operator pinned the route below its models (cache-only mode during an outage).
		err = &exhaustedError{class: mantlev1.ErrorClass_ERROR_CLASS_BREAKER_OPEN, forced: rt.ladder.ForceLevel}
	default:
		ans, err = r.attempt(ctx, req, rt, qc, sink, granted.inputTokens)
	}
	r.settle(ctx, qc, reservation, qc.Usage)
	if err != nil {
		var exhausted *exhaustedError
		if errors.As(err, &exhausted) && !exhausted.partial {
			if resp := r.descend(ctx, req, rt, qc, exhausted.Error()); resp != nil {
				r.publishDegradation(ctx, rt, qc, qc.DegradationReason, degradationCause(qc, err))
				resp.RateLimit = limits
				return resp, sendWhole(sink, resp)
			}
		}
		// A request the provider refused (bad request, content filter) did not degrade:
		// no other candidate was or could have been used.
		var rejected *rejectedError
		if !errors.As(err, &rejected) && !errors.Is(ctx.Err(), context.Canceled) {
			r.publishDegradation(ctx, rt, qc, err.Error(), degradationCause(qc, err))
		}
		return nil, err
	}
	if ans.degraded {
		r.publishDegradation(ctx, rt, qc, qc.DegradationReason, degradationCause(qc, nil))
	}
	complete := ans.FinishReason == "stop" || ans.FinishReason == "tool_calls" && len(ans.ToolCalls) > 0
	if qc.GetVerification().GetL1Passed() && complete && !storeDeclined {
		if why := unstorable(ans.verdict); why != "" {
			r.audit(qc, "store", "not cached: "+why, 0)
		} else if why := reshaped(qc); why != "" {
			// The answer is to another prompt than the caller's: a later identical request
			// deserves the route's full answer, not this one.
			r.audit(qc, "store", "not cached: "+why, 0)
		} else if len(ans.ToolCalls) > 0 && !rt.cacheToolCalls {
			// Replaying a tool call repeats an action; the route must say that is fine.
			r.audit(qc, "store", "not cached: the answer calls tools and the route's cache.tool_calls is off", 0)
		} else {
			r.store(ctx, req, rt, qc, ans, lease)
			stored = true
		}
	}
	return &routerv1.CompleteResponse{
		Id:           qc.RequestId,
		Model:        ans.model,
		Message:      &mantlev1.ChatMessage{Role: "assistant", Content: ans.Content, ToolCalls: toolCallsProto(ans.ToolCalls)},
		FinishReason: ans.FinishReason,
		Logprobs:     string(ans.Logprobs),
		StopSequence: ans.StopSequence,
		Usage:        usageProto(ans.Usage),
		Quality:      qc,
		RateLimit:    limits,
	}, nil
}

// sendWhole streams an answer that did not come from a provider stream (cache, ladder,
// idempotent replay) as one delta.
func sendWhole(sink Sink, resp *routerv1.CompleteResponse) error {
	msg := resp.GetMessage()
	if sink == nil || (msg.GetContent() == "" && len(msg.GetToolCalls()) == 0) {
		return nil
	}
	qc := resp.GetQuality()
	d := Delta{Content: msg.Content, Model: resp.Model, Level: qc.GetFallbackLevel(), Cached: qc.GetCacheHit(), Stale: qc.GetCacheStale(), Replayed: qc.GetSessionReplayed()}
	for i, tc := range msg.GetToolCalls() {
		d.ToolCalls = append(d.ToolCalls, provider.ToolCallDelta{Index: i, ID: tc.Id, Type: tc.Type, Name: tc.Name, Arguments: tc.Arguments})
	}
	if resp.Logprobs != "" {
		d.Logprobs = []byte(resp.Logprobs)
	}
	return sink(d)
}

// answer is a provider response that passed (or skipped) verification.
type answer struct {
	provider.Response
	model string
	// verdict is the verifier's on the answer; nil when it was not verified.
	verdict *verifierv1.VerifyResponse
	// degraded: the answer is not the route's first choice's because something failed
	// (a hedge that merely answered first is not degraded).
	degraded bool
}

// unstorable says why an answer must not be cached, or "" when it may be. The cache keeps
// plain answers only: one the rules changed (masked, replaced, noticed), one a person is
// asked to review, or one that failed a check after it was streamed would otherwise come
// back later as a plain, high-grade answer. Hits are ruled again when served, so what a
// rule does to an answer is never stored, only redone.
func unstorable(v *verifierv1.VerifyResponse) string {
	switch {
	case v == nil:
		return "not verified"
	case !v.Passed:
		return "failed verification"
	case v.ReviewId != "":
		return "under review (" + v.ReviewId + ")"
	case len(v.Actions) > 0:
		ids := make([]string, 0, len(v.Actions))
		for _, a := range v.Actions {
			if !slices.Contains(ids, a.RuleId) {
				ids = append(ids, a.RuleId)
			}
		}
		return "rules applied (" + strings.Join(ids, ",") + ")"
	case v.UserNotice != "":
		return "carries a notice"
	}
	return ""
}

// maxWaitMs caps a wait another service reports before it becomes a time.Duration, which
// a bad figure could overflow (a day is longer than any request's budget; timeRequest
// then bounds it by the request's own time).
const maxWaitMs = 24 * 60 * 60 * 1000

func (r *Router) reserve(ctx context.Context, req *routerv1.Request, rt *route, qc *mantlev1.QualityContext) (reservation, error) {
	return r.reserveTokens(ctx, rt, qc, int64(req.MaxTokens), req.Messages, req.Tools, 0)
}

// reservation is what quota granted a request: the id to settle, the tenant's limits for
// the caller's rate-limit headers, and the prompt's tokens as quota counted them (0 when
// quota is off or unreachable).
type reservation struct {
	id          string
	limits      *routerv1.RateLimit
	inputTokens int64
}

// reserveTokens reserves quota for a request on rt: maxOutput tokens of answer (0: quota's
// default) and the input, counted by quota from messages and the tools offered unless
// inputTokens says it.
func (r *Router) reserveTokens(ctx context.Context, rt *route, qc *mantlev1.QualityContext, maxOutput int64, messages []*mantlev1.ChatMessage, tools []*mantlev1.Tool, inputTokens int64) (reservation, error) {
	if r.deps.Quota == nil {
		return reservation{}, nil // quota is off: nothing to reserve, so nothing to settle
	}
	hop, cancel := r.hopContext(ctx)
	defer cancel()
	start := r.deps.Clock.Now()
	// Buckets, prices and the tokenizer are per model: charge the route's first choice,
	// which is what answers when nothing goes wrong.
	res, err := r.deps.Quota.Reserve(hop, &quotav1.ReserveRequest{
		Quality: hopQuality(qc),
		Model:   rt.candidates[0].model.Name,
		// Naming the key lets quota count requests per key for the shared retry budget.
		UpstreamKeyId:   rt.admissionKeyID(),
		MaxOutputTokens: maxOutput,
		Messages:        messages,
		InputTokens:     inputTokens,
		// Tool definitions are prompt tokens too: quota counts them with the messages.
		Tools: tools,
	}, rpc.HandOverRequest())
	if err != nil {
		code := status.Code(err)
		info := rpc.ErrorInfo(err)
		// A refusal after a wait in quota's queue: the wait was deliberate, not overhead.
		if ms, perr := strconv.ParseInt(info.GetMetadata()["waited_ms"], 10, 64); perr == nil && ms > 0 {
			addWait(qc, time.Duration(min(ms, maxWaitMs))*time.Millisecond)
		}
		// A money budget whose state quota cannot read fails closed by design
		// (BUDGET_UNAVAILABLE); only quota itself being unreachable may fail open.
		budgetDown := info.GetReason() == "BUDGET_UNAVAILABLE"
		if r.conf().QuotaFailOpen && !budgetDown && (code == codes.Unavailable || code == codes.DeadlineExceeded) && ctx.Err() == nil {
			// Fail open, but bounded: a local limiter per tenant at this replica's share
			// keeps a quota outage from becoming unlimited spending.
			if !r.fallbackLimiter.allow(qc.Tenant, r.deps.Clock.Now()) {
				r.audit(qc, "reserve", "quota unavailable and local fallback limit reached", r.deps.Clock.Since(start))
				return reservation{}, rpc.ResourceExhausted(errorDomain, "tenant:"+qc.Tenant+":local-fallback",
					"quota service unavailable and this replica's fallback limit is reached", time.Second)
			}
			r.deps.Log.WarnContext(ctx, "quota unavailable; admitting under the local fallback limit", "err", err)
			qc.SkippedSteps = append(qc.SkippedSteps, "quota")
			r.audit(qc, "reserve", "fail open (local limit): "+code.String(), r.deps.Clock.Since(start))
			return reservation{}, nil
		}
		return reservation{}, err
	}
	adoptAudit(qc, res.GetQuality())
	addWait(qc, res.GetWaited().AsDuration()) // in quota's priority queue
	r.audit(qc, "reserve", "reserved "+strconv.FormatInt(res.ReservedTokens, 10)+" tokens", r.deps.Clock.Since(start))
	l := res.GetLimits()
	return reservation{id: res.ReservationId, inputTokens: res.InputTokens, limits: &routerv1.RateLimit{
		LimitRequests: l.GetLimitRequests(), RemainingRequests: l.GetRemainingRequests(),
		LimitTokens: l.GetLimitTokens(), RemainingTokens: l.GetRemainingTokens(),
		ResetRequests: l.GetResetRequests(), ResetTokens: l.GetResetTokens(),
	}}, nil
}

// settle reports real usage. It runs even when the caller has gone away, with its own
// short deadline, so that reservations are not left to expire.
func (r *Router) settle(ctx context.Context, qc *mantlev1.QualityContext, reservation string, usage *mantlev1.Usage) {
	if reservation == "" {
		return
	}
	ctx, cancel := withLazyDeadline(context.WithoutCancel(ctx), time.Now().Add(2*time.Second))
	defer cancel()
	// Handed over with a copy of the usage, which the request's QualityContext holds.
	sreq := &quotav1.SettleRequest{Quality: hopQuality(qc), ReservationId: reservation, Usage: &mantlev1.Usage{
		InputTokens: usage.GetInputTokens(), OutputTokens: usage.GetOutputTokens(), TotalTokens: usage.GetTotalTokens(),
	}}
	if _, err := r.deps.Quota.Settle(ctx, sreq, rpc.HandOverRequest()); err != nil {
		r.deps.Log.WarnContext(ctx, "settle failed; the reservation will expire", "reservation", reservation, "err", err)
	}
}

// lookup asks the cache for the prompt. On a miss it may hold a lease: identical prompts
// arriving meanwhile wait for this request's answer instead of calling a model themselves
// (task merging), so the lease must end in store or release. storeDeclined says the
// cache's policy would refuse to store the answer, so store need not be called. A hit is
// not the request's answer yet: ruleCached decides.
func (r *Router) lookup(ctx context.Context, req *routerv1.Request, rt *route, qc *mantlev1.QualityContext) (hit *cachev1.LookupResponse, lease string, storeDeclined bool) {
	if r.deps.Cache == nil {
		return nil, "", true // the cache is off: there is nothing to ask and nowhere to store
	}
	hop, cancel := r.hopContext(ctx)
	defer cancel()
	start := r.deps.Clock.Now()
	// A duplicate waits at most half of what is left for the first request's answer, so it
	// still has time to ask a model itself if that answer never comes.
	wait := qc.Deadline.AsTime().Sub(start) / 2
	res, err := r.deps.Cache.Lookup(hop, &cachev1.LookupRequest{
		Quality: hopQuality(qc), Prompt: cachePrompt(req, rt, qc), Coalesce: true, MaxWait: durationpb.New(wait),
	}, rpc.HandOverRequest())
	if err != nil {
		r.deps.Log.WarnContext(ctx, "cache lookup failed; treating as miss", "err", err)
		qc.SkippedSteps = append(qc.SkippedSteps, "cache")
		r.audit(qc, "lookup", "error: "+status.Code(err).String(), r.deps.Clock.Since(start))
		return nil, "", false
	}
	adoptAudit(qc, res.GetQuality())
	// Waiting for an identical request's answer is that request's provider call, not
	// mantle's work.
	addWait(qc, res.GetWaited().AsDuration())
	if res.Hit && res.Entry != nil && len(res.Entry.ToolCalls) > 0 && !exactMatch(res.Match) {
		// A similar question's tool calls would act with another question's arguments
		// (book Lyon for Paris): tool calls are served for the identical prompt only.
		r.audit(qc, "lookup", fmt.Sprintf("miss (%s is a tool-call answer to a similar prompt, not this one)", res.Entry.Id), r.deps.Clock.Since(start))
		return nil, res.GetLease().GetId(), res.GetStoreDeclined()
	}
	if !res.Hit || res.Entry == nil {
		detail := "miss"
		if res.MissReason != "" {
			detail += " (" + res.MissReason + ")"
		}
		r.audit(qc, "lookup", detail, r.deps.Clock.Since(start))
		return nil, res.GetLease().GetId(), res.GetStoreDeclined()
	}
	r.audit(qc, "lookup", fmt.Sprintf("hit %s (%s, similarity %.3f)", res.Entry.Id, strings.ToLower(strings.TrimPrefix(res.Match.String(), "MATCH_KIND_")), res.Similarity), r.deps.Clock.Since(start))
	return res, "", false
}

// ruleCached verifies a cached answer for this request as the answer of level: the L1
// checks and the L2 rules of the request's own scenario (a mask, a notice, a review, a
// block apply to a hit as to a fresh answer), and the risk score. ok is false when the
// verdict refuses the answer; v is nil when the verifier could not be asked (the answer
// then goes out unverified, as a fresh one would). content is the answer to deliver.
func (r *Router) ruleCached(ctx context.Context, req *routerv1.Request, qc *mantlev1.QualityContext, res *cachev1.LookupResponse, level mantlev1.FallbackLevel) (v *verifierv1.VerifyResponse, content string, ok bool) {
	e := res.Entry
	finish := e.FinishReason
	if finish == "" {
		finish = "stop"
	}
	ans := provider.Response{Content: e.Content, FinishReason: finish, ToolCalls: toolCallsFromProto(e.ToolCalls)}
	v, audit, err := r.verify(ctx, req, qc, answerer{model: e.SourceModel, level: level, cached: true, stale: res.Stale}, &ans, nil)
	qc.Audit = append(qc.Audit, audit...)
	if err != nil {
		r.deps.Metrics.cachedRefused.Inc()
		r.audit(qc, "lookup", fmt.Sprintf("cached answer %s not served: %v", e.Id, err), 0)
		return nil, "", false
	}
	return v, ans.Content, true
}

// exactMatch reports whether a hit answers this very prompt (found by its key, or the
// answer of an identical request it waited for), not a similar one.
func exactMatch(m cachev1.MatchKind) bool {
	return m == cachev1.MatchKind_MATCH_KIND_EXACT || m == cachev1.MatchKind_MATCH_KIND_COALESCED
}

func toolCallsFromProto(tcs []*mantlev1.ToolCall) []provider.ToolCall {
	var out []provider.ToolCall
	for _, tc := range tcs {
		out = append(out, provider.ToolCall{ID: tc.GetId(), Type: tc.GetType(), Name: tc.GetName(), Arguments: tc.GetArguments()})
	}
	return out
}

// serveCached makes a cached answer that passed ruleCached the request's answer.
func (r *Router) serveCached(qc *mantlev1.QualityContext, res *cachev1.LookupResponse, v *verifierv1.VerifyResponse, content string) *routerv1.CompleteResponse {
	e := res.Entry
	qc.CacheHit, qc.CacheSimilarity, qc.CacheStale = true, res.Similarity, res.Stale
	qc.CurrentModel = e.SourceModel
	applyVerdict(qc, v)
	finish := "stop"
	if len(e.ToolCalls) > 0 {
		finish = "tool_calls"
	}
	return &routerv1.CompleteResponse{
		Id:           qc.RequestId,
		Model:        e.SourceModel,
		Message:      &mantlev1.ChatMessage{Role: "assistant", Content: content, ToolCalls: e.ToolCalls},
		FinishReason: finish,
		Usage:        &mantlev1.Usage{},
		Quality:      qc,
	}
}

// store offers a verified answer to the cache, answering the lease's waiters too. With
// router.async_cache_store and a lease, it does so after the answer has gone to the
// caller: the lease makes an identical lookup wait for this store (in the cache replica
// that gave it), so the caller's next identical request still finds the answer. Without a
// lease nothing would make that request wait, so the store is made before the answer.
func (r *Router) store(ctx context.Context, req *routerv1.Request, rt *route, qc *mantlev1.QualityContext, ans *answer, lease string) {
	// Built now: qc goes out with the answer, and the copies must not race with that.
	sreq := &cachev1.StoreRequest{
		Quality:      hopQuality(qc),
		Prompt:       cachePrompt(req, rt, qc),
		Content:      ans.Content,
		SourceModel:  ans.model,
		FinishReason: ans.FinishReason,
		ToolCalls:    toolCallsProto(ans.ToolCalls),
		Usage:        usageProto(ans.Usage),
		LeaseId:      lease,
	}
	// Left to the HTTP door (doorRequest) or offered to the store workers it is made
	// after the answer. With every worker busy the store is shed, and its lease released
	// so that identical requests waiting on it go on: made before the answer, as it once
	// was, it put the cache's backlog on the callers' latency just when the replica was
	// short of CPU. Once the workers have stopped (shutting down) it is made before the
	// answer, like one without a lease.
	if lease != "" && r.conf().AsyncCacheStore {
		if r.leaveToDoor(ctx, sreq) {
			return
		}
		switch err := r.stores.offer(ctx, sreq); {
		case err == nil:
			return
		case errors.Is(err, errStoresFull):
			r.deps.Metrics.storesShed.Inc()
			r.release(ctx, qc, lease)
			return
		}
	}
	hop, cancel := r.hopContext(ctx)
	defer cancel()
	r.sendStore(hop, sreq)
}

// asyncStoreTimeout bounds each store in flight after its answer (router.async_cache_store).
// A store made before the answer has what is left of the request's budget; one made after
// it gets a few seconds too, not less: on a loaded cache replica an embedding and an index
// write can take over a second, and a store cut short leaves the caller's next identical
// request a miss.
const asyncStoreTimeout = 5 * time.Second

func (r *Router) sendStore(ctx context.Context, sreq *cachev1.StoreRequest) {
	if _, err := r.deps.Cache.Store(ctx, sreq, rpc.HandOverRequest()); err != nil {
		r.deps.Log.WarnContext(ctx, "cache store failed", "err", err)
	}
}

// WaitStores waits for the stores made after their answers and ends the workers that
// make them; later stores are made before their answers. The router's run loop calls it
// at shutdown.
func (r *Router) WaitStores() { r.stores.stop() }

// release gives a coalescing lease back when this request will not store an answer, so
// the requests waiting on it stop waiting. Like settle, it runs even when the caller left.
func (r *Router) release(ctx context.Context, qc *mantlev1.QualityContext, lease string) {
	ctx, cancel := withLazyDeadline(context.WithoutCancel(ctx), time.Now().Add(time.Second))
	defer cancel()
	if _, err := r.deps.Cache.Release(ctx, &cachev1.ReleaseRequest{Quality: hopQuality(qc), LeaseId: lease}); err != nil {
		r.deps.Log.WarnContext(ctx, "cache lease not released; it will expire", "err", err)
	}
}

// admit is the overload shedder's decision on a request of priority p, taken where
// requests come in (the gRPC service, the HTTP front door before it reads the body) so
// that a refusal costs next to nothing: errOverloaded, or the release to call when the
// admitted request ends. Router.Complete and Stream, for callers inside this process,
// do not shed.
func (r *Router) admit(p mantlev1.Priority) (release func(), err error) {
	p = effectivePriority(p)
	if r.shedder.Admit(p) {
		return r.shedder.Done, nil
	}
	r.deps.Metrics.shed.WithLabelValues(priorityLabel(p)).Inc()
	return nil, errOverloaded
}

// errOverloaded is the answer to a request the shedder refused: UNAVAILABLE, which gRPC
// clients with a retry policy and the OpenAI SDKs (503) retry, after RetryInfo's second.
var errOverloaded = rpc.Status(codes.Unavailable, errorDomain, ReasonOverloaded,
	"the router is overloaded and sheds requests; retry after 1s", &errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)})

// overloadChanged reports the shedder starting or stopping, as a degradation of the
// whole router (route "overload").
func (r *Router) overloadChanged(ctx context.Context, c overload.Change) {
	limit := r.shedder.Config().MaxSchedulingDelay
	reason := fmt.Sprintf("router overloaded: P90 wait for a CPU %s over %s; shedding a share of new requests (batch first, critical never)", c.Delay, limit)
	if c.Shedding {
		r.deps.Log.Warn("router overloaded; shedding requests", "p90_cpu_wait", c.Delay, "max_scheduling_delay", limit)
	} else {
		reason = fmt.Sprintf("router overload over: P90 wait for a CPU %s; every request admitted again", c.Delay)
		r.deps.Log.Info("router overload over; admitting every request", "p90_cpu_wait", c.Delay)
	}
	r.deps.Events.Publish(ctx, events.SubjectDegradation, &eventsv1.DegradationEvent{
		At: timestamppb.New(r.deps.Clock.Now()), Route: "overload", Reason: reason,
	})
}

// effectivePriority is the priority a request is treated with: normal when the caller set
// none, or a value this build does not know (a gRPC caller can send any number).
func effectivePriority(p mantlev1.Priority) mantlev1.Priority {
	if _, known := mantlev1.Priority_name[int32(p)]; !known || p == mantlev1.Priority_PRIORITY_UNSPECIFIED {
		return mantlev1.Priority_PRIORITY_NORMAL
	}
	return p
}

// priorityLabel is an effective priority as the shed metric's label: critical, high,
// normal or batch, so that callers cannot mint series.
func priorityLabel(p mantlev1.Priority) string { return shortPriorities.of(p) }

// publishDegradation reports an answer below the primary. reason is the free text the event
// and the caller see; cause is its bounded form for the metric label (degradationCause).
func (r *Router) publishDegradation(ctx context.Context, rt *route, qc *mantlev1.QualityContext, reason, cause string) {
	ev := &eventsv1.DegradationEvent{
		At:         timestamppb.New(r.deps.Clock.Now()),
		RequestId:  qc.RequestId,
		Tenant:     qc.Tenant,
		Scenario:   qc.Scenario,
		Route:      rt.name,
		Level:      qc.FallbackLevel,
		Reason:     reason,
		AnsweredBy: qc.CurrentModel,
	}
	for _, a := range qc.Attempts {
		if a.ErrorClass != mantlev1.ErrorClass_ERROR_CLASS_NONE && !slices.Contains(ev.FailedModels, a.Model) {
			ev.FailedModels = append(ev.FailedModels, a.Model)
		}
	}
	r.deps.Metrics.degradations.WithLabelValues(rt.name, ShortLevel(qc.FallbackLevel), cause).Inc()
	r.deps.Events.Publish(ctx, events.SubjectDegradation, ev)
	r.degradations.add(ev, r.conf().Status.RecentDegradations)
}

func (r *Router) newQualityContext(ctx context.Context, req *routerv1.Request, rt *route) *mantlev1.QualityContext {
	now := r.deps.Clock.Now()
	tenant := rpc.Tenant(ctx)
	if tenant == "" {
		tenant = defaultTenant
	}
	id := rpc.RequestID(ctx)
	if id == "" {
		id = rpc.NewRequestID()
	}
	deadline := now.Add(rt.budget)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	scenario := req.Scenario
	if scenario == "" {
		scenario = rt.scenario
	}
	priority := effectivePriority(req.Priority)
	// The QualityContext, its deadline, usage and audit trail in one allocation.
	b := &requestQuality{qualityBlock: qualityBlock{qc: mantlev1.QualityContext{
		RequestId:      id,
		IdempotencyKey: req.IdempotencyKey,
		TraceId:        rpc.TraceID(ctx),
		Tenant:         tenant,
		Scenario:       scenario,
		Priority:       priority,
		Route:          rt.name,
	}}}
	qc := &b.qc
	pbtime.SetTimestamp(&b.deadline, deadline)
	qc.Deadline, qc.Usage = &b.deadline, &b.usage
	qc.Audit = b.audit[:0]
	r.audit(qc, "admit", "route="+rt.name+" budget="+deadline.Sub(now).Round(time.Millisecond).String(), 0)
	return qc
}

// requestQuality is a request's QualityContext with room for its deadline, usage and the
// eight audit steps of a request its first attempt answers (admit, quota's and the
// router's reserve, the cache's and the router's lookup, attempt, the verifier's and the
// router's verify), which growing by doubling made in four allocations.
type requestQuality struct {
	qualityBlock
	audit [8]*mantlev1.AuditStep
}

func (r *Router) audit(qc *mantlev1.QualityContext, step, detail string, d time.Duration) {
	qc.Audit = append(qc.Audit, r.step(step, detail, d))
}

// adoptAudit appends to qc the audit steps another service returned on the copy of qc it
// was given (hopQuality), which held none: every step returned is the service's. The copy
// itself is not read again: its request was handed over (rpc.HandOverRequest), and in
// process the service may have extended it in place.
func adoptAudit(qc, returned *mantlev1.QualityContext) {
	qc.Audit = append(qc.Audit, returned.GetAudit()...)
}

// addUsage charges an attempt's tokens and cost to the request and to the per-tenant,
// per-model counters operators watch for spend.
func (r *Router) addUsage(qc *mantlev1.QualityContext, u *upstream, usage provider.Usage) {
	cost := u.cost(usage)
	qc.Usage.InputTokens += usage.InputTokens
	qc.Usage.OutputTokens += usage.OutputTokens
	qc.Usage.TotalTokens += usage.InputTokens + usage.OutputTokens
	qc.CostUsd += cost
	m := r.deps.Metrics
	series := m.usage(qc.Tenant, u.model.Name)
	series.input.Add(float64(usage.InputTokens))
	series.output.Add(float64(usage.OutputTokens))
	series.cost.Add(cost)
}

func levelOf(candidate int) mantlev1.FallbackLevel {
	if candidate == 0 {
		return mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY
	}
	return mantlev1.FallbackLevel_FALLBACK_LEVEL_BACKUP_MODEL
}

func providerRequest(req *routerv1.Request, qc *mantlev1.QualityContext) provider.Request {
	p := provider.Request{
		MaxTokens:      int(req.MaxTokens),
		Temperature:    req.Temperature,
		User:           req.User,
		IdempotencyKey: qc.RequestId,
	}
	if qc.IdempotencyKey != "" {
		p.IdempotencyKey = qc.IdempotencyKey
	}
	switch req.GetResponseFormat().GetType() {
	case mantlev1.ResponseFormat_TYPE_JSON_OBJECT, mantlev1.ResponseFormat_TYPE_JSON_SCHEMA:
		p.JSON = true
	}
	for _, m := range req.Messages {
		p.Messages = append(p.Messages, chatMessageOut(m))
	}
	chatFields(&p, req)
	return p
}

func usageProto(u provider.Usage) *mantlev1.Usage {
	return &mantlev1.Usage{InputTokens: u.InputTokens, OutputTokens: u.OutputTokens, TotalTokens: u.InputTokens + u.OutputTokens}
}

// findingCodes names the blocking findings for an attempt's error, with where the first
// one that has a place failed (a tool call's "tool_calls[0]:get_weather#/city"), so that
// the caller's error says which call was wrong.
func findingCodes(fs []*verifierv1.Finding) string {
	var codes []string
	at := ""
	for _, f := range fs {
		if f.Blocking {
			codes = append(codes, f.Code)
			if at == "" && f.Path != "" {
				at = " (at " + f.Path + ")"
			}
		}
	}
	return strings.Join(codes, ",") + at
}

// shortClass turns ERROR_CLASS_RATE_LIMITED into rate_limited for logs and labels.
func shortClass(c mantlev1.ErrorClass) string { return shortClasses.of(c) }

func shortGrade(g mantlev1.QualityGrade) string { return shortGrades.of(g) }

// ShortLevel turns FALLBACK_LEVEL_BACKUP_MODEL into backup_model (the x-mantle-fallback-level
// header value).
func ShortLevel(l mantlev1.FallbackLevel) string { return shortLevels.of(l) }

// The short names of the enums' declared values, made once: every request labels its
// metrics and headers with some, and each made anew cost a lower-cased copy.
var (
	shortClasses    = newShortNames[mantlev1.ErrorClass](mantlev1.ErrorClass_name, "ERROR_CLASS_")
	shortGrades     = newShortNames[mantlev1.QualityGrade](mantlev1.QualityGrade_name, "QUALITY_GRADE_")
	shortLevels     = newShortNames[mantlev1.FallbackLevel](mantlev1.FallbackLevel_name, "FALLBACK_LEVEL_")
	shortPriorities = newShortNames[mantlev1.Priority](mantlev1.Priority_name, "PRIORITY_")
)

// shortNames is an enum's value names without their prefix, in lower case.
type shortNames[E interface {
	~int32
	String() string
}] struct {
	prefix string
	names  map[E]string
}

func newShortNames[E interface {
	~int32
	String() string
}](declared map[int32]string, prefix string) shortNames[E] {
	names := make(map[E]string, len(declared))
	for n := range declared {
		names[E(n)] = shortName(E(n).String(), prefix)
	}
	return shortNames[E]{prefix: prefix, names: names}
}

// of is v's short name; a value the enum does not declare is named as it always was.
func (s shortNames[E]) of(v E) string {
	if name, ok := s.names[v]; ok {
		return name
	}
	return shortName(v.String(), s.prefix)
}

func shortName(name, prefix string) string {
	return strings.ToLower(strings.TrimPrefix(name, prefix))
}
