package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// echo is a service for the in-process channel: Echo answers its input with a suffix,
// after calling seen; Count streams n values.
type echo struct {
	seen func(ctx context.Context, in *wrapperspb.StringValue) error
}

func (e *echo) desc() *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: "mantle.test.v1.Echo",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Echo",
			Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
				in := new(wrapperspb.StringValue)
				if err := dec(in); err != nil {
					return nil, err
				}
				h := func(ctx context.Context, req any) (any, error) {
					in := req.(*wrapperspb.StringValue)
					if err := e.seen(ctx, in); err != nil {
						return nil, err
					}
					out := wrapperspb.String(in.Value + " back")
					in.Value = "changed by the handler" // must not reach the caller's message
					return out, nil
				}
				return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/mantle.test.v1.Echo/Echo"}, h)
			},
		}},
		Streams: []grpc.StreamDesc{{
			StreamName:    "Count",
			ServerStreams: true,
			Handler: func(_ any, ss grpc.ServerStream) error {
				in := new(wrapperspb.Int32Value)
				if err := ss.RecvMsg(in); err != nil {
					return err
				}
				for i := range in.Value {
					if err := ss.SendMsg(wrapperspb.Int32(i)); err != nil {
						return err
					}
				}
				return nil
			},
		}},
	}
}

// echoAudiences puts the echo service on the tenant plane.
var echoAudiences = rpc.Audiences{"/mantle.test.v1.Echo/Echo": rpc.AudienceTenant, "/mantle.test.v1.Echo/Count": rpc.AudienceTenant}

type ctxKey struct{}

// TestServerContextDerivesWithoutGoroutines: contexts a handler derives from its context
// hook into the caller's cancellation without a goroutine each, and are cancelled with
// the caller. Not parallel, so that no other test's goroutines come and go meanwhile.
func TestServerContextDerivesWithoutGoroutines(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	sctx, call := serverContext(parent, methodValues("/mantle.test.v1.Echo/Echo"), nil)
	defer call.end()
	const derived = 100
	before := runtime.NumGoroutine()
	children := make([]context.Context, derived)
	for i := range children {
		var stop context.CancelFunc
		children[i], stop = context.WithCancel(sctx)
		t.Cleanup(stop)
	}
	if grew := runtime.NumGoroutine() - before; grew >= derived/2 {
		t.Errorf("%d derived contexts started %d goroutines, want none", derived, grew)
	}
	cancel()
	for i, c := range children {
		select {
		case <-c.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("derived context %d not cancelled with the caller", i)
		}
	}
}

