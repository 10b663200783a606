package rpc_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/test/bufconn"

	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/pkg/telemetry/telemetrytest"
)

// startTracedServer is startServer with tracing on: its own tracer provider (as every
// mantle process has) exporting to exp.
func startTracedServer(t *testing.T, exp sdktrace.SpanExporter, backend *grpc.ClientConn) *testServer {
	t.Helper()
	s := &testServer{lis: bufconn.Listen(1 << 20), reg: prometheus.NewRegistry(), logs: &syncBuffer{}}
	log := slog.New(slog.NewTextHandler(s.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	chain, err := rpc.ServerInterceptors(log, s.reg, nil, probeAudiences)
	if err != nil {
		t.Fatalf("ServerOptions: %v", err)
	}
	srv := grpc.NewServer(append(chain.ServerOptions(), rpc.TracingServerOption(newProvider(t, exp)))...)
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

func newProvider(t *testing.T, exp sdktrace.SpanExporter) *sdktrace.TracerProvider {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp
}

// With tracing on, a call through two servers is one trace that continues the caller's
// traceparent: each server span is the child of the client span that called it, and the
// trace id handlers and logs see is the spans' own.
func TestTracingContinuesTheCallersTrace(t *testing.T) {
	t.Parallel()
	const (
		traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
		spanID  = "00f067aa0ba902b7"
	)
	exp := telemetrytest.NewExporter()
	back := startTracedServer(t, exp, nil)
	backConn := back.dial(t, append(rpc.ClientIdentity{}.DialOptions(), rpc.TracingDialOption(newProvider(t, exp)))...)
	front := startTracedServer(t, exp, backConn)

	got, err := call(withMD("x-request-id", "req_traced", "traceparent", "00-"+traceID+"-"+spanID+"-01"), front.dial(t), "forward")
	if err != nil {
		t.Fatalf("forward: %v", err)
	}
	if want := "tenant= request=req_traced trace=" + traceID; got != want {
		t.Errorf("back-end saw %q, want %q", got, want)
	}

	// Server spans end after their response left: wait for both.
	spans := exp.Await(t, func(s tracetest.SpanStubs) bool { return count(s, trace.SpanKindServer) == 2 })
	var frontServer, client, backServer tracetest.SpanStub
	for _, s := range spans {
		switch {
		case s.SpanKind == trace.SpanKindClient:
			client = s
		case s.SpanKind == trace.SpanKindServer && s.Parent.IsRemote() && s.Parent.SpanID().String() == spanID:
			frontServer = s
		case s.SpanKind == trace.SpanKindServer:
			backServer = s
		}
	}
	if len(spans) != 3 {
		t.Fatalf("spans:\n%s\nwant a front server span, its client span and the back-end's server span", telemetrytest.Dump(spans))
	}
	for _, s := range spans {
		if s.SpanContext.TraceID().String() != traceID {
			t.Errorf("%s has trace %s, want the caller's %s", s.Name, s.SpanContext.TraceID(), traceID)
		}
		if s.Name != strings.TrimPrefix(probeCall, "/") {
			t.Errorf("span name %q, want %q", s.Name, strings.TrimPrefix(probeCall, "/"))
		}
	}
	if client.Parent.SpanID() != frontServer.SpanContext.SpanID() {
		t.Errorf("client span's parent = %s, want the front server span %s", client.Parent.SpanID(), frontServer.SpanContext.SpanID())
	}
	if backServer.Parent.SpanID() != client.SpanContext.SpanID() {
		t.Errorf("back-end server span's parent = %s, want the client span %s", backServer.Parent.SpanID(), client.SpanContext.SpanID())
	}
	for name, s := range map[string]*testServer{"front": front, "back": back} {
		if logs := s.logs.String(); !strings.Contains(logs, "trace_id="+traceID) {
			t.Errorf("%s logs do not carry trace_id=%s:\n%s", name, traceID, logs)
		}
	}
}

// Without a caller's traceparent a traced server starts a new trace, and the id handlers
// log is that trace's.
func TestTracingNewTraceAgreesWithLogs(t *testing.T) {
	t.Parallel()
	exp := telemetrytest.NewExporter()
	s := startTracedServer(t, exp, nil)
	got, err := call(context.Background(), s.dial(t), "whoami")
	if err != nil {
		t.Fatal(err)
	}
	spans := exp.Await(t, func(s tracetest.SpanStubs) bool { return count(s, trace.SpanKindServer) == 1 })
	id := spans[0].SpanContext.TraceID().String()
	if !strings.HasSuffix(got, "trace="+id) {
		t.Errorf("handler saw %q, want the server span's trace %s", got, id)
	}
	if spans[0].Parent.IsValid() {
		t.Errorf("server span has parent %s, want a root", spans[0].Parent.SpanID())
	}
}

// Health probes arrive every few seconds and are not traced.
func TestTracingSkipsHealthChecks(t *testing.T) {
	t.Parallel()
	exp := telemetrytest.NewExporter()
	s := startTracedServer(t, exp, nil)
	conn := s.dial(t)
	if _, err := grpc_health_v1.NewHealthClient(conn).Check(context.Background(), &grpc_health_v1.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	// A traced call after the probe: once its span is in, the probe's would be too.
	if _, err := call(context.Background(), conn, "whoami"); err != nil {
		t.Fatal(err)
	}
	spans := exp.Await(t, func(s tracetest.SpanStubs) bool { return count(s, trace.SpanKindServer) >= 1 })
	for _, sp := range spans {
		if strings.Contains(sp.Name, "Health") {
			t.Errorf("health check traced: %s", sp.Name)
		}
	}
}

func count(spans tracetest.SpanStubs, kind trace.SpanKind) int {
	n := 0
	for _, s := range spans {
		if s.SpanKind == kind {
			n++
		}
	}
	return n
}
