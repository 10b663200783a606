package cache

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/cache/internal/nearmiss"
	"github.com/mantle-mesh/mantle/services/cache/internal/vector"
)

// ErrNoTenant is returned when a call names no tenant. Entries are always scoped to one,
// so nothing can be looked up, stored or removed without it.
var ErrNoTenant = errors.New("no tenant")

const roleUser = "user"

// Prompt is everything that decides whether two requests may share an answer.
type Prompt struct {
	Scenario string
	Model    string
	// ModelFamily, when set, replaces Model in the scope: models of one family share
	// answers.
	ModelFamily    string
	Messages       []Message
	Temperature    *float64 // nil: the provider's default
	MaxTokens      int32    // 0: the provider's default
	ResponseFormat ResponseFormat
	// ContextFingerprint stands for everything else that changes the answer (tools, stop
	// sequences); it is hashed into the scope.
	ContextFingerprint string
	// EndUser is who the prompt is asked for (the OpenAI user field). A personal prompt is
	// cached in a scope of its own per end user, and not at all without one.
	EndUser string
}

// maxEndUser bounds Prompt.EndUser; OpenAI's user field is an opaque identifier, well
// below this.
const maxEndUser = 256

// Message is one conversation turn.
type Message struct {
	Role    string
	Name    string
	Content string
}

// FormatType is the requested shape of the answer.
type FormatType string

// Format types. The empty FormatType means text.
const (
	FormatText       FormatType = "text"
	FormatJSONObject FormatType = "json_object"
	FormatJSONSchema FormatType = "json_schema"
)

// ResponseFormat asks for structured output.
type ResponseFormat struct {
	Type           FormatType
	JSONSchema     string
	RequiredFields []string
}

// typeOrText treats an unset type as text, which is what providers answer with.
func (f ResponseFormat) typeOrText() FormatType {
	if f.Type == "" {
		return FormatText
	}
	return f.Type
}

// Mode says how far a lookup may go (see LookupMode in cache.proto).
type Mode int

// Lookup modes.
const (
	// ModeNormal: fresh entries at the scenario's threshold.
	ModeNormal Mode = iota
	// ModeCacheOnly: also stale entries (within max_staleness) at the stale threshold.
	ModeCacheOnly
	// ModeApproximate: like ModeCacheOnly, and entries down to the approximate threshold.
	ModeApproximate
)

// MatchKind says how a hit was found.
type MatchKind string

// Match kinds.
const (
	MatchNone      MatchKind = "none"
	MatchExact     MatchKind = "exact"
	MatchSemantic  MatchKind = "semantic"
	MatchCoalesced MatchKind = "coalesced"
)

// Reasons a lookup did not search or could not, besides the policy's SkipReasons.
const (
	MissBackendError    = "backend_error"
	MissEmbedderError   = "embedder_error"
	MissCoalesceTimeout = "coalesce_timeout"
)

// LookupRequest asks for a cached answer.
type LookupRequest struct {
	Prompt Prompt
	Mode   Mode
	// Coalesce asks for a lease on a miss, or to wait for the answer of the lookup that
	// holds one.
	Coalesce bool
	// MaxWait shortens the configured coalesce.max_wait; zero uses it.
	MaxWait time.Duration
	// Deadline is the request's deadline (zero: none). A lease expires by then at the
	// latest, since its holder stops answering by then.
	Deadline time.Time
}

// LookupResult is a hit or a miss, and why.
type LookupResult struct {
	Hit   bool
	Entry Entry
	// Similarity of the hit: 1 for exact and coalesced matches.
	Similarity float64
	Match      MatchKind
	// Stale: the hit is past its TTL. Approximate: its similarity is below the normal
	// threshold.
	Stale, Approximate bool
	// Age of the hit's entry.
	Age time.Duration
	// Rejected is the closest candidate that did not answer, and why.
	Rejected *Rejection
	// Lease is set on a coalescing miss: the caller answers for the others.
	Lease *Lease
	// MissReason says why a miss did not search or could not ("" for an ordinary miss).
	MissReason string
	Namespace  string
	// StoreDeclined: the prompt policy refused the lookup, so it would refuse a Store of
	// the answer too; the caller can skip that call.
	StoreDeclined bool
	// Waited is how long a coalescing lookup waited for another request's answer.
	Waited time.Duration
}

