package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
)

// stream relays a provider stream. Nothing is sent to the caller until the first chunk
// arrived, so a candidate that fails before its first token can still be replaced. The
// route's first-token and stall limits cancel a stream that keeps the caller waiting.
// x.preq is the request as this attempt's model gets it.
func (r *Router) stream(ctx context.Context, x *exchange, s slot, att *mantlev1.Attempt, start time.Time) (provider.Response, bool, error) {
	rt, c, preq, sink := x.rt, s.c, x.preq, x.sink
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// Whatever the route says (the caller may have shortened the budget), an attempt that
	// never starts or stalls leaves a share of the time left for a fallback to continue or
	// restart it.
	ceiling := rescueCeiling(time.Until(deadlineOf(ctx)), r.conf().StreamRescueShare)
	firstToken, stall := min(rt.firstTokenTimeout, c.u.timeout, ceiling), min(rt.stallTimeout, ceiling)
	// One timer guards the whole stream: armed for the first token, then re-armed at every
	// piece for the stall limit (a timer and a closure a piece cost more than the piece's
	// own relay).
	var started atomic.Bool
	watchdog := r.deps.Clock.AfterFunc(firstToken, func() {
		if started.Load() {
			cancel(&provider.Error{Class: mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT, Message: fmt.Sprintf("stream stalled for %s", stall)})
			return
		}
		cancel(&provider.Error{Class: mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT, Message: fmt.Sprintf("no first token within %s", firstToken)})
	})
	defer watchdog.Stop()

	st, err := s.key.client.Stream(ctx, preq)
	if err != nil {
		return provider.Response{}, false, streamCause(ctx, err)
	}
	defer st.Close()
	var res provider.Response
	var content strings.Builder
	// Reassembled for verification, the idempotency record, the final message and what a
	// toolHold sends joined.
	tools := x.tools
	// answer is res with what the stream has said so far, however it ends.
	answer := func() provider.Response {
		res.Content, res.RequestID, res.ToolCalls = content.String(), st.RequestID(), tools.Calls()
		return res
	}
	committed := false
	for {
		chunk, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return answer(), committed, streamCause(ctx, err)
		}
		if chunk.Usage != nil {
			res.Usage = *chunk.Usage
		}
		if chunk.FinishReason != "" {
			res.FinishReason = chunk.FinishReason
		}
		if chunk.Empty() {
			continue
		}
		if !committed {
			started.Store(true) // before the re-arm: the timer's next firing is a stall
			ttft := r.deps.Clock.Since(start)
			att.Ttft = durationpb.New(ttft)
			r.deps.Metrics.ttft.WithLabelValues(c.u.model.Name).Observe(ttft.Seconds())
			committed = true
		}
		watchdog.Reset(stall)
		content.WriteString(chunk.Content)
		perr := tools.Add(chunk.ToolCalls)
		if perr == nil && content.Len()+tools.Bytes() > provider.MaxAnswerBytes {
			perr = &provider.Error{
				Class:   mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
				Message: fmt.Sprintf("streamed answer longer than %d bytes", provider.MaxAnswerBytes),
			}
		}
		if perr != nil {
			return answer(), committed, perr
		}
		if err := sink(Delta{Content: chunk.Content, Model: c.u.model.Name, Level: c.level, ToolCalls: chunk.ToolCalls, Logprobs: chunk.Logprobs, More: chunk.More}); err != nil {
			return answer(), true, err
		}
	}
	res.Model = preq.Model
	return answer(), committed, nil
}

// streamCause prefers the watchdog's reason over the bare cancellation it caused.
func streamCause(ctx context.Context, err error) error {
	var pe *provider.Error
	if cause := context.Cause(ctx); cause != nil && errors.As(cause, &pe) {
		return pe
	}
	return err
}

