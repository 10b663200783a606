package cache

import (
	"time"
	"unsafe"
)

// packedEntry is an Entry as the embedded index keeps it: its strings back to back in one
// byte slice, which is never written again, and read back as strings that point into it
// (entry). Why: the index is most of a busy process's live heap, and the collector follows
// every pointer in it at every collection, requests sharing the CPUs with it meanwhile.
// Kept as a dozen strings, an entry's text was about half of the index's cost to the
// collector: with 100,000 entries of one partition a full collection took 4.4 to 5.1 ms
// per 10,000 entries on two CPUs, and 3.3 to 3.5 packed (BenchmarkEmbeddedIndexMemory,
// gc-ms/10k-entries; docs/performance.md). The ends fit in uint32: an entry is bounded by
// the largest message a service accepts.
type packedEntry struct {
	text []byte
	// ends[i] is where text field i ends in text (textID ... textFinishReason).
	ends       [textFields]uint32
	key        Key
	partition  Key
	toolCalls  []ToolCall // nil for most answers
	usage      Usage
	createdAt  time.Time
	expiresAt  time.Time
	staleUntil time.Time
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
		usage: e.Usage, createdAt: e.CreatedAt, expiresAt: e.ExpiresAt, staleUntil: e.StaleUntil,
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

// entry is the Entry p was packed from.
func (p *packedEntry) entry() Entry {
	return Entry{
		ID: p.field(textID), Key: p.key, Partition: p.partition,
		Tenant: p.field(textTenant), Scenario: p.field(textScenario), Namespace: p.field(textNamespace),
		Question: p.field(textQuestion), Content: p.field(textContent),
		SourceModel: p.field(textSourceModel), FinishReason: p.field(textFinishReason),
		ToolCalls: p.toolCalls, Usage: p.usage,
		CreatedAt: p.createdAt, ExpiresAt: p.expiresAt, StaleUntil: p.staleUntil,
	}
}

func (p *packedEntry) freshAt(now time.Time) bool { return now.Before(p.expiresAt) }

func (p *packedEntry) heldAt(now time.Time) bool { return now.Before(p.staleUntil) }
