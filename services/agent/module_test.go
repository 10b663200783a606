package agent

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/mantle-mesh/mantle/pkg/app"
)

// lockedBuffer is a log destination the module writes while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestAgentWithoutVerifier: an agent module built WithoutVerifier (router.verifier_address
// off) warns at start that nobody confirms action outcomes and never dials a verifier; an
// action whose outcome becomes unknown, however it does, stays pending_confirmation on
// every repeat of its key, an hour later too: the backend is called once, the action is
// never retried and never answered as done.
func TestAgentWithoutVerifier(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		// fail answers the action's backend call so that its outcome is unknown.
		fail func(w http.ResponseWriter)
	}{
		{"the request timed out (408)", func(w http.ResponseWriter) { w.WriteHeader(http.StatusRequestTimeout) }},
		{"a gateway timed out (504)", func(w http.ResponseWriter) { w.WriteHeader(http.StatusGatewayTimeout) }},
		{"the backend failed after receiving it (500)", func(w http.ResponseWriter) { w.WriteHeader(http.StatusInternalServerError) }},
		{"the connection was cut before an answer", func(w http.ResponseWriter) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var calls atomic.Int32
			backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				calls.Add(1)
				tt.fail(w)
			}))
			t.Cleanup(backend.Close)

			cfg := DefaultConfig()
			cfg.Idempotency.Backend = IdempotencyMemory
			order := action("order")
			order.Backend.URL = backend.URL + "/order"
			cfg.Tools = []ToolConfig{order}
			logs := &lockedBuffer{}
			clock := clockwork.NewFakeClockAt(time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC))
			var dialled atomic.Int32
			env := app.Env{
				GRPC:    grpc.NewServer(),
				Log:     slog.New(slog.NewJSONHandler(logs, nil)),
				Metrics: prometheus.NewRegistry(),
				Clock:   clock,
				Dial: func(string) (grpc.ClientConnInterface, error) {
					dialled.Add(1)
					return nil, errors.New("an agent without a verifier dialled one")
				},
			}
			mod := Module(cfg, WithoutVerifier())
			if len(mod.Deps) != 0 {
				t.Errorf("module deps %v: an agent without a verifier needs none", mod.Deps)
			}
			run, err := mod.New(context.Background(), env)
			if err != nil {
				t.Fatal(err)
			}
			m := run.(*module)
			t.Cleanup(m.tools.Close)

			if n := dialled.Load(); n != 0 {
				t.Errorf("the verifier was dialled %d times", n)
			}
			if log := logs.String(); !strings.Contains(log, `"level":"WARN"`) || !strings.Contains(log, "stays pending_confirmation, never retried and never marked done") {
				t.Errorf("no warning at start about unconfirmed action outcomes; the log:\n%s", log)
			}

			req := CallRequest{Tenant: "acme", Name: "order", Arguments: `{"sku":"a"}`, IdempotencyKey: "order-1"}
			for i, later := range []time.Duration{0, 0, time.Minute, time.Hour} {
				clock.Advance(later)
				res, err := m.tools.Call(context.Background(), req)
				if err != nil {
					t.Fatalf("call %d: %v", i+1, err)
				}
				if res.Status != StatusPendingConfirmation || res.ConfirmationID != "" || res.Result != "" {
					t.Errorf("call %d (%s on): status %s, confirmation %q, result %q; want pending with no confirmation and no result",
						i+1, later, statusName(res.Status), res.ConfirmationID, res.Result)
				}
			}
			if n := calls.Load(); n != 1 {
				t.Errorf("the backend was called %d times, want once: an unknown outcome is never retried", n)
			}
		})
	}
}
