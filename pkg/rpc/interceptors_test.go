package rpc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// probe is a test service. Its one unary method runs the command named in the request:
//
//	whoami   answers "tenant=<t> request=<id> trace=<id>" as the handler sees them
//	panic    panics
//	plain    returns an error that is not a status and names a secret
//	canceled returns context.Canceled
//	notfound returns a NOT_FOUND status
//	forward  calls whoami on the back-end with the handler's context
type probe struct {
	backend *grpc.ClientConn
}

const (
	probeService = "mantle.test.v1.Probe"
	probeCall    = "/" + probeService + "/Call"
	probeWatch   = "/" + probeService + "/Watch"
	secret       = "password hunter2 rejected by db"
)

var probeDesc = grpc.ServiceDesc{
	ServiceName: probeService,
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Call",
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.StringValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) {
				return srv.(*probe).call(ctx, req.(*wrapperspb.StringValue).GetValue())
			}
			return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: probeCall}, h)
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Watch",
		ServerStreams: true,
		Handler: func(_ any, stream grpc.ServerStream) error {
			return stream.SendMsg(wrapperspb.String(whoami(stream.Context())))
		},
	}},
}

func whoami(ctx context.Context) string {
	return fmt.Sprintf("tenant=%s request=%s trace=%s", rpc.Tenant(ctx), rpc.RequestID(ctx), rpc.TraceID(ctx))
}

func (p *probe) call(ctx context.Context, cmd string) (*wrapperspb.StringValue, error) {
	switch cmd {
	case "whoami":
		return wrapperspb.String(whoami(ctx)), nil
	case "panic":
		panic("boom: " + secret)
	case "plain":
		return nil, errors.New(secret)
	case "canceled":
		return nil, fmt.Errorf("waiting for upstream: %w", context.Canceled)
	case "notfound":
		return nil, status.Error(codes.NotFound, "no such route")
	case "forward":
		out := new(wrapperspb.StringValue)
		if err := p.backend.Invoke(ctx, probeCall, wrapperspb.String("whoami"), out); err != nil {
			return nil, err
		}
		return out, nil
	}
	return nil, status.Errorf(codes.Unimplemented, "unknown command %q", cmd)
}

// syncBuffer is a log sink the server goroutines and the test can share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type testServer struct {
	lis  *bufconn.Listener
	reg  *prometheus.Registry
	logs *syncBuffer
}

// startServer serves probe and health with rpc.ServerInterceptors' chain on an in-memory listener.
func startServer(t *testing.T, authn *rpc.Authenticator, backend *grpc.ClientConn) *testServer {
	t.Helper()
	return startServerWith(t, authn, backend, probeAudiences)
}

