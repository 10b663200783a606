package router

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/agent/v1"
	cachev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/cache/v1"
	quotav1 "github.com/mantle-mesh/mantle/pkg/api/mantle/quota/v1"
	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/router/internal/idempotency"
)

// In-memory fakes of the router's collaborators. Each embeds the generated client interface
// it stands in for, so the fakes keep compiling as the protos gain RPCs; an RPC the router
// starts calling without the fake implementing it panics (nil interface), which a test
// notices at once. Requests are cloned when recorded: the router keeps mutating its
// QualityContext after a call returns.

type fakeQuota struct {
	quotav1.QuotaServiceClient
	reserveErr error
	// refuseRetries makes the shared retry budget refuse every retry; retryErr makes it
	// unreachable.
	refuseRetries bool
	retryErr      error
	// queued makes Reserve wait that long in the queue, on clock.
	queued time.Duration
	clock  *clockwork.FakeClock
	// inputTokens is the prompt size Reserve reports.
	inputTokens int64

	mu       sync.Mutex
	reserves []*quotav1.ReserveRequest
	// reserveIDs are the request ids the Reserve calls' contexts carried.
	reserveIDs []string
	settles    []*quotav1.SettleRequest
	retries    []*quotav1.AcquireRetryRequest
	observed   []*quotav1.ObserveUpstreamRequest
}

func (q *fakeQuota) AcquireRetry(_ context.Context, in *quotav1.AcquireRetryRequest, _ ...grpc.CallOption) (*quotav1.AcquireRetryResponse, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.retries = append(q.retries, proto.Clone(in).(*quotav1.AcquireRetryRequest))
	if q.retryErr != nil {
		return nil, q.retryErr
	}
	if q.refuseRetries {
		return &quotav1.AcquireRetryResponse{Budget: "retry:overall"}, nil
	}
	return &quotav1.AcquireRetryResponse{Granted: true, Budget: "retry:overall"}, nil
}

func (q *fakeQuota) ObserveUpstream(_ context.Context, in *quotav1.ObserveUpstreamRequest, _ ...grpc.CallOption) (*quotav1.ObserveUpstreamResponse, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.observed = append(q.observed, proto.Clone(in).(*quotav1.ObserveUpstreamRequest))
	return &quotav1.ObserveUpstreamResponse{}, nil
}

func (q *fakeQuota) retryRequests() []*quotav1.AcquireRetryRequest {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]*quotav1.AcquireRetryRequest(nil), q.retries...)
}

func (q *fakeQuota) reserveRequests() []*quotav1.ReserveRequest {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]*quotav1.ReserveRequest(nil), q.reserves...)
}

func (q *fakeQuota) Reserve(ctx context.Context, in *quotav1.ReserveRequest, _ ...grpc.CallOption) (*quotav1.ReserveResponse, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.reserves = append(q.reserves, proto.Clone(in).(*quotav1.ReserveRequest))
	q.reserveIDs = append(q.reserveIDs, rpc.RequestID(ctx))
	if q.queued > 0 {
		q.clock.Advance(q.queued)
	}
	if q.reserveErr != nil {
		return nil, q.reserveErr
	}
	return &quotav1.ReserveResponse{ReservationId: "res-1", ReservedTokens: 100, InputTokens: q.inputTokens, Quality: in.Quality, Waited: durationpb.New(q.queued),
		Limits: &quotav1.Limits{LimitRequests: 10, RemainingRequests: 9, ResetRequests: durationpb.New(time.Second)}}, nil
}

func (q *fakeQuota) Settle(_ context.Context, in *quotav1.SettleRequest, _ ...grpc.CallOption) (*quotav1.SettleResponse, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.settles = append(q.settles, proto.Clone(in).(*quotav1.SettleRequest))
	return &quotav1.SettleResponse{}, nil
}