// TestServerContextCancellation: the server context is done when the caller is or when
// the call ends, with the caller's error or context.Canceled, whether or not anything
// asked for Done before; it never shows the caller's values, and always the method and
// the peer.
func TestServerContextCancellation(t *testing.T) {
	t.Parallel()
	past := time.Now().Add(-time.Minute)
	tests := []struct {
		name string
		// askDone: Done is asked for (and a context derived) before the event.
		askDone bool
		// event makes the context done: the caller's cancel or the call's end.
		callerDeadline bool
		endCall        bool
		wantErr        error
	}{
		{name: "caller cancelled, nobody asked for Done", wantErr: context.Canceled},
		{name: "caller cancelled, Done asked for", askDone: true, wantErr: context.Canceled},
		{name: "caller's deadline passed, nobody asked for Done", callerDeadline: true, wantErr: context.DeadlineExceeded},
		{name: "caller's deadline passed, Done asked for", callerDeadline: true, askDone: true, wantErr: context.DeadlineExceeded},
		{name: "call ended, nobody asked for Done", endCall: true, wantErr: context.Canceled},
		{name: "call ended, Done asked for", endCall: true, askDone: true, wantErr: context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			parent, cancelParent := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "secret"))
			defer cancelParent()
			caller := parent
			if tt.callerDeadline {
				var cancel context.CancelFunc
				caller, cancel = context.WithDeadline(parent, past)
				defer cancel()
			}
			sctx, call := serverContext(caller, methodValues("/mantle.test.v1.Echo/Echo"), nil)
			defer call.end()
			var derived context.Context
			if tt.askDone {
				var cancel context.CancelFunc
				derived, cancel = context.WithCancel(context.WithValue(sctx, ctxKey{}, "handler's"))
				defer cancel()
			}
			if sctx.Value(ctxKey{}) != nil {
				t.Error("a value of the caller's context leaked")
			}
			for name, ctx := range map[string]context.Context{"server context": sctx, "derived context": derived} {
				if ctx == nil {
					continue
				}
				if m, _ := grpc.Method(ctx); m != "/mantle.test.v1.Echo/Echo" {
					t.Errorf("%s: grpc.Method = %q", name, m)
				}
				if p, ok := peer.FromContext(ctx); !ok || p.Addr.String() != "inproc" {
					t.Errorf("%s: no in-process peer", name)
				}
			}
			if d, ok := sctx.Deadline(); ok != tt.callerDeadline || (ok && !d.Equal(past)) {
				t.Errorf("Deadline = %v, %t", d, ok)
			}
			if !tt.callerDeadline {
				if err := sctx.Err(); err != nil {
					t.Fatalf("Err = %v before anything happened", err)
				}
			}
			switch {
			case tt.endCall:
				call.end()
			case !tt.callerDeadline:
				cancelParent()
			}
			waitDone(t, sctx)
			if err := sctx.Err(); !errors.Is(err, tt.wantErr) {
				t.Errorf("Err = %v, want %v", err, tt.wantErr)
			}
			if derived == nil {
				derived = sctx // a context derived after the event is done at once
				var cancel context.CancelFunc
				derived, cancel = context.WithCancel(derived)
				defer cancel()
			}
			waitDone(t, derived)
			if err := derived.Err(); !errors.Is(err, tt.wantErr) {
				t.Errorf("derived context's Err = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

func waitDone(t *testing.T, ctx context.Context) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("context not done")
	}
}

func TestLocalConnUnary(t *testing.T) {
	t.Parallel()
	deadline := time.Now().Add(time.Hour)
	tests := []struct {
		name   string
		ctx    func() (context.Context, context.CancelFunc)
		method string
		seen   func(ctx context.Context, in *wrapperspb.StringValue) error
		// cancelThenFail: the handler cancels the caller's context, then fails.
		cancelThenFail bool
		wantCode       codes.Code
		wantMsg        string
	}{
		{
			name: "the handler sees the request, its metadata and deadline, none of the caller's values",
			ctx: func() (context.Context, context.CancelFunc) {
				ctx := context.WithValue(rpc.WithRequestID(context.Background(), "req_1"), ctxKey{}, "secret")
				return context.WithDeadline(ctx, deadline)
			},
			seen: func(ctx context.Context, in *wrapperspb.StringValue) error {
				var errs []error
				if in.Value != "hi" {
					errs = append(errs, errors.New("request = "+in.Value))
				}
				if md, _ := metadata.FromIncomingContext(ctx); len(md.Get(rpc.MetadataRequestID)) != 1 || md.Get(rpc.MetadataRequestID)[0] != "req_1" {
					errs = append(errs, errors.New("no request id in the incoming metadata"))
				}
				if rpc.RequestID(ctx) != "req_1" {
					errs = append(errs, errors.New("the request-meta interceptor did not run"))
				}
				if ctx.Value(ctxKey{}) != nil {
					errs = append(errs, errors.New("a value of the caller's context leaked"))
				}
				if d, ok := ctx.Deadline(); !ok || !d.Equal(deadline) {
					errs = append(errs, errors.New("deadline not carried"))
				}
				if m, _ := grpc.Method(ctx); m != "/mantle.test.v1.Echo/Echo" {
					errs = append(errs, errors.New("grpc.Method = "+m))
				}
				if p, ok := peer.FromContext(ctx); !ok || p.Addr.String() != "inproc" {
					errs = append(errs, errors.New("no in-process peer"))
				}
				if err := errors.Join(errs...); err != nil {
					return status.Error(codes.FailedPrecondition, err.Error())
				}
				return nil
			},
		},
		{
			name: "a status error reaches the caller as it is",
			seen: func(context.Context, *wrapperspb.StringValue) error {
				return status.Error(codes.ResourceExhausted, "over limit")
			},
			wantCode: codes.ResourceExhausted, wantMsg: "over limit",
		},
		{
			name:     "any other error reaches the caller as the backstop's Internal",
			seen:     func(context.Context, *wrapperspb.StringValue) error { return errors.New("disk full") },
			wantCode: codes.Internal, wantMsg: "internal error",
		},
		{
			name: "a cancelled caller does not reach the handler",
			ctx: func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return ctx, cancel
			},
			seen:     func(context.Context, *wrapperspb.StringValue) error { return errors.New("called") },
			wantCode: codes.Canceled,
		},
		{
			name: "an answer after the caller gave up is not delivered",
			ctx:  func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) },
			// The case's cancel is called by the handler through cancelFromHandler below.
			seen:     nil,
			wantCode: codes.Canceled,
		},
		{
			name:           "a caller that gave up sees that, not the handler's error",
			ctx:            func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) },
			cancelThenFail: true,
			wantCode:       codes.Canceled,
		},
		{name: "an unknown method", method: "/mantle.test.v1.Echo/Nope", wantCode: codes.Unimplemented},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if tt.ctx != nil {
				ctx, cancel = tt.ctx()
			}
			defer cancel()
			seen := tt.seen
			switch {
			case tt.cancelThenFail:
				seen = func(context.Context, *wrapperspb.StringValue) error {
					cancel()
					return status.Error(codes.Unavailable, "backend down")
				}
			case seen == nil:
				seen = func(context.Context, *wrapperspb.StringValue) error { cancel(); return nil }
			}
			c := testLocalConn(t, &echo{seen: seen}, nil, nil)
			method := tt.method
			if method == "" {
				method = "/mantle.test.v1.Echo/Echo"
			}
			req, reply := wrapperspb.String("hi"), new(wrapperspb.StringValue)
			err := c.Invoke(ctx, method, req, reply)
			st := status.Convert(err)
			if st.Code() != tt.wantCode || (tt.wantMsg != "" && st.Message() != tt.wantMsg) {
				t.Fatalf("Invoke = %v, want %v %q", err, tt.wantCode, tt.wantMsg)
			}
			if req.Value != "hi" {
				t.Errorf("the caller's request became %q: messages must be copied", req.Value)
			}
			if tt.wantCode == codes.OK && reply.Value != "hi back" {
				t.Errorf("reply = %q, want %q", reply.Value, "hi back")
			}
		})
	}
}

