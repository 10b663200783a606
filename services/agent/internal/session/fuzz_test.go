package session

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// FuzzSessionRecord: a session's record is JSON read back from the store, which other
// replicas (and whoever else can write the bucket) wrote. Whatever it holds, every
// operation on it answers or fails; none panics, and an event handler sees only
// well-formed events.
func FuzzSessionRecord(f *testing.F) {
	for _, seed := range []string{
		`{"id":"s1","tenant":"acme","state":"active","budget":{"deadline":3600000000000,"tokens":100,"cost_usd":1,"steps":10},"created_at":"2025-06-01T12:00:00Z","steps":[{"id":"t1","kind":"tool","status":"running","target":"weather","tool_kind":"query","lease_until":"2025-06-01T12:01:00Z"}]}`,
		`{"id":"s1","tenant":"acme","state":"active","degraded":true,"steps":[{"id":"a1","kind":"tool","status":"pending_confirmation","tool_kind":"action"}]}`,
		`{"state":"completed","steps":[null]}`,
		`{"state":"active","steps":[{"id":"t1"},{"id":"t1"}],"budget":{"deadline":-1,"steps":-5}}`,
		`{}`, `null`, `[]`, `{"steps":{}}`,
	} {
		f.Add([]byte(seed))
	}
	epoch := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, record []byte) {
		if len(record) > 64<<10 {
			return
		}
		if _, err := decode(record); err != nil {
			return
		}
		ctx := context.Background()
		clock := clockwork.NewFakeClockAt(epoch)
		store := NewMemory(100, clock)
		if _, err := store.Create(ctx, sessionKey("acme", "s1"), record, time.Hour); err != nil {
			t.Fatal(err)
		}
		m := NewManager(DefaultConfig(), store, clock)
		m.OnEvent(func(_ context.Context, ev Event) {
			if ev.Kind < EventDegraded || ev.Kind > EventEnded {
				t.Errorf("event of kind %d", ev.Kind)
			}
		})
		_, _ = m.Get(ctx, "acme", "s1", true)
		_, _ = m.Begin(ctx, BeginRequest{Tenant: "acme", SessionID: "s1", StepID: "t1", Kind: KindTool, Target: "weather", ToolKind: ToolQuery})
		_, _ = m.End(ctx, EndRequest{Tenant: "acme", SessionID: "s1", StepID: "t1", Status: StatusStale, Result: []byte(`{}`)})
		_, _ = m.Begin(ctx, BeginRequest{Tenant: "acme", SessionID: "s1", StepID: "m1", Kind: KindModel, Target: "chat"})
		_, _ = m.End(ctx, EndRequest{Tenant: "acme", SessionID: "s1", StepID: "a1", Status: StatusPendingConfirmation})
		clock.Advance(2 * time.Hour)
		_, _ = m.Cancel(ctx, "acme", "s1", "fuzz")
		_, _ = m.Complete(ctx, "acme", "s1")
	})
}