// fakeCache misses unless hit is set. With approximateOnly, only the ladder's L2 lookups
// (mode APPROXIMATE) hit: hit is a related answer, not a match for the prompt.
type fakeCache struct {
	cachev1.CacheServiceClient
	hit             *cachev1.Entry
	approximateOnly bool
	// declineStore answers misses as the real cache does for a prompt its policy refuses.
	declineStore bool
	// lookups are the QualityContexts the cache was sent.
	lookups []*mantlev1.QualityContext
	// coalesced makes the hit another request's answer, waited for that long on clock;
	// takes makes a lookup take that long on clock (the cache's own work).
	coalesced, takes time.Duration
	clock            *clockwork.FakeClock
	// lease is the coalescing lease a miss hands out (none when empty); a Store waits for
	// storeGate when it is set.
	lease     string
	storeGate chan struct{}

	mu       sync.Mutex
	stores   []*cachev1.StoreRequest
	released []string // the leases released
}

func (c *fakeCache) Release(_ context.Context, in *cachev1.ReleaseRequest, _ ...grpc.CallOption) (*cachev1.ReleaseResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.released = append(c.released, in.GetLeaseId())
	return &cachev1.ReleaseResponse{}, nil
}

func (c *fakeCache) releasedLeases() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.released)
}

func (c *fakeCache) Lookup(_ context.Context, in *cachev1.LookupRequest, _ ...grpc.CallOption) (*cachev1.LookupResponse, error) {
	c.mu.Lock()
	c.lookups = append(c.lookups, proto.Clone(in.Quality).(*mantlev1.QualityContext))
	c.mu.Unlock()
	if c.hit == nil || (c.approximateOnly && in.Mode != cachev1.LookupMode_LOOKUP_MODE_APPROXIMATE) {
		q := proto.Clone(in.Quality).(*mantlev1.QualityContext)
		q.Audit = append(q.Audit, &mantlev1.AuditStep{Service: "cache", Step: "lookup", Detail: "miss"})
		if c.declineStore {
			return &cachev1.LookupResponse{Quality: q, MissReason: "high_temperature", StoreDeclined: true}, nil
		}
		if c.lease != "" {
			return &cachev1.LookupResponse{Quality: q, Lease: &cachev1.Lease{Id: c.lease}}, nil
		}
		return &cachev1.LookupResponse{Quality: q}, nil
	}
	if c.takes > 0 {
		c.clock.Advance(c.takes)
	}
	if c.coalesced > 0 {
		c.clock.Advance(c.coalesced)
		return &cachev1.LookupResponse{Hit: true, Entry: c.hit, Similarity: 1, Match: cachev1.MatchKind_MATCH_KIND_COALESCED,
			Quality: in.Quality, Waited: durationpb.New(c.coalesced)}, nil
	}
	return &cachev1.LookupResponse{Hit: true, Entry: c.hit, Similarity: 0.93, Quality: in.Quality}, nil
}

func (c *fakeCache) Store(_ context.Context, in *cachev1.StoreRequest, _ ...grpc.CallOption) (*cachev1.StoreResponse, error) {
	if c.storeGate != nil {
		<-c.storeGate
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stores = append(c.stores, proto.Clone(in).(*cachev1.StoreRequest))
	return &cachev1.StoreResponse{Stored: true}, nil
}

func (c *fakeCache) stored() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.stores)
}

// fakeVerifier passes everything unless verdict says otherwise.
type fakeVerifier struct {
	verifierv1.VerifierServiceClient
	verdict func(*verifierv1.VerifyRequest) (*verifierv1.VerifyResponse, error)
}

func (v *fakeVerifier) Verify(_ context.Context, in *verifierv1.VerifyRequest, _ ...grpc.CallOption) (*verifierv1.VerifyResponse, error) {
	if v.verdict != nil {
		return v.verdict(in)
	}
	return pass(in), nil
}

// pass is the verdict of a real verifier on a good answer: it writes its verification into
// the QualityContext it returns.
func pass(in *verifierv1.VerifyRequest) *verifierv1.VerifyResponse {
	q := proto.Clone(in.Quality).(*mantlev1.QualityContext)
	q.Verification = &mantlev1.Verification{L1Passed: true}
	return &verifierv1.VerifyResponse{Passed: true, Content: in.Content, Grade: mantlev1.QualityGrade_QUALITY_GRADE_HIGH, Quality: q}
}

