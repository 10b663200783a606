package rpc_test

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/mantle-mesh/mantle/pkg/rpc"
)

func TestTraceIDFromTraceParent(t *testing.T) {
	t.Parallel()
	const (
		traceID  = "4bf92f3577b34da6a3ce929d0e0e4736"
		parentID = "00f067aa0ba902b7"
	)
	tests := []struct {
		name string
		tp   string
		want string // "" means rejected
	}{
		{"w3c example", "00-" + traceID + "-" + parentID + "-01", traceID},
		{"not sampled", "00-" + traceID + "-" + parentID + "-00", traceID},
		{"future version with extra field", "cc-" + traceID + "-" + parentID + "-01-what-the-future-holds", traceID},
		{"empty", "", ""},
		{"garbage", "not-a-traceparent", ""},
		{"three fields", "00-" + traceID + "-" + parentID, ""},
		{"version 00 with extra field", "00-" + traceID + "-" + parentID + "-01-extra", ""},
		{"version ff", "ff-" + traceID + "-" + parentID + "-01", ""},
		{"short trace id", "00-" + traceID[:31] + "-" + parentID + "-01", ""},
		{"long trace id", "00-" + traceID + "0-" + parentID + "-01", ""},
		{"non-hex trace id", "00-" + strings.Repeat("g", 32) + "-" + parentID + "-01", ""},
		{"upper-case trace id", "00-" + strings.ToUpper(traceID) + "-" + parentID + "-01", ""},
		{"all-zero trace id", "00-" + strings.Repeat("0", 32) + "-" + parentID + "-01", ""},
		{"all-zero parent id", "00-" + traceID + "-" + strings.Repeat("0", 16) + "-01", ""},
		{"short parent id", "00-" + traceID + "-" + parentID[:15] + "-01", ""},
		{"bad flags", "00-" + traceID + "-" + parentID + "-1", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, ok := rpc.TraceIDFromTraceParent(tt.tp)
			if got != tt.want || ok != (tt.want != "") {
				t.Errorf("TraceIDFromTraceParent(%q) = %q, %t; want %q, %t", tt.tp, got, ok, tt.want, tt.want != "")
			}
		})
	}
}

func TestNewIDs(t *testing.T) {
	t.Parallel()
	trace := rpc.NewTraceID()
	if _, ok := rpc.TraceIDFromTraceParent("00-" + trace + "-00f067aa0ba902b7-01"); !ok {
		t.Errorf("NewTraceID() = %q, not a valid W3C trace id", trace)
	}
	if trace == rpc.NewTraceID() {
		t.Errorf("two NewTraceID calls returned the same id %q", trace)
	}
	if id := rpc.NewRequestID(); !regexp.MustCompile(`^req_[0-9a-f]{24}$`).MatchString(id) {
		t.Errorf("NewRequestID() = %q, want req_ and 24 hex digits", id)
	}
}

func TestContextValues(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if rpc.RequestID(ctx) != "" || rpc.TraceID(ctx) != "" || rpc.Tenant(ctx) != "" {
		t.Fatal("empty context carries request values")
	}
	ctx = rpc.WithTenant(rpc.WithTraceID(rpc.WithRequestID(ctx, "req_1"), "t1"), "acme")
	if got := [3]string{rpc.RequestID(ctx), rpc.TraceID(ctx), rpc.Tenant(ctx)}; got != [3]string{"req_1", "t1", "acme"} {
		t.Errorf("request id, trace id, tenant = %v, want [req_1 t1 acme]", got)
	}
}

func TestValidRequestID(t *testing.T) {
	for _, tc := range []struct {
		id   string
		want bool
	}{
		{"req_0123abcd", true},
		{"2f1c-ab.9:x", true},
		{"", false},
		{strings.Repeat("a", 129), false},
		{"has space", false},
		{"new\nline", false},
		{"日本", false},
	} {
		if got := rpc.ValidRequestID(tc.id); got != tc.want {
			t.Errorf("ValidRequestID(%q) = %v, want %v", tc.id, got, tc.want)
		}
	}
}