// Rejection is a candidate that did not answer.
type Rejection struct {
	EntryID    string
	Similarity float64
	// Reason is below_threshold or a nearmiss.Reason.
	Reason string
	Detail string
}

// Lease is a coalescing lease handed to the caller.
type Lease struct {
	ID        string
	ExpiresAt time.Time
}

// StoreRequest is an answer offered to the cache.
type StoreRequest struct {
	Prompt       Prompt
	Content      string
	SourceModel  string
	FinishReason string
	// ToolCalls are the answer's tool calls (FinishReason tool_calls); Content may then be
	// empty.
	ToolCalls []ToolCall
	Usage     Usage
	// TTL shortens the policy's TTL; zero uses it. It cannot lengthen it.
	TTL time.Duration
	// Verified: the answer passed verification. Degraded and FromCache describe where the
	// answer came from (the request's QualityContext); each keeps it out of the cache.
	Verified  bool
	Degraded  bool
	FromCache bool
	// LeaseID ends the caller's coalescing lease: the waiters get the answer when it may be
	// stored, and look again when not.
	LeaseID string
}

// StoreResult says whether the answer was stored, under which id, or why not.
type StoreResult struct {
	Stored        bool
	EntryID       string
	SkippedReason SkipReason
}

// InvalidateRequest selects the tenant's entries to remove. Scenario, EntryID and
// Namespace narrow the selection; All must be set to remove the whole tenant, so a request
// with every field forgotten removes nothing.
type InvalidateRequest struct {
	Tenant    string
	Scenario  string
	EntryID   string
	Namespace string
	All       bool
}

// Deps are what a Service is built on.
type Deps struct {
	Index Index
	// Embedder is nil for exact matching only.
	Embedder Embedder
	Clock    clockwork.Clock
	Metrics  prometheus.Registerer
	Log      *slog.Logger
}

// Service is the cache: it derives keys, applies the policies, matches exactly and by
// similarity, coalesces identical requests, and keeps entries in an Index. It is safe for
// concurrent use.
type Service struct {
	index         Index
	embedder      Embedder
	namespace     string
	clock         clockwork.Clock
	log           *slog.Logger
	defaultPolicy policy
	scenarios     map[string]policy
	metrics       *metrics
	leases        *leases
	coalesce      CoalesceConfig
	embedTimeout  time.Duration
	// embedWaits is false for an embedder that computes without waiting on anything (the
	// lexical one): a deadline could not stop it, so it gets none.
	embedWaits bool
	// indexCooldown and embedCooldown skip a failing dependency for a while.
	indexCooldown *cooldown
	embedCooldown *cooldown
	// stats count ordinary lookups and hits for DescribeStats.
	stats *lookupStats
}

// candidateLimit is how many nearest entries a similarity search returns: the best one
// may be rejected as a near miss while the next is a true paraphrase.
const candidateLimit = 5

// reportMargin widens the search below the threshold, so that the closest candidate that
// missed it can be reported (the similarity histogram and LookupResponse.rejected are how
// thresholds get tuned).
const reportMargin = 0.05