// startServerWith is startServer with the probe on the given planes.
func startServerWith(t *testing.T, authn *rpc.Authenticator, backend *grpc.ClientConn, audiences rpc.Audiences) *testServer {
	t.Helper()
	s := &testServer{lis: bufconn.Listen(1 << 20), reg: prometheus.NewRegistry(), logs: &syncBuffer{}}
	log := slog.New(slog.NewTextHandler(s.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	chain, err := rpc.ServerInterceptors(log, s.reg, authn, audiences)
	if err != nil {
		t.Fatalf("ServerOptions: %v", err)
	}
	srv := grpc.NewServer(chain.ServerOptions()...)
	srv.RegisterService(&probeDesc, &probe{backend: backend})
	grpc_health_v1.RegisterHealthServer(srv, health.NewServer())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(s.lis) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return s
}

func (s *testServer) dial(t *testing.T, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	opts = append(opts,
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return s.lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	conn, err := grpc.NewClient("passthrough:///bufnet", opts...)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func call(ctx context.Context, conn *grpc.ClientConn, cmd string) (string, error) {
	out := new(wrapperspb.StringValue)
	err := conn.Invoke(ctx, probeCall, wrapperspb.String(cmd), out)
	return out.GetValue(), err
}

func withMD(kv ...string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), kv...)
}

// probeAudiences puts the probe on the tenant plane.
var probeAudiences = rpc.Audiences{probeCall: rpc.AudienceTenant, probeWatch: rpc.AudienceTenant}

// meshSecret is the test mesh's secret.
const meshSecret = "0123456789abcdef0123456789abcdef-test"

func newAuth(t *testing.T) *rpc.Authenticator {
	t.Helper()
	a, err := rpc.NewAuthenticator([]rpc.TenantKey{{ID: "acme", KeySHA256: rpc.HashKey("sk-acme")}}, nil, rpc.WithMeshSecret(meshSecret))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// handled is grpc_server_handled_total for one method and code.
func handled(t *testing.T, reg *prometheus.Registry, method string, code codes.Code) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "grpc_server_handled_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["grpc_method"] == method && labels["grpc_code"] == code.String() {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func TestAuthentication(t *testing.T) {
	t.Parallel()
	s := startServer(t, newAuth(t), nil)
	conn := s.dial(t)
	tests := []struct {
		name       string
		md         []string
		wantCode   codes.Code
		wantTenant string
	}{
		{"no key", nil, codes.Unauthenticated, ""},
		{"wrong key", []string{"authorization", "Bearer sk-wrong"}, codes.Unauthenticated, ""},
		{"other scheme", []string{"authorization", "Basic c2stYWNtZQ=="}, codes.Unauthenticated, ""},
		{"empty bearer", []string{"authorization", "Bearer "}, codes.Unauthenticated, ""},
		{"valid key", []string{"authorization", "Bearer sk-acme"}, codes.OK, "acme"},
		{"lower-case scheme", []string{"authorization", "bearer sk-acme"}, codes.OK, "acme"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := withMD(tt.md...)
			t.Run("unary", func(t *testing.T) {
				got, err := call(ctx, conn, "whoami")
				checkAuth(t, got, err, tt.wantCode, tt.wantTenant)
			})
			t.Run("stream", func(t *testing.T) {
				got, err := watch(ctx, conn)
				checkAuth(t, got, err, tt.wantCode, tt.wantTenant)
			})
		})
	}
}

func watch(ctx context.Context, conn *grpc.ClientConn) (string, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := conn.NewStream(ctx, &probeDesc.Streams[0], probeWatch)
	if err != nil {
		return "", err
	}
	if err := st.SendMsg(wrapperspb.String("")); err != nil {
		return "", err
	}
	if err := st.CloseSend(); err != nil {
		return "", err
	}
	out := new(wrapperspb.StringValue)
	err = st.RecvMsg(out)
	return out.GetValue(), err
}

func checkAuth(t *testing.T, got string, err error, wantCode codes.Code, wantTenant string) {
	t.Helper()
	if status.Code(err) != wantCode {
		t.Fatalf("code = %v (%v), want %v", status.Code(err), err, wantCode)
	}
	if wantCode == codes.Unauthenticated {
		if reason := rpc.ErrorInfo(err).GetReason(); reason != rpc.ReasonUnauthenticated {
			t.Errorf("ErrorInfo reason = %q, want %s", reason, rpc.ReasonUnauthenticated)
		}
		return
	}
	if !strings.HasPrefix(got, "tenant="+wantTenant+" ") {
		t.Errorf("handler saw %q, want tenant %s", got, wantTenant)
	}
}

func TestHealthNeedsNoKey(t *testing.T) {
	t.Parallel()
	s := startServer(t, newAuth(t), nil)
	res, err := grpc_health_v1.NewHealthClient(s.dial(t)).Check(context.Background(), &grpc_health_v1.HealthCheckRequest{})
	if err != nil || res.GetStatus() != grpc_health_v1.HealthCheckResponse_SERVING {
		t.Errorf("health check without key = %v, %v; want SERVING", res.GetStatus(), err)
	}
}

func TestHandlerErrors(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil, nil)
	conn := s.dial(t)
	tests := []struct {
		cmd        string
		wantCode   codes.Code
		wantMsg    string
		wantReason string
	}{
		{"plain", codes.Internal, "internal error", rpc.ReasonInternal},
		{"panic", codes.Internal, "internal error", ""},
		{"canceled", codes.Canceled, "request canceled", ""},
		{"notfound", codes.NotFound, "no such route", ""},
	}
	for _, tt := range tests {
		t.Run(tt.cmd, func(t *testing.T) {
			_, err := call(context.Background(), conn, tt.cmd)
			st := status.Convert(err)
			if st.Code() != tt.wantCode || st.Message() != tt.wantMsg {
				t.Errorf("status = %v %q, want %v %q", st.Code(), st.Message(), tt.wantCode, tt.wantMsg)
			}
			if got := rpc.ErrorInfo(err).GetReason(); got != tt.wantReason {
				t.Errorf("ErrorInfo reason = %q, want %q", got, tt.wantReason)
			}
			if strings.Contains(fmt.Sprint(st.Proto()), "hunter2") {
				t.Errorf("status leaks the internal error: %v", st.Proto())
			}
			// Metrics count the code the caller saw, not the handler's raw error.
			if n := handled(t, s.reg, "Call", tt.wantCode); n < 1 {
				t.Errorf("grpc_server_handled_total{grpc_method=Call,grpc_code=%s} = %v, want >= 1", tt.wantCode, n)
			}
		})
	}
	if n := handled(t, s.reg, "Call", codes.Unknown); n != 0 {
		t.Errorf("grpc_server_handled_total{grpc_code=Unknown} = %v, want 0: callers never see Unknown", n)
	}

	// The causes went to the log, not to the caller.
	logs := s.logs.String()
	for _, want := range []string{"panic in handler", "boom: " + secret, "grpc.error=\"" + secret + "\"", "grpc.code=Internal"} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs do not contain %q:\n%s", want, logs)
		}
	}

	// The panic did not take the server down.
	if _, err := call(context.Background(), conn, "whoami"); err != nil {
		t.Errorf("call after panic: %v", err)
	}
}

