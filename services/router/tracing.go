package router

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// TracerName is the instrumentation scope of the router's own spans (provider attempts and
// the HTTP front door); gRPC spans come from the stats handlers in pkg/rpc.
const TracerName = "github.com/mantle-mesh/mantle/services/router"

// SpanAttempt is the name of the span of one provider attempt.
const SpanAttempt = "router.attempt"

// Span attribute keys. gen_ai.* follow OpenTelemetry's GenAI conventions where one exists,
// so trace backends that know them show tokens and models; the rest are mantle's own.
const (
	AttrModel             = attribute.Key("mantle.model")
	AttrUpstreamModel     = attribute.Key("gen_ai.request.model")
	AttrProvider          = attribute.Key("mantle.provider")
	AttrKeyID             = attribute.Key("mantle.key_id") // the key's configured id, never the key
	AttrScenario          = attribute.Key("mantle.scenario")
	AttrRoute             = attribute.Key("mantle.route")
	AttrRequestID         = attribute.Key("mantle.request_id")
	AttrTenant            = attribute.Key("mantle.tenant")
	AttrRetry             = attribute.Key("mantle.attempt.retry") // retries on this model before this attempt
	AttrHedged            = attribute.Key("mantle.attempt.hedged")
	AttrLevel             = attribute.Key("mantle.fallback_level")
	AttrErrorClass        = attribute.Key("mantle.error_class")
	AttrProviderRequestID = attribute.Key("mantle.provider_request_id")
	AttrLatencyMS         = attribute.Key("mantle.latency_ms") // the provider call, on the process clock
	AttrTTFTMS            = attribute.Key("mantle.ttft_ms")    // streams only
	AttrInputTokens       = attribute.Key("gen_ai.usage.input_tokens")
	AttrOutputTokens      = attribute.Key("gen_ai.usage.output_tokens")
	AttrCostUSD           = attribute.Key("mantle.cost_usd")
	AttrCacheHit          = attribute.Key("mantle.cache_hit")
	AttrRetryCount        = attribute.Key("mantle.retry_count")
	AttrAttempts          = attribute.Key("mantle.attempts")
	AttrAnsweredBy        = attribute.Key("mantle.answered_by")
)

// startAttempt opens the span of one provider attempt. Only the provider call runs under
// it: verification is the verifier's own hop, a child of the request's span like quota's
// and cache's, and the attempt span reports its verdict through its error class.
func (r *Router) startAttempt(ctx context.Context, qc *mantlev1.QualityContext, s slot) (context.Context, trace.Span) {
	if !r.tracing {
		return r.deps.Tracer.Start(ctx, SpanAttempt)
	}
	c := s.c
	return r.deps.Tracer.Start(ctx, SpanAttempt, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		AttrModel.String(c.u.model.Name),
		AttrUpstreamModel.String(c.u.upstreamModel()),
		AttrProvider.String(c.u.provider),
		AttrKeyID.String(s.key.id),
		AttrScenario.String(qc.GetScenario()),
		AttrRetry.Int(c.retries),
		AttrHedged.Bool(s.hedged),
		AttrLevel.String(ShortLevel(c.level)),
	))
}

// endAttempt records the attempt's outcome on its span and ends it.
func (r *Router) endAttempt(span trace.Span, o outcome) {
	defer span.End()
	if !span.IsRecording() { // it would drop them
		return
	}
	att := o.att
	span.SetAttributes(
		AttrErrorClass.String(shortClass(att.GetErrorClass())),
		AttrLatencyMS.Int64(att.GetLatency().AsDuration().Milliseconds()),
		AttrInputTokens.Int64(o.res.Usage.InputTokens),
		AttrOutputTokens.Int64(o.res.Usage.OutputTokens),
		AttrCostUSD.Float64(o.c.u.cost(o.res.Usage)),
	)
	if att.GetTtft() != nil {
		span.SetAttributes(AttrTTFTMS.Int64(att.GetTtft().AsDuration().Milliseconds()))
	}
	if id := att.GetProviderRequestId(); id != "" {
		span.SetAttributes(AttrProviderRequestID.String(id))
	}
	if o.err != nil {
		// The class, not the message: provider messages can quote the prompt.
		span.SetStatus(codes.Error, shortClass(att.GetErrorClass()))
		span.SetAttributes(attribute.String("error.type", shortClass(att.GetErrorClass())))
	}
}

// traceRequest puts the request's outcome on the span it is served under (the gRPC server
// span, or the HTTP front door's), so one span per request says how it was answered.
func traceRequest(ctx context.Context, qc *mantlev1.QualityContext) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(
		AttrRequestID.String(qc.GetRequestId()),
		AttrTenant.String(qc.GetTenant()),
		AttrRoute.String(qc.GetRoute()),
		AttrScenario.String(qc.GetScenario()),
		AttrCacheHit.Bool(qc.GetCacheHit()),
		AttrLevel.String(ShortLevel(qc.GetFallbackLevel())),
		AttrAttempts.Int(len(qc.GetAttempts())),
		AttrRetryCount.Int64(int64(qc.GetRetryCount())),
		AttrInputTokens.Int64(qc.GetUsage().GetInputTokens()),
		AttrOutputTokens.Int64(qc.GetUsage().GetOutputTokens()),
		AttrCostUSD.Float64(qc.GetCostUsd()),
	)
	if qc.GetCurrentModel() != "" {
		span.SetAttributes(AttrAnsweredBy.String(qc.GetCurrentModel()))
	}
}

// traced runs an HTTP front-door handler under a server span that continues the caller's
// traceparent. With tracing off the tracer records nothing, but the caller's span context
// is still extracted, so the request keeps the caller's trace id; a request without one
// then runs as it came.
func (f *frontDoor) traced(route string, h http.HandlerFunc) http.Handler {
	post := http.MethodPost + " " + route // the span name of nearly every request, made once
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		ctx := rpc.Propagator.Extract(req.Context(), propagation.HeaderCarrier(req.Header))
		if !f.router.tracing && !trace.SpanContextFromContext(ctx).IsValid() {
			// Nothing records, and there is no caller's span to carry on: a span would
			// change nothing, and starting one cost the request three allocations (its
			// context, the request's copy and the status writer).
			h(w, req)
			return
		}
		name := post
		if req.Method != http.MethodPost {
			name = req.Method + " " + route
		}
		// A tracer that records nothing still carries the caller's span context on; the
		// attributes, which nothing would read, are then not built.
		var opts []trace.SpanStartOption
		if f.router.tracing {
			opts = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
				attribute.String("http.request.method", req.Method),
				attribute.String("http.route", route),
				attribute.String("url.path", req.URL.Path),
			)}
		}
		ctx, span := f.router.deps.Tracer.Start(ctx, name, opts...)
		defer span.End()
		sw := &statusWriter{ResponseWriter: w}
		h(sw, req.WithContext(ctx))
		if !span.IsRecording() {
			return
		}
		code := sw.status
		if code == 0 {
			code = http.StatusOK
		}
		span.SetAttributes(attribute.Int("http.response.status_code", code))
		// As OpenTelemetry's HTTP conventions say: a 4xx is the caller's error, not the
		// server's, and leaves the span's status unset.
		if code >= 500 {
			span.SetStatus(codes.Error, http.StatusText(code))
		}
	})
}

// statusWriter remembers the status code a handler sent, for the span.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the real writer to flush streamed answers.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
