// Package telemetry sets up OpenTelemetry tracing for one mantle process. Every process
// (and every test mesh) builds its own TracerProvider and passes it down through app.Env;
// nothing here touches OpenTelemetry's global provider, so two meshes in one test binary
// never share spans, samplers or exporters.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// TracingConfig is the root configuration's tracing block.
type TracingConfig struct {
	// Enabled exports OpenTelemetry spans over OTLP/gRPC. Off, mantle still carries a W3C
	// traceparent between services, and the trace id appears in the logs.
	Enabled bool `yaml:"enabled"`
	// OTLPEndpoint is the host:port of the OTLP/gRPC collector (Jaeger, the OTel
	// Collector), without a scheme; required when tracing is on.
	OTLPEndpoint string `yaml:"otlp_endpoint"`
	// Insecure sends spans in plaintext, for a collector on the same host or a private
	// network; otherwise TLS.
	Insecure bool `yaml:"insecure"`
	// SampleRatio is the share of new traces kept, in [0, 1]. A request that arrives with a
	// traceparent follows its caller's sampling decision instead (parent-based sampling), so
	// a trace is never cut in the middle.
	SampleRatio float64 `yaml:"sample_ratio"`
	// ServiceName is the service.name of the spans: as is with target all, with the target
	// appended otherwise (mantle-router).
	ServiceName string `yaml:"service_name"`
}

// DefaultTracingConfig is off, and pointed at a collector on the local host when turned on.
func DefaultTracingConfig() TracingConfig {
	return TracingConfig{OTLPEndpoint: "localhost:4317", SampleRatio: 1, ServiceName: "mantle"}
}

// Validate checks the block. Messages start with the key they are about; the caller
// prefixes the block name ("tracing.").
func (c TracingConfig) Validate() error {
	var errs []error
	if c.SampleRatio < 0 || c.SampleRatio > 1 {
		errs = append(errs, fmt.Errorf("sample_ratio: want a number from 0 to 1, got %v", c.SampleRatio))
	}
	if strings.TrimSpace(c.ServiceName) == "" {
		errs = append(errs, errors.New("service_name: required"))
	}
	// The endpoint only matters when spans are exported; a disabled block may leave it empty.
	if c.Enabled {
		if err := validEndpoint(c.OTLPEndpoint); err != nil {
			errs = append(errs, fmt.Errorf("otlp_endpoint: %w", err))
		}
	}
	return errors.Join(errs...)
}

// validEndpoint accepts host:port, which is what the OTLP/gRPC exporter dials. A URL is
// refused with a hint, because its scheme would silently contradict the insecure key.
func validEndpoint(ep string) error {
	if ep == "" {
		return errors.New("required when tracing.enabled is true (host:port of an OTLP/gRPC collector, e.g. jaeger:4317)")
	}
	if strings.Contains(ep, "://") {
		return fmt.Errorf("want host:port without a scheme (set tracing.insecure for plaintext), got %q", ep)
	}
	host, port, err := net.SplitHostPort(ep)
	if err != nil || host == "" {
		return fmt.Errorf("want host:port, got %q", ep)
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		return fmt.Errorf("want a port from 1 to 65535, got %q", port)
	}
	return nil
}

// ServiceName is the service.name of a process running targets (module names or "all").
func ServiceName(base string, targets []string) string {
	var mods []string
	for _, t := range targets {
		if t == "all" {
			return base
		}
		mods = append(mods, t)
	}
	if len(mods) == 0 {
		return base
	}
	return base + "-" + strings.Join(mods, "-")
}

// NewTracerProvider builds the process's tracer provider. With exporter nil, spans are
// batched to c.OTLPEndpoint; a non-nil exporter (tests: an in-memory one) receives every
// span synchronously as it ends, so a test can read a span as soon as its work is done.
// The caller owns the provider: Shutdown flushes what is still batched and must be called
// once the process stops.
func NewTracerProvider(ctx context.Context, c TracingConfig, service string, exporter sdktrace.SpanExporter) (*sdktrace.TracerProvider, error) {
	res := resource.NewSchemaless(semconv.ServiceName(service), semconv.ServiceNamespace("mantle"))
	opts := []sdktrace.TracerProviderOption{
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(c.SampleRatio))),
	}
	if exporter != nil {
		opts = append(opts, sdktrace.WithSyncer(exporter))
		return sdktrace.NewTracerProvider(opts...), nil
	}
	expOpts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(c.OTLPEndpoint)}
	if c.Insecure {
		expOpts = append(expOpts, otlptracegrpc.WithInsecure())
	}
	// New does not wait for the collector: the exporter connects lazily and retries, so a
	// collector that is down at start costs spans, never the process.
	exp, err := otlptracegrpc.New(ctx, expOpts...)
	if err != nil {
		return nil, fmt.Errorf("otlp exporter for %s: %w", c.OTLPEndpoint, err)
	}
	opts = append(opts, sdktrace.WithBatcher(exp))
	return sdktrace.NewTracerProvider(opts...), nil
}