// NewService returns a Service over deps.Index, with metrics registered on deps.Metrics.
func NewService(cfg Config, deps Deps) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Index == nil || deps.Clock == nil || deps.Metrics == nil {
		return nil, errors.New("cache: NewService needs an index, a clock and a metrics registry")
	}
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(deps.Metrics, slices.Collect(maps.Keys(cfg.Scenarios)))
	if err != nil {
		return nil, err
	}
	namespace := namespaceExact
	if deps.Embedder != nil {
		namespace = deps.Embedder.Namespace()
	}
	defaults := defaultThresholds(cfg.Embedder.Kind)
	scenarios := make(map[string]policy, len(cfg.Scenarios))
	for name, override := range cfg.Scenarios {
		scenarios[name] = compilePolicy(cfg.DefaultPolicy.with(override), defaults)
	}
	return &Service{
		index:         deps.Index,
		embedder:      deps.Embedder,
		namespace:     namespace,
		clock:         deps.Clock,
		log:           deps.Log,
		defaultPolicy: compilePolicy(cfg.DefaultPolicy, defaults),
		scenarios:     scenarios,
		metrics:       m,
		leases:        newLeases(),
		coalesce:      cfg.Coalesce,
		embedTimeout:  cfg.Embedder.Timeout,
		embedWaits:    !computesInPlace(deps.Embedder),
		indexCooldown: newCooldown(deps.Clock),
		embedCooldown: newCooldown(deps.Clock),
		stats:         newLookupStats(deps.Clock.Now()),
	}, nil
}

// Namespace returns the embedder namespace entries are stored and found under.
func (s *Service) Namespace() string { return s.namespace }

// Lookup returns the tenant's best answer for req, or a miss. Only invalid requests and a
// cancelled caller are errors: a failing backend or embedder is a miss with a MissReason.
func (s *Service) Lookup(ctx context.Context, tenant string, req LookupRequest) (LookupResult, error) {
	if tenant == "" {
		return LookupResult{}, ErrNoTenant
	}
	if err := validatePrompt(req.Prompt).OrNil(); err != nil {
		return LookupResult{}, err
	}
	scenario := s.metrics.scenario(req.Prompt.Scenario)
	res, err := s.lookup(ctx, tenant, req, scenario)
	if err != nil {
		return LookupResult{}, err
	}
	if req.Mode == ModeNormal {
		s.stats.record(scenario, res.Hit)
	}
	if res.Hit {
		s.metrics.lookups.WithLabelValues(scenario, "hit", string(res.Match)).Inc()
		if res.Stale {
			s.metrics.degraded.WithLabelValues(scenario, "stale").Inc()
		}
		if res.Approximate {
			s.metrics.degraded.WithLabelValues(scenario, "approximate").Inc()
		}
	} else {
		s.metrics.lookups.WithLabelValues(scenario, "miss", string(MatchNone)).Inc()
		if res.MissReason != "" {
			s.metrics.skips.WithLabelValues(scenario, res.MissReason).Inc()
		}
	}
	return res, nil
}

func (s *Service) lookup(ctx context.Context, tenant string, req LookupRequest, scenario string) (LookupResult, error) {
	res := LookupResult{Match: MatchNone, Namespace: s.namespace}
	k := deriveKeys(tenant, s.namespace, req.Prompt)
	pol := s.policyFor(req.Prompt.Scenario)
	if reason := pol.promptSkip(req.Prompt, k.Normalized); reason == SkipPersonalPrompt && req.Prompt.EndUser != "" {
		req.Prompt = endUserScope(req.Prompt)
		k = deriveKeys(tenant, s.namespace, req.Prompt)
	} else if reason != "" {
		res.MissReason = string(reason)
		res.StoreDeclined = true
		return res, nil
	}
	now := s.clock.Now()

	// Read before the index: a lease on the key that ends after this shows in it
	// (coalesceMiss).
	seen := s.leases.version(k.Exact)
	// Exact first: the same normalised question in the same scope needs no embedding.
	if e, ok, err := s.get(ctx, k.Exact, now); err != nil {
		if ctx.Err() != nil {
			return LookupResult{}, ctx.Err()
		}
		res.MissReason = MissBackendError
	} else if ok && (e.freshAt(now) || req.Mode != ModeNormal) && s.admits(k.Question, e, 1, scenario, &res) {
		return s.hit(res, e, 1, MatchExact, now, pol, req.Mode), nil
	}

	emb := embedding{question: k.Question}
	if res.MissReason == "" && s.embedder != nil {
		v, near, err := s.searchSimilar(ctx, tenant, req, k, pol, now, scenario, &res)
		if err != nil {
			return LookupResult{}, err
		}
		if res.Hit {
			return res, nil
		}
		emb.vector, emb.near = v, near
	}
	if !req.Coalesce {
		return res, nil
	}
	return s.coalesceMiss(ctx, tenant, req, k, res, pol, emb, seen)
}

