package rpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"
)

// Interceptors is the chain every mantle gRPC server runs, outermost first. The one
// gRPC server and the in-process channel between modules of one process (pkg/app) both
// use it, so a call is authenticated, logged and counted the same way on either path.
type Interceptors struct {
	Unary  []grpc.UnaryServerInterceptor
	Stream []grpc.StreamServerInterceptor
}

// ServerInterceptors returns the chain, outermost first:
//
//  1. request metadata: request id and trace id into the context, so every later
//     interceptor and handler log them;
//  2. metrics: grpc_server_* counters and histograms on the process registry; outside
//     the backstop, so they count the codes callers see;
//  3. error backstop: an error that is not a status becomes INTERNAL with a generic
//     message (the cause was logged by step 4), so internals never leak to callers;
//  4. logging: one structured line per call with duration, the code the caller sees and
//     the handler's own error; inside the backstop, so the cause is not lost;
//  5. panic recovery: a panic becomes INTERNAL and its stack is logged;
//  6. authentication and planes: the caller is established (tenant key, operator key or
//     mesh service) and refused unless the method's audience admits it; a method that is
//     not in audiences is refused, even with authentication off. Health is open;
//     reflection, when served, is operator-only (ReflectionAudiences).
//
// It registers the metrics on reg, so it is called once per process.
func ServerInterceptors(log *slog.Logger, reg prometheus.Registerer, authn *Authenticator, audiences Audiences) (Interceptors, error) {
	metrics := newServerMetrics()
	if err := reg.Register(metrics); err != nil {
		return Interceptors{}, fmt.Errorf("register grpc server metrics: %w", err)
	}
	calls := callLog{log: log}
	recoverOpt := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		log.ErrorContext(ctx, "panic in handler", "panic", fmt.Sprint(p), "stack", string(debug.Stack()),
			"request_id", RequestID(ctx))
		return status.Error(codes.Internal, "internal error")
	})
	gate := authGate{authn: authn, audiences: audiences}

	return Interceptors{
		Unary: []grpc.UnaryServerInterceptor{
			requestMetaUnary,
			metrics.unary(),
			backstopUnary,
			calls.unary,
			recovery.UnaryServerInterceptor(recoverOpt),
			gate.unary,
		},
		Stream: []grpc.StreamServerInterceptor{
			requestMetaStream,
			metrics.stream(),
			backstopStream,
			calls.stream,
			recovery.StreamServerInterceptor(recoverOpt),
			gate.stream,
		},
	}, nil
}

// ServerOptions returns the server options that install the chain.
func (i Interceptors) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(i.Unary...), grpc.ChainStreamInterceptor(i.Stream...)}
}

// isInfrastructure reports whether a service is gRPC plumbing (health probes, reflection)
// rather than requests, which tracing leaves out.
func isInfrastructure(service string) bool {
	switch service {
	case grpc_health_v1.Health_ServiceDesc.ServiceName,
		grpc_reflection_v1.ServerReflection_ServiceDesc.ServiceName,
		grpc_reflection_v1alpha.ServerReflection_ServiceDesc.ServiceName:
		return true
	}
	return false
}

// isOpen reports whether a service answers without credentials: health, which load
// balancers probe. Reflection is not: it lists every method of every service, a map a
// tenant has no use for, so it goes through the gate with ReflectionAudiences.
func isOpen(service string) bool {
	return service == grpc_health_v1.Health_ServiceDesc.ServiceName
}

// ReflectionAudiences makes gRPC reflection (v1 and v1alpha, which grpcurl still uses)
// operator-only; a process that serves reflection merges it into its table.
var ReflectionAudiences = Audiences{
	"/" + grpc_reflection_v1.ServerReflection_ServiceDesc.ServiceName + "/ServerReflectionInfo":      AudienceOperator,
	"/" + grpc_reflection_v1alpha.ServerReflection_ServiceDesc.ServiceName + "/ServerReflectionInfo": AudienceOperator,
}

// authGate is step 6 of the chain.
type authGate struct {
	authn     *Authenticator
	audiences Audiences
}

func (g authGate) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if isOpen(serviceOf(info.FullMethod)) {
		return handler(ctx, req)
	}
	ctx, err := g.authn.authorize(ctx, info.FullMethod, g.audiences)
	if err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (g authGate) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if isOpen(serviceOf(info.FullMethod)) {
		return handler(srv, ss)
	}
	ctx, err := g.authn.authorize(ss.Context(), info.FullMethod, g.audiences)
	if err != nil {
		return err
	}
	return handler(srv, &contextStream{ServerStream: ss, ctx: ctx})
}

func serviceOf(fullMethod string) string {
	service, _ := splitMethod(fullMethod)
	return service
}

