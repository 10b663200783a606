package router

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

func withKey(req *routerv1.Request, key string) *routerv1.Request {
	req.IdempotencyKey = key
	return req
}

func TestIdempotency(t *testing.T) {
	t.Parallel()

	t.Run("a replay returns the recorded answer without calling a provider", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, testConfig(), &harness{idempotency: true, providers: map[string]*fakeProvider{
			"a": newFakeProvider(reply("first answer", 3, 4), reply("a second, different answer", 1, 1)),
		}})
		first, err := h.router.Complete(context.Background(), withKey(ask("chat"), "order-42"))
		if err != nil {
			t.Fatal(err)
		}
		again, err := h.router.Complete(context.Background(), withKey(ask("chat"), "order-42"))
		if err != nil {
			t.Fatal(err)
		}
		if h.calls("a") != 1 {
			t.Errorf("a called %d times, want 1", h.calls("a"))
		}
		if again.Id != first.Id || again.Message.Content != "first answer" {
			t.Errorf("replay %s %q, want request %s's answer %q", again.Id, again.Message.Content, first.Id, "first answer")
		}
		if diff := cmp.Diff(first.Usage, again.Usage, protocmp.Transform()); diff != "" {
			t.Errorf("replayed usage (-first +replay):\n%s", diff)
		}
		if !hasAudit(again.Quality, "replay", "answered from the idempotency record of "+first.Id) {
			t.Errorf("replay audit missing: %v", again.Quality.Audit)
		}
		if got := h.providers["a"].requests()[0].IdempotencyKey; got != "order-42" {
			t.Errorf("provider got Idempotency-Key %q, want the caller's key forwarded", got)
		}
		if got := counterValue(t, h.router.deps.Metrics.replays); got != 1 {
			t.Errorf("replays = %v, want 1", got)
		}
		// A different key is a different request.
		if resp, err := h.router.Complete(context.Background(), withKey(ask("chat"), "order-43")); err != nil || resp.Message.Content != "a second, different answer" {
			t.Errorf("another key: %v %v, want a new call", resp.GetMessage().GetContent(), err)
		}
	})

	t.Run("a request id the caller chose identifies the request too", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, testConfig(), &harness{idempotency: true})
		ctx := rpc.WithCallerRequestID(context.Background(), "req_caller_chosen")
		for range 2 {
			if _, err := h.router.Complete(ctx, ask("chat")); err != nil {
				t.Fatal(err)
			}
		}
		if h.calls("a") != 1 {
			t.Errorf("a called %d times, want 1", h.calls("a"))
		}
		if got := h.providers["a"].requests()[0].IdempotencyKey; got != "req_caller_chosen" {
			t.Errorf("provider got Idempotency-Key %q, want the request id", got)
		}
	})

	t.Run("keys are scoped by tenant", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, testConfig(), &harness{idempotency: true})
		auth, err := rpc.NewAuthenticator([]rpc.TenantKey{
			{ID: "acme", KeySHA256: rpc.HashKey("sk-acme")}, {ID: "zeta", KeySHA256: rpc.HashKey("sk-zeta")},
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, key := range []string{"sk-acme", "sk-zeta"} {
			ctx, err := auth.Login(context.Background(), key)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := h.router.Complete(ctx, withKey(ask("chat"), "same-key")); err != nil {
				t.Fatal(err)
			}
		}
		if h.calls("a") != 2 {
			t.Errorf("a called %d times, want 2: another tenant's key never replays", h.calls("a"))
		}
	})

	t.Run("a duplicate that arrives while the first runs waits for it: one provider call", func(t *testing.T) {
		t.Parallel()
		release := make(chan struct{})
		h := newHarness(t, testConfig(), &harness{idempotency: true, providers: map[string]*fakeProvider{
			"a": newFakeProvider(result{release: release, res: reply("the only answer", 1, 1).res}),
		}})
		first := h.start(context.Background(), withKey(ask("chat"), "dup"))
		<-h.providers["a"].started
		second := h.start(context.Background(), withKey(ask("chat"), "dup"))
		h.blockUntil(t, 1) // the duplicate waits on the in-flight claim
		close(release)
		d1, d2 := await(t, first), await(t, second)
		if d1.err != nil || d2.err != nil {
			t.Fatalf("errors: %v, %v", d1.err, d2.err)
		}
		if h.calls("a") != 1 || d2.resp.Id != d1.resp.Id || d2.resp.Message.Content != "the only answer" {
			t.Errorf("%d calls; duplicate answered %s %q, want one call and the first request's answer", h.calls("a"), d2.resp.Id, d2.resp.Message.Content)
		}
	})

	t.Run("a rejected request's error is replayed", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, testConfig(), &harness{idempotency: true, providers: map[string]*fakeProvider{
			"a": newFakeProvider(failure(classBadRequest, "max_tokens is too large"), reply("never", 1, 1)),
		}})
		var msgs []string
		for range 2 {
			_, err := h.router.Complete(context.Background(), withKey(ask("chat"), "bad"))
			st := status.Convert(toStatus(err))
			if st.Code() != codes.InvalidArgument {
				t.Fatalf("code = %v, want InvalidArgument", st.Code())
			}
			msgs = append(msgs, st.Message())
		}
		if h.calls("a") != 1 || msgs[0] != msgs[1] {
			t.Errorf("%d calls, messages %q, want one call and the same error twice", h.calls("a"), msgs)
		}
	})

	t.Run("a failure a retry may fix is not recorded", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, testConfig(), &harness{idempotency: true, providers: map[string]*fakeProvider{
			"a": newFakeProvider(failure(classOverloaded, "busy"), failure(classOverloaded, "busy"), failure(classOverloaded, "busy"), reply("recovered", 1, 1)),
		}})
		_, err := h.router.Complete(context.Background(), withKey(ask("a"), "retry-me"))
		if status.Code(toStatus(err)) != codes.Unavailable {
			t.Fatalf("first try: %v, want Unavailable", err)
		}
		resp, err := h.router.Complete(context.Background(), withKey(ask("a"), "retry-me"))
		if err != nil || resp.Message.Content != "recovered" || h.calls("a") != 4 {
			t.Errorf("retry: %v %v after %d calls, want a fresh attempt that answers", resp.GetMessage().GetContent(), err, h.calls("a"))
		}
	})
}
