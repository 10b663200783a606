package router

import (
	"context"
	"errors"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/pbtime"
	"github.com/mantle-mesh/mantle/pkg/provider"
)

// try makes one attempt: the provider call, the breaker and cooldown bookkeeping, and for
// unary answers the verification. It does not touch qc (hedges run concurrently); the
// caller applies the outcome with record.
func (r *Router) try(ctx context.Context, x *exchange, s slot) outcome {
	o := r.run(ctx, x, s)
	r.record(x.qc, o)
	return o
}

// run is try without recording, safe to call concurrently for hedges.
func (r *Router) run(ctx context.Context, x *exchange, s slot) outcome {
	req, qc, sink := x.req, x.qc, x.sink
	actx, span := r.startAttempt(ctx, qc, s)
	o := r.call(actx, x, s)
	defer func() { r.endAttempt(span, o) }() // after verification: its verdict is the attempt's outcome
	o.streamed = sink != nil
	if o.err == nil && sink != nil && len(o.held) > 0 {
		// An answer that is only tool calls was held back whole: it is checked like a unary
		// answer before the caller gets any of it, so a bad call fails over instead.
		o.verdict, o.audit, o.err = r.verify(ctx, req, qc, s.c.answerer(), &o.res, o.audit)
		if o.err != nil {
			o.att.ErrorClass = provider.ClassOf(o.err)
			o.att.ErrorMessage = o.err.Error()
			return o
		}
		o.verified = true
		for _, d := range o.held {
			if err := sink(d); err != nil {
				o.err = err
				o.att.ErrorClass, o.att.ErrorMessage = provider.ClassOf(err), err.Error()
				break
			}
		}
		o.committed = true
	}
	if o.err == nil && sink == nil {
		o.verdict, o.audit, o.err = r.verify(ctx, req, qc, s.c.answerer(), &o.res, o.audit)
		if o.err != nil {
			o.att.ErrorClass = provider.ClassOf(o.err)
			o.att.ErrorMessage = o.err.Error()
		}
	}
	return o
}

