package rpc_test

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"pgregory.net/rapid"

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
		{"version 00 with a trailing dash", "00-" + traceID + "-" + parentID + "-01-", ""},
		{"future version with a trailing dash", "cc-" + traceID + "-" + parentID + "-01-", traceID},
		{"empty fields", "---", ""},
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

// splitTraceParent is TraceIDFromTraceParent as first written, on strings.Split's
// fields; the version that cuts them off in place is held to it.
func splitTraceParent(tp string) (string, bool) {
	parts := strings.Split(tp, "-")
	if len(parts) < 4 {
		return "", false
	}
	version, traceID, parentID, flags := parts[0], parts[1], parts[2], parts[3]
	lowerHex := regexp.MustCompile(`^[0-9a-f]*$`).MatchString
	if len(version) != 2 || !lowerHex(version) || version == "ff" || (version == "00" && len(parts) != 4) {
		return "", false
	}
	if len(traceID) != 32 || !lowerHex(traceID) || traceID == strings.Repeat("0", 32) ||
		len(parentID) != 16 || !lowerHex(parentID) || parentID == strings.Repeat("0", 16) ||
		len(flags) != 2 || !lowerHex(flags) {
		return "", false
	}
	return traceID, true
}

func TestTraceIDFromTraceParentMatchesSplit(t *testing.T) {
	t.Parallel()
	field := rapid.SampledFrom([]string{"", "00", "cc", "ff", "01", "0", "4bf92f3577b34da6a3ce929d0e0e4736",
		"00f067aa0ba902b7", strings.Repeat("0", 16), strings.Repeat("0", 32), "4BF92F3577B34DA6A3CE929D0E0E4736", "x-y"})
	rapid.Check(t, func(t *rapid.T) {
		tp := strings.Join(rapid.SliceOfN(field, 0, 6).Draw(t, "fields"), "-")
		gotID, gotOK := rpc.TraceIDFromTraceParent(tp)
		wantID, wantOK := splitTraceParent(tp)
		if gotID != wantID || gotOK != wantOK {
			t.Fatalf("TraceIDFromTraceParent(%q) = %q, %t; strings.Split's fields give %q, %t", tp, gotID, gotOK, wantID, wantOK)
		}
	})
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