// searchSimilar embeds the question and looks for a close enough entry in its partition.
// It fills res with a hit, or with the closest rejection and a miss reason, and returns
// the question's vector (zero when it has none) and, when the index recorded it for a lease
// (req.Coalesce), what its search found near the vector.
func (s *Service) searchSimilar(ctx context.Context, tenant string, req LookupRequest, k keys, pol policy, now time.Time, scenario string, res *LookupResult) (vector.Vector, *vector.Near, error) {
	v, err := s.embed(ctx, k.Question)
	if errors.Is(err, vector.ErrZero) {
		return vector.Vector{}, nil, nil // nothing to compare: only exact matches are possible
	}
	if err != nil {
		if ctx.Err() != nil {
			return vector.Vector{}, nil, ctx.Err()
		}
		res.MissReason = MissEmbedderError
		return vector.Vector{}, nil, nil
	}
	var near *vector.Near
	if req.Coalesce {
		// A miss takes a lease, and the store that answers it puts the same vector.
		near = new(vector.Near)
	}
	th := pol.thresholds
	floor := th.normal
	if req.Mode == ModeApproximate {
		floor = th.approximate
	}
	candidates, err := s.search(ctx, Query{
		Tenant:    tenant,
		Partition: k.Partition,
		Namespace: s.namespace,
		Vector:    v,
		Limit:     candidateLimit,
		MinScore:  float32(max(0, floor-reportMargin)),
		Now:       now,
		FreshOnly: req.Mode == ModeNormal,
		Near:      near,
	})
	if err != nil {
		if ctx.Err() != nil {
			return vector.Vector{}, nil, ctx.Err()
		}
		res.MissReason = MissBackendError
		return v, nil, nil
	}
	var query nearmiss.Signature
	if len(candidates) > 0 {
		query = nearmiss.Extract(k.Question)
	}
	for _, c := range candidates {
		score := math.Min(float64(c.Score), 1) // float rounding can put an identical vector a hair above 1
		need := th.normal
		switch {
		case req.Mode == ModeApproximate:
			need = th.approximate
		case !c.Entry.freshAt(now):
			need = th.stale
		}
		reason, detail := "", ""
		if score < need {
			reason, detail = rejectBelowThreshold, fmt.Sprintf("%.3f below %.2f", score, need)
			if !c.Entry.freshAt(now) {
				detail += " (stale entry)"
			}
		} else if r, d := nearmiss.CompareSignatures(query, nearmiss.Extract(c.Entry.Question)); r != "" {
			reason, detail = string(r), d
		}
		if reason != "" {
			s.metrics.rejections.WithLabelValues(scenario, reason).Inc()
			if res.Rejected == nil {
				res.Rejected = &Rejection{EntryID: c.Entry.ID, Similarity: score, Reason: reason, Detail: detail}
			}
			continue
		}
		if t, ok := s.index.(interface{ Touch(Key) }); ok {
			t.Touch(c.Entry.Key)
		}
		s.metrics.similarity.WithLabelValues(scenario, "hit").Observe(score)
		*res = s.hit(*res, c.Entry, score, MatchSemantic, now, pol, req.Mode)
		return v, nil, nil
	}
	if res.Rejected != nil {
		s.metrics.similarity.WithLabelValues(scenario, "rejected").Observe(res.Rejected.Similarity)
	}
	return v, near, nil
}

