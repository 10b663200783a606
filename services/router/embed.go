package router

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/openaiapi"
	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// Embed answers an embeddings request: the route's embeddings models in order, through
// the same quota, breakers, cooldowns, bulkheads and retry budget as chat (no hedging, no
// verification: a vector has nothing to check but its shape), with an exact cache.
func (r *Router) Embed(ctx context.Context, req *routerv1.EmbedRequest) (*routerv1.EmbedResponse, error) {
	start := arrivalOf(ctx, r.deps.Clock.Now())
	rt, err := r.validateEmbed(req)
	if err != nil {
		return nil, err
	}
	creq := &routerv1.Request{Model: req.Model, Scenario: req.Scenario, Priority: req.Priority, User: req.User}
	qc := r.newQualityContext(ctx, creq, rt)
	if rpc.RequestID(ctx) != qc.RequestId { // made up by newQualityContext
		ctx = rpc.WithRequestID(ctx, qc.RequestId)
	}
	ctx, cancel := context.WithDeadline(ctx, qc.Deadline.AsTime())
	defer cancel()

	resp, err := r.embed(ctx, req, rt, qc)
	end := r.deps.Clock.Now()
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

// validateEmbed checks req's bounds and finds its route, which must be of embeddings
// models only.
func (r *Router) validateEmbed(req *routerv1.EmbedRequest) (*route, error) {
	if req == nil {
		return nil, rpc.Invalid("request", "required")
	}
	v := &rpc.ValidationError{}
	if req.Model == "" {
		v.Add("model", "required: name an embeddings model or route (GET /v1/models lists them)")
	}
	n := len(req.Input) + len(req.InputTokens)
	switch {
	case len(req.Input) > 0 && len(req.InputTokens) > 0:
		v.Add("input", "set input or input_tokens, not both")
	case n == 0:
		v.Add("input", "at least one input is required")
	case n > openaiapi.MaxEmbeddingInputs:
		v.Add("input", "at most %d inputs, got %d", openaiapi.MaxEmbeddingInputs, n)
	}
	size := 0
	for i, s := range req.Input {
		if s == "" {
			v.Add(fmt.Sprintf("input[%d]", i), "must not be empty")
		}
		size += len(s)
	}
	for i, t := range req.InputTokens {
		if len(t.GetTokens()) == 0 || len(t.GetTokens()) > openaiapi.MaxEmbeddingTokens {
			v.Add(fmt.Sprintf("input[%d]", i), "want 1 to %d tokens, got %d", openaiapi.MaxEmbeddingTokens, len(t.GetTokens()))
		}
		size += 4 * len(t.GetTokens())
	}
	if size > r.conf().MaxPromptBytes {
		v.Add("input", "inputs are %d bytes; the limit is %d (router.max_prompt_bytes)", size, r.conf().MaxPromptBytes)
	}
	if d := req.Dimensions; d != nil && (*d < 1 || *d > openaiapi.MaxEmbeddingDimensions) {
		v.Add("dimensions", "must be between 1 and %d, got %d", openaiapi.MaxEmbeddingDimensions, *d)
	}
	switch req.EncodingFormat {
	case "", "float", "base64":
	default:
		v.Add("encoding_format", "want float or base64, got %q", req.EncodingFormat)
	}
	if len(req.User) > 256 {
		v.Add("user", "at most 256 bytes")
	}
	if req.Scenario != "" && !validLabel(req.Scenario) {
		v.Add("scenario", "must be 1 to %d characters of a-z, A-Z, 0-9, '_', '-', '.' or ':'", maxLabelBytes)
	}
	if err := v.OrNil(); err != nil {
		return nil, err
	}
	rt, ok := r.table().routes[req.Model]
	if !ok {
		return nil, &unknownRouteError{name: req.Model}
	}
	for _, u := range rt.candidates {
		if !u.model.embeddings() {
			return nil, rpc.Invalid("model", "%q is a chat model or route: embeddings need a model with capabilities.embeddings (%s is not one)", req.Model, u.model.Name)
		}
	}
	return rt, nil
}

// embed serves a validated request: cache, quota, the attempt loop, the cache again.
func (r *Router) embed(ctx context.Context, req *routerv1.EmbedRequest, rt *route, qc *mantlev1.QualityContext) (*routerv1.EmbedResponse, error) {
	key := embedKey(qc.Tenant, rt.name, qc.Scenario, req)
	if e, ok := r.embedCache.get(key, r.deps.Clock.Now()); ok {
		qc.CacheHit, qc.CacheSimilarity = true, 1
		qc.CurrentModel = e.model
		qc.FallbackLevel = mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY
		r.audit(qc, "lookup", "embeddings: exact hit", 0)
		return embedResponse(e.model, e.vectors, &mantlev1.Usage{}, qc, nil), nil
	}
	var messages []*mantlev1.ChatMessage
	var tokens int64
	for _, s := range req.Input {
		messages = append(messages, &mantlev1.ChatMessage{Role: "user", Content: s})
	}
	for _, t := range req.InputTokens {
		tokens += int64(len(t.GetTokens()))
	}
	// An embedding has no output: one token is the least quota accepts.
	granted, err := r.reserveTokens(ctx, rt, qc, 1, messages, nil, tokens)
	if err != nil {
		return nil, err
	}
	reservation, limits := granted.id, granted.limits
	preq := provider.EmbedRequest{Input: req.Input, User: req.User}
	for _, t := range req.InputTokens {
		preq.InputTokens = append(preq.InputTokens, t.GetTokens())
	}
	if req.Dimensions != nil {
		d := int(*req.Dimensions)
		preq.Dimensions = &d
	}
	res, c, err := r.embedAttempts(ctx, preq, rt, qc)
	r.settle(ctx, qc, reservation, qc.Usage)
	if err != nil {
		return nil, err
	}
	// Vectors of a backup model live in another space: only the first choice's are kept,
	// so a hit never mixes them into the caller's index later.
	if c.level == mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY {
		r.embedCache.put(key, embedEntry{model: c.u.model.Name, vectors: res.Vectors}, r.deps.Clock.Now())
	}
	return embedResponse(c.u.model.Name, res.Vectors, qc.Usage, qc, limits), nil
}

func embedResponse(model string, vectors [][]float32, usage *mantlev1.Usage, qc *mantlev1.QualityContext, limits *routerv1.RateLimit) *routerv1.EmbedResponse {
	out := &routerv1.EmbedResponse{Model: model, Usage: usage, Quality: qc, RateLimit: limits, Data: make([]*routerv1.Embedding, len(vectors))}
	for i, v := range vectors {
		out.Data[i] = &routerv1.Embedding{Index: int32(i), Vector: v}
	}
	return out
}

// embedKey names an embeddings answer: everything that changes the vectors, length-prefixed
// so no two requests collide.
func embedKey(tenant, route, scenario string, req *routerv1.EmbedRequest) [sha256.Size]byte {
	h := sha256.New()
	var b []byte
	field := func(s string) {
		b = binary.AppendUvarint(b[:0], uint64(len(s)))
		h.Write(b)
		h.Write([]byte(s))
	}
	field("mantle.embed/v1")
	field(tenant)
	field(route)
	field(scenario)
	dims := ""
	if req.Dimensions != nil {
		dims = strconv.Itoa(int(*req.Dimensions))
	}
	field(dims)
	field(req.EncodingFormat)
	field(strconv.Itoa(len(req.Input)))
	for _, s := range req.Input {
		field(s)
	}
	field(strconv.Itoa(len(req.InputTokens)))
	for _, t := range req.InputTokens {
		b = binary.AppendUvarint(b[:0], uint64(len(t.GetTokens())))
		for _, tok := range t.GetTokens() {
			b = binary.AppendVarint(b, tok)
		}
		h.Write(b)
	}
	var k [sha256.Size]byte
	h.Sum(k[:0])
	return k
}

// embedAttempts is the attempt loop of an embeddings request: attempt's, without hedges,
// streams or verification.
func (r *Router) embedAttempts(ctx context.Context, preq provider.EmbedRequest, rt *route, qc *mantlev1.QualityContext) (provider.EmbedResponse, *candidate, error) {
	p := r.newPlan(rt, qc.Scenario)
	r.budget.Request()
	for ctx.Err() == nil {
		c := p.next()
		if c == nil {
			break
		}
		remaining := qc.Deadline.AsTime().Sub(r.deps.Clock.Now()) - r.conf().HopReserve
		if remaining <= 0 {
			break
		}
		if wait := r.waitBefore(c); p.attempts > 0 && wait > 0 {
			if !r.budget.Allowed(false) {
				r.denyRetry(qc, p)
				break
			}
			if wait >= remaining {
				c.exhausted = true
				continue
			}
			slept := r.deps.Clock.Now()
			woke := r.sleep(ctx, wait)
			addWait(qc, r.deps.Clock.Since(slept))
			if !woke {
				c.exhausted = true
				continue
			}
		}
		key, permit, skip := r.acquire(c.u, p.breakerScenario, p.avoid)
		if key == nil {
			r.skipCandidate(qc, p, c, skip)
			continue
		}
		release, ok := c.u.bulkhead.TryAcquire()
		if !ok {
			permit.Cancel()
			r.skipCandidate(qc, p, c, mantlev1.ErrorClass_ERROR_CLASS_BULKHEAD_FULL)
			continue
		}
		if p.attempts > 0 && !p.isFailover(c, permit) && !r.allowRetry(ctx, qc, p.budgetKey(c, key), p.sharedKey, false) {
			permit.Cancel()
			release()
			r.denyRetry(qc, p)
			break
		}
		if p.attempts > 0 {
			r.deps.Metrics.retries.WithLabelValues(c.u.model.Name, shortClass(p.prefer)).Inc()
		} else {
			key.budget.Request()
		}
		p.attempts++
		p.last = c
		s := slot{c: c, key: key, permit: permit}
		actx, span := r.startAttempt(ctx, qc, s)
		o, res := r.callEmbed(actx, s, preq, qc.Tenant)
		r.endAttempt(span, o)
		release()
		r.record(qc, o)
		if o.err == nil {
			qc.CurrentModel, qc.CurrentProvider = c.u.model.Name, c.u.provider
			qc.FallbackLevel = c.level
			if c.level != mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY && qc.DegradationReason == "" {
				qc.DegradationReason = "primary unavailable"
			}
			return res, c, nil
		}
		class := provider.ClassOf(o.err)
		p.lastErr = o.err
		p.failed = append(p.failed, c.u.model.Name)
		qc.DegradationReason = fmt.Sprintf("%s failed: %s", c.u.model.Name, shortClass(class))
		if ctx.Err() != nil {
			break
		}
		if !failsOver(class) {
			return provider.EmbedResponse{}, nil, &rejectedError{class: class, cause: o.err}
		}
		r.afterFailure(p, o)
	}
	return provider.EmbedResponse{}, nil, r.exhausted(ctx, qc, p)
}

// callEmbed makes one embeddings call on key and books it like a chat call.
func (r *Router) callEmbed(ctx context.Context, s slot, preq provider.EmbedRequest, tenant string) (outcome, provider.EmbedResponse) {
	u, key := s.c.u, s.key
	preq.Model = u.upstreamModel()
	remaining := max(time.Until(deadlineOf(ctx))-r.conf().HopReserve, time.Millisecond)
	limit := min(u.timeout, remaining)
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	start := r.deps.Clock.Now()
	o := outcome{slot: s, att: &mantlev1.Attempt{Model: u.model.Name, Provider: u.provider, KeyId: key.id, StartedAt: timestamppb.New(start)}}
	key.stats.start()
	var res provider.EmbedResponse
	if e, ok := key.client.(provider.Embedder); ok {
		res, o.err = e.Embed(ctx, preq)
	} else {
		o.err = &provider.Error{Class: mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST, Message: "provider " + u.provider + " has no embeddings API"}
	}
	switch {
	case o.err != nil:
	case len(res.Vectors) != max(len(preq.Input), len(preq.InputTokens)):
		o.err = &provider.Error{Class: mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT, Message: "wrong number of embeddings"}
	case preq.Dimensions != nil && len(res.Vectors[0]) != *preq.Dimensions:
		// A provider that ignored dimensions: vectors of another size would break the
		// caller's index, so they are a malformed answer and another model is asked.
		o.err = &provider.Error{Class: mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
			Message: fmt.Sprintf("%d dimensions, %d were asked for", len(res.Vectors[0]), *preq.Dimensions)}
	}
	o.res = provider.Response{Usage: res.Usage, RateLimit: res.RateLimit, RequestID: res.RequestID, Model: res.Model}
	r.finishCall(ctx, &o, start, callLimit{limit: limit, cut: limit < u.timeout}, tenant)
	return o, res
}

// isEmbeddingsRoute reports whether rt answers embeddings, for the chat door's refusal.
func isEmbeddingsRoute(rt *route) bool {
	return len(rt.candidates) > 0 && rt.candidates[0].model.embeddings()
}
