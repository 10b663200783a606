package cache

import (
	"time"
	"unsafe"
)

// packedEntry is an Entry as the embedded index keeps it: its strings back to back in one
// byte slice, which is never written again, and read back as strings that point into it
// (entry), so that the collector follows one pointer for all of them (see nodeTable for
// why that matters). The ends fit in uint32: an entry is bounded by the largest message a
// service accepts.
type packedEntry struct {
	text []byte
	// ends[i] is where text field i ends in text (textID ... textFinishReason).
	ends      [textFields]uint32
	key       Key
	partition Key
	toolCalls []ToolCall // nil for most answers
	usage     Usage
	// The times without their zones: a time.Time holds a pointer to its Location. Entries
	// are compared with the clock by their wall time, as a snapshot's always were.
	createdAt  wallTime
	expiresAt  wallTime
	staleUntil wallTime
}

// wallTime is a time.Time's instant (its wall clock, without the monotonic reading or
// the zone). The zero time.Time's is a valid one, and reads back as the zero time.Time.
type wallTime struct {
	sec  int64 // since 1970-01-01 UTC
	nsec int32
}

func wallOf(t time.Time) wallTime { return wallTime{sec: t.Unix(), nsec: int32(t.Nanosecond())} }

// time is w in UTC.
func (w wallTime) time() time.Time { return time.Unix(w.sec, int64(w.nsec)).UTC() }

// after reports whether w is after t, as t.Before(w.time()) does for a t without a
// monotonic reading.
func (w wallTime) after(t time.Time) bool {
	s := t.Unix()
	return s < w.sec || s == w.sec && int32(t.Nanosecond()) < w.nsec
}

// The string fields of an Entry, in their order in packedEntry.text.
const (
	textID = iota
	textTenant
	textScenario
	textNamespace
	textQuestion
	textContent
	textSourceModel
	textFinishReason
	textFields
)

func pack(e Entry) packedEntry {
	fields := [textFields]string{
		textID: e.ID, textTenant: e.Tenant, textScenario: e.Scenario, textNamespace: e.Namespace,
		textQuestion: e.Question, textContent: e.Content, textSourceModel: e.SourceModel,
		textFinishReason: e.FinishReason,
	}
	n := 0
	for _, f := range fields {
		n += len(f)
	}
	p := packedEntry{
		text: make([]byte, 0, n), key: e.Key, partition: e.Partition, toolCalls: e.ToolCalls,
		usage: e.Usage, createdAt: wallOf(e.CreatedAt), expiresAt: wallOf(e.ExpiresAt), staleUntil: wallOf(e.StaleUntil),
	}
	for i, f := range fields {
		p.text = append(p.text, f...)
		p.ends[i] = uint32(len(p.text))
	}
	return p
}

// field is text field i, as a string that shares text's memory: text is never written
// once packed, so the string stays what it was.
func (p *packedEntry) field(i int) string {
	start := uint32(0)
	if i > 0 {
		start = p.ends[i-1]
	}
	if start == p.ends[i] {
		return ""
	}
	return unsafe.String(&p.text[start], int(p.ends[i]-start))
}

// entry is the Entry p was packed from, its times in UTC.
func (p *packedEntry) entry() Entry {
	return Entry{
		ID: p.field(textID), Key: p.key, Partition: p.partition,
		Tenant: p.field(textTenant), Scenario: p.field(textScenario), Namespace: p.field(textNamespace),
		Question: p.field(textQuestion), Content: p.field(textContent),
		SourceModel: p.field(textSourceModel), FinishReason: p.field(textFinishReason),
		ToolCalls: p.toolCalls, Usage: p.usage,
		CreatedAt: p.createdAt.time(), ExpiresAt: p.expiresAt.time(), StaleUntil: p.staleUntil.time(),
	}
}

func (p *packedEntry) freshAt(now time.Time) bool { return p.expiresAt.after(now) }

func (p *packedEntry) heldAt(now time.Time) bool { return p.staleUntil.after(now) }
