package app

import (
	"context"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fullstorydev/grpchan"
	"github.com/fullstorydev/grpchan/inprocgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// localConn carries calls between the modules of one process. Every call runs the
// client's interceptor (the service credential, the tenant acted for) and the server's
// chain (request id, metrics, call log, recovery, authentication and planes)
// and, with tracing on, the client's and server's stats handlers, and the messages are
// copied both ways, as over the network, except the answers a service hands over
// (ResponseHandOver), which are moved, and the requests a caller hands over
// (rpc.HandOverRequest) to a service that takes them (RequestTakeOver), which are
// moved too; what it saves is HTTP/2 framing, sockets and serialisation.
//
// A unary call runs in the caller's goroutine, with a server context built as the
// network builds it: the caller's deadline and cancellation, its outgoing metadata as
// incoming metadata, none of its values. grpchan's channel, which carries the streams,
// runs each call's handler in a goroutine of its own; for unary calls that hand-off,
// and the new goroutine's stack growing from 8 KiB doubling by doubling, cost 10 to 14%
// of the whole mesh's CPU (docs/performance.md). Headers and trailers a handler sets,
// and the call options that would read them (grpc.Header, grpc.Trailer, grpc.Peer), are
// not carried; no mantle service or client uses them.
type localConn struct {
	methods map[string]localMethod // by full method name, "/package.Service/Method"
	chain   grpc.UnaryServerInterceptor
	client  rpc.ClientIdentity
	streams grpc.ClientConnInterface
	// register registers a service's streams on the grpchan channel.
	register grpc.ServiceRegistrar
	// clientStats and serverStats are the tracing handlers; nil without tracing.
	clientStats, serverStats stats.Handler
}

type localMethod struct {
	impl    any
	handler grpc.MethodHandler
	// handsOver says the handler hands its responses over (ResponseHandOver): they are
	// moved into the caller's message, not copied.
	handsOver bool
	// takesOver says the handler takes requests over (RequestTakeOver): those their
	// callers hand over are moved into the handler's message, not copied.
	takesOver bool
	// values holds what the method's server contexts carry besides the call's own: the
	// peer and the stream that answers grpc.Method; made once, not per call.
	values context.Context
}

func newLocalConn(chain rpc.Interceptors, client rpc.ClientIdentity, clientStats, serverStats stats.Handler) *localConn {
	ch := new(inprocgrpc.Channel).WithCloner(messageCloner{})
	if serverStats != nil {
		ch.WithServerStatsHandler(serverStats)
		ch.WithClientStatsHandler(clientStats)
	}
	return &localConn{
		methods:     map[string]localMethod{},
		chain:       chainUnary(chain.Unary),
		client:      client,
		streams:     grpchan.InterceptClientConnStream(ch, client.StreamClient),
		register:    grpchan.WithStreamInterceptors(ch, chain.Stream...),
		clientStats: clientStats,
		serverStats: serverStats,
	}
}

// RegisterService implements grpc.ServiceRegistrar. Services are registered while the
// app is built, before any call.
func (c *localConn) RegisterService(desc *grpc.ServiceDesc, impl any) {
	for _, m := range desc.Methods {
		name := "/" + desc.ServiceName + "/" + m.MethodName
		h, ok := impl.(ResponseHandOver)
		t, ok2 := impl.(RequestTakeOver)
		c.methods[name] = localMethod{impl: impl, handler: m.Handler, values: methodValues(name),
			handsOver: ok && h.HandsOverResponse(name), takesOver: ok2 && t.TakesOverRequest(name)}
	}
	if len(desc.Streams) > 0 {
		c.register.RegisterService(&grpc.ServiceDesc{ServiceName: desc.ServiceName, HandlerType: desc.HandlerType, Streams: desc.Streams, Metadata: desc.Metadata}, impl)
	}
}

// Invoke implements grpc.ClientConnInterface.
//
// Without tracing, nothing comes between the client's interceptor and the server: the
// metadata pairs the interceptor would add to the outgoing context go straight into the
// handler's incoming metadata (serverContext), which spares the outgoing context and
// both copies of the metadata through it, about five allocations a call. With tracing
// the client's stats handler may rewrite the outgoing metadata (the traceparent of its
// span), so the call takes the interceptor's way.
func (c *localConn) Invoke(ctx context.Context, method string, req, reply any, opts ...grpc.CallOption) error {
	if c.clientStats != nil {
		return c.client.UnaryClient(ctx, method, req, reply, nil, c.invoke, opts...)
	}
	var buf [rpc.MaxMetadataPairs * 2]string
	return c.serve(ctx, method, req, reply, c.client.AppendMetadata(ctx, buf[:0]), rpc.HandsOverRequest(opts))
}

// NewStream implements grpc.ClientConnInterface.
func (c *localConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return c.streams.NewStream(ctx, desc, method, opts...)
}

// invoke is the invoker of the client's interceptor, with tracing on.
func (c *localConn) invoke(ctx context.Context, method string, req, reply any, _ *grpc.ClientConn, opts ...grpc.CallOption) error {
	begin := time.Now()
	ctx = c.clientStats.TagRPC(ctx, &stats.RPCTagInfo{FullMethodName: method})
	c.clientStats.HandleRPC(ctx, &stats.Begin{Client: true, BeginTime: begin})
	err := c.serve(ctx, method, req, reply, nil, rpc.HandsOverRequest(opts))
	c.clientStats.HandleRPC(ctx, &stats.End{Client: true, BeginTime: begin, EndTime: time.Now(), Error: err})
	return err
}

// serve runs the server's side of a call: the chain, the handler, the copies. kv are
// metadata pairs the call carries besides ctx's outgoing metadata; handOver says the
// caller handed req over (rpc.HandOverRequest).
func (c *localConn) serve(ctx context.Context, method string, req, reply any, kv []string, handOver bool) error {
	m, ok := c.methods[method]
	if !ok {
		return status.Errorf(codes.Unimplemented, "unknown method %s", method)
	}
	if err := ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	sctx, call := serverContext(ctx, m.values, kv)
	defer call.end()
	var begin time.Time
	if c.serverStats != nil {
		begin = time.Now()
		sctx = c.serverStats.TagRPC(sctx, &stats.RPCTagInfo{FullMethodName: method})
		c.serverStats.HandleRPC(sctx, &stats.Begin{BeginTime: begin})
	}
	into := copyMessage
	if handOver && m.takesOver {
		into = moveMessage
	}
	out, err := m.handler(m.impl, sctx, func(in any) error { return into(in, req) }, c.chain)
	if c.serverStats != nil {
		c.serverStats.HandleRPC(sctx, &stats.End{BeginTime: begin, EndTime: time.Now(), Error: err})
	}
	// A caller whose deadline passed or who gave up meanwhile sees that, whatever the
	// handler made of it, as over the network, where the client returns at the deadline.
	if cerr := ctx.Err(); cerr != nil {
		return status.FromContextError(cerr).Err()
	}
	if err != nil {
		return status.Convert(err).Err()
	}
	if m.handsOver {
		return moveMessage(reply, out)
	}
	return copyMessage(reply, out)
}

// ResponseHandOver is a service implementation whose handlers of some unary methods hand
// their responses over: every response is made for its call, and the handler keeps
// nothing of it, no message, slice or map it holds, once it returns (strings, which no
// one can change, may be shared). The in-process channel then moves such a response into
// the caller's message instead of copying it. Over the network the response is encoded
// either way; in process the copies of the mesh's five answers a request were 45 of the
// about 450 allocations it made (the quality context, usage, limits and buckets each
// answer carries; docs/design/016-handed-over-answers.md).
//
// A handler that keeps what it answers, or answers with what it keeps (a stored entry, a
// cached snapshot), must not be named: the caller could change it under the handler.
type ResponseHandOver interface {
	// HandsOverResponse reports whether the handler of method, a full method name
	// ("/package.Service/Method"), hands its responses over.
	HandsOverResponse(method string) bool
}

// RequestTakeOver is a service implementation whose handlers of some unary methods may
// read their callers' requests instead of copies: each such handler writes nothing its
// request holds but the request's QualityContext (which it may extend and answer with),
// and what it keeps of the request once it returns it only reads. A request its caller
// hands over (rpc.HandOverRequest: built for the call, its QualityContext left to the
// handler, the rest written by neither side) is then moved into the handler's message
// instead of copied; other requests are copied as before. Over the network the request
// is decoded either way (docs/design/017-handed-over-requests.md).
type RequestTakeOver interface {
	// TakesOverRequest reports whether the handler of method, a full method name
	// ("/package.Service/Method"), takes requests over.
	TakesOverRequest(method string) bool
}

// moveMessage makes dst the message src is, by one struct assignment: their fields then
// share whatever src's held, which its owner has handed over (ResponseHandOver,
// rpc.HandOverRequest).
func moveMessage(dst, src any) error {
	d, ok1 := dst.(proto.Message)
	s, ok2 := src.(proto.Message)
	if !ok1 || !ok2 {
		return status.Errorf(codes.Internal, "in-process call: %T or %T is not a protobuf message", dst, src)
	}
	if !assign(d, s) {
		return copyMessage(dst, src)
	}
	return nil
}

// assign sets *dst to *src when both are non-nil pointers of one message type, and
// reports whether it did.
func assign(dst, src proto.Message) bool {
	dv, sv := reflect.ValueOf(dst), reflect.ValueOf(src)
	if dv.Type() != sv.Type() || dv.IsNil() || sv.IsNil() {
		return false
	}
	dv.Elem().Set(sv.Elem())
	// The assignment cleared dst's reflection state, which a protoreflect.Message of dst
	// taken before would still read; ProtoReflect sets it again.
	dst.ProtoReflect()
	return true
}

// serverContext is the context a handler gets: the caller's deadline and cancellation
// but none of its values, its outgoing metadata and the pairs kv (added after it, as
// metadata.AppendToOutgoingContext would) as incoming metadata, and the values of method
// (methodValues: the peer and the method). It is cancelled when
// the call ends, as a gRPC server's is: call its root's end method (a method call, where a
// cancel func would be one more allocation a call).
//
// The keys of kv are lower-case and distinct, as rpc.ClientIdentity.AppendMetadata's are
// (TestAppendMetadataKeys): they are not lower-cased again, and looked up before they
// are added only when the caller's own metadata may already hold them.
func serverContext(ctx, method context.Context, kv []string) (_ context.Context, root *callContext) {
	call := &callContext{caller: ctx, values: method}
	var sctx context.Context = call
	// A copy: the handler may change its metadata, the caller may go on using its own.
	md, ok := metadata.FromOutgoingContext(ctx)
	if len(kv) > 0 {
		fresh := !ok
		if fresh {
			md = make(metadata.MD, len(kv)/2)
		}
		// The values share one array, the call's own when they fit (the client's pairs
		// always do); each key's slice is capped at its own value, so that appending to
		// one never writes into the next.
		var values []string
		if n := len(kv) / 2; n <= len(call.mdValues) {
			values = call.mdValues[:n]
		} else {
			values = make([]string, n)
		}
		for i := range values {
			key, v := kv[2*i], kv[2*i+1]
			if !fresh {
				if old, dup := md[key]; dup {
					md[key] = append(old[:len(old):len(old)], v)
					continue
				}
			}
			values[i] = v
			md[key] = values[i : i+1 : i+1]
		}
		ok = true
	}
	if ok {
		sctx = metadata.NewIncomingContext(sctx, md)
	}
	return sctx, call
}

// methodValues is the context whose values every server context of the method carries:
// the in-process peer and the stream that answers grpc.Method. They are the same for
// every call, so they are made once, where two context layers a call cost two allocations.
func methodValues(method string) context.Context {
	return grpc.NewContextWithServerTransportStream(peer.NewContext(context.Background(), &localPeer), localStream(method))
}

// callContext is the root of a unary call's server context: the caller's deadline and
// cancellation, none of its values but the method's (serverContext), and cancelled when
// the call ends.
//
// Its cancellation is the context package's: a cancel context over the caller's context
// with the values hidden (withoutValues), made only once Done is asked for, by the
// handler or by a context derived from this one. Contexts a handler derives then find
// that cancel context through Value and register with it directly, without a goroutine
// each. Made for every call, it cost about nine allocations (the cancel context, its
// func, and its registration with the caller's context through withoutValues.AfterFunc),
// and most handlers never ask for Done: until one does, Err reads the caller's.
type callContext struct {
	caller context.Context
	// values answers for the values of the method's contexts (methodValues).
	values context.Context

	mu sync.Mutex
	// err is the context's error while there is no cancel context: the caller's once
	// it is done, context.Canceled once the call ended.
	err   error
	inner atomic.Pointer[cancelContext]

	// mdValues holds the values of the metadata pairs the call carries (serverContext), in
	// the allocation every call makes anyway rather than one more.
	mdValues [rpc.MaxMetadataPairs]string
}

type cancelContext struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// closedDone is Done of a context that was cancelled before anything asked for Done.
var closedDone = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (c *callContext) Deadline() (time.Time, bool) { return c.caller.Deadline() }

// Value hides the caller's values and answers the method's. Once there is a cancel
// context, it answers first, for itself: the context package finds a cancellable parent so.
func (c *callContext) Value(key any) any {
	if inner := c.inner.Load(); inner != nil {
		if v := inner.ctx.Value(key); v != nil {
			return v
		}
	}
	return c.values.Value(key)
}

func (c *callContext) String() string { return "app.callContext" }

func (c *callContext) Done() <-chan struct{} {
	if inner, _ := c.state(true); inner != nil {
		return inner.ctx.Done()
	}
	return closedDone // done before anything asked
}

func (c *callContext) Err() error {
	inner, err := c.state(false)
	if inner != nil {
		return inner.ctx.Err()
	}
	return err
}

// state returns the cancel context when there is one; otherwise the context's error (nil
// while it is live), after making the cancel context when create is set and it is live.
func (c *callContext) state(create bool) (*cancelContext, error) {
	if inner := c.inner.Load(); inner != nil {
		return inner, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if inner := c.inner.Load(); inner != nil {
		return inner, nil
	}
	if c.err == nil {
		c.err = c.caller.Err()
	}
	if c.err != nil || !create {
		return nil, c.err
	}
	ctx, cancel := context.WithCancel(withoutValues{c.caller})
	inner := &cancelContext{ctx: ctx, cancel: cancel}
	c.inner.Store(inner)
	return inner, nil
}

// end cancels the context when the call ends.
func (c *callContext) end() {
	c.mu.Lock()
	if c.err == nil {
		c.err = context.Canceled
	}
	inner := c.inner.Load()
	c.mu.Unlock()
	if inner != nil {
		inner.cancel()
	}
}

// copyMessage makes dst a deep copy of src, so that caller and handler share no mutable
// memory, as over the network.
//
// The messages of pkg/api have a generated CloneMessageVT (buf.gen.yaml), which copies
// without reflection: src's clone is made and moved into dst by one struct assignment,
// whose shallow copy is harmless because the clone is new and then dropped (one more
// allocation than a merge into dst, for far less CPU). It took the
// channel's copies from about a fifth of a call's CPU to a few percent. Other messages
// (well-known types, tests' own) are copied with proto.Merge.
func copyMessage(dst, src any) error {
	d, ok1 := dst.(proto.Message)
	s, ok2 := src.(proto.Message)
	if !ok1 || !ok2 {
		return status.Errorf(codes.Internal, "in-process call: %T or %T is not a protobuf message", dst, src)
	}
	if c, ok := s.(cloner); ok && assign(d, c.CloneMessageVT()) {
		return nil
	}
	proto.Reset(d)
	proto.Merge(d, s)
	return nil
}

// cloner is a message with a generated deep copy.
type cloner interface{ CloneMessageVT() proto.Message }

// messageCloner copies the messages of streams (grpchan's channel) as copyMessage does
// those of unary calls.
type messageCloner struct{}

func (messageCloner) Copy(dst, src any) error { return copyMessage(dst, src) }

func (messageCloner) Clone(src any) (any, error) {
	m, ok := src.(proto.Message)
	if !ok {
		return nil, status.Errorf(codes.Internal, "in-process call: %T is not a protobuf message", src)
	}
	if c, ok := m.(cloner); ok {
		return c.CloneMessageVT(), nil
	}
	return proto.Clone(m), nil
}

// withoutValues keeps a context's deadline and cancellation and hides its values, so
// that nothing the caller holds in its context leaks to the handler.
type withoutValues struct{ context.Context }

func (withoutValues) Value(any) any { return nil }

// AfterFunc lets a context derived from this one hook into the caller's cancellation
// directly (callContext's cancel context).
func (c withoutValues) AfterFunc(f func()) (stop func() bool) { return context.AfterFunc(c.Context, f) }

var localPeer = peer.Peer{Addr: localAddr{}}

type localAddr struct{}

func (localAddr) Network() string { return "inproc" }
func (localAddr) String() string  { return "inproc" }

// localStream answers grpc.Method for handlers and interceptors; headers and trailers
// are accepted and dropped.
type localStream string

func (s localStream) Method() string             { return string(s) }
func (localStream) SetHeader(metadata.MD) error  { return nil }
func (localStream) SendHeader(metadata.MD) error { return nil }
func (localStream) SetTrailer(metadata.MD) error { return nil }

// chainUnary folds interceptors into one, the first outermost, as grpc.ChainUnaryInterceptor does.
//
// A call's chain is one value whose handler walks the interceptors by index instead of a
// closure per interceptor per call: every mesh call crosses the whole chain, and the
// closures were the channel's largest count of allocations. The index is restored as each
// interceptor returns, so an interceptor that calls its handler again, or not at all, sees
// what a closure chain would give it; handlers must be called in the call's goroutine,
// before the interceptor returns, as every interceptor of pkg/rpc does. So a chain value
// is free again once the call returns, and is reused from a pool, with its handler bound
// once.
func chainUnary(interceptors []grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	if len(interceptors) == 0 {
		return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			return handler(ctx, req)
		}
	}
	calls := &sync.Pool{New: func() any {
		c := &chainCall{interceptors: interceptors}
		c.handler = c.step
		return c
	}}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		c := calls.Get().(*chainCall)
		c.info, c.final, c.next = info, handler, 0
		resp, err := c.step(ctx, req)
		// A panic that leaves the chain leaves c to the garbage collector.
		c.info, c.final = nil, nil
		calls.Put(c)
		return resp, err
	}
}

// chainCall is one call's way through the chain.
type chainCall struct {
	interceptors []grpc.UnaryServerInterceptor
	info         *grpc.UnaryServerInfo
	final        grpc.UnaryHandler
	handler      grpc.UnaryHandler // step, bound once
	next         int               // the interceptor the handler runs next
}

// step runs the interceptor at c.next, handing it the rest of the chain, or the
// final handler when none is left.
func (c *chainCall) step(ctx context.Context, req any) (any, error) {
	i := c.next
	if i == len(c.interceptors) {
		return c.final(ctx, req)
	}
	c.next = i + 1
	defer func() { c.next = i }()
	return c.interceptors[i](ctx, req, c.info, c.handler)
}
