package router

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/pkg/telemetry/telemetrytest"
)

// tracedHarness is a harness whose router records spans; ctx carries the request's span
// (the gRPC server span in a real process), which every attempt span must be a child of.
func tracedHarness(t *testing.T, cfg Config, h *harness) (*harness, *telemetrytest.Exporter, context.Context, trace.Span) {
	t.Helper()
	exp := telemetrytest.NewExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	h.tracer = tp.Tracer(TracerName)
	h = newHarness(t, cfg, h)
	ctx, span := tp.Tracer("test").Start(context.Background(), "request", trace.WithSpanKind(trace.SpanKindServer))
	return h, exp, ctx, span
}

type wantAttempt struct {
	model  string
	failed bool
	attrs  map[attribute.Key]attribute.Value
}

// Every provider attempt is a span under the request's with what the attempt was (model,
// key id, hedge, level, retry) and how it went (class, tokens, cost, TTFT for streams);
// its status is an error exactly when the attempt failed, verification included.
func TestAttemptSpans(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  func(*Config)
		h    *harness
		// run sends the request (streaming or not) and returns when it is done.
		run  func(t *testing.T, h *harness, ctx context.Context)
		want []wantAttempt
	}{
		{
			name: "hedge wins, the cancelled primary is an error",
			cfg:  hedging,
			h: &harness{providers: map[string]*fakeProvider{
				"a": newFakeProvider(hang()),
				"b": newFakeProvider(reply("from the hedge", 2, 3)),
			}},
			run: func(t *testing.T, h *harness, ctx context.Context) {
				ch := h.start(ctx, ask("chat"))
				h.blockUntil(t, 1) // the hedge timer
				h.clock.Advance(500 * time.Millisecond)
				if d := await(t, ch); d.err != nil {
					t.Fatal(d.err)
				}
			},
			want: []wantAttempt{
				{model: "a", failed: true, attrs: map[attribute.Key]attribute.Value{
					AttrHedged: attribute.BoolValue(false), AttrErrorClass: attribute.StringValue("canceled"),
					AttrUpstreamModel: attribute.StringValue("a-upstream"), AttrLevel: attribute.StringValue("primary"),
				}},
				{model: "b", attrs: map[attribute.Key]attribute.Value{
					AttrHedged: attribute.BoolValue(true), AttrErrorClass: attribute.StringValue("none"),
					AttrInputTokens: attribute.Int64Value(2), AttrOutputTokens: attribute.Int64Value(3),
					AttrLevel: attribute.StringValue("backup_model"), AttrKeyID: attribute.StringValue("sim"),
					AttrScenario: attribute.StringValue("support"), AttrProvider: attribute.StringValue("p"),
				}},
			},
		},
		{
			name: "a failed verification fails the attempt that gave the answer",
			h: &harness{
				providers: map[string]*fakeProvider{"a": newFakeProvider(reply("not json", 10, 20)), "b": newFakeProvider(reply("{}", 1, 1))},
				verifier:  &fakeVerifier{verdict: failVerification("not json", mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT)},
			},
			run: func(t *testing.T, h *harness, ctx context.Context) {
				if d := await(t, h.start(ctx, ask("chat"))); d.err != nil {
					t.Fatal(d.err)
				}
			},
			want: []wantAttempt{
				{model: "a", failed: true, attrs: map[attribute.Key]attribute.Value{
					AttrErrorClass: attribute.StringValue("malformed_output"), AttrRetry: attribute.IntValue(0),
					// a's prices: 10 input and 20 output tokens at 1 and 2 per million.
					AttrCostUSD: attribute.Float64Value(50e-6),
				}},
				{model: "b", attrs: map[attribute.Key]attribute.Value{AttrErrorClass: attribute.StringValue("none")}},
			},
		},
		{
			name: "a stream's attempt has its time to first token",
			h:    &harness{providers: map[string]*fakeProvider{"a": newFakeProvider(streamOf("Hel", "lo"))}},
			run: func(t *testing.T, h *harness, ctx context.Context) {
				if _, err := h.router.Stream(ctx, ask("chat"), func(Delta) error { return nil }); err != nil {
					t.Fatal(err)
				}
			},
			want: []wantAttempt{{model: "a", attrs: map[attribute.Key]attribute.Value{
				AttrTTFTMS:      attribute.Int64Value(0), // the fake clock did not move
				AttrInputTokens: attribute.Int64Value(5), AttrOutputTokens: attribute.Int64Value(2),
			}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig()
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			h, exp, ctx, parent := tracedHarness(t, cfg, tt.h)
			tt.run(t, h, ctx)
			parent.End()

			// The exporter is synchronous and attempts end before the request returns.
			spans := exp.Spans()
			var attempts tracetest.SpanStubs
			for _, s := range spans {
				if s.Name == SpanAttempt {
					attempts = append(attempts, s)
				}
			}
			if len(attempts) != len(tt.want) {
				t.Fatalf("attempt spans:\n%s\nwant %d", telemetrytest.Dump(spans), len(tt.want))
			}
			for _, w := range tt.want {
				var s tracetest.SpanStub
				for _, a := range attempts {
					if attrOf(a, AttrModel).AsString() == w.model {
						s = a
					}
				}
				if s.Parent.SpanID() != parent.SpanContext().SpanID() || s.SpanKind != trace.SpanKindClient {
					t.Errorf("%s: kind %s parent %s, want a client span under the request's %s", w.model, s.SpanKind, s.Parent.SpanID(), parent.SpanContext().SpanID())
				}
				if failed := s.Status.Code == codes.Error; failed != w.failed {
					t.Errorf("%s: status %v, want failed=%t", w.model, s.Status, w.failed)
				}
				for k, v := range w.attrs {
					if got := attrOf(s, k); got != v {
						t.Errorf("%s: %s = %v, want %v", w.model, k, got.String(), v.String())
					}
				}
				if !has(s, AttrLatencyMS) {
					t.Errorf("%s: no %s", w.model, AttrLatencyMS)
				}
			}
		})
	}
}

