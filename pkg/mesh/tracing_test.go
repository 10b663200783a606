package mesh_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/pkg/telemetry/telemetrytest"
	"github.com/mantle-mesh/mantle/services/router"
)

const (
	callerTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	callerSpanID  = "00f067aa0ba902b7"
	callerParent  = "00-" + callerTraceID + "-" + callerSpanID + "-01"
)

// tracedMesh runs testConfig split into four processes, each with its own tracer provider
// exporting to one in-memory exporter.
func tracedMesh(t *testing.T) (*meshtest.Mesh, *telemetrytest.Exporter) {
	t.Helper()
	exp := telemetrytest.NewExporter()
	cfg := testConfig()
	cfg.Tracing.Enabled = true
	return meshtest.StartWith(t, cfg, meshtest.Split, mesh.Options{TraceExporter: exp}), exp
}

// tracedHop is one gRPC call the router makes for every request, and the process that serves it.
type tracedHop struct {
	method  string // span name: package.Service/Method
	service string // service.name of the serving process
}

var tracedHops = []tracedHop{
	{"mantle.quota.v1.QuotaService/Reserve", "mantle-quota"},
	{"mantle.cache.v1.CacheService/Lookup", "mantle-cache"},
	{"mantle.verifier.v1.VerifierService/Verify", "mantle-verifier"},
	{"mantle.quota.v1.QuotaService/Settle", "mantle-quota"},
}

// requestTrace is the spans of one request, indexed for assertions.
type requestTrace struct {
	spans tracetest.SpanStubs
	root  tracetest.SpanStub // the router's span for the request (gRPC server or HTTP front door)
}

// checkTree asserts the shape every request has: one trace; the router's span is the
// parent of a client span per tracedHop, whose server span (in the serving process) is its
// child; the failed and the answering provider attempt are children of the router's span
// with their attributes; the degradation event's publish is the router's child too.
func checkTree(t *testing.T, rt requestTrace, requestID string) {
	t.Helper()
	defer func() {
		if t.Failed() {
			t.Logf("spans:\n%s", telemetrytest.Dump(rt.spans))
		}
	}()
	if got := spanService(rt.root); got != "mantle-router" {
		t.Errorf("router span reported by %q, want mantle-router", got)
	}
	for _, h := range tracedHops {
		client, _ := rt.child(rt.root, h.method, trace.SpanKindClient)
		server, _ := rt.child(client, h.method, trace.SpanKindServer)
		if spanService(client) != "mantle-router" || spanService(server) != h.service {
			t.Errorf("%s: client in %q, server in %q; want mantle-router and %s", h.method, spanService(client), spanService(server), h.service)
		}
		if server.Status.Code == codes.Error {
			t.Errorf("%s: server span status %v", h.method, server.Status)
		}
	}

	attempts := rt.children(rt.root, router.SpanAttempt)
	byModel := map[string]tracetest.SpanStub{}
	for _, a := range attempts {
		byModel[spanAttr(a, router.AttrModel).AsString()] = a
	}
	broken, backup := byModel["broken"], byModel["backup"]
	if broken.Status.Code != codes.Error || spanAttr(broken, router.AttrErrorClass).AsString() == "none" {
		t.Errorf("broken's attempt: status %v class %q, want an error with its class", broken.Status, spanAttr(broken, router.AttrErrorClass).AsString())
	}
	if backup.Status.Code == codes.Error {
		t.Errorf("backup's attempt: status %v, want not an error", backup.Status)
	}
	want := map[attribute.Key]attribute.Value{
		router.AttrModel:         attribute.StringValue("backup"),
		router.AttrUpstreamModel: attribute.StringValue("backup"),
		router.AttrProvider:      attribute.StringValue("sim"),
		router.AttrKeyID:         attribute.StringValue("sim"),
		router.AttrScenario:      attribute.StringValue("chat"),
		router.AttrHedged:        attribute.BoolValue(false),
		router.AttrRetry:         attribute.IntValue(0),
		router.AttrLevel:         attribute.StringValue("backup_model"),
		router.AttrErrorClass:    attribute.StringValue("none"),
	}
	for k, v := range want {
		if got := spanAttr(backup, k); got != v {
			t.Errorf("backup's attempt %s = %v, want %v", k, got.String(), v.String())
		}
	}
	if spanAttr(backup, router.AttrInputTokens).AsInt64() <= 0 || spanAttr(backup, router.AttrOutputTokens).AsInt64() <= 0 {
		t.Errorf("backup's attempt tokens in %v out %v, want both counted", spanAttr(backup, router.AttrInputTokens).String(), spanAttr(backup, router.AttrOutputTokens).String())
	}
	for _, k := range []attribute.Key{router.AttrCostUSD, router.AttrLatencyMS} {
		if !spanHas(backup, k) {
			t.Errorf("backup's attempt has no %s", k)
		}
	}
	if id := spanAttr(backup, router.AttrProviderRequestID).AsString(); !strings.HasPrefix(id, "req_sim_") {
		t.Errorf("backup's attempt provider request id %q, want the sim's x-request-id", id)
	}

	publish := rt.children(rt.root, "send mantle.events.degradation")
	if len(publish) != 1 || publish[0].SpanKind != trace.SpanKindProducer {
		t.Errorf("degradation publish spans under the router's: %d, want one producer span", len(publish))
	}

	for k, v := range map[attribute.Key]attribute.Value{
		router.AttrRequestID:  attribute.StringValue(requestID),
		router.AttrCacheHit:   attribute.BoolValue(false),
		router.AttrLevel:      attribute.StringValue("backup_model"),
		router.AttrAnsweredBy: attribute.StringValue("backup"),
		router.AttrRoute:      attribute.StringValue("chat"),
	} {
		if got := spanAttr(rt.root, k); got != v {
			t.Errorf("router span %s = %v, want %v", k, got.String(), v.String())
		}
	}
}