type published struct {
	subject string
	msg     proto.Message
}

type fakePublisher struct {
	mu     sync.Mutex
	events []published
}

func (p *fakePublisher) Publish(_ context.Context, subject string, msg proto.Message) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.events = append(p.events, published{subject, proto.Clone(msg)})
}

// on returns the messages published on subject, oldest first.
func (p *fakePublisher) on(subject string) []proto.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []proto.Message
	for _, e := range p.events {
		if e.subject == subject {
			out = append(out, e.msg)
		}
	}
	return out
}

// result is one scripted provider answer. A result that hangs (or waits for release)
// blocks the call until then; when ctx ends first the call fails the way an HTTP client
// does (CANCELED, or TIMEOUT for a deadline).
type result struct {
	res     provider.Response
	err     error
	hang    bool          // block until ctx is done
	release chan struct{} // block until closed (or ctx is done)
	// advance moves the harness's fake clock during the call: the attempt takes that long
	// as far as the router's latency statistics can tell.
	advance time.Duration
	// stream scripts a Stream call: its chunks in order, then io.EOF. A nil stream on a
	// successful result streams res.Content as one chunk.
	stream []chunk
}

// chunk is one step of a scripted stream.
type chunk struct {
	content string
	finish  string
	usage   *provider.Usage
	err     error // Recv fails with it
	hang    bool  // Recv blocks until ctx is done
	tools   []provider.ToolCallDelta
	more    bool // the chunk says the next piece follows at once (provider.Chunk.More)
	// gate, when set, holds the chunk back until it is closed (Recv fails as hang does
	// if ctx ends first).
	gate chan struct{}
}

func reply(content string, in, out int64) result {
	return result{res: provider.Response{Content: content, FinishReason: "stop", Usage: provider.Usage{InputTokens: in, OutputTokens: out}}}
}

func failure(class mantlev1.ErrorClass, msg string) result {
	return result{err: &provider.Error{Class: class, StatusCode: 400, Message: msg}}
}

func rateLimited(hint time.Duration) result {
	return result{err: &provider.Error{Class: mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED, StatusCode: 429, Message: "slow down", RetryAfter: hint}}
}

func hang() result { return result{hang: true} }

// fakeProvider replays its results in order (repeating the last) and honours ctx like an
// HTTP client does. Every call is announced on started (buffered), so a test knows a
// blocking call has begun.
type fakeProvider struct {
	results []result
	started chan provider.Request
	// returned is announced when a Complete call has decided its result (buffered).
	returned chan struct{}
	clock    *clockwork.FakeClock // set by newHarness, for result.advance

	mu   sync.Mutex
	reqs []provider.Request
}

func newFakeProvider(results ...result) *fakeProvider {
	return &fakeProvider{results: results, started: make(chan provider.Request, 64), returned: make(chan struct{}, 64)}
}

func (p *fakeProvider) next(req provider.Request) result {
	p.mu.Lock()
	p.reqs = append(p.reqs, req)
	n := len(p.reqs)
	p.mu.Unlock()
	select {
	case p.started <- req:
	default:
	}
	if len(p.results) == 0 {
		return reply("default answer", 1, 1)
	}
	r := p.results[min(n, len(p.results))-1]
	if r.advance > 0 {
		p.clock.Advance(r.advance)
	}
	return r
}

// block waits as r says; it returns the transport failure when ctx ended first.
func block(ctx context.Context, r result) error {
	switch {
	case r.hang:
		<-ctx.Done()
	case r.release != nil:
		select {
		case <-r.release:
			return nil
		case <-ctx.Done():
		}
	default:
		if ctx.Err() == nil {
			return nil
		}
	}
	return provider.ClassifyTransport(ctx, ctx.Err())
}

func (p *fakeProvider) Complete(ctx context.Context, req provider.Request) (provider.Response, error) {
	defer func() {
		select {
		case p.returned <- struct{}{}:
		default:
		}
	}()
	r := p.next(req)
	if err := block(ctx, r); err != nil {
		return provider.Response{}, err
	}
	return r.res, r.err
}

