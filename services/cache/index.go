package cache

import (
	"context"
	"errors"
	"time"

	"github.com/mantle-mesh/mantle/services/cache/internal/vector"
)

// Index stores entries by key and finds them by similarity within a partition. The service
// owns this interface and the backends implement it: EmbeddedIndex (in process, for mantle
// dev and single nodes) and QdrantIndex (shared by replicas). Implementations are safe for
// concurrent use.
//
// An entry is held until its StaleUntil; whether it is fresh or stale at a given time is
// the service's decision, from ExpiresAt. Reads never extend either.
type Index interface {
	// Get returns the entry stored under key in namespace when now is before its
	// StaleUntil.
	Get(ctx context.Context, namespace string, key Key, now time.Time) (Entry, bool, error)
	// Search returns the entries of q's tenant and partition most similar to q.Vector,
	// best first.
	Search(ctx context.Context, q Query) ([]Candidate, error)
	// Put stores e under e.Key with its vector, replacing any entry with that key. A zero
	// vector (no embedder, or a question without words) stores an entry that only exact
	// lookups find, or is refused with ErrNeedsVector. near, when not nil, is what a Search
	// for the same vector recorded (Query.Near); the index takes it over.
	Put(ctx context.Context, e Entry, v vector.Vector, near *vector.Near) error
	// Delete removes the entries that match f and returns how many it removed.
	Delete(ctx context.Context, f Filter) (int, error)
}

// ErrNeedsVector is returned by Put of a backend that keeps only entries with a vector.
var ErrNeedsVector = errors.New("the index keeps only entries with a vector")

// Query is one similarity search.
type Query struct {
	// Tenant and Partition scope the search before any similarity is computed; Namespace
	// names the vector space (the Qdrant collection).
	Tenant    string
	Partition Key
	Namespace string
	Vector    vector.Vector
	// Limit is the most candidates returned.
	Limit int
	// MinScore drops candidates below this similarity.
	MinScore float32
	Now      time.Time
	// FreshOnly drops entries past their ExpiresAt; otherwise entries are returned until
	// their StaleUntil.
	FreshOnly bool
	// Near, when not nil, is where an index that links its vectors into a graph
	// (EmbeddedIndex) records what its search found near Vector. The service stores the
	// answer to a question it has just looked up, and a Put of the same vector with it
	// chooses the vector's links from it instead of searching the graph again. Other
	// indexes leave it empty.
	Near *vector.Near
}

// Candidate is an entry and its similarity to the query.
type Candidate struct {
	Entry Entry
	Score float32
}

// Filter selects entries of one tenant for Delete. Empty fields match everything; the
// tenant is required, so a delete can never reach across tenants.
type Filter struct {
	Tenant    string
	Scenario  string
	ID        string
	Namespace string
}

func (f Filter) matches(e Entry) bool {
	return e.Tenant == f.Tenant &&
		(f.Scenario == "" || e.Scenario == f.Scenario) &&
		(f.ID == "" || e.ID == f.ID) &&
		(f.Namespace == "" || e.Namespace == f.Namespace)
}

// Entry is one cached answer.
type Entry struct {
	ID string
	// Key names the entry (partition and normalised question); Partition is its scope.
	Key       Key
	Partition Key
	// Tenant, Scenario and Namespace are kept beside the keys (which are one-way hashes)
	// for filtering and invalidation.
	Tenant    string
	Scenario  string
	Namespace string
	// Question is the last user message the answer was given to, folded (see foldText);
	// the near-miss check compares it with later questions.
	Question     string
	Content      string
	SourceModel  string
	FinishReason string
	// ToolCalls are the answer's tool calls, when it has some.
	ToolCalls []ToolCall
	Usage     Usage
	CreatedAt time.Time
	ExpiresAt time.Time
	// StaleUntil is when the entry is deleted: ExpiresAt plus the scenario's max_staleness
	// for verified answers, which cache-only lookups may serve stale until then.
	StaleUntil time.Time
}

// ToolCall is one tool call of a cached answer, as the model made it.
type ToolCall struct {
	ID, Type, Name string
	// Arguments is the raw JSON string the model wrote.
	Arguments string
}

// freshAt reports whether e may be served at now in every mode.
func (e Entry) freshAt(now time.Time) bool { return now.Before(e.ExpiresAt) }

// heldAt reports whether e is still kept at now (fresh, or stale but not yet deleted).
func (e Entry) heldAt(now time.Time) bool { return now.Before(e.StaleUntil) }

// Usage counts the tokens the answer cost when it was generated.
type Usage struct {
	InputTokens  int64
	OutputTokens int64
	TotalTokens  int64
}