// endUserScope returns p scoped to its end user: the user joins the context fingerprint,
// which is hashed into the partition, so the exact key, the vector search and coalescing
// all stay within that user's entries. The user is length-prefixed so no choice of user
// and fingerprint spells another pair's. The policy treats the scoped prompt as personal
// still; callers check it before scoping.
func endUserScope(p Prompt) Prompt {
	p.ContextFingerprint = fmt.Sprintf("end_user:%d:%s\x00%s", len(p.EndUser), p.EndUser, p.ContextFingerprint)
	return p
}

// admits runs the near-miss check on an entry found by its exact key or handed over by a
// coalescing lease. The exact key normalises case and the punctuation at either end, so
// "-5" and "5", or "50%" and "50", share a key while asking different things; the check
// reads the questions as written. A rejection is recorded in res and the metrics.
func (s *Service) admits(question string, e Entry, similarity float64, scenario string, res *LookupResult) bool {
	if question == e.Question {
		return true // the same text agrees with itself (FuzzCompare holds the check to that)
	}
	r, d := nearmiss.Compare(question, e.Question)
	if r == "" {
		return true
	}
	s.metrics.rejections.WithLabelValues(scenario, string(r)).Inc()
	if res.Rejected == nil {
		res.Rejected = &Rejection{EntryID: e.ID, Similarity: similarity, Reason: string(r), Detail: d}
	}
	return false
}

// hit fills res with e as the answer.
func (s *Service) hit(res LookupResult, e Entry, similarity float64, match MatchKind, now time.Time, pol policy, mode Mode) LookupResult {
	res.Hit, res.Entry, res.Similarity, res.Match = true, e, similarity, match
	res.Stale = !e.freshAt(now)
	res.Approximate = mode == ModeApproximate && similarity < pol.thresholds.normal
	res.Age = max(0, now.Sub(e.CreatedAt))
	res.MissReason = ""
	return res
}