// The front door continues an HTTP caller's traceparent: its span is the caller's child,
// the request's trace id (logs, QualityContext) is the caller's, and with tracing off
// the trace id still is.
func TestFrontDoorContinuesTraceparent(t *testing.T) {
	t.Parallel()
	const (
		traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
		spanID  = "00f067aa0ba902b7"
	)
	tests := []struct {
		name    string
		tracing bool
		header  string
		want    string // trace id the handler sees; "" means a fresh one
	}{
		{"tracing on", true, "00-" + traceID + "-" + spanID + "-01", traceID},
		{"tracing off", false, "00-" + traceID + "-" + spanID + "-01", traceID},
		{"tracing off, invalid header", false, "00-" + traceID + "-0000000000000000-01", ""},
		{"tracing off, no header", false, "", ""},
		{"tracing on, no header", true, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			exp := telemetrytest.NewExporter()
			h := &harness{}
			if tt.tracing {
				tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
				t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
				h.tracer = tp.Tracer(TracerName)
			}
			h = newHarness(t, testConfig(), h)
			f := &frontDoor{router: h.router}
			var seen string
			handler := f.traced("/v1/test", func(w http.ResponseWriter, r *http.Request) {
				ctx, _ := f.authenticate(w, r)
				seen = rpc.TraceID(ctx)
				w.WriteHeader(http.StatusTeapot)
			})
			req := httptest.NewRequest(http.MethodPost, "/v1/test", nil)
			if tt.header != "" {
				req.Header.Set("traceparent", tt.header)
			}
			handler.ServeHTTP(httptest.NewRecorder(), req)

			if tt.want != "" && seen != tt.want {
				t.Errorf("handler saw trace %q, want %q", seen, tt.want)
			}
			if tt.want == "" && (len(seen) != 32 || seen == traceID) {
				t.Errorf("handler saw trace %q, want a fresh 32-hex id", seen)
			}
			spans := exp.Spans()
			if !tt.tracing {
				if len(spans) != 0 {
					t.Errorf("spans with tracing off:\n%s", telemetrytest.Dump(spans))
				}
				return
			}
			if len(spans) != 1 {
				t.Fatalf("spans:\n%s\nwant the front door's", telemetrytest.Dump(spans))
			}
			s := spans[0]
			if s.Name != "POST /v1/test" || s.SpanKind != trace.SpanKindServer || s.SpanContext.TraceID().String() != seen {
				t.Errorf("span %q kind %s trace %s, want POST /v1/test, server, trace %s", s.Name, s.SpanKind, s.SpanContext.TraceID(), seen)
			}
			if tt.header != "" && (s.Parent.SpanID().String() != spanID || !s.Parent.IsRemote()) {
				t.Errorf("span parent %s, want the caller's %s", s.Parent.SpanID(), spanID)
			}
			// A 4xx is the caller's error: the status code is recorded, the span is not failed.
			if attrOf(s, "http.response.status_code").AsInt64() != http.StatusTeapot || s.Status.Code == codes.Error {
				t.Errorf("span status code %v status %v, want 418 and no error", attrOf(s, "http.response.status_code").String(), s.Status)
			}
		})
	}
}

func attrOf(s tracetest.SpanStub, k attribute.Key) attribute.Value {
	for _, kv := range s.Attributes {
		if kv.Key == k {
			return kv.Value
		}
	}
	return attribute.Value{}
}

func has(s tracetest.SpanStub, k attribute.Key) bool { return attrOf(s, k).Type() != attribute.EMPTY }