func TestLocalConnStream(t *testing.T) {
	t.Parallel()
	c := testLocalConn(t, &echo{}, nil, nil)
	desc := &grpc.StreamDesc{StreamName: "Count", ServerStreams: true}
	s, err := c.NewStream(context.Background(), desc, "/mantle.test.v1.Echo/Count")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SendMsg(wrapperspb.Int32(3)); err != nil {
		t.Fatal(err)
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	var got []int32
	for {
		v := new(wrapperspb.Int32Value)
		if err := s.RecvMsg(v); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		got = append(got, v.Value)
	}
	if len(got) != 3 || got[2] != 2 {
		t.Errorf("stream = %v, want [0 1 2]", got)
	}
}

// TestLocalConnStats: with tracing on, both sides' stats handlers see the call begin
// and end, with its error, and the client's tag reaches the server as metadata.
func TestLocalConnStats(t *testing.T) {
	t.Parallel()
	client, server := &recordingStats{client: true}, &recordingStats{}
	c := testLocalConn(t, &echo{seen: func(ctx context.Context, _ *wrapperspb.StringValue) error {
		if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("x-tagged")) == 0 {
			return status.Error(codes.FailedPrecondition, "the client handler's metadata did not arrive")
		}
		return status.Error(codes.NotFound, "nothing")
	}}, client, server)
	err := c.Invoke(context.Background(), "/mantle.test.v1.Echo/Echo", wrapperspb.String("hi"), new(wrapperspb.StringValue))
	if status.Code(err) != codes.NotFound {
		t.Fatalf("Invoke = %v, want NotFound", err)
	}
	for _, r := range []*recordingStats{client, server} {
		r.mu.Lock()
		if len(r.events) != 3 || r.events[0] != "tag /mantle.test.v1.Echo/Echo" || r.events[1] != "begin" || r.events[2] != "end NotFound" {
			t.Errorf("client=%v stats events = %q, want tag, begin, end NotFound", r.client, r.events)
		}
		r.mu.Unlock()
	}
}

