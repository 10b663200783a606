// Package telemetrytest records spans for tests: an in-memory exporter that tells waiting
// tests when spans arrive, so a test waits for the spans it expects instead of sleeping.
// Server spans end after the response has left, so a caller that got its answer cannot
// assume every span of the call has ended yet.
package telemetrytest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// Exporter is a tracetest.InMemoryExporter that wakes Await on every export. Give it to
// one or more tracer providers with sdktrace.WithSyncer (mesh.Options.TraceExporter does).
type Exporter struct {
	mem *tracetest.InMemoryExporter

	mu      sync.Mutex
	changed chan struct{} // closed (and replaced) whenever spans arrive
}

// NewExporter returns an empty exporter.
func NewExporter() *Exporter {
	return &Exporter{mem: tracetest.NewInMemoryExporter(), changed: make(chan struct{})}
}

// ExportSpans records spans and wakes waiters.
func (e *Exporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := e.mem.ExportSpans(ctx, spans)
	e.mu.Lock()
	close(e.changed)
	e.changed = make(chan struct{})
	e.mu.Unlock()
	return err
}

// Shutdown keeps the recorded spans: several providers share one exporter in a test
// mesh, and one of them stopping must not erase the others' spans.
func (e *Exporter) Shutdown(context.Context) error { return nil }

// Spans returns the spans ended so far.
func (e *Exporter) Spans() tracetest.SpanStubs { return e.mem.GetSpans() }

// Await returns the spans once done reports that they are complete. It waits for exports,
// never for time; if the test's deadline comes first, the test fails with the spans seen.
func (e *Exporter) Await(t testing.TB, done func(tracetest.SpanStubs) bool) tracetest.SpanStubs {
	t.Helper()
	ctx := t.Context()
	if dl, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if d, ok := dl.Deadline(); ok {
			// Room to report before go test's own timeout panics without a word.
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, d.Add(-5*time.Second))
			defer cancel()
		}
	}
	for {
		e.mu.Lock()
		changed := e.changed
		e.mu.Unlock()
		spans := e.Spans()
		if done(spans) {
			return spans
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatalf("spans never completed; have:\n%s", Dump(spans))
			return nil
		}
	}
}

// Dump renders spans as an indented tree per trace, for failure messages.
func Dump(spans tracetest.SpanStubs) string {
	children := map[trace.SpanID][]int{}
	known := map[trace.SpanID]bool{}
	for _, s := range spans {
		known[s.SpanContext.SpanID()] = true
	}
	var roots []int
	for i, s := range spans {
		if p := s.Parent.SpanID(); s.Parent.IsValid() && known[p] {
			children[p] = append(children[p], i)
		} else {
			roots = append(roots, i)
		}
	}
	var b strings.Builder
	var walk func(i, depth int)
	walk = func(i, depth int) {
		s := spans[i]
		fmt.Fprintf(&b, "%s%s [%s] trace=%s span=%s parent=%s status=%s\n", strings.Repeat("  ", depth), s.Name,
			s.SpanKind, s.SpanContext.TraceID(), s.SpanContext.SpanID(), s.Parent.SpanID(), s.Status.Code)
		for _, c := range children[s.SpanContext.SpanID()] {
			walk(c, depth+1)
		}
	}
	for _, r := range roots {
		walk(r, 0)
	}
	return b.String()
}
