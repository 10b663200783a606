package router

import (
	"context"
	"testing"

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