// TestLocalConnMetadataAsOverTheNetwork: a handler behind the in-process channel sees the
// incoming metadata a handler behind a gRPC server sees for the same call, with and
// without a mesh identity and with metadata the caller added itself; what it changes of
// its copy never reaches the caller.
func TestLocalConnMetadataAsOverTheNetwork(t *testing.T) {
	t.Parallel()
	const secret = "a mesh secret of at least thirty-two bytes"
	authn, err := rpc.NewAuthenticator([]rpc.TenantKey{{ID: "acme", KeySHA256: rpc.HashKey("sk-acme")}}, nil, rpc.WithMeshSecret(secret))
	if err != nil {
		t.Fatal(err)
	}
	traced := rpc.WithTraceID(rpc.WithRequestID(context.Background(), "req_1"), "4bf92f3577b34da6a3ce929d0e0e4736")
	tests := []struct {
		name     string
		identity rpc.ClientIdentity // a mesh identity turns authentication on
		ctx      context.Context
	}{
		{"no request identity", rpc.ClientIdentity{}, context.Background()},
		{"request id and trace", rpc.ClientIdentity{}, traced},
		{"a mesh service on a tenant's behalf", authn.ClientIdentity("router"), rpc.WithTenant(traced, "acme")},
		{"metadata the caller added", authn.ClientIdentity("router"),
			metadata.AppendToOutgoingContext(rpc.WithTenant(traced, "acme"), "authorization", "Bearer x", "X-Request-Id", "req_extra")},
		{"outgoing metadata set as a map", rpc.ClientIdentity{},
			metadata.NewOutgoingContext(traced, metadata.MD{"x-tag": {"a", "b"}, "traceparent": {"00-set-by-the-caller"}})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			seen := map[string]metadata.MD{}
			record := func(path string) func(context.Context, *wrapperspb.StringValue) error {
				return func(ctx context.Context, _ *wrapperspb.StringValue) error {
					md, _ := metadata.FromIncomingContext(ctx)
					mu.Lock()
					seen[path] = md
					mu.Unlock()
					// The handler's own copy: changing it must not show anywhere else.
					if in := metadata.ValueFromIncomingContext(ctx, rpc.MetadataRequestID); len(in) > 0 {
						in[0] = "changed by the handler"
					}
					return nil
				}
			}
			var serverAuth *rpc.Authenticator
			if tt.identity != (rpc.ClientIdentity{}) {
				serverAuth = authn
			}
			chain, err := rpc.ServerInterceptors(slog.New(slog.DiscardHandler), prometheus.NewRegistry(), serverAuth, echoAudiences)
			if err != nil {
				t.Fatal(err)
			}
			local := newLocalConn(chain, tt.identity, nil, nil)
			local.RegisterService((&echo{seen: record("local")}).desc(), &echo{seen: record("local")})
			srv := grpc.NewServer(chain.ServerOptions()...)
			srv.RegisterService((&echo{seen: record("network")}).desc(), &echo{seen: record("network")})
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			go func() { _ = srv.Serve(lis) }()
			t.Cleanup(srv.Stop)
			conn, err := grpc.NewClient(lis.Addr().String(), append(tt.identity.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = conn.Close() })

			before, _ := metadata.FromOutgoingContext(tt.ctx)
			for _, cc := range []grpc.ClientConnInterface{local, conn} {
				if err := cc.Invoke(tt.ctx, "/mantle.test.v1.Echo/Echo", wrapperspb.String("hi"), new(wrapperspb.StringValue)); err != nil {
					t.Fatalf("Invoke: %v", err)
				}
			}
			network := seen["network"]
			// What the transport adds of its own, which the in-process channel does not claim to.
			for _, k := range []string{":authority", "content-type", "user-agent", "grpc-accept-encoding"} {
				delete(network, k)
			}
			if got, want := withoutParentIDs(seen["local"]), withoutParentIDs(network); !reflect.DeepEqual(got, want) {
				t.Errorf("the handler's metadata in process:\n  %v\nover the network:\n  %v", got, want)
			}
			if after, _ := metadata.FromOutgoingContext(tt.ctx); !reflect.DeepEqual(after, before) {
				t.Errorf("the caller's outgoing metadata became %v, was %v", after, before)
			}
		})
	}
}

