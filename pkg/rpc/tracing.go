package rpc

import (
	"context"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
)

// Propagator is how mantle carries trace context over every transport (gRPC metadata,
// HTTP headers, NATS message headers): W3C traceparent and tracestate, nothing else. It is
// passed explicitly rather than installed globally, so a process owns its wiring.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// TracingServerOption makes a gRPC server start a span for every call from the caller's
// traceparent. It is a stats handler rather than an interceptor so that the span exists
// before the first interceptor runs: request metadata, logs and metrics all see it.
func TracingServerOption(tp trace.TracerProvider) grpc.ServerOption {
	return grpc.StatsHandler(TracingServerHandler(tp))
}

// TracingDialOption makes a client start a span for every call and send its traceparent.
func TracingDialOption(tp trace.TracerProvider) grpc.DialOption {
	return grpc.WithStatsHandler(TracingClientHandler(tp))
}

// TracingServerHandler is TracingServerOption's stats handler, for channels that take
// handlers rather than server options (pkg/app's in-process channel).
func TracingServerHandler(tp trace.TracerProvider) stats.Handler {
	return otelgrpc.NewServerHandler(otelOptions(tp)...)
}

// TracingClientHandler is TracingDialOption's stats handler.
func TracingClientHandler(tp trace.TracerProvider) stats.Handler {
	return otelgrpc.NewClientHandler(otelOptions(tp)...)
}

func otelOptions(tp trace.TracerProvider) []otelgrpc.Option {
	return []otelgrpc.Option{
		otelgrpc.WithTracerProvider(tp),
		otelgrpc.WithPropagators(Propagator),
		// gRPC metrics come from the Prometheus interceptors on the process registry; the
		// global meter provider must not collect a second, unexported copy.
		otelgrpc.WithMeterProvider(metricnoop.NewMeterProvider()),
		// Health probes and reflection arrive every few seconds and say nothing about requests.
		otelgrpc.WithFilter(func(info *stats.RPCTagInfo) bool {
			service, _ := splitMethod(info.FullMethodName)
			return !isInfrastructure(service)
		}),
	}
}

// traceParentOf renders the span context of ctx as a traceparent, or "" when ctx has none.
func traceParentOf(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	carrier := propagation.MapCarrier{}
	Propagator.Inject(ctx, carrier)
	return carrier.Get(MetadataTraceParent)
}
