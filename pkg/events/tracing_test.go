package events_test

import (
	"context"
	"github.com/mantle-mesh/mantle/pkg/natsembed"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/mantle-mesh/mantle/pkg/events"
	"github.com/mantle-mesh/mantle/pkg/telemetry/telemetrytest"
)

// A publish is a producer span, child of the caller's span, and the message carries its
// traceparent so that a consumer continues the same trace from the publish.
func TestPublishCarriesTheTrace(t *testing.T) {
	t.Parallel()
	srv, err := natsembed.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	exp := telemetrytest.NewExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	pub, err := events.Connect(context.Background(), srv.URL(), slog.New(slog.DiscardHandler), prometheus.NewRegistry(), events.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	sub, err := pub.Conn().SubscribeSync("mantle.events.test")
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Conn().Flush(); err != nil { // the subscription is in place before the publish
		t.Fatal(err)
	}

	ctx, parent := tp.Tracer("test").Start(context.Background(), "request")
	pub.Publish(ctx, "mantle.events.test", wrapperspb.String("degraded"))
	parent.End()
	msg, err := sub.NextMsgWithContext(t.Context())
	if err != nil {
		t.Fatalf("no message: %v", err)
	}

	spans := exp.Spans() // synchronous exporter: both spans ended above
	var send tracetest.SpanStub
	for _, s := range spans {
		if s.Name == "send mantle.events.test" {
			send = s
		}
	}
	if send.SpanKind != trace.SpanKindProducer {
		t.Fatalf("spans:\n%s\nwant a producer span named send mantle.events.test", telemetrytest.Dump(spans))
	}
	if send.Parent.SpanID() != parent.SpanContext().SpanID() {
		t.Errorf("publish span's parent = %s, want the request's span %s", send.Parent.SpanID(), parent.SpanContext().SpanID())
	}
	got := trace.SpanContextFromContext(events.TraceContext(context.Background(), msg.Header))
	if got.TraceID() != parent.SpanContext().TraceID() || got.SpanID() != send.SpanContext.SpanID() {
		t.Errorf("message headers %v name span %s/%s, want the publish span %s/%s", msg.Header,
			got.TraceID(), got.SpanID(), send.SpanContext.TraceID(), send.SpanContext.SpanID())
	}
	if msg.Header.Get("traceparent") == "" {
		t.Errorf("headers %v: want a lower-case traceparent, as W3C spells it", msg.Header)
	}
}

// Without tracing, a publish outside any trace sends no trace headers.
func TestPublishWithoutTracing(t *testing.T) {
	t.Parallel()
	srv, err := natsembed.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	pub, err := events.Connect(context.Background(), srv.URL(), slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	sub, err := pub.Conn().SubscribeSync("mantle.events.test")
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	pub.Publish(context.Background(), "mantle.events.test", wrapperspb.String("x"))
	msg, err := sub.NextMsgWithContext(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if v := msg.Header.Get("traceparent"); v != "" {
		t.Errorf("traceparent = %q, want none", v)
	}
}
