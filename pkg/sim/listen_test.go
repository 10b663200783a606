package sim

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

func TestStartServesAndShutsDownGracefully(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	clock := clockwork.NewFakeClock()
	srv := NewServer(ServerConfig{
		Models: map[string]Profile{
			"slow": {Latency: fixed(time.Second)},
			"hang": {Errors: ErrorMix{Hang: 1}},
		},
		Clock: clock,
	})
	planned := make(chan string, 4)
	srv.onPlan = func(model string, _ Outcome) { planned <- model }

	serveCtx, stop := context.WithCancel(ctx)
	defer stop()
	addr, wait, err := Start(serveCtx, "127.0.0.1:0", srv, nil)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	base := "http://" + addr
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()

	resp, err := client.Get(base + "/v1/models")
	if err != nil {
		t.Fatalf("GET /v1/models: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"hang"`) {
		t.Fatalf("GET /v1/models = %d %s", resp.StatusCode, body)
	}

	type result struct {
		status int
		err    error
	}
	post := func(model string) <-chan result {
		ch := make(chan result, 1)
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions",
				bytes.NewReader(chatParams{model: model}.body()))
			resp, err := client.Do(req)
			if err != nil {
				ch <- result{err: err}
				return
			}
			defer resp.Body.Close()
			_, err = io.ReadAll(resp.Body)
			ch <- result{resp.StatusCode, err}
		}()
		return ch
	}
	slow := post("slow")
	receive(ctx, t, planned, "the slow call")
	if err := clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatalf("waiting for the slow call's timer: %v", err)
	}
	hung := post("hang")
	receive(ctx, t, planned, "the hung call")

	began := time.Now()
	stop()
	// Shutdown drops the hung call at once rather than waiting out the grace period...
	if r := receive(ctx, t, hung, "the hung call to be dropped"); r.err == nil {
		t.Errorf("hung call answered %d during shutdown, want a dropped connection", r.status)
	}
	// ...while the ordinary call in flight still gets its answer.
	clock.Advance(time.Second)
	if r := receive(ctx, t, slow, "the slow call"); r.err != nil || r.status != 200 {
		t.Errorf("call in flight during shutdown: status %d, err %v; want 200", r.status, r.err)
	}
	if err := wait(); err != nil {
		t.Errorf("wait() = %v, want nil after ctx was cancelled", err)
	}
	if took := time.Since(began); took >= ShutdownGrace {
		t.Errorf("shutdown took %v, want well under the %v grace", took, ShutdownGrace)
	}
	if err := wait(); err != nil {
		t.Errorf("second wait() = %v, want nil", err)
	}
	if _, err := client.Get(base + "/v1/models"); err == nil {
		t.Error("the server still answers after shutdown")
	}
}

func TestStartReportsListenErrors(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	serveCtx, stop := context.WithCancel(ctx)
	addr, wait, err := Start(serveCtx, "127.0.0.1:0", NewServer(ServerConfig{}), nil)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer func() {
		stop()
		if err := wait(); err != nil {
			t.Errorf("wait() = %v", err)
		}
	}()
	if _, _, err := Start(ctx, addr, NewServer(ServerConfig{}), nil); err == nil {
		t.Errorf("second Start on %s succeeded, want an address-in-use error", addr)
	}
	if err := ListenAndServe(ctx, addr, NewServer(ServerConfig{}), nil); err == nil {
		t.Errorf("ListenAndServe on %s succeeded, want an address-in-use error", addr)
	}
}

func TestListenAndServeReturnsWhenCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(testCtx(t))
	cancel()
	if err := ListenAndServe(ctx, "127.0.0.1:0", NewServer(ServerConfig{}), nil); err != nil {
		t.Errorf("ListenAndServe = %v, want nil after cancellation", err)
	}
}
