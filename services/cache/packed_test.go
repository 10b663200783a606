package cache

import (
	"reflect"
	"testing"
	"time"
)

// TestPackedEntry: an entry packed and read back is the entry, field for field, whatever
// its strings hold (empty, multi-byte, one field taking all), its times the same instants
// in UTC (the zero time stays zero), and it is fresh and held exactly when the entry is, to
// the nanosecond.
func TestPackedEntry(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	full := Entry{
		ID: "id-1", Key: Key{1}, Partition: Key{2}, Tenant: "acme", Scenario: "support", Namespace: "lexical-v1",
		Question: "退款多久到账？", Content: "五个工作日内原路退回。", SourceModel: "gpt-4o-mini", FinishReason: "stop",
		ToolCalls: []ToolCall{{ID: "call_1", Type: "function", Name: "refund", Arguments: `{"days":5}`}},
		Usage:     Usage{InputTokens: 12, OutputTokens: 9, TotalTokens: 21},
		CreatedAt: at, ExpiresAt: at.Add(time.Hour), StaleUntil: at.Add(2 * time.Hour),
	}
	for _, tt := range []struct {
		name string
		e    Entry
	}{
		{name: "every field", e: full},
		{name: "empty", e: Entry{}},
		{name: "one string", e: Entry{Content: "only the content"}},
		{name: "first and last", e: Entry{ID: "x", FinishReason: "length"}},
		{name: "middle empty", e: Entry{ID: "x", Tenant: "", Scenario: "s", Question: "", Content: "c"}},
		{name: "times in another zone", e: Entry{
			ID: "z", CreatedAt: at.In(time.FixedZone("CST", 8*3600)), ExpiresAt: at.Add(time.Nanosecond).In(time.Local),
			StaleUntil: time.Date(1969, 7, 20, 20, 17, 40, 999, time.FixedZone("EDT", -4*3600)),
		}},
		{name: "times with a monotonic reading", e: Entry{ID: "m", CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour), StaleUntil: time.Now().Add(2 * time.Hour)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := pack(tt.e)
			want := tt.e
			for _, t := range []*time.Time{&want.CreatedAt, &want.ExpiresAt, &want.StaleUntil} {
				*t = time.Unix(t.Unix(), int64(t.Nanosecond())).UTC() // the zero time stays zero
			}
			if got := p.entry(); !reflect.DeepEqual(got, want) {
				t.Errorf("entry() = %+v, want %+v", got, want)
			}
			for _, now := range []time.Time{
				at, tt.e.ExpiresAt.Add(-time.Nanosecond), tt.e.ExpiresAt, tt.e.StaleUntil.Add(-time.Nanosecond),
				tt.e.StaleUntil, tt.e.StaleUntil.Add(time.Nanosecond),
			} {
				now = now.Round(0) // as the clock's times compare with a stored one: by the wall clock
				if p.freshAt(now) != tt.e.freshAt(now) || p.heldAt(now) != tt.e.heldAt(now) {
					t.Errorf("at %v: fresh %v held %v, the entry's %v %v", now, p.freshAt(now), p.heldAt(now), tt.e.freshAt(now), tt.e.heldAt(now))
				}
			}
		})
	}
}