// coalesceMiss turns a miss into a lease, or waits for the lease another lookup holds
// (and says how long in the result's Waited).
//
// seen is the lease table's version of the key (leases.version) from before the lookup
// read the index. The holder of a lease writes its entry and then ends the lease; a
// lookup that read the index before the write and reaches the lease table after the end
// gets a new lease, and would miss an answer that is in: with router.async_cache_store the
// caller's next identical request, sent once the first answer came back, is that lookup.
// A changed version says a lease on the key (or its bucket) ended since, and the key is
// read once more.
func (s *Service) coalesceMiss(ctx context.Context, tenant string, req LookupRequest, k keys, res LookupResult, pol policy, emb embedding, seen uint64) (out LookupResult, err error) {
	start := s.clock.Now()
	waited := false
	defer func() {
		if waited && err == nil {
			out.Waited = s.clock.Since(start)
		}
	}()
	wait := s.coalesce.MaxWait
	if req.MaxWait > 0 && req.MaxWait < wait {
		wait = req.MaxWait
	}
	// Give up waiting a little before the caller's deadline, so it gets a miss it can act
	// on rather than a deadline error.
	if d, ok := ctx.Deadline(); ok {
		if left := time.Until(d) * 9 / 10; left < wait {
			wait = left
		}
	}
	giveUp := start.Add(wait)
	for {
		now := s.clock.Now()
		expires := now.Add(s.coalesce.LeaseTTL)
		if !req.Deadline.IsZero() && req.Deadline.Before(expires) {
			expires = req.Deadline
		}
		mine, theirs := s.leases.acquire(k.Exact, tenant, now, expires, emb)
		if mine != nil && s.leases.version(k.Exact) != seen {
			if e, ok, err := s.get(ctx, k.Exact, now); err == nil && ok && (e.freshAt(now) || req.Mode != ModeNormal) &&
				s.admits(k.Question, e, 1, s.metrics.scenario(req.Prompt.Scenario), &res) {
				s.leases.finish(mine.id, tenant, &e) // whoever joined the new lease gets the entry too
				s.metrics.coalesce.WithLabelValues("overtaken").Inc()
				return s.hit(res, e, 1, MatchExact, now, pol, req.Mode), nil
			}
		}
		if mine != nil {
			s.metrics.coalesce.WithLabelValues("leased").Inc()
			res.Lease = &Lease{ID: mine.id, ExpiresAt: mine.expires}
			return res, nil
		}
		if !now.Before(giveUp) {
			s.metrics.coalesce.WithLabelValues("timeout").Inc()
			res.MissReason = MissCoalesceTimeout
			return res, nil
		}
		// One timer for whichever comes first: the lease's expiry or the end of the wait.
		until := min(theirs.expires.Sub(now), giveUp.Sub(now))
		timer := s.clock.NewTimer(until)
		waited = true
		select {
		case <-theirs.done:
			timer.Stop()
			if theirs.entry != nil {
				if !s.admits(k.Question, *theirs.entry, 1, s.metrics.scenario(req.Prompt.Scenario), &res) {
					// Same normalised text, other meaning ("-5" and "5"): this caller asks
					// the model itself.
					return res, nil
				}
				s.metrics.coalesce.WithLabelValues("joined").Inc()
				return s.hit(res, *theirs.entry, 1, MatchCoalesced, s.clock.Now(), pol, req.Mode), nil
			}
			// Released or expired without an answer: look once more (another path may have
			// stored one), then try for the lease.
			s.metrics.coalesce.WithLabelValues("retried").Inc()
			seen = s.leases.version(k.Exact)
			if e, ok, err := s.get(ctx, k.Exact, s.clock.Now()); err == nil && ok && e.freshAt(s.clock.Now()) &&
				s.admits(k.Question, e, 1, s.metrics.scenario(req.Prompt.Scenario), &res) {
				return s.hit(res, e, 1, MatchExact, s.clock.Now(), pol, req.Mode), nil
			}
		case <-timer.Chan():
			s.leases.expire(theirs, s.clock.Now())
		case <-ctx.Done():
			timer.Stop()
			return LookupResult{}, ctx.Err()
		}
	}
}

// get reads an entry unless the index is cooling down after failures.
func (s *Service) get(ctx context.Context, key Key, now time.Time) (Entry, bool, error) {
	if !s.indexCooldown.allow() {
		s.metrics.errors.WithLabelValues("get").Inc()
		return Entry{}, false, errCooldown
	}
	e, ok, err := s.index.Get(ctx, s.namespace, key, now)
	s.indexCooldown.record(ctx, err)
	if err != nil {
		s.metrics.errors.WithLabelValues("get").Inc()
		s.log.WarnContext(ctx, "cache: index get failed; serving a miss", "err", err)
	}
	return e, ok, err
}

func (s *Service) search(ctx context.Context, q Query) ([]Candidate, error) {
	if !s.indexCooldown.allow() {
		s.metrics.errors.WithLabelValues("search").Inc()
		return nil, errCooldown
	}
	c, err := s.index.Search(ctx, q)
	s.indexCooldown.record(ctx, err)
	if err != nil {
		s.metrics.errors.WithLabelValues("search").Inc()
		s.log.WarnContext(ctx, "cache: index search failed; serving a miss", "err", err)
	}
	return c, err
}

// embed embeds text within the embedder timeout, unless the embedder is cooling down.
func (s *Service) embed(ctx context.Context, text string) (vector.Vector, error) {
	if !s.embedCooldown.allow() {
		s.metrics.errors.WithLabelValues("embed").Inc()
		return vector.Vector{}, errCooldown
	}
	ectx := ctx
	if s.embedWaits {
		var cancel context.CancelFunc
		ectx, cancel = context.WithTimeout(ctx, s.embedTimeout)
		defer cancel()
	}
	v, err := s.embedder.Embed(ectx, text)
	if errors.Is(err, vector.ErrZero) {
		return v, err
	}
	s.embedCooldown.record(ctx, err)
	if err != nil {
		s.metrics.errors.WithLabelValues("embed").Inc()
		s.log.WarnContext(ctx, "cache: embedding failed", "err", err)
	}
	return v, err
}