// The "done when": a request through the four services in split mode is one
// trace with every tracedHop in its place.
func TestTracingSplitMeshGRPC(t *testing.T) {
	m, exp := tracedMesh(t)
	client := routerv1.NewRouterServiceClient(meshtest.Dial(t, m.GRPCAddr))
	tests := []struct {
		name        string
		traceparent string // the caller's; "" starts a new trace
		prompt      string
	}{
		{"new trace", "", "Why do hedged requests cut the tail?"},
		{"caller's trace continues", callerParent, "What does a bulkhead isolate?"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := authed(acmeKey)
			if tt.traceparent != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", tt.traceparent)
			}
			q := ask("chat", tt.prompt)
			q.Temperature = proto.Float64(0) // cacheable, so the answer is stored: one more tracedHop
			resp, err := client.Complete(ctx, &routerv1.CompleteRequest{Request: q})
			if err != nil {
				t.Fatalf("Complete: %v", err)
			}
			rt := awaitRequestFor(t, exp, "mantle.router.v1.RouterService/Complete", resp.GetQuality().GetRequestId())
			checkTree(t, rt, resp.GetQuality().GetRequestId())

			traceID := rt.root.SpanContext.TraceID().String()
			if tt.traceparent == "" && rt.root.Parent.IsValid() {
				t.Errorf("router span has parent %s, want a new trace's root", rt.root.Parent.SpanID())
			}
			if tt.traceparent != "" && (traceID != callerTraceID || rt.root.Parent.SpanID().String() != callerSpanID || !rt.root.Parent.IsRemote()) {
				t.Errorf("router span trace %s parent %s, want the caller's %s/%s", traceID, rt.root.Parent.SpanID(), callerTraceID, callerSpanID)
			}
			// Logs and the QualityContext name the trace the spans are in.
			if got := resp.GetQuality().GetTraceId(); got != traceID {
				t.Errorf("quality trace_id %q, want the spans' %s", got, traceID)
			}
		})
	}
}

// awaitRequestFor waits until the request with the given id has all its spans: the
// router's span (named rootName), a server span under the client span of every tracedHop in
// tracedHops, both provider attempts and the degradation event's publish. Spans end
// after responses leave, so the caller having its answer is not enough.
func awaitRequestFor(t *testing.T, exp *telemetrytest.Exporter, rootName, requestID string) requestTrace {
	t.Helper()
	var rt requestTrace
	exp.Await(t, func(spans tracetest.SpanStubs) bool {
		root, ok := findSpan(spans, func(s tracetest.SpanStub) bool {
			return s.Name == rootName && s.SpanKind == trace.SpanKindServer && spanAttr(s, router.AttrRequestID).AsString() == requestID
		})
		if !ok {
			return false
		}
		rt = requestTrace{spans: spansInTrace(spans, root.SpanContext.TraceID()), root: root}
		return rt.complete()
	})
	return rt
}