// withoutParentIDs is md with the parent ids of its W3C traceparents cut out (each call
// makes a new one), as a plain map: metadata.MD prints its values redacted.
func withoutParentIDs(md metadata.MD) map[string][]string {
	out := map[string][]string{}
	for k, vs := range md {
		for _, v := range vs {
			if parts := strings.Split(v, "-"); k == rpc.MetadataTraceParent && len(parts) == 4 {
				v = parts[0] + "-" + parts[1] + "-(parent)-" + parts[3]
			}
			out[k] = append(out[k], v)
		}
	}
	return out
}

func testLocalConn(t *testing.T, e *echo, client, server stats.Handler) *localConn {
	t.Helper()
	chain, err := rpc.ServerInterceptors(slog.New(slog.DiscardHandler), prometheus.NewRegistry(), nil, echoAudiences)
	if err != nil {
		t.Fatal(err)
	}
	c := newLocalConn(chain, rpc.ClientIdentity{}, client, server)
	c.RegisterService(e.desc(), e)
	return c
}

type recordingStats struct {
	client bool
	mu     sync.Mutex
	events []string
}

func (r *recordingStats) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	r.record("tag " + info.FullMethodName)
	if r.client {
		return metadata.AppendToOutgoingContext(ctx, "x-tagged", "1")
	}
	return ctx
}

func (r *recordingStats) HandleRPC(_ context.Context, s stats.RPCStats) {
	if s.IsClient() != r.client {
		r.record("wrong side")
	}
	switch s := s.(type) {
	case *stats.Begin:
		r.record("begin")
	case *stats.End:
		r.record("end " + status.Code(s.Error).String())
	}
}

func (r *recordingStats) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (r *recordingStats) HandleConn(context.Context, stats.ConnStats) {}