// errCooldown is the error of a call skipped because its dependency failed repeatedly.
var errCooldown = errors.New("skipped: failing repeatedly, cooling down")

// Store records req's answer for tenant unless the scenario's policy forbids it; a
// forbidden answer is a StoreResult with a SkippedReason, not an error. With a lease id it
// also ends the lease: its waiters get the answer when policy allows it, even if the
// backend then fails to keep it.
func (s *Service) Store(ctx context.Context, tenant string, req StoreRequest) (StoreResult, error) {
	if tenant == "" {
		return StoreResult{}, ErrNoTenant
	}
	invalid := validatePrompt(req.Prompt)
	if req.Content == "" && len(req.ToolCalls) == 0 {
		invalid.Add("content", "required (or tool_calls)")
	}
	if req.TTL < 0 {
		invalid.Add("ttl", "must not be negative, got %s", req.TTL)
	}
	if err := invalid.OrNil(); err != nil {
		return StoreResult{}, err
	}

	pol := s.policyFor(req.Prompt.Scenario)
	k := deriveKeys(tenant, s.namespace, req.Prompt)
	var held *lease
	if req.LeaseID != "" {
		held = s.leases.find(req.LeaseID, tenant)
	}
	var promptReason SkipReason
	if held == nil || held.key != k.Exact {
		// A personal prompt asked for a known end user is kept in that user's scope; its
		// lease, if any, was taken in the same scope by the lookup.
		promptReason = pol.promptSkip(req.Prompt, k.Normalized)
		if promptReason == SkipPersonalPrompt && req.Prompt.EndUser != "" {
			req.Prompt = endUserScope(req.Prompt) // the reason stays: scoping changes no text
			k = deriveKeys(tenant, s.namespace, req.Prompt)
		}
	}
	// Otherwise the prompt is the one whose lookup took the lease in the shared scope,
	// which it does only when the prompt scans find nothing (promptReason stays ""): the
	// exact key covers all they read (tenant, scenario and so its policy, the temperature's
	// bucket, the earlier turns, the normalised question), and they are the dearest checks.
	if held != nil && held.key != k.Exact {
		// A lease for another prompt: its waiters asked something else. Let them look
		// again rather than hand them this answer.
		s.leases.finish(held.id, tenant, nil)
		held = nil
	}
	if reason := pol.storeSkip(req, promptReason); reason != "" {
		if held != nil {
			s.leases.finish(held.id, tenant, nil)
		}
		s.metrics.stores.WithLabelValues(string(reason)).Inc()
		return StoreResult{SkippedReason: reason}, nil
	}

	ttl := pol.ttl
	if req.TTL > 0 && req.TTL < ttl {
		ttl = req.TTL
	}
	now := s.clock.Now()
	e := Entry{
		ID:           rand.Text(),
		Key:          k.Exact,
		Partition:    k.Partition,
		Tenant:       tenant,
		Scenario:     req.Prompt.Scenario,
		Namespace:    s.namespace,
		Question:     k.Question,
		Content:      req.Content,
		SourceModel:  req.SourceModel,
		FinishReason: req.FinishReason,
		ToolCalls:    req.ToolCalls,
		Usage:        req.Usage,
		CreatedAt:    now,
		ExpiresAt:    now.Add(ttl),
		StaleUntil:   now.Add(ttl + pol.maxStaleness),
	}
	if held != nil {
		// The waiters get the answer now; the lease stays until the entry is in the index,
		// so that an identical lookup in between joins it instead of missing.
		s.leases.answer(held.id, tenant, &e)
		defer s.leases.finish(held.id, tenant, nil)
	}
	var v vector.Vector
	var near *vector.Near
	if s.embedder != nil {
		var err error
		var ok bool
		// The lookup that took the lease embedded this question already; without a
		// vector the entry still serves exact matches.
		if v, near, ok = held.vectorFor(k.Question); !ok {
			if v, err = s.embed(ctx, k.Question); err != nil && !errors.Is(err, vector.ErrZero) && ctx.Err() != nil {
				return StoreResult{}, ctx.Err()
			}
		}
	}
	err := s.index.Put(ctx, e, v, near)
	if errors.Is(err, ErrNeedsVector) {
		s.metrics.stores.WithLabelValues(string(SkipNoVector)).Inc()
		return StoreResult{SkippedReason: SkipNoVector}, nil
	}
	s.indexCooldown.record(ctx, err)
	if err != nil {
		s.metrics.errors.WithLabelValues("put").Inc()
		return StoreResult{}, fmt.Errorf("put %s: %w", e.Key, err)
	}
	s.metrics.stores.WithLabelValues(outcomeStored).Inc()
	return StoreResult{Stored: true, EntryID: e.ID}, nil
}

