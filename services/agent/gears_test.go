package agent

import (
	"testing"
	"time"
)

// TestNextGear is the decision table kind × failure → next gear, with the conditions
// that move a query from one gear to the next.
func TestNextGear(t *testing.T) {
	t.Parallel()
	// open is a query situation where every gear is available.
	open := func(kind string, f failure) situation {
		return situation{kind: kind, failure: f, maxRetries: 2, delay: time.Second, left: 10 * time.Second,
			budget: true, backup: true, stale: true, staleAge: 5 * time.Minute}
	}
	tests := []struct {
		name string
		s    situation
		want gear
	}{
		// Every kind answers with a result or the tool's own error answer.
		{"query ok", open(KindQuery, failNone), gearAnswer},
		{"action ok", open(KindAction, failNone), gearAnswer},
		{"query tool error", open(KindQuery, failToolError), gearAnswer},
		{"action tool error", open(KindAction, failToolError), gearAnswer},
		{"external tool error", open(KindExternal, failToolError), gearAnswer},

		// Actions: never retried, never backed up, never served stale.
		{"action timeout", open(KindAction, failUnknown), gearConfirm},
		{"action bad response", open(KindAction, failBadResponse), gearConfirm},
		{"action refused", open(KindAction, failRefused), gearNotDone},
		{"action not called", open(KindAction, failNotCalled), gearNotDone},

		// Queries and external tools: retry first.
		{"query timeout", open(KindQuery, failUnknown), gearRetry},
		{"query refused", open(KindQuery, failRefused), gearRetry},
		{"query bad response", open(KindQuery, failBadResponse), gearRetry},
		{"external timeout", open(KindExternal, failUnknown), gearRetry},
		// Not called: a retry would be refused at once; the backup instead.
		{"query breaker open", open(KindQuery, failNotCalled), gearBackup},
		{"external rate limited here", open(KindExternal, failNotCalled), gearBackup},

		// Then backup, when retries are spent or do not fit.
		{"retries spent", with(open(KindQuery, failUnknown), func(s *situation) { s.retries = 2 }), gearBackup},
		{"no retries configured", with(open(KindQuery, failUnknown), func(s *situation) { s.maxRetries = 0 }), gearBackup},
		{"backoff past the deadline", with(open(KindQuery, failUnknown), func(s *situation) { s.left = 900 * time.Millisecond }), gearBackup},
		// An empty retry budget stops retries and the backup call alike...
		{"budget empty", with(open(KindQuery, failUnknown), func(s *situation) { s.budget = false }), gearStale},
		// ...except a backup for a tool that was not called.
		{"budget empty, breaker open", with(open(KindQuery, failNotCalled), func(s *situation) { s.budget = false }), gearBackup},

		// Then stale, then give up.
		{"no backup", with(open(KindQuery, failUnknown), func(s *situation) { s.retries, s.backup = 2, false }), gearStale},
		{"nothing stale", with(open(KindExternal, failRefused), func(s *situation) { s.retries, s.backup, s.stale = 2, false, false }), gearGiveUp},
		{"nothing left", situation{kind: KindQuery, failure: failNotCalled}, gearGiveUp},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := nextGear(tc.s); got != tc.want {
				t.Errorf("nextGear(%+v) = %s, want %s", tc.s, got, tc.want)
			}
		})
	}
}

// TestActionsNeverRetried checks the rule over every failure and every situation an
// action can be in: no gear of an action calls a backend again.
func TestActionsNeverRetried(t *testing.T) {
	t.Parallel()
	for f := failNone; f <= failNotCalled; f++ {
		for _, budget := range []bool{false, true} {
			for _, backup := range []bool{false, true} {
				s := situation{kind: KindAction, failure: f, maxRetries: 5, delay: time.Millisecond, left: time.Hour, budget: budget, backup: backup, stale: true}
				switch g := nextGear(s); g {
				case gearRetry, gearBackup, gearStale:
					t.Errorf("action, %s, budget %t, backup %t: %s", f, budget, backup, g)
				}
			}
		}
	}
}

func with(s situation, f func(*situation)) situation {
	f(&s)
	return s
}