// A traceparent on the OpenAI-compatible front door is continued: the front door's span is
// the caller's child, and everything below it is in the caller's trace. With tracing off
// no span is exported, yet the request still carries the caller's trace id.
func TestTracingHTTPContinuesTraceparent(t *testing.T) {
	tests := []struct {
		name    string
		enabled bool
	}{
		{"tracing on", true},
		{"tracing off", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			exp := telemetrytest.NewExporter()
			cfg := testConfig()
			cfg.Tracing.Enabled = tt.enabled
			m := meshtest.StartWith(t, cfg, meshtest.Split, mesh.Options{TraceExporter: exp})

			req, err := http.NewRequest(http.MethodPost, "http://"+m.HTTPAddr+"/v1/chat/completions",
				strings.NewReader(`{"model":"chat","messages":[{"role":"user","content":"trace me over http"}],"temperature":0}`))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+acmeKey)
			req.Header.Set("traceparent", callerParent)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body struct {
				Mantle struct {
					RequestID string `json:"request_id"`
					TraceID   string `json:"trace_id"`
				} `json:"mantle"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d, decode: %v", resp.StatusCode, err)
			}
			if body.Mantle.TraceID != callerTraceID {
				t.Errorf("quality trace_id %q, want the caller's %s", body.Mantle.TraceID, callerTraceID)
			}
			if !tt.enabled {
				// Every process has shut its (absent) tracing down only at cleanup; nothing
				// may have been exported by then, and nothing is started when tracing is off.
				if n := len(exp.Spans()); n != 0 {
					t.Errorf("%d spans exported with tracing off:\n%s", n, telemetrytest.Dump(exp.Spans()))
				}
				return
			}
			rt := awaitRequestFor(t, exp, "POST /v1/chat/completions", body.Mantle.RequestID)
			checkTree(t, rt, body.Mantle.RequestID)
			if got := rt.root.SpanContext.TraceID().String(); got != callerTraceID {
				t.Errorf("front door span trace %s, want the caller's %s", got, callerTraceID)
			}
			if !rt.root.Parent.IsRemote() || rt.root.Parent.SpanID().String() != callerSpanID {
				t.Errorf("front door span parent %s (remote %t), want the caller's span %s", rt.root.Parent.SpanID(), rt.root.Parent.IsRemote(), callerSpanID)
			}
			if spanAttr(rt.root, "http.response.status_code").AsInt64() != http.StatusOK {
				t.Errorf("front door span status code %v, want 200", spanAttr(rt.root, "http.response.status_code").String())
			}
		})
	}
}

// complete reports whether every span the request makes has ended (see checkTree).
func (rt requestTrace) complete() bool {
	for _, h := range tracedHops {
		client, ok := rt.child(rt.root, h.method, trace.SpanKindClient)
		if !ok {
			return false
		}
		if _, ok := rt.child(client, h.method, trace.SpanKindServer); !ok {
			return false
		}
	}
	return len(rt.children(rt.root, router.SpanAttempt)) >= 2 && len(rt.children(rt.root, "send mantle.events.degradation")) == 1
}

// child is the span named name of the given kind whose parent is parent.
func (rt requestTrace) child(parent tracetest.SpanStub, name string, kind trace.SpanKind) (tracetest.SpanStub, bool) {
	return findSpan(rt.spans, func(s tracetest.SpanStub) bool {
		return s.Name == name && s.SpanKind == kind && s.Parent.SpanID() == parent.SpanContext.SpanID()
	})
}

// children are the spans named name whose parent is parent.
func (rt requestTrace) children(parent tracetest.SpanStub, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range rt.spans {
		if s.Name == name && s.Parent.SpanID() == parent.SpanContext.SpanID() {
			out = append(out, s)
		}
	}
	return out
}

func findSpan(spans tracetest.SpanStubs, match func(tracetest.SpanStub) bool) (tracetest.SpanStub, bool) {
	for _, s := range spans {
		if match(s) {
			return s, true
		}
	}
	return tracetest.SpanStub{}, false
}

func spansInTrace(spans tracetest.SpanStubs, id trace.TraceID) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range spans {
		if s.SpanContext.TraceID() == id {
			out = append(out, s)
		}
	}
	return out
}

func spanAttr(s tracetest.SpanStub, k attribute.Key) attribute.Value {
	for _, kv := range s.Attributes {
		if kv.Key == k {
			return kv.Value
		}
	}
	return attribute.Value{}
}

func spanHas(s tracetest.SpanStub, k attribute.Key) bool {
	return spanAttr(s, k).Type() != attribute.EMPTY
}

func spanService(s tracetest.SpanStub) string {
	if s.Resource == nil {
		return ""
	}
	v, _ := s.Resource.Set().Value("service.name")
	return v.AsString()
}
