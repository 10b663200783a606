package router

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mantle-mesh/mantle/pkg/provider"
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

// TestRequestIDReachesHops: the calls a request makes carry its id, the caller's or, for
// a request that came without one, the one mantle made up for it.
func TestRequestIDReachesHops(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want string // "" for a made-up id
	}{
		{"the caller's", rpc.WithRequestID(context.Background(), "req-given"), "req-given"},
		{"none", context.Background(), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, testConfig(), &harness{
				providers: map[string]*fakeProvider{"a": newFakeProvider(result{res: provider.Response{Content: "ok", FinishReason: "stop"}})},
				quota:     &fakeQuota{},
			})
			resp, err := h.router.Complete(tc.ctx, ask("chat"))
			if err != nil {
				t.Fatal(err)
			}
			id := resp.GetQuality().GetRequestId()
			if id == "" || tc.want != "" && id != tc.want {
				t.Fatalf("request id %q, want %q (or one made up)", id, tc.want)
			}
			h.quota.mu.Lock()
			defer h.quota.mu.Unlock()
			if len(h.quota.reserveIDs) != 1 || h.quota.reserveIDs[0] != id {
				t.Errorf("Reserve saw request ids %q, want [%q]", h.quota.reserveIDs, id)
			}
		})
	}
}