func (r *recordingStats) record(e string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// BenchmarkLocalCall compares one unary call between modules of a process through the
// in-process channel with the same call over loopback gRPC, the path it replaced; both
// run the server's interceptor chain.
//
//	go test -run '^$' -bench BenchmarkLocalCall -benchmem ./pkg/app/
func BenchmarkLocalCall(b *testing.B) {
	chain, err := rpc.ServerInterceptors(slog.New(slog.DiscardHandler), prometheus.NewRegistry(), nil, echoAudiences)
	if err != nil {
		b.Fatal(err)
	}
	e := &echo{seen: func(context.Context, *wrapperspb.StringValue) error { return nil }}
	local := newLocalConn(chain, rpc.ClientIdentity{}, nil, nil)
	local.RegisterService(e.desc(), e)

	srv := grpc.NewServer(chain.ServerOptions()...)
	srv.RegisterService(e.desc(), e)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	b.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), append(rpc.ClientIdentity{}.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })

	for _, bb := range []struct {
		name string
		cc   grpc.ClientConnInterface
	}{{"in-process", local}, {"loopback gRPC", conn}} {
		b.Run(bb.name, func(b *testing.B) {
			ctx := rpc.WithRequestID(context.Background(), "req_bench")
			req := wrapperspb.String("a request of a few words")
			b.ReportAllocs()
			for b.Loop() {
				if err := bb.cc.Invoke(ctx, "/mantle.test.v1.Echo/Echo", req, new(wrapperspb.StringValue)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestChainUnary: the chain runs as a closure per interceptor would (referenceChain, the
// fold grpc.ChainUnaryInterceptor makes): in order, with each interceptor's request, and
// with the rest of the chain again for an interceptor that calls its handler twice, none
// for one that answers itself, and after an inner panic an outer interceptor recovered.
func TestChainUnary(t *testing.T) {
	t.Parallel()
	type trace = []string
	pass := func(name string) func(*trace) grpc.UnaryServerInterceptor {
		return func(tr *trace) grpc.UnaryServerInterceptor {
			return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				*tr = append(*tr, name+">")
				resp, err := h(ctx, req.(string)+name)
				*tr = append(*tr, "<"+name)
				return resp, err
			}
		}
	}
	twice := func(tr *trace) grpc.UnaryServerInterceptor {
		return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			*tr = append(*tr, "twice>")
			if _, err := h(ctx, req); err != nil {
				return nil, err
			}
			return h(ctx, req.(string)+"2")
		}
	}
	answer := func(tr *trace) grpc.UnaryServerInterceptor {
		return func(context.Context, any, *grpc.UnaryServerInfo, grpc.UnaryHandler) (any, error) {
			*tr = append(*tr, "answer")
			return "answered", nil
		}
	}
	// retryPanic calls its handler again after the first call panicked.
	retryPanic := func(tr *trace) grpc.UnaryServerInterceptor {
		return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
			func() {
				defer func() {
					if p := recover(); p != nil {
						*tr = append(*tr, "recovered")
					}
				}()
				resp, err = h(ctx, req)
			}()
			return h(ctx, req.(string)+"r")
		}
	}
	panicOnce := func(tr *trace) grpc.UnaryServerInterceptor {
		n := 0
		return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if n++; n == 1 {
				panic("once")
			}
			return h(ctx, req)
		}
	}
	for _, tc := range []struct {
		name  string
		chain []func(*trace) grpc.UnaryServerInterceptor
	}{
		{"none", nil},
		{"one", []func(*trace) grpc.UnaryServerInterceptor{pass("a")}},
		{"in order", []func(*trace) grpc.UnaryServerInterceptor{pass("a"), pass("b"), pass("c")}},
		{"handler called twice", []func(*trace) grpc.UnaryServerInterceptor{pass("a"), twice, pass("b"), pass("c")}},
		{"answered inside", []func(*trace) grpc.UnaryServerInterceptor{pass("a"), answer, pass("b")}},
		{"retried after a panic", []func(*trace) grpc.UnaryServerInterceptor{pass("a"), retryPanic, pass("b"), panicOnce, pass("c")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			run := func(fold func([]grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor) (trace, any) {
				var tr trace
				ics := make([]grpc.UnaryServerInterceptor, len(tc.chain))
				for i, mk := range tc.chain {
					ics[i] = mk(&tr)
				}
				final := func(_ context.Context, req any) (any, error) {
					tr = append(tr, "final("+req.(string)+")")
					return req, nil
				}
				// Twice through the same chain: the second call reuses what the first left.
				chain := fold(ics)
				var resp any
				for range 2 {
					var err error
					if resp, err = chain(context.Background(), "", &grpc.UnaryServerInfo{FullMethod: "/m"}, final); err != nil {
						t.Fatal(err)
					}
				}
				return tr, resp
			}
			got, gotResp := run(chainUnary)
			want, wantResp := run(referenceChain)
			if fmt.Sprint(got) != fmt.Sprint(want) || gotResp != wantResp {
				t.Errorf("chain ran %v, answered %v; want %v, %v", got, gotResp, want, wantResp)
			}
		})
	}
}

// referenceChain is the fold of a closure per interceptor per call.
func referenceChain(ics []grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if len(ics) == 0 {
			return handler(ctx, req)
		}
		return ics[0](ctx, req, info, func(ctx context.Context, req any) (any, error) {
			return referenceChain(ics[1:])(ctx, req, info, handler)
		})
	}
}

// TestServerContextMetadata: the handler's incoming metadata is the caller's outgoing
// metadata followed by the pairs the call carries, however many there are (those that
// fit share the call's own array, more get one of their own), and the caller's stays as
// it was.
func TestServerContextMetadata(t *testing.T) {
	t.Parallel()
	pairs := func(n int) []string {
		var kv []string
		for i := range n {
			kv = append(kv, fmt.Sprintf("k%d", i), fmt.Sprintf("v%d", i))
		}
		return kv
	}
	tests := []struct {
		name     string
		outgoing metadata.MD
		kv       []string
		want     metadata.MD
	}{
		{"none", nil, nil, nil},
		{"outgoing only", metadata.MD{"a": {"1"}}, nil, metadata.MD{"a": {"1"}}},
		{"pairs only", nil, pairs(2), metadata.MD{"k0": {"v0"}, "k1": {"v1"}}},
		{"as many pairs as the client adds", nil, pairs(rpc.MaxMetadataPairs),
			metadata.MD{"k0": {"v0"}, "k1": {"v1"}, "k2": {"v2"}, "k3": {"v3"}, "k4": {"v4"}}},
		{"more pairs than the client adds", nil, pairs(rpc.MaxMetadataPairs + 1),
			metadata.MD{"k0": {"v0"}, "k1": {"v1"}, "k2": {"v2"}, "k3": {"v3"}, "k4": {"v4"}, "k5": {"v5"}}},
		{"a pair after the outgoing key's values", metadata.MD{"k0": {"out"}}, pairs(2),
			metadata.MD{"k0": {"out", "v0"}, "k1": {"v1"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			if tt.outgoing != nil {
				ctx = metadata.NewOutgoingContext(ctx, tt.outgoing.Copy())
			}
			sctx, call := serverContext(ctx, methodValues("/m"), tt.kv)
			defer call.end()
			md, _ := metadata.FromIncomingContext(sctx)
			if len(md) != len(tt.want) || (len(md) > 0 && !reflect.DeepEqual(map[string][]string(md), map[string][]string(tt.want))) {
				t.Fatalf("incoming metadata = %v, want %v", map[string][]string(md), map[string][]string(tt.want))
			}
			if out, _ := metadata.FromOutgoingContext(ctx); tt.outgoing != nil && !reflect.DeepEqual(out, tt.outgoing) {
				t.Errorf("the caller's outgoing metadata became %v", out)
			}
		})
	}
}

// TestAppendMetadataKeys: the pairs a client adds, which serverContext takes as they are,
// have lower-case keys, each once, whatever the call carries.
func TestAppendMetadataKeys(t *testing.T) {
	t.Parallel()
	authn, err := rpc.NewAuthenticator([]rpc.TenantKey{{ID: "acme", KeySHA256: rpc.HashKey("sk-acme")}}, nil,
		rpc.WithMeshSecret("a mesh secret of at least thirty-two bytes"))
	if err != nil {
		t.Fatal(err)
	}
	full := rpc.WithTenant(rpc.WithTraceID(rpc.WithRequestID(context.Background(), "req_1"), "4bf92f3577b34da6a3ce929d0e0e4736"), "acme")
	for _, tt := range []struct {
		name     string
		identity rpc.ClientIdentity
		ctx      context.Context
		pairs    int
	}{
		{"nothing to carry", rpc.ClientIdentity{}, context.Background(), 0},
		{"request identity", rpc.ClientIdentity{}, full, 2},
		{"a mesh service on a tenant's behalf", authn.ClientIdentity("router"), full, rpc.MaxMetadataPairs},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			kv := tt.identity.AppendMetadata(tt.ctx, nil)
			if len(kv) != 2*tt.pairs {
				t.Fatalf("AppendMetadata = %q, want %d pairs", kv, tt.pairs)
			}
			seen := map[string]bool{}
			for i := 0; i < len(kv); i += 2 {
				if k := kv[i]; k != strings.ToLower(k) || seen[k] {
					t.Errorf("key %q: want lower-case keys, each once (%q)", k, kv)
				}
				seen[kv[i]] = true
			}
		})
	}
}

// handingService answers Get with a Struct whose one field is kept, the same message
// every call, and says through ResponseHandOver whether it hands its answers over.
type handingService struct {
	kept     *structpb.Value
	handOver bool
	// takesOver makes Take a method whose requests are taken over (RequestTakeOver);
	// taken is the field "x" of the last request Take read.
	takesOver bool
	taken     *structpb.Value
}

const (
	handingGet  = "/mantle.test.v1.Handing/Get"
	handingTake = "/mantle.test.v1.Handing/Take"
)

func (h *handingService) TakesOverRequest(method string) bool {
	return h.takesOver && method == handingTake
}

func (h *handingService) HandsOverResponse(method string) bool {
	return h.handOver && method == handingGet
}

func (h *handingService) desc() *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: "mantle.test.v1.Handing",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Get",
			Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
				in := new(wrapperspb.StringValue)
				if err := dec(in); err != nil {
					return nil, err
				}
				return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: handingGet}, func(context.Context, any) (any, error) {
					return &structpb.Struct{Fields: map[string]*structpb.Value{"kept": h.kept}}, nil
				})
			},
		}, {
			MethodName: "Take",
			Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
				in := new(structpb.Struct)
				if err := dec(in); err != nil {
					return nil, err
				}
				return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: handingTake}, func(context.Context, any) (any, error) {
					h.taken = in.GetFields()["x"]
					return &structpb.Struct{}, nil
				})
			},
		}},
	}
}