// continueStream finishes a stream that broke after part of the answer reached the caller.
// A candidate that accepts a prefill gets the partial answer and continues it; failing
// that, a candidate restarts the answer from the beginning and a splicer passes on only
// what extends the caller's text. Either way only the rest is streamed, so the caller
// receives one complete answer. Without such a candidate (or budget), or when every
// restart diverged, the caller gets a clear error: a cut answer is never reported as
// complete, and text is never repeated.
func (r *Router) continueStream(ctx context.Context, x *exchange, o outcome) (*answer, error) {
	qc, p := x.qc, x.plan
	partial := o.res.Content
	r.afterFailure(p, o)
	o.c.exhausted = true
	diverged := false
	// Restarting cannot reproduce streamed tool calls piece by piece; only text is spliced.
	restartable := len(o.res.ToolCalls) == 0
	for _, prefill := range []bool{true, false} {
		for _, c := range p.cands {
			// The fast-answer rung answers a simplified request: it cannot continue or
			// redo an answer to the caller's.
			if c.exhausted || c.fast || c.u.model.AcceptsPrefill != prefill || ctx.Err() != nil {
				continue
			}
			if !prefill && !restartable {
				break
			}
			if qc.Deadline.AsTime().Sub(r.deps.Clock.Now()) <= r.conf().HopReserve {
				break
			}
			s, release, ok, denied := r.extraAttempt(p, c, func(key *upstreamKey) bool {
				return r.allowRetry(ctx, qc, p.budgetKey(c, key), p.sharedKey, false)
			})
			if denied {
				r.deps.Metrics.budgetDenied.Inc()
				return nil, r.cutStream(qc, o, p, diverged)
			}
			if !ok {
				continue
			}
			cx := *x // the request as the models get it: compressed, when it was
			p.attempts++
			r.deps.Metrics.retries.WithLabelValues(c.u.model.Name, shortClass(provider.ClassOf(o.err))).Inc()
			var next outcome
			if prefill {
				cx.preq.Prefill = partial
				r.audit(qc, "stream", fmt.Sprintf("continuing the answer on %s after %d bytes", c.u.model.Name, len(partial)), 0)
				next = r.try(ctx, &cx, s)
			} else {
				r.audit(qc, "stream", fmt.Sprintf("restarting the answer on %s, to splice after %d bytes", c.u.model.Name, len(partial)), 0)
				sp := newSplicer(partial, x.sink)
				cx.sink = sp.sink
				next = r.try(ctx, &cx, s)
				if next.err == nil && !sp.spliced {
					// It ended before repeating everything the caller has: not an answer.
					next.err = errRestartDiverged
					next.att.ErrorClass, next.att.ErrorMessage = errRestartDiverged.Class, errRestartDiverged.Error()
				}
				next.res.Content = string(sp.rest)
				diverged = diverged || errors.Is(next.err, errRestartDiverged)
			}
			release()
			if next.err == nil {
				how := "finished it"
				if !prefill {
					how = "restarted and finished it"
				}
				qc.DegradationReason = fmt.Sprintf("%s broke mid-answer (%s); %s %s", o.c.u.model.Name, shortClass(provider.ClassOf(o.err)), c.u.model.Name, how)
				return r.accept(ctx, x, next, partial), nil
			}
			partial += next.res.Content // it may have added some before breaking too
			c.exhausted = true
		}
	}
	return nil, r.cutStream(qc, o, p, diverged)
}

// cutStream is the error of a stream that broke after its first token and could not be
// finished.
func (r *Router) cutStream(qc *mantlev1.QualityContext, o outcome, p *plan, diverged bool) error {
	why := "no fallback could continue it"
	if diverged {
		why = "a restart on a fallback diverged from the text already sent"
	}
	r.audit(qc, "stream", "stream failed after the first token and "+why+": "+shortClass(provider.ClassOf(o.err)), 0)
	return &exhaustedError{class: mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED, cause: o.err, tried: p.failed, partial: true, diverged: diverged}
}
