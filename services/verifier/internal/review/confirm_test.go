package review

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/mantle-mesh/mantle/pkg/rpc"
)

func confirmation(key, attempt string) Confirmation {
	return Confirmation{Tenant: "acme", Tool: "pay", IdempotencyKey: key, Attempt: attempt, SessionID: "s-1", StepID: "4",
		Arguments: `{"invoice":"i-1"}`, Reason: "HTTP 504 Gateway Timeout"}
}

// TestConfirmationLifecycle: open is idempotent per tenant, key and run; a run after
// "not happened" is another confirmation; a decision is final and audited; the lists
// filter by state and tenant; another tenant's confirmation is not found.
func TestConfirmationLifecycle(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, kv KV) {
		ctx := context.Background()
		f := newFixture(t, kv)
		first, created, err := f.svc.OpenConfirmation(ctx, confirmation("pay-1", "1"))
		if err != nil || !created || first.State != ConfirmPending || !strings.HasPrefix(first.ID, ConfirmationPrefix) || !first.CreatedAt.Equal(t0) {
			t.Fatalf("OpenConfirmation = %+v, %v, %v", first, created, err)
		}
		again, created, err := f.svc.OpenConfirmation(ctx, confirmation("pay-1", "1"))
		if err != nil || created || again.ID != first.ID {
			t.Fatalf("second open of the same run = %+v, created %v, %v; want the first", again, created, err)
		}
		if _, err := f.svc.GetConfirmation(ctx, "beta", first.ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("another tenant's read = %v, want not found", err)
		}
		if _, err := f.svc.DecideConfirmation(ctx, ConfirmDecision{ID: "cf_missing", Reviewer: "anna", State: ConfirmHappened}); !errors.Is(err, ErrNotFound) {
			t.Errorf("deciding a missing confirmation = %v, want not found", err)
		}
		decided, err := f.svc.DecideConfirmation(ctx, ConfirmDecision{ID: first.ID, Reviewer: "anna", State: ConfirmNotHappened, Note: "no charge at the bank"})
		if err != nil || decided.State != ConfirmNotHappened || decided.DecidedBy != "anna" || decided.DecidedAt.IsZero() {
			t.Fatalf("decide = %+v, %v", decided, err)
		}
		if _, err := f.svc.DecideConfirmation(ctx, ConfirmDecision{ID: first.ID, Reviewer: "bob", State: ConfirmHappened}); !conflict(err) {
			t.Errorf("second decision = %v, want a conflict", err)
		}
		second, created, err := f.svc.OpenConfirmation(ctx, confirmation("pay-1", "2"))
		if err != nil || !created || second.ID == first.ID {
			t.Fatalf("open of the next run = %+v, created %v, %v; want a new confirmation", second, created, err)
		}
		other := confirmation("pay-9", "1")
		other.Tenant = "beta"
		if _, _, err := f.svc.OpenConfirmation(ctx, other); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			filter ConfirmFilter
			want   int
		}{
			{ConfirmFilter{}, 3},
			{ConfirmFilter{State: ConfirmPending}, 2},
			{ConfirmFilter{State: ConfirmNotHappened}, 1},
			{ConfirmFilter{Tenant: "beta"}, 1},
			{ConfirmFilter{Tenant: "acme", State: ConfirmPending}, 1},
		} {
			list, _, err := f.svc.ListConfirmations(ctx, tc.filter, Page{})
			if err != nil || len(list) != tc.want {
				t.Errorf("ListConfirmations(%+v) = %d, %v; want %d", tc.filter, len(list), err, tc.want)
			}
		}
		audit, _, err := f.svc.Audit(ctx, AuditFilter{ReviewID: first.ID}, Page{})
		if err != nil || len(audit) != 2 || audit[0].Action != AuditCreated || audit[1].Action != AuditDecided || audit[1].Actor != "anna" ||
			!strings.Contains(audit[1].Detail, "not_happened") {
			t.Errorf("audit = %+v, %v", audit, err)
		}
		if _, _, err := f.svc.Audit(ctx, AuditFilter{Scope: "acme", ReviewID: first.ID}, Page{}); !errors.Is(err, ErrNotFound) {
			t.Errorf("a tenant-scoped audit of a confirmation = %v, want not found", err)
		}
		if entries, _, err := f.svc.Audit(ctx, AuditFilter{Scope: "acme"}, Page{}); err != nil || len(entries) != 0 {
			t.Errorf("a tenant's audit trail = %+v, %v; want no confirmation entries", entries, err)
		}
	})
}

// TestConfirmationBounds: what the agent saw is cut to size, so the confirmation opens;
// what is missing or what a person writes too long is refused, naming the field.
func TestConfirmationBounds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, NewMemoryKV())
	long := confirmation("k-long", "1")
	long.Arguments = strings.Repeat("a", 100<<10)
	long.Reason = strings.Repeat("é", 10<<10)
	c, _, err := f.svc.OpenConfirmation(ctx, long)
	if err != nil || len(c.Arguments) > maxConfirmArguments || len(c.Reason) > maxConfirmReason || !strings.Contains(c.Arguments, "truncated") {
		t.Fatalf("long texts: %d and %d bytes, %v; want cut with a marker", len(c.Arguments), len(c.Reason), err)
	}
	for _, tc := range []struct {
		name  string
		edit  func(*Confirmation)
		field string
	}{
		{"no tenant", func(c *Confirmation) { c.Tenant = "" }, "tenant"},
		{"no tool", func(c *Confirmation) { c.Tool = "" }, "tool"},
		{"no key", func(c *Confirmation) { c.IdempotencyKey = "" }, "idempotency_key"},
		{"no attempt", func(c *Confirmation) { c.Attempt = "" }, "attempt"},
		{"long key", func(c *Confirmation) { c.IdempotencyKey = strings.Repeat("k", 513) }, "idempotency_key"},
		{"long session", func(c *Confirmation) { c.SessionID = strings.Repeat("s", 513) }, "session_id"},
	} {
		c := confirmation("k", "1")
		tc.edit(&c)
		_, _, err := f.svc.OpenConfirmation(ctx, c)
		if !fieldRefused(err, tc.field) {
			t.Errorf("%s: %v, want %s refused", tc.name, err, tc.field)
		}
	}
	open, _, err := f.svc.OpenConfirmation(ctx, confirmation("k-decide", "1"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		d     ConfirmDecision
		field string
	}{
		{"no reviewer", ConfirmDecision{State: ConfirmHappened}, "reviewer"},
		{"no decision", ConfirmDecision{Reviewer: "anna"}, "decision"},
		{"pending is no decision", ConfirmDecision{Reviewer: "anna", State: ConfirmPending}, "decision"},
		{"result too long", ConfirmDecision{Reviewer: "anna", State: ConfirmHappened, Result: strings.Repeat("r", MaxConfirmResult+1)}, "result"},
		{"result without happened", ConfirmDecision{Reviewer: "anna", State: ConfirmNotHappened, Result: "x"}, "result"},
	} {
		tc.d.ID = open.ID
		if _, err := f.svc.DecideConfirmation(ctx, tc.d); !fieldRefused(err, tc.field) {
			t.Errorf("%s: %v, want %s refused", tc.name, err, tc.field)
		}
	}
	if c, err := f.svc.GetConfirmation(ctx, "acme", open.ID); err != nil || c.State != ConfirmPending {
		t.Errorf("after refused decisions: %+v, %v; want still pending", c, err)
	}
}

func fieldRefused(err error, field string) bool {
	var v *rpc.ValidationError
	return errors.As(err, &v) && strings.Contains(v.Error(), field)
}
