package rpc

import "testing"

// TestTraceParentParsesBack: the traceparent of an outgoing call carries the trace id and
// a fresh parent id, in the form TraceIDFromTraceParent accepts.
func TestTraceParentParsesBack(t *testing.T) {
	id := NewTraceID()
	first, second := traceParent(id), traceParent(id)
	for _, tp := range []string{first, second} {
		if got, ok := TraceIDFromTraceParent(tp); !ok || got != id || len(tp) != 55 {
			t.Errorf("traceParent(%q) = %q: parses to %q, %t; want the trace id back, 55 characters", id, tp, got, ok)
		}
	}
	if first == second {
		t.Errorf("two traceparents share the parent id: %q", first)
	}
}