func (p *fakeProvider) Stream(ctx context.Context, req provider.Request) (provider.Stream, error) {
	r := p.next(req)
	if err := block(ctx, r); err != nil {
		return nil, err
	}
	if r.err != nil {
		return nil, r.err
	}
	steps := r.stream
	if steps == nil {
		u := r.res.Usage
		steps = []chunk{{content: r.res.Content}, {finish: r.res.FinishReason, usage: &u}}
	}
	return &fakeStream{ctx: ctx, steps: steps}, nil
}

func (p *fakeProvider) calls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.reqs)
}

func (p *fakeProvider) requests() []provider.Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]provider.Request(nil), p.reqs...)
}

type fakeStream struct {
	ctx   context.Context
	steps []chunk
	mu    sync.Mutex
	i     int
}

func (s *fakeStream) Recv() (provider.Chunk, error) {
	s.mu.Lock()
	if s.i == len(s.steps) {
		s.mu.Unlock()
		return provider.Chunk{}, io.EOF
	}
	st := s.steps[s.i]
	s.i++
	s.mu.Unlock()
	if st.gate != nil {
		select {
		case <-st.gate:
		case <-s.ctx.Done():
			return provider.Chunk{}, provider.ClassifyTransport(s.ctx, s.ctx.Err())
		}
	}
	if st.hang {
		<-s.ctx.Done()
		return provider.Chunk{}, provider.ClassifyTransport(s.ctx, s.ctx.Err())
	}
	if st.err != nil {
		return provider.Chunk{}, st.err
	}
	return provider.Chunk{Content: st.content, FinishReason: st.finish, Usage: st.usage, ToolCalls: st.tools, More: st.more}, nil
}

func (s *fakeStream) Close() error      { return nil }
func (s *fakeStream) RequestID() string { return "req-stream" }

// testConfig has three models on one provider and route "chat" over them in order.
func testConfig() Config {
	c := DefaultConfig()
	c.Providers = []ProviderConfig{{Name: "p", Type: ProviderSim, Timeout: 5 * time.Second}}
	c.Models = []ModelConfig{
		{Name: "a", Provider: "p", Upstream: "a-upstream", InputPricePerMillion: 1, OutputPricePerMillion: 2},
		{Name: "b", Provider: "p"},
		{Name: "c", Provider: "p"},
	}
	c.Routes = []RouteConfig{{Name: "chat", Scenario: "support", Candidates: []string{"a", "b", "c"}}}
	return c
}

type harness struct {
	router   *Router
	clock    *clockwork.FakeClock
	quota    *fakeQuota
	cache    *fakeCache
	verifier *fakeVerifier
	events   *fakePublisher
	// providers are looked up by "model/key" first, then by "model" (any key).
	providers map[string]*fakeProvider
	// rand is the jitter source; nil draws 0, so backoff never waits unless a test asks.
	rand func() float64
	// idempotency enables replay protection with an in-memory store on the fake clock.
	idempotency bool
	// tracer records the router's spans; nil records nothing.
	tracer trace.Tracer
	// schedulingDelay is the overload shedder's signal; nil reads the Go runtime's.
	schedulingDelay func() time.Duration
	// log receives the router's log; nil discards it.
	log slog.Handler
	// sessions keeps agent sessions; nil refuses requests that name one.
	sessions agentv1.SessionServiceClient
}