// Release ends tenant's lease without an answer; it reports whether the lease was live.
func (s *Service) Release(_ context.Context, tenant, leaseID string) (bool, error) {
	if tenant == "" {
		return false, ErrNoTenant
	}
	if leaseID == "" {
		return false, rpc.Invalid("lease_id", "required")
	}
	return s.leases.finish(leaseID, tenant, nil), nil
}

// Invalidate removes the entries req selects and returns how many it removed.
func (s *Service) Invalidate(ctx context.Context, req InvalidateRequest) (int, error) {
	if req.Tenant == "" {
		return 0, ErrNoTenant
	}
	if !req.All && req.Scenario == "" && req.EntryID == "" && req.Namespace == "" {
		return 0, rpc.Invalid("all", "set scenario, entry_id, namespace, or all to remove every entry of the tenant")
	}
	removed, err := s.index.Delete(ctx, Filter{Tenant: req.Tenant, Scenario: req.Scenario, ID: req.EntryID, Namespace: req.Namespace})
	if err != nil {
		s.metrics.errors.WithLabelValues("delete").Inc()
		return 0, fmt.Errorf("delete: %w", err)
	}
	return removed, nil
}

// SweepLeases ends the leases expired at now.
func (s *Service) SweepLeases() int { return s.leases.sweep(s.clock.Now()) }

func (s *Service) policyFor(scenario string) policy {
	if p, ok := s.scenarios[scenario]; ok {
		return p
	}
	return s.defaultPolicy
}

// validatePrompt collects what makes p unusable as a key. Field paths follow the proto
// (prompt.messages[2].role), so callers can point at the offending field.
func validatePrompt(p Prompt) *rpc.ValidationError {
	invalid := &rpc.ValidationError{}
	if len(p.Messages) == 0 {
		invalid.Add("prompt.messages", "must not be empty")
	} else {
		last := len(p.Messages) - 1
		if role := p.Messages[last].Role; role != roleUser {
			invalid.Add(fmt.Sprintf("prompt.messages[%d].role", last), "the last message must be from the user, got %q", role)
		}
		if p.Messages[last].Content == "" {
			invalid.Add(fmt.Sprintf("prompt.messages[%d].content", last), "required")
		}
	}
	if t := p.Temperature; t != nil && (*t < 0 || math.IsNaN(*t) || math.IsInf(*t, 0)) {
		invalid.Add("prompt.temperature", "must be a non-negative number, got %v", *t)
	}
	if p.MaxTokens < 0 {
		invalid.Add("prompt.max_tokens", "must not be negative, got %d", p.MaxTokens)
	}
	if len(p.EndUser) > maxEndUser {
		invalid.Add("prompt.end_user", "at most %d bytes, got %d", maxEndUser, len(p.EndUser))
	}
	return invalid
}
