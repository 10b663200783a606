package rpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/mantle-mesh/mantle/pkg/procusage"
)

// countedDesc is a service whose methods end as their request says. Do answers "ok", or
// fails with NOT_FOUND ("notfound"), a plain error ("plain") or context.Canceled
// ("canceled"); Send sends as many messages as the request's value, then fails when it
// is odd; Take reads messages until the client closes, then answers.
var countedDesc = grpc.ServiceDesc{
	ServiceName: "mantle.test.v1.Counted",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Do",
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.StringValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(_ context.Context, req any) (any, error) {
				switch req.(*wrapperspb.StringValue).GetValue() {
				case "notfound":
					return nil, status.Error(codes.NotFound, "no such thing")
				case "plain":
					return nil, errors.New("disk full")
				case "canceled":
					return nil, fmt.Errorf("waiting: %w", context.Canceled)
				}
				return wrapperspb.String("ok"), nil
			}
			return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/mantle.test.v1.Counted/Do"}, h)
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Send",
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
			if in.Value%2 == 1 {
				return status.Error(codes.Unavailable, "odd")
			}
			return nil
		},
	}, {
		StreamName:    "Take",
		ClientStreams: true,
		Handler: func(_ any, ss grpc.ServerStream) error {
			n := int32(0)
			for {
				err := ss.RecvMsg(new(wrapperspb.Int32Value))
				if errors.Is(err, io.EOF) {
					return ss.SendMsg(wrapperspb.Int32(n))
				}
				if err != nil {
					return err
				}
				n++
			}
		},
	}},
}

// TestServerMetricsAsTheProvider: serverMetrics exports what go-grpc-middleware's
// Prometheus provider exports for the same calls (unary calls ending in each way, server
// and client streams, each method several times): the same families with the same help,
// type, labels and counts, and the same histogram buckets.
func TestServerMetricsAsTheProvider(t *testing.T) {
	t.Parallel()
	ours := newServerMetrics()
	theirs := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram())
	got := exercise(t, ours, ours.unary(), ours.stream())
	want := exercise(t, theirs, theirs.UnaryServerInterceptor(), theirs.StreamServerInterceptor())
	if got != want {
		t.Fatalf("serverMetrics exported\n%s\nthe provider\n%s", got, want)
	}
}

// exercise makes the same calls on a gRPC server with the metrics interceptors given and
// returns what c exports, without the histograms' sums and bucket counts, which depend
// on time.
func exercise(t *testing.T, c prometheus.Collector, unary grpc.UnaryServerInterceptor, stream grpc.StreamServerInterceptor) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.UnaryInterceptor(unary), grpc.StreamInterceptor(stream))
	srv.RegisterService(&countedDesc, struct{}{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctx := t.Context()

	for _, cmd := range []string{"ok", "ok", "notfound", "plain", "canceled", "ok"} {
		_ = conn.Invoke(ctx, "/mantle.test.v1.Counted/Do", wrapperspb.String(cmd), new(wrapperspb.StringValue))
	}
	for _, n := range []int32{2, 3, 0} {
		s, err := conn.NewStream(ctx, &countedDesc.Streams[0], "/mantle.test.v1.Counted/Send")
		if err != nil {
			t.Fatal(err)
		}
		if err := s.SendMsg(wrapperspb.Int32(n)); err != nil {
			t.Fatal(err)
		}
		if err := s.CloseSend(); err != nil {
			t.Fatal(err)
		}
		for {
			if err := s.RecvMsg(new(wrapperspb.Int32Value)); err != nil {
				break // io.EOF, or the odd count's UNAVAILABLE
			}
		}
	}
	for _, n := range []int{3, 1} {
		s, err := conn.NewStream(ctx, &countedDesc.Streams[1], "/mantle.test.v1.Counted/Take")
		if err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if err := s.SendMsg(wrapperspb.Int32(int32(i))); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.CloseSend(); err != nil {
			t.Fatal(err)
		}
		if err := s.RecvMsg(new(wrapperspb.Int32Value)); err != nil {
			t.Fatal(err)
		}
	}
	// The server's side of a stream may end after the client's: stop waits for it.
	srv.GracefulStop()

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if h := m.GetHistogram(); h != nil {
				h.SampleSum = nil
				for _, b := range h.GetBucket() {
					b.CumulativeCount = nil
				}
			}
			if ctr := m.GetCounter(); ctr != nil {
				ctr.CreatedTimestamp = nil
			}
			if h := m.GetHistogram(); h != nil {
				h.CreatedTimestamp = nil
			}
		}
		out += prototext.Format(mf) + "\n"
	}
	return out
}

// BenchmarkServerMetricsUnary is what the metrics step costs a unary call once its
// method's series exist: find the method, count it started, its message received and
// sent, and its end.
func BenchmarkServerMetricsUnary(b *testing.B) {
	s := newServerMetrics()
	meta := interceptors.NewServerCallMeta("/mantle.quota.v1.QuotaService/Settle", nil, nil)
	ctx := context.Background()
	b.ReportAllocs()
	// CPU time, unlike ns/op, leaves out the time spent waiting for a CPU on a shared machine.
	cpuStart, cpuOK := procusage.CPU()
	for b.Loop() {
		r, _ := s.ServerReporter(ctx, meta)
		r.PostMsgReceive(nil, nil, 0)
		r.PostMsgSend(nil, nil, 0)
		r.PostCall(nil, time.Millisecond)
	}
	if cpuEnd, ok := procusage.CPU(); ok && cpuOK {
		b.ReportMetric(float64(cpuEnd-cpuStart)/float64(b.N), "cpu-ns/op")
	}
}
