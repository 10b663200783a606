package router

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// TestLoginRequestID: a caller's valid x-request-id (in any case) becomes the request's id
// and is answered as x-mantle-request-id; without one, or with an invalid one, mantle makes
// one up, which is not the caller's.
func TestLoginRequestID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, header, value string
		caller              bool
	}{
		{"the caller's", "X-Request-Id", "abc-123", true},
		{"the caller's, in lower case", "x-request-id", "abc-123", true},
		{"none", "", "", false},
		{"an invalid one", "X-Request-Id", "bad id\x01", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
			if tc.header != "" {
				r.Header.Set(tc.header, tc.value)
			}
			w := httptest.NewRecorder()
			ctx, ok := (&frontDoor{}).login(w, r, "", writeError)
			if !ok {
				t.Fatalf("login refused: %s", w.Body)
			}
			id, answered := rpc.RequestID(ctx), w.Header().Get(HeaderRequestID)
			if answered != id || len(w.Header()[http.CanonicalHeaderKey(HeaderRequestID)]) != 1 {
				t.Errorf("answered %s %q (%d values), want the request's id %q once", HeaderRequestID, answered, len(w.Header().Values(HeaderRequestID)), id)
			}
			switch {
			case tc.caller && (id != tc.value || rpc.CallerRequestID(ctx) != tc.value):
				t.Errorf("id %q, caller's %q; want the caller's %q", id, rpc.CallerRequestID(ctx), tc.value)
			case !tc.caller && (!strings.HasPrefix(id, "req_") || rpc.CallerRequestID(ctx) != ""):
				t.Errorf("id %q, caller's %q; want one made up and none of the caller's", id, rpc.CallerRequestID(ctx))
			}
			if rpc.TraceID(ctx) == "" {
				t.Error("no trace id")
			}
		})
	}
}