func TestRequestMetadataReachesHandler(t *testing.T) {
	t.Parallel()
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	s := startServer(t, nil, nil)
	conn := s.dial(t)
	tests := []struct {
		name        string
		md          []string
		wantRequest string
		wantTrace   string // "" means a fresh random trace id
	}{
		{"both", []string{"x-request-id", "req_abc", "traceparent", "00-" + traceID + "-00f067aa0ba902b7-01"}, "req_abc", traceID},
		{"none", nil, "", ""},
		{"invalid traceparent", []string{"traceparent", "00-" + strings.ToUpper(traceID) + "-00f067aa0ba902b7-01"}, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := call(withMD(tt.md...), conn, "whoami")
			if err != nil {
				t.Fatal(err)
			}
			m := regexp.MustCompile(`^tenant= request=(\S*) trace=([0-9a-f]{32})$`).FindStringSubmatch(got)
			if m == nil {
				t.Fatalf("handler saw %q, want a request id and a 32-hex trace id", got)
			}
			if m[1] != tt.wantRequest {
				t.Errorf("request id = %q, want %q", m[1], tt.wantRequest)
			}
			if tt.wantTrace != "" && m[2] != tt.wantTrace {
				t.Errorf("trace id = %q, want %q", m[2], tt.wantTrace)
			}
			if tt.wantTrace == "" && strings.EqualFold(m[2], traceID) {
				t.Errorf("trace id = %q, want a fresh one", m[2])
			}
		})
	}
}

func TestClientIdentityPropagatesToNextHop(t *testing.T) {
	t.Parallel()
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	authn := newAuth(t)
	back := startServer(t, authn, nil)
	ctx := withMD("authorization", "Bearer sk-acme", "x-request-id", "req_chain",
		"traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")

	t.Run("with ClientOptions", func(t *testing.T) {
		t.Parallel()
		front := startServer(t, authn, back.dial(t, authn.ClientIdentity("front").DialOptions()...))
		got, err := call(ctx, front.dial(t), "forward")
		if err != nil {
			t.Fatalf("forward: %v", err)
		}
		if want := "tenant=acme request=req_chain trace=" + traceID; got != want {
			t.Errorf("back-end saw %q, want %q", got, want)
		}
	})
	t.Run("without the service identity the back-end refuses", func(t *testing.T) {
		t.Parallel()
		front := startServer(t, authn, back.dial(t))
		_, err := call(ctx, front.dial(t), "forward")
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("forward without a service credential = %v, want Unauthenticated: the tenant's key is not forwarded", err)
		}
	})
}

// TestAppendMetadataTraceParent: a call carries the span's traceparent when its context
// holds one, else one made of the request's trace id; a process that records spans finds
// a span started below the request's meta.
func TestAppendMetadataTraceParent(t *testing.T) {
	t.Parallel()
	const ownTrace, spanTrace, spanID = "4bf92f3577b34da6a3ce929d0e0e4736", "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	sc := func() trace.SpanContext {
		tid, _ := trace.TraceIDFromHex(spanTrace)
		sid, _ := trace.SpanIDFromHex(spanID)
		return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
	}()
	withOwn := rpc.WithTraceID(context.Background(), ownTrace)
	for _, tt := range []struct {
		name      string
		identity  rpc.ClientIdentity
		ctx       context.Context
		wantTrace string
		wantExact string // the whole traceparent, when it is the span's
	}{
		{"the request's own trace id", rpc.ClientIdentity{}, withOwn, ownTrace, ""},
		{"a caller's span", rpc.ClientIdentity{}, trace.ContextWithRemoteSpanContext(context.Background(), sc), spanTrace,
			"00-" + spanTrace + "-" + spanID + "-01"},
		{"a traced process's span below the request's meta", rpc.ClientIdentity{}.WithTracing(), trace.ContextWithSpanContext(withOwn, sc), spanTrace,
			"00-" + spanTrace + "-" + spanID + "-01"},
		{"a traced process without a span", rpc.ClientIdentity{}.WithTracing(), withOwn, ownTrace, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			kv := tt.identity.AppendMetadata(tt.ctx, nil)
			tp := ""
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == rpc.MetadataTraceParent {
					tp = kv[i+1]
				}
			}
			if got, ok := rpc.TraceIDFromTraceParent(tp); !ok || got != tt.wantTrace {
				t.Errorf("traceparent %q carries trace %q (valid %t), want %q", tp, got, ok, tt.wantTrace)
			}
			if tt.wantExact != "" && tp != tt.wantExact {
				t.Errorf("traceparent = %q, want the span's %q", tp, tt.wantExact)
			}
		})
	}
}