// call makes the provider call and keeps the breaker, cooldown and statistics of the key.
// It reads only x's route, provider request, sink and tenant.
func (r *Router) call(ctx context.Context, x *exchange, s slot) outcome {
	u, key, sink := s.c.u, s.key, x.sink
	preq := x.preq
	if s.c.fast {
		preq = fastRequest(preq, x.rt.ladder.FastAnswer)
	}
	preq.Model = u.upstreamModel()
	remaining := max(time.Until(deadlineOf(ctx))-r.conf().HopReserve, time.Millisecond)
	// The per-try timeout bounds a unary call. A stream is bounded by it only until its first
	// token (see stream): a healthy long answer must not be cut, and the stall limit guards
	// the rest.
	limit := min(u.timeout, remaining)
	if sink != nil {
		limit = remaining
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	start := r.deps.Clock.Now()
	o := outcome{slot: s, att: &mantlev1.Attempt{
		Model: u.model.Name, Provider: u.provider, KeyId: key.id, StartedAt: timestamppb.New(start), Hedged: s.hedged,
	}}
	key.stats.start()
	if sink == nil {
		o.res, o.err = key.client.Complete(ctx, preq)
	} else {
		hold := &toolHold{next: sink, calls: new(provider.ToolCallAssembler)}
		held := *x
		held.preq, held.sink, held.tools = preq, hold.sink, hold.calls
		o.res, o.committed, o.err = r.stream(ctx, &held, s, o.att, start)
		if !hold.passing {
			// Only tool calls so far, and the caller has none of them: not committed.
			o.committed, o.held = false, hold.held()
		}
	}
	t := callLimit{limit: limit, cut: limit < u.timeout}
	if sink != nil {
		t = callLimit{} // a stream's limits are its first-token and stall timeouts (see stream)
	}
	r.finishCall(ctx, &o, start, t, x.tenant)
	return o
}

// callLimit is the time limit a provider call ran under: limit (0 when the call had none
// of its own), and cut when that was the request's remaining budget, shorter than the
// provider's timeout.
type callLimit struct {
	limit time.Duration
	cut   bool
}

// finishCall books a provider call that ended: the key's statistics, cooldown and
// breaker, the attempt's record, metrics and audit step. t is the call's time limit.
func (r *Router) finishCall(ctx context.Context, o *outcome, start time.Time, t callLimit, tenant string) {
	u, key, permit := o.c.u, o.key, o.permit
	latency := r.deps.Clock.Since(start)
	class := provider.ClassOf(o.err)
	timedOut := class == mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT
	late := timedOut && (lateTimeout(latency, t.limit) || r.starved(t.limit))
	key.stats.finish(latency, o.err != nil, timedOut && !late && !t.cut)
	r.observe(ctx, tenant, key, o.res.RateLimit)
	switch {
	case late:
		// This process noticed the call's deadline late, or its goroutines waited long for
		// a CPU: it was short of CPU (a busy machine, a long pause), and the answer may
		// have been there, unread. The timeout is then this process's as much as the
		// provider's, so the breaker gets no verdict (a probe or scout stays spent).
		// Counting such timeouts opened the breakers of healthy models in mantle drill on
		// a loaded machine, which sent their requests down the ladder to templates.
		permit.Abandon()
		r.deps.Metrics.lateTimeouts.WithLabelValues(u.model.Name).Inc()
	case timedOut && t.cut:
		// The request's deadline, not the provider's timeout, ended the call: the provider
		// was given less time than it is allowed, which says nothing about its health.
		permit.Abandon()
	case class == mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED:
		// A 429 is the key's quota, not the provider's health: cool the key, spare the breaker.
		hint := retryAfter(o.err)
		if hint <= 0 {
			hint = r.conf().Retry.BackoffCap
		}
		key.cooldown.Set(hint)
		permit.Abandon() // it reached the provider: a half-open place stays spent
	case class == mantlev1.ErrorClass_ERROR_CLASS_CANCELED, o.err != nil && errors.Is(ctx.Err(), context.Canceled):
		// The call was sent and then we stopped listening: a hedge that lost, or a caller
		// that went away (mid-stream the error is the caller's, not the provider's). No
		// verdict on the provider, but the call did reach it, so a probe stays spent: Cancel
		// would let the next request probe again (mantle drill: 4-9 calls per half-open
		// period reached a recovering primary with hedging on; the cap is 3).
		permit.Abandon()
	default:
		permit.Done(breakerFailure(class), latency)
	}
	o.att.Latency = durationpb.New(latency)
	o.att.ErrorClass = class
	o.att.Usage = usageProto(o.res.Usage)
	o.att.ProviderRequestId = o.res.RequestID
	if o.err != nil {
		o.att.ErrorMessage = o.err.Error()
		var pe *provider.Error
		if errors.As(o.err, &pe) && pe.RequestID != "" {
			o.att.ProviderRequestId = pe.RequestID
		}
	}
	r.deps.Metrics.latency(u.model.Name, shortClass(class)).Observe(latency.Seconds())
	o.audit = append(o.audit, r.step("attempt", attemptDetail(u.provider, u.model.Name, key.id, class, o.hedged), latency))
}

// lateTimeout reports whether a call that timed out after latency, against its limit,
// was noticed more than a tenth of the limit late. A process that runs its timers that late
// was not running its goroutines either, and reading an answer takes several of them.
func lateTimeout(latency, limit time.Duration) bool {
	return limit > 0 && latency-limit > limit/10
}

// starved reports whether this process's goroutines waited for a CPU, at the P90 of the
// overload shedder's last interval, over a tenth of a call's limit: reading an answer
// takes several of those waits in a row, so a call timed out under them may have been
// answered in time. The reading is 0 while shedding is off (router.overload), and so
// is never starved then.
func (r *Router) starved(limit time.Duration) bool {
	return limit > 0 && r.shedder.Delay() > limit/10
}

// attemptDetail is an attempt's audit line, "provider/model key=id class=class", marked
// when the attempt was a hedge. Concatenated, not formatted: every attempt writes one.
func attemptDetail(provider, model, keyID string, class mantlev1.ErrorClass, hedged bool) string {
	return provider + "/" + model + " key=" + keyID + " class=" + shortClass(class) + hedgeNote(hedged)
}

func hedgeNote(hedged bool) string {
	if hedged {
		return " (hedge)"
	}
	return ""
}

// breakerFailure says which classes count against a provider's health. Request problems
// (bad request, context length, content filter) and answers that failed our own checks do
// not: the provider answered.
func breakerFailure(c mantlev1.ErrorClass) bool {
	switch c {
	case mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT,
		mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT, mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR,
		mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT, mantlev1.ErrorClass_ERROR_CLASS_UNKNOWN,
		mantlev1.ErrorClass_ERROR_CLASS_AUTH:
		return true
	}
	return false
}

func deadlineOf(ctx context.Context) time.Time {
	if dl, ok := ctx.Deadline(); ok {
		return dl
	}
	return time.Now().Add(time.Hour)
}

// record applies an outcome to the request's QualityContext.
func (r *Router) record(qc *mantlev1.QualityContext, o outcome) {
	o.att.Number = int32(len(qc.Attempts) + 1)
	qc.Attempts = append(qc.Attempts, o.att)
	if len(qc.Attempts) > 1 {
		qc.RetryCount++
	}
	r.addUsage(qc, o.c.u, o.res.Usage)
	qc.Audit = append(qc.Audit, o.audit...)
	if o.verdict != nil || (o.err == nil && !o.streamed) {
		applyVerdict(qc, o.verdict)
	}
	r.deps.Metrics.attempt(o.c.u.model.Name, shortClass(o.att.ErrorClass)).Inc()
}

// step is one of the router's audit steps, taken now.
func (r *Router) step(step, detail string, d time.Duration) *mantlev1.AuditStep {
	s := &auditStep{step: mantlev1.AuditStep{Service: "router", Step: step, Detail: detail}}
	pbtime.SetTimestamp(&s.at, r.deps.Clock.Now())
	pbtime.SetDuration(&s.duration, d)
	s.step.At, s.step.Duration = &s.at, &s.duration
	return &s.step
}

// auditStep is an audit step with its time and duration in one allocation instead of
// three: the router adds several to every request.
type auditStep struct {
	step     mantlev1.AuditStep
	at       timestamppb.Timestamp
	duration durationpb.Duration
}
