package cache

import (
	"reflect"
	"testing"
	"time"
)

// TestPackedEntry: an entry packed and read back is the entry, field for field, whatever
// its strings hold (empty, multi-byte, one field taking all), and it is fresh and held
// exactly when the entry is.
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
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := pack(tt.e)
			if got := p.entry(); !reflect.DeepEqual(got, tt.e) {
				t.Errorf("entry() = %+v, want %+v", got, tt.e)
			}
			if p.freshAt(at) != tt.e.freshAt(at) || p.heldAt(at) != tt.e.heldAt(at) {
				t.Errorf("freshAt/heldAt disagree with the entry's")
			}
		})
	}
}