// ClientIdentity is what this process's modules present when they call other mesh
// services: the mesh secret (when one is configured; an mTLS client certificate is the
// transport's business), the process's service name and the tenant the call acts for.
// The zero ClientIdentity presents no credential (authentication off).
type ClientIdentity struct {
	secret, service string
	// traced says this process records spans (WithTracing), so that a call's context may
	// hold a span started below its request's meta.
	traced bool
}

// WithTracing returns c for a process that records spans: its calls then look for a span
// in every call's context (AppendMetadata).
func (c ClientIdentity) WithTracing() ClientIdentity {
	c.traced = true
	return c
}

// ClientIdentity returns the identity this process's service calls carry, under the
// service name service.
func (a *Authenticator) ClientIdentity(service string) ClientIdentity {
	if a == nil {
		return ClientIdentity{}
	}
	return ClientIdentity{secret: a.secret, service: service}
}

// DialOptions returns the dial options for calls between mantle services: they carry
// the caller's request id, trace, service credential and tenant to the next hop.
func (c ClientIdentity) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(c.UnaryClient), grpc.WithChainStreamInterceptor(c.StreamClient)}
}

// UnaryClient is DialOptions' interceptor for unary calls, for channels that are not
// grpc.ClientConns (pkg/app's in-process channel).
func (c ClientIdentity) UnaryClient(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return invoker(c.outgoing(ctx), method, req, reply, cc, opts...)
}

// StreamClient is DialOptions' interceptor for streams.
func (c ClientIdentity) StreamClient(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return streamer(c.outgoing(ctx), desc, cc, method, opts...)
}

func (c ClientIdentity) outgoing(ctx context.Context) context.Context {
	var buf [MaxMetadataPairs * 2]string
	kv := c.AppendMetadata(ctx, buf[:0])
	if len(kv) == 0 {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

// MaxMetadataPairs is the most key-value pairs AppendMetadata adds.
const MaxMetadataPairs = 5

// AppendMetadata appends to kv the metadata pairs (lower-case key, value) a call made on
// behalf of ctx carries, which the client interceptors add to the outgoing metadata: at
// most MaxMetadataPairs. A channel that hands these to its server directly (pkg/app's
// in-process channel) gives the handler the metadata a network hop would.
func (c ClientIdentity) AppendMetadata(ctx context.Context, kv []string) []string {
	// Each lookup in ctx walks the caller's context chain, which on the router is a whole
	// HTTP request's, up to the value or, when there is none, to its root: the request's
	// identity is looked up once, and so is its span when there is none.
	m := metaOf(ctx)
	if m.id != "" {
		kv = append(kv, MetadataRequestID, m.id)
	}
	// The span's own traceparent when there is one (the client stats handler, with tracing
	// on, replaces it with its client span's); otherwise the trace id alone, so that logs of
	// one request share it across hops even with tracing off. Without a span, TraceID is
	// the request's own.
	//
	// A request whose meta holds a trace id had no span context where the id was given
	// (WithTraceID), and in a process that records no spans none starts below it: a tracer
	// that records nothing only carries a caller's span context on, and such a request has
	// none. Its calls skip the search for a span, which walks the whole context chain to
	// its root without finding one.
	if m.traceID != "" && !c.traced {
		kv = append(kv, MetadataTraceParent, traceParent(m.traceID))
	} else if tp := traceParentOf(ctx); tp != "" {
		kv = append(kv, MetadataTraceParent, tp)
	} else if m.traceID != "" {
		kv = append(kv, MetadataTraceParent, traceParent(m.traceID))
	}
	// The tenant's own key never leaves the front door: the next hop learns the tenant
	// from the service that vouches for it.
	if c.secret != "" {
		kv = append(kv, MetadataMeshSecret, c.secret)
		if c.service != "" {
			kv = append(kv, MetadataService, c.service)
		}
		if t := Tenant(ctx); t != "" {
			kv = append(kv, MetadataOnBehalfOf, t)
		}
	}
	return kv
}

// logFields are the request's own fields in every call's log line.
func logFields(ctx context.Context) []any {
	f := []any{"trace_id", TraceID(ctx)}
	if id := RequestID(ctx); id != "" {
		f = append(f, "request_id", id)
	}
	if t := Tenant(ctx); t != "" {
		f = append(f, "tenant", t)
	}
	return f
}

func requestMetaUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	return handler(requestMetaFromIncoming(ctx), req)
}

func requestMetaStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, &contextStream{ServerStream: ss, ctx: requestMetaFromIncoming(ss.Context())})
}

func backstopUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	return resp, backstop(err)
}

func backstopStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return backstop(handler(srv, ss))
}

// backstop keeps statuses and context errors and hides everything else.
func backstop(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, "request canceled")
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, "deadline exceeded")
	}
	return Status(codes.Internal, "mantle", ReasonInternal, "internal error")
}

// contextStream overrides the context of a server stream.
type contextStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *contextStream) Context() context.Context { return s.ctx }
