package router

import (
	"context"
	"net/http/httptest"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// TestIdempotencyKeyReusedForAnotherBody: the same key with another body is refused
// (FAILED_PRECONDITION, IDEMPOTENCY_KEY_REUSED, HTTP 422), never answered with the first
// request's answer; the same body with another priority is still a replay.
func TestIdempotencyKeyReusedForAnotherBody(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(), &harness{idempotency: true, providers: map[string]*fakeProvider{
		"a": newFakeProvider(reply("about breakers", 1, 1), reply("about something else", 1, 1)),
	}})
	if _, err := h.router.Complete(context.Background(), withKey(ask("chat"), "k-1")); err != nil {
		t.Fatal(err)
	}
	other := withKey(ask("chat"), "k-1")
	other.Messages[0].Content = "What is a bulkhead?"
	resp, err := h.router.Complete(context.Background(), other)
	if status.Code(err) != codes.FailedPrecondition || rpc.ErrorInfo(err).GetReason() != ReasonIdempotencyKeyReused {
		t.Fatalf("another body under the same key: %v %v, want FAILED_PRECONDITION %s", resp.GetMessage().GetContent(), err, ReasonIdempotencyKeyReused)
	}
	w := httptest.NewRecorder()
	writeError(w, toStatus(err))
	if w.Code != 422 {
		t.Errorf("HTTP status %d, want 422", w.Code)
	}
	same := withKey(ask("chat"), "k-1")
	same.Priority = mantlev1.Priority_PRIORITY_HIGH
	if resp, err := h.router.Complete(context.Background(), same); err != nil || resp.GetMessage().GetContent() != "about breakers" {
		t.Errorf("same body, other priority: %q %v, want the replay", resp.GetMessage().GetContent(), err)
	}
	if h.calls("a") != 1 {
		t.Errorf("a called %d times, want 1", h.calls("a"))
	}
}
