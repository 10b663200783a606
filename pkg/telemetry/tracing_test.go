package telemetry_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"

	"github.com/mantle-mesh/mantle/pkg/telemetry"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mutate func(*telemetry.TracingConfig)
		want   []string // substrings of the error; none means valid
	}{
		{"defaults", func(*telemetry.TracingConfig) {}, nil},
		{"enabled with the default endpoint", func(c *telemetry.TracingConfig) { c.Enabled = true }, nil},
		{"enabled, jaeger in compose", func(c *telemetry.TracingConfig) {
			c.Enabled, c.OTLPEndpoint, c.Insecure = true, "jaeger:4317", true
		}, nil},
		{"disabled may leave the endpoint empty", func(c *telemetry.TracingConfig) { c.OTLPEndpoint = "" }, nil},
		{"enabled needs an endpoint", func(c *telemetry.TracingConfig) { c.Enabled, c.OTLPEndpoint = true, "" },
			[]string{"otlp_endpoint: required when tracing.enabled is true"}},
		{"a URL is not host:port", func(c *telemetry.TracingConfig) { c.Enabled, c.OTLPEndpoint = true, "http://jaeger:4317" },
			[]string{"otlp_endpoint: want host:port without a scheme", "tracing.insecure"}},
		{"no port", func(c *telemetry.TracingConfig) { c.Enabled, c.OTLPEndpoint = true, "jaeger" },
			[]string{`otlp_endpoint: want host:port, got "jaeger"`}},
		{"port out of range", func(c *telemetry.TracingConfig) { c.Enabled, c.OTLPEndpoint = true, "jaeger:99999" },
			[]string{`otlp_endpoint: want a port from 1 to 65535, got "99999"`}},
		{"ratio above 1", func(c *telemetry.TracingConfig) { c.SampleRatio = 1.5 },
			[]string{"sample_ratio: want a number from 0 to 1, got 1.5"}},
		{"negative ratio", func(c *telemetry.TracingConfig) { c.SampleRatio = -0.1 },
			[]string{"sample_ratio: want a number from 0 to 1"}},
		{"no service name", func(c *telemetry.TracingConfig) { c.ServiceName = " " },
			[]string{"service_name: required"}},
		{"every error at once", func(c *telemetry.TracingConfig) {
			c.Enabled, c.OTLPEndpoint, c.SampleRatio, c.ServiceName = true, "", 2, ""
		}, []string{"otlp_endpoint:", "sample_ratio:", "service_name:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := telemetry.DefaultTracingConfig()
			tt.mutate(&c)
			err := c.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want errors containing %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %q, want it to contain %q", err, w)
				}
			}
		})
	}
}

func TestServiceName(t *testing.T) {
	t.Parallel()
	tests := []struct {
		targets []string
		want    string
	}{
		{[]string{"all"}, "mantle"},
		{nil, "mantle"},
		{[]string{"router"}, "mantle-router"},
		{[]string{"cache", "quota"}, "mantle-cache-quota"},
		{[]string{"router", "all"}, "mantle"},
	}
	for _, tt := range tests {
		if got := telemetry.ServiceName("mantle", tt.targets); got != tt.want {
			t.Errorf("ServiceName(mantle, %q) = %q, want %q", tt.targets, got, tt.want)
		}
	}
}

// The OTLP path builds without a collector: the exporter connects lazily, so a collector
// that is down at start costs spans, not the process; Shutdown flushes and returns.
func TestNewTracerProviderOTLP(t *testing.T) {
	t.Parallel()
	c := telemetry.DefaultTracingConfig()
	c.Enabled, c.Insecure, c.OTLPEndpoint = true, true, "127.0.0.1:1" // nothing listens on port 1
	tp, err := telemetry.NewTracerProvider(context.Background(), c, "mantle-test", nil)
	if err != nil {
		t.Fatalf("NewTracerProvider: %v", err)
	}
	// No span was started, so nothing waits on the unreachable collector.
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

// collector is an OTLP/gRPC trace receiver that keeps what it is sent.
type collector struct {
	coltracepb.UnimplementedTraceServiceServer
	mu   sync.Mutex
	reqs []*coltracepb.ExportTraceServiceRequest
}

func (c *collector) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reqs = append(c.reqs, req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// Spans batched for OTLP reach the collector at otlp_endpoint in plaintext (insecure), under
// the process's service.name, by the time Shutdown returns: closing a process flushes.
func TestOTLPExportReachesTheCollector(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	col := &collector{}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, col)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })

	c := telemetry.DefaultTracingConfig()
	c.Enabled, c.Insecure, c.OTLPEndpoint = true, true, lis.Addr().String()
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	tp, err := telemetry.NewTracerProvider(context.Background(), c, "mantle-router", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, span := tp.Tracer("test").Start(context.Background(), "router.attempt")
	span.End()
	if err := tp.Shutdown(t.Context()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}

	col.mu.Lock()
	defer col.mu.Unlock()
	var names, services []string
	for _, req := range col.reqs {
		for _, rs := range req.GetResourceSpans() {
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.GetKey() == "service.name" {
					services = append(services, kv.GetValue().GetStringValue())
				}
			}
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					names = append(names, s.GetName())
				}
			}
		}
	}
	if len(names) != 1 || names[0] != "router.attempt" || len(services) != 1 || services[0] != "mantle-router" {
		t.Errorf("collector got spans %q from services %q, want router.attempt from mantle-router", names, services)
	}
}

// Sampling is parent-based: sample_ratio decides for new traces only, and a request that
// arrives with a caller's decision keeps it, so a trace is never cut between hops.
func TestSamplingFollowsTheParent(t *testing.T) {
	t.Parallel()
	remote := func(sampled bool) context.Context {
		sc := trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, Remote: true,
		})
		if sampled {
			sc = sc.WithTraceFlags(trace.FlagsSampled)
		}
		return trace.ContextWithRemoteSpanContext(context.Background(), sc)
	}
	tests := []struct {
		name        string
		ratio       float64
		ctx         context.Context
		wantSampled bool
	}{
		{"new trace, ratio 1", 1, context.Background(), true},
		{"new trace, ratio 0", 0, context.Background(), false},
		{"sampled caller, ratio 0", 0, remote(true), true},
		{"unsampled caller, ratio 1", 1, remote(false), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := telemetry.DefaultTracingConfig()
			c.Enabled, c.SampleRatio = true, tt.ratio
			exp := tracetest.NewInMemoryExporter()
			tp, err := telemetry.NewTracerProvider(context.Background(), c, "mantle-test", exp)
			if err != nil {
				t.Fatal(err)
			}
			_, span := tp.Tracer("test").Start(tt.ctx, "op")
			span.End()
			got := len(exp.GetSpans()) == 1 // the exporter is synchronous: an ended span is there
			if got != tt.wantSampled || span.SpanContext().IsSampled() != tt.wantSampled {
				t.Errorf("sampled = %t (exported %t), want %t", span.SpanContext().IsSampled(), got, tt.wantSampled)
			}
			if sc := span.SpanContext(); tt.ctx != context.Background() && sc.TraceID() != (trace.TraceID{1}) {
				t.Errorf("trace id %s, want the caller's", sc.TraceID())
			}
			_ = tp.Shutdown(context.Background())
		})
	}
}
