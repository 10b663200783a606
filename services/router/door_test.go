package router

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// TestStoreAfterAnswer: through the HTTP doors as the router registers them, on a nearly
// idle replica, the request's own goroutine stores its answer once the caller has it (the
// store waits here on storeGate while the client reads the whole answer), and WaitStores
// waits for that store; with more requests in flight, or for a streamed answer, the store
// workers make it instead, as they do the gRPC door's.
func TestStoreAfterAnswer(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		path   string
		body   string
		busy   int  // other requests in flight
		inline bool // stored by the request's goroutine, no worker started
	}{
		{name: "chat, idle", path: "/v1/chat/completions", body: `{"model":"chat","messages":[{"role":"user","content":"hi"}]}`, inline: true},
		{name: "chat, one other in flight", path: "/v1/chat/completions", body: `{"model":"chat","messages":[{"role":"user","content":"hi"}]}`, busy: 1, inline: true},
		{name: "chat, busy", path: "/v1/chat/completions", body: `{"model":"chat","messages":[{"role":"user","content":"hi"}]}`, busy: inlineStoreMaxInFlight},
		{name: "chat streamed, idle", path: "/v1/chat/completions", body: `{"model":"chat","stream":true,"messages":[{"role":"user","content":"hi"}]}`},
		{name: "messages, idle", path: "/v1/messages", body: `{"model":"chat","max_tokens":50,"messages":[{"role":"user","content":"hi"}]}`, inline: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig()
			cfg.AsyncCacheStore = true
			gate := make(chan struct{})
			h := newHarness(t, cfg, &harness{cache: &fakeCache{lease: "lease-1", storeGate: gate}})
			for range tt.busy {
				if !h.router.shedder.Admit(mantlev1.Priority_PRIORITY_NORMAL) {
					t.Fatal("shedder refused a request on an idle replica")
				}
				t.Cleanup(h.router.shedder.Done)
			}
			mux := http.NewServeMux()
			(&frontDoor{router: h.router}).register(mux)
			srv := httptest.NewServer(mux)
			defer srv.Close()
			openGate := sync.OnceFunc(func() { close(gate) })
			defer openGate() // before srv.Close, which waits for the handler
			client := srv.Client()
			client.Timeout = time.Minute // an answer held back until the store fails, not hangs

			req, err := http.NewRequest(http.MethodPost, srv.URL+tt.path, strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set(HeaderAnthropicVersion, "2023-06-01")
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body) // the whole answer, while the store waits
			_ = resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("HTTP %d, %v: %s", resp.StatusCode, err, body)
			}
			if n := h.cache.stored(); n != 0 {
				t.Fatalf("%d stores made before the answer came, want 0", n)
			}
			h.router.stores.mu.Lock()
			workers := h.router.stores.n
			h.router.stores.mu.Unlock()
			if started := workers > 0; started == tt.inline {
				t.Errorf("%d store workers alive; want a worker to store: %v", workers, !tt.inline)
			}
			openGate()
			h.router.WaitStores()
			if n := h.cache.stored(); n != 1 {
				t.Fatalf("%d stores after WaitStores, want 1", n)
			}
			if got := h.cache.stores[0].GetLeaseId(); got != "lease-1" {
				t.Errorf("store's lease %q, want lease-1", got)
			}
		})
	}
}
