package router

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// Which budget pays for an extra attempt: a retry on the model that failed is charged to
// the key it goes to; a failover to another model only to the overall budget. Here model
// a's key has spent its own retry budget (as a key whose breaker keeps it out of most
// requests does), and the overall budget is untouched.
func TestRetryBudgetKeyOfExtraAttempts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		first    result
		want     []string // attempts as model:class
		wantCode bool     // the request ends in the ladder or an error, not an answer from b
	}{
		{
			name:  "failover to another model: a's spent budget does not stop it",
			first: failure(mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, "busy"),
			want:  []string{"a:overloaded", "b:none"},
		},
		{
			name:  "slow primary (timeout) fails over too",
			first: failure(mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT, "too slow"),
			want:  []string{"a:timeout", "b:none"},
		},
		{
			name:     "a retry on a itself is refused by a's spent budget",
			first:    failure(mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT, "blip"),
			want:     []string{"a:transient"},
			wantCode: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig()
			cfg.RetryBudget.Floor = 3
			h := newHarness(t, cfg, &harness{providers: map[string]*fakeProvider{
				"a": newFakeProvider(tt.first, reply("from a", 1, 1)),
			}})
			for _, k := range h.router.upstreams["a"].keys {
				for k.budget.TryRetry(false) {
				}
			}
			resp, err := h.router.Complete(context.Background(), ask("chat"))
			qc := resp.GetQuality()
			if err != nil {
				qc = FailedQuality(err)
			}
			if diff := cmp.Diff(tt.want, attemptsOf(qc)); diff != "" {
				t.Errorf("attempts (-want +got):\n%s", diff)
			}
			gotDegraded := err != nil || resp.GetModel() != "b"
			if gotDegraded != tt.wantCode {
				t.Errorf("answered by %q (err %v); want an answer from b: %t", resp.GetModel(), err, !tt.wantCode)
			}
			if tt.wantCode && !hasAudit(qc, "retry", "retry budget exhausted") {
				t.Errorf("audit %v, want the budget's refusal", qc.GetAudit())
			}
		})
	}
}

// The shared retry budget in quota weighs a request's extra attempts against the requests
// it counted for the key the request was admitted under. It must be asked about that key
// even when the first attempt went elsewhere: here a's breaker is open, so requests start
// on b, and b's transient failure is retried on b. Asking about b's key (which quota
// counted no requests for) refused every retry past the budget's floor in the
// seed-incident drill. The failovers from a to b while a trips are not asked about at all:
// b's breaker is closed, so they add no load to an upstream in trouble (plan.isFailover).
func TestSharedRetryBudgetAsksTheAdmissionKey(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	fastBreaker(&cfg)
	cfg.Retry.MaxRetries = 1
	cfg.Routes[0].Candidates = []string{"a", "b", "c"}
	cfg.Providers = []ProviderConfig{
		{Name: "pa", Type: ProviderSim, Timeout: 5 * time.Second, Keys: []KeyConfig{{ID: "key-a", Env: "MANTLE_TEST_KEY_A"}}},
		{Name: "pb", Type: ProviderSim, Timeout: 5 * time.Second, Keys: []KeyConfig{{ID: "key-b", Env: "MANTLE_TEST_KEY_B"}}},
	}
	cfg.Models[0].Provider = "pa"
	cfg.Models[1].Provider, cfg.Models[2].Provider = "pb", "pb"
	h := newHarness(t, cfg, &harness{providers: map[string]*fakeProvider{
		"a": newFakeProvider(failure(mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT, "slow"), failure(mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT, "slow")), // trips a
		"b": newFakeProvider(reply("b", 1, 1), reply("b", 1, 1), failure(classTransient, "blip"), reply("b", 1, 1)),
	}})
	for i := range 2 {
		if _, err := h.router.Complete(context.Background(), ask("chat")); err != nil {
			t.Fatalf("request %d while a trips: %v", i, err)
		}
	}
	resp, err := h.router.Complete(context.Background(), ask("chat"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"b:transient", "b:none"}, attemptsOf(resp.GetQuality())); diff != "" {
		t.Fatalf("attempts with a open (-want +got):\n%s", diff)
	}
	reserves, asked := h.quota.reserveRequests(), h.quota.retryRequests()
	if len(asked) != 1 { // the retry on b; the failovers from a to the healthy b ask nothing
		t.Fatalf("%d AcquireRetry requests, want 1", len(asked))
	}
	for i, a := range asked {
		if a.UpstreamKeyId != "key-a" {
			t.Errorf("AcquireRetry %d asked about key %q, want key-a, the key admission counted", i, a.UpstreamKeyId)
		}
	}
	if len(reserves) != 3 {
		t.Fatalf("%d Reserve requests, want 3", len(reserves))
	}
	for i, r := range reserves {
		if r.UpstreamKeyId != "key-a" {
			t.Errorf("Reserve %d counted key %q, want key-a", i, r.UpstreamKeyId)
		}
	}
}