// TestLocalConnHandsOverResponses: the answer of a method its service names in
// ResponseHandOver is moved into the caller's message, sharing what it holds; any other
// is copied, sharing nothing with what the handler kept, as over the network.
func TestLocalConnHandsOverResponses(t *testing.T) {
	t.Parallel()
	for _, handOver := range []bool{false, true} {
		t.Run(fmt.Sprintf("handOver=%t", handOver), func(t *testing.T) {
			t.Parallel()
			chain, err := rpc.ServerInterceptors(slog.New(slog.DiscardHandler), prometheus.NewRegistry(), nil,
				rpc.Audiences{handingGet: rpc.AudienceTenant})
			if err != nil {
				t.Fatal(err)
			}
			c := newLocalConn(chain, rpc.ClientIdentity{}, nil, nil)
			svc := &handingService{kept: structpb.NewStringValue("kept"), handOver: handOver}
			c.RegisterService(svc.desc(), svc)
			reply := new(structpb.Struct)
			if err := c.Invoke(context.Background(), handingGet, wrapperspb.String("hi"), reply); err != nil {
				t.Fatal(err)
			}
			got := reply.GetFields()["kept"]
			if got.GetStringValue() != "kept" {
				t.Fatalf("reply = %v, want the field kept = \"kept\"", reply)
			}
			if shared := got == svc.kept; shared != handOver {
				t.Errorf("the reply shares the handler's field: %t, want %t (moved only when handed over)", shared, handOver)
			}
			// The moved message is the caller's to read through reflection as any other.
			if !proto.Equal(reply, &structpb.Struct{Fields: map[string]*structpb.Value{"kept": structpb.NewStringValue("kept")}}) {
				t.Errorf("reply reads as %v through reflection", reply)
			}
		})
	}
}

