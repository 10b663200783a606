package cache

import (
	"context"
	"time"
)

// Index stores entries by key. The service owns this interface and the backends implement
// it: MemoryIndex for dev, tests and single nodes; Qdrant (with vector search beside the
// exact key) later. Implementations are safe for concurrent use.
type Index interface {
	// Get returns the entry stored under key when it is still live at now. An entry whose
	// ExpiresAt is not after now is a miss and is removed. A hit counts as a use for
	// eviction but does not extend the entry's life.
	Get(ctx context.Context, key Key, now time.Time) (Entry, bool, error)
	// Put stores e under e.Key, replacing any entry with that key.
	Put(ctx context.Context, e Entry) error
	// Delete removes the entries that match f and returns how many it removed.
	Delete(ctx context.Context, f Filter) (int, error)
}

// Filter selects entries of one tenant for Delete. Empty fields match everything; the
// tenant is required, so a delete can never reach across tenants.
type Filter struct {
	Tenant   string
	Scenario string
	ID       string
}

func (f Filter) matches(e Entry) bool {
	return e.Tenant == f.Tenant &&
		(f.Scenario == "" || e.Scenario == f.Scenario) &&
		(f.ID == "" || e.ID == f.ID)
}

// Entry is one cached answer.
type Entry struct {
	ID  string
	Key Key
	// Tenant and Scenario are the parts of the key that Invalidate filters on; the key is
	// a one-way hash, so they are kept beside it.
	Tenant       string
	Scenario     string
	Content      string
	SourceModel  string
	FinishReason string
	Usage        Usage
	CreatedAt    time.Time
	ExpiresAt    time.Time
}

// liveAt reports whether e may still be served at now.
func (e Entry) liveAt(now time.Time) bool { return now.Before(e.ExpiresAt) }

// Usage counts the tokens the answer cost when it was generated.
type Usage struct {
	InputTokens  int64
	OutputTokens int64
	TotalTokens  int64
}