// newHarness builds a Router over fakes. Its clock is fake and starts at the real now,
// because contexts carry real deadlines derived from it.
func newHarness(t *testing.T, cfg Config, h *harness) *harness {
	t.Helper()
	if h == nil {
		h = &harness{}
	}
	if h.clock == nil {
		h.clock = clockwork.NewFakeClockAt(time.Now())
	}
	if h.quota == nil {
		h.quota = &fakeQuota{}
	}
	if h.cache == nil {
		h.cache = &fakeCache{}
	}
	if h.verifier == nil {
		h.verifier = &fakeVerifier{}
	}
	h.events = &fakePublisher{}
	if h.providers == nil {
		h.providers = map[string]*fakeProvider{}
	}
	for _, m := range cfg.Models {
		if h.providers[m.Name] == nil {
			h.providers[m.Name] = newFakeProvider()
		}
	}
	for _, p := range h.providers {
		p.clock = h.clock
		if p.started == nil {
			p.started, p.returned = make(chan provider.Request, 64), make(chan struct{}, 64)
		}
	}
	if h.rand == nil {
		h.rand = func() float64 { return 0 }
	}
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if h.log == nil {
		h.log = slog.DiscardHandler
	}
	deps := Deps{Quota: h.quota, Cache: h.cache, Verifier: h.verifier, Events: h.events,
		Clock: h.clock, Log: slog.New(h.log), Metrics: m, Rand: h.rand, Tracer: h.tracer, SchedulingDelay: h.schedulingDelay,
		// No CPU reading: the shedder learns no cost, and grows its share by StepUp alone.
		ProcessCPU: func() (time.Duration, bool) { return 0, false }}
	deps.Sessions = h.sessions
	if h.idempotency {
		deps.Idempotency = idempotency.NewMemory(time.Hour, time.Minute, h.clock)
	}
	h.router, err = New(cfg, deps, func(_ ProviderConfig, m ModelConfig, key string) (provider.Provider, error) {
		if p := h.providers[m.Name+"/"+key]; p != nil {
			return p, nil
		}
		return h.providers[m.Name], nil
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(h.router.WaitStores) // the store workers wait a while for more stores
	return h
}

func (h *harness) calls(name string) int { return h.providers[name].calls() }

// outcome of a request run in the background.
type done struct {
	resp *routerv1.CompleteResponse
	err  error
}

// start runs Complete in the background, so the test can drive the fake clock meanwhile.
func (h *harness) start(ctx context.Context, req *routerv1.Request) <-chan done {
	ch := make(chan done, 1)
	go func() {
		resp, err := h.router.Complete(ctx, req)
		ch <- done{resp, err}
	}()
	return ch
}

// await returns the request's outcome. The real-time guard only turns a hang (a bug) into
// a failure instead of a test timeout; nothing waits on it in a passing run.
func await(t *testing.T, ch <-chan done) done {
	t.Helper()
	select {
	case d := <-ch:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("request did not finish")
		return done{}
	}
}

// blockUntil waits until the fake clock has n waiters: the router is sleeping.
func (h *harness) blockUntil(t *testing.T, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.clock.BlockUntilContext(ctx, n); err != nil {
		t.Fatalf("the router never waited on the clock (%d waiters wanted): %v", n, err)
	}
}

func ask(model string) *routerv1.Request {
	return &routerv1.Request{Model: model, Messages: []*mantlev1.ChatMessage{{Role: "user", Content: "What is a circuit breaker?"}}}
}

func usage(in, out int64) *mantlev1.Usage {
	return &mantlev1.Usage{InputTokens: in, OutputTokens: out, TotalTokens: in + out}
}

func failVerification(content string, class mantlev1.ErrorClass) func(*verifierv1.VerifyRequest) (*verifierv1.VerifyResponse, error) {
	return func(in *verifierv1.VerifyRequest) (*verifierv1.VerifyResponse, error) {
		if in.Content != content {
			return pass(in), nil
		}
		q := proto.Clone(in.Quality).(*mantlev1.QualityContext)
		q.Verification = &mantlev1.Verification{L1Passed: false, FailureClass: class}
		return &verifierv1.VerifyResponse{Passed: false, FailedLayer: "l1", FailureClass: class,
			Findings: []*verifierv1.Finding{{Code: "json_parse", Blocking: true}}, Quality: q}, nil
	}
}

// attemptsOf lists (model, class) of every attempt in qc.
func attemptsOf(qc *mantlev1.QualityContext) []string {
	var out []string
	for _, a := range qc.GetAttempts() {
		s := a.Model + ":" + shortClass(a.ErrorClass)
		if a.Hedged {
			s += ":hedged"
		}
		out = append(out, s)
	}
	return out
}

// counterValue reads a counter (prometheus/testutil would need modules go.sum does not pin).
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