// TestLocalConnTakesOverRequests: a request is moved into the handler's message, sharing
// what it holds, only when its caller hands it over (rpc.HandOverRequest) to a method its
// service names in RequestTakeOver; otherwise it is copied, as over the network. The
// option goes through the client's interceptor too, the way calls take with tracing on.
func TestLocalConnTakesOverRequests(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		handOver, takesOver, tracing, moved bool
	}{
		{handOver: false, takesOver: false},
		{handOver: true, takesOver: false},
		{handOver: false, takesOver: true},
		{handOver: true, takesOver: true, moved: true},
		{handOver: true, takesOver: true, tracing: true, moved: true},
		{handOver: false, takesOver: true, tracing: true},
	} {
		t.Run(fmt.Sprintf("handOver=%t,takesOver=%t,tracing=%t", tt.handOver, tt.takesOver, tt.tracing), func(t *testing.T) {
			t.Parallel()
			chain, err := rpc.ServerInterceptors(slog.New(slog.DiscardHandler), prometheus.NewRegistry(), nil,
				rpc.Audiences{handingGet: rpc.AudienceTenant, handingTake: rpc.AudienceTenant})
			if err != nil {
				t.Fatal(err)
			}
			var client, server stats.Handler
			if tt.tracing {
				client, server = &recordingStats{client: true}, &recordingStats{}
			}
			c := newLocalConn(chain, rpc.ClientIdentity{}, client, server)
			svc := &handingService{takesOver: tt.takesOver}
			c.RegisterService(svc.desc(), svc)
			x := structpb.NewStringValue("sent")
			var opts []grpc.CallOption
			if tt.handOver {
				opts = append(opts, rpc.HandOverRequest())
			}
			req := &structpb.Struct{Fields: map[string]*structpb.Value{"x": x}}
			if err := c.Invoke(context.Background(), handingTake, req, new(structpb.Struct), opts...); err != nil {
				t.Fatal(err)
			}
			if svc.taken.GetStringValue() != "sent" {
				t.Fatalf("the handler read x = %v, want \"sent\"", svc.taken)
			}
			if moved := svc.taken == x; moved != tt.moved {
				t.Errorf("the handler read the caller's field: %t, want %t", moved, tt.moved)
			}
		})
	}
}
