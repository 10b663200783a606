package cache

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/qdrant/go-client/qdrant"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mantle-mesh/mantle/services/cache/internal/vector"
)

// QdrantServerVersion is the Qdrant server line this backend is built and tested against,
// matching github.com/qdrant/go-client v1.17.1.
const QdrantServerVersion = "1.17"

// Payload fields of every point. tenant is indexed with is_tenant, so Qdrant lays out each
// tenant's points together and a tenant-filtered search reads only them.
const (
	fieldTenant     = "tenant"
	fieldPartition  = "partition"
	fieldKey        = "key"
	fieldEntryID    = "entry_id"
	fieldScenario   = "scenario"
	fieldNamespace  = "namespace"
	fieldQuestion   = "question"
	fieldContent    = "content"
	fieldModel      = "source_model"
	fieldFinish     = "finish_reason"
	fieldToolCalls  = "tool_calls"
	fieldInput      = "input_tokens"
	fieldOutput     = "output_tokens"
	fieldTotal      = "total_tokens"
	fieldCreated    = "created_at_ms"
	fieldExpires    = "expires_at_ms"
	fieldStaleUntil = "stale_until_ms"
)

// sparseVectorName names the sparse vector of collections for sparse embedders; dense
// collections use the unnamed default vector.
const sparseVectorName = "lexical"

// QdrantIndex is an Index in Qdrant: one collection per embedder namespace, cosine distance
// for dense vectors (sparse vectors are unit length, so their dot product, Qdrant's only
// sparse score, is the cosine), the tenant as a payload index with is_tenant, and the
// expiry as an integer payload that Sweep deletes by. Points are named by the entry's key,
// so storing a prompt again replaces its point. Every call has its own short deadline.
type QdrantIndex struct {
	client  *qdrant.Client
	prefix  string
	timeout time.Duration

	mu    sync.Mutex
	ready map[string]bool // collections known to exist with their payload indexes
}

var _ Index = (*QdrantIndex)(nil)

// NewQdrantIndex returns an index over client. It does not call Qdrant: collections are
// created when the first entry of a namespace is stored.
func NewQdrantIndex(client *qdrant.Client, prefix string, timeout time.Duration) *QdrantIndex {
	return &QdrantIndex{client: client, prefix: prefix, timeout: timeout, ready: map[string]bool{}}
}

// Collection returns the collection that holds namespace's entries.
func (q *QdrantIndex) Collection(namespace string) string { return q.prefix + namespace }

// pointID derives a point id (a UUID) from the entry key.
func pointID(k Key) *qdrant.PointId {
	h := hex.EncodeToString(k[:16])
	return qdrant.NewID(h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32])
}

func (q *QdrantIndex) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, q.timeout)
}

// ensureCollection creates namespace's collection and its payload indexes unless they are
// known to exist. v decides the vector configuration.
func (q *QdrantIndex) ensureCollection(ctx context.Context, namespace string, v vector.Vector) error {
	q.mu.Lock()
	ready := q.ready[namespace]
	q.mu.Unlock()
	if ready {
		return nil
	}
	name := q.Collection(namespace)
	callCtx, cancel := q.call(ctx)
	exists, err := q.client.CollectionExists(callCtx, name)
	cancel()
	if err != nil {
		return fmt.Errorf("qdrant: %w", err)
	}
	if !exists {
		create := &qdrant.CreateCollection{CollectionName: name}
		if v.Sparse() {
			create.SparseVectorsConfig = qdrant.NewSparseVectorsConfig(map[string]*qdrant.SparseVectorParams{sparseVectorName: {}})
		} else {
			create.VectorsConfig = qdrant.NewVectorsConfig(&qdrant.VectorParams{Size: uint64(len(v.Dense)), Distance: qdrant.Distance_Cosine})
		}
		callCtx, cancel := q.call(ctx)
		err := q.client.CreateCollection(callCtx, create)
		cancel()
		// Another replica may have created it in between.
		if err != nil && status.Code(err) != codes.AlreadyExists && !strings.Contains(err.Error(), "already exists") {
			return fmt.Errorf("qdrant: %w", err)
		}
	}
	indexes := []struct {
		field  string
		kind   qdrant.FieldType
		params *qdrant.PayloadIndexParams
	}{
		{fieldTenant, qdrant.FieldType_FieldTypeKeyword, qdrant.NewPayloadIndexParamsKeyword(&qdrant.KeywordIndexParams{IsTenant: new(true)})},
		{fieldPartition, qdrant.FieldType_FieldTypeKeyword, nil},
		{fieldEntryID, qdrant.FieldType_FieldTypeKeyword, nil},
		{fieldScenario, qdrant.FieldType_FieldTypeKeyword, nil},
		{fieldExpires, qdrant.FieldType_FieldTypeInteger, nil},
		{fieldStaleUntil, qdrant.FieldType_FieldTypeInteger, nil},
	}
	for _, ix := range indexes {
		callCtx, cancel := q.call(ctx)
		_, err := q.client.CreateFieldIndex(callCtx, &qdrant.CreateFieldIndexCollection{
			CollectionName:   name,
			FieldName:        ix.field,
			FieldType:        ix.kind.Enum(),
			FieldIndexParams: ix.params,
			Wait:             new(true),
		})
		cancel()
		if err != nil {
			return fmt.Errorf("qdrant: index %s: %w", ix.field, err)
		}
	}
	q.mu.Lock()
	q.ready[namespace] = true
	q.mu.Unlock()
	return nil
}

// isNotFound reports whether err says the collection does not exist yet: nothing has been
// stored in the namespace, which for a read is simply a miss.
func isNotFound(err error) bool {
	return err != nil && status.Code(err) == codes.NotFound // status.Code unwraps
}

// Get implements Index, reading the point named by key in namespace's collection.
func (q *QdrantIndex) Get(ctx context.Context, namespace string, key Key, now time.Time) (Entry, bool, error) {
	callCtx, cancel := q.call(ctx)
	defer cancel()
	points, err := q.client.Get(callCtx, &qdrant.GetPoints{
		CollectionName: q.Collection(namespace),
		Ids:            []*qdrant.PointId{pointID(key)},
		WithPayload:    qdrant.NewWithPayload(true),
	})
	if isNotFound(err) {
		return Entry{}, false, nil
	}
	if err != nil {
		return Entry{}, false, fmt.Errorf("qdrant: %w", err)
	}
	for _, p := range points {
		e, err := entryFromPayload(p.GetPayload())
		if err != nil {
			return Entry{}, false, err
		}
		// The id is half of the key; the payload's full key settles it.
		if e.Key == key && e.heldAt(now) {
			return e, true, nil
		}
	}
	return Entry{}, false, nil
}

// Search implements Index.
func (q *QdrantIndex) Search(ctx context.Context, query Query) ([]Candidate, error) {
	if query.Vector.Len() == 0 || query.Limit <= 0 {
		return nil, nil
	}
	expiry, bound := fieldStaleUntil, query.Now
	if query.FreshOnly {
		expiry = fieldExpires
	}
	req := &qdrant.QueryPoints{
		CollectionName: q.Collection(query.Namespace),
		Filter: &qdrant.Filter{Must: []*qdrant.Condition{
			qdrant.NewMatchKeyword(fieldTenant, query.Tenant),
			qdrant.NewMatchKeyword(fieldPartition, query.Partition.String()),
			qdrant.NewRange(expiry, &qdrant.Range{Gt: new(float64(bound.UnixMilli()))}),
		}},
		Limit:          new(uint64(query.Limit)),
		ScoreThreshold: new(query.MinScore),
		WithPayload:    qdrant.NewWithPayload(true),
	}
	if query.Vector.Sparse() {
		req.Query = qdrant.NewQuerySparse(query.Vector.Indices, query.Vector.Values)
		req.Using = new(sparseVectorName)
	} else {
		req.Query = qdrant.NewQueryDense(query.Vector.Dense)
	}
	callCtx, cancel := q.call(ctx)
	defer cancel()
	points, err := q.client.Query(callCtx, req)
	if isNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("qdrant: %w", err)
	}
	out := make([]Candidate, 0, len(points))
	for _, p := range points {
		e, err := entryFromPayload(p.GetPayload())
		if err != nil {
			return nil, err
		}
		// Qdrant applied the filter; checking again costs nothing and keeps a filter
		// mistake from ever crossing tenants.
		if e.Tenant != query.Tenant || e.Partition != query.Partition {
			return nil, fmt.Errorf("qdrant: search returned a point outside its filter (entry %s)", e.ID)
		}
		out = append(out, Candidate{Entry: e, Score: p.GetScore()})
	}
	return out, nil
}

// Put implements Index. An entry without a vector is refused with ErrNeedsVector: a point
// needs one.
func (q *QdrantIndex) Put(ctx context.Context, e Entry, v vector.Vector, _ *vector.Near) error {
	if v.Len() == 0 {
		return ErrNeedsVector
	}
	if err := q.ensureCollection(ctx, e.Namespace, v); err != nil {
		return err
	}
	point := &qdrant.PointStruct{Id: pointID(e.Key), Payload: payloadOf(e)}
	if v.Sparse() {
		point.Vectors = qdrant.NewVectorsMap(map[string]*qdrant.Vector{sparseVectorName: qdrant.NewVectorSparse(v.Indices, v.Values)})
	} else {
		point.Vectors = qdrant.NewVectorsDense(v.Dense)
	}
	callCtx, cancel := q.call(ctx)
	defer cancel()
	_, err := q.client.Upsert(callCtx, &qdrant.UpsertPoints{
		CollectionName: q.Collection(e.Namespace),
		Points:         []*qdrant.PointStruct{point},
		Wait:           new(true),
	})
	if err != nil {
		// The collection may have been deleted behind our back; find out next time.
		if isNotFound(err) {
			q.mu.Lock()
			delete(q.ready, e.Namespace)
			q.mu.Unlock()
		}
		return fmt.Errorf("qdrant: %w", err)
	}
	return nil
}

// Delete implements Index. Without a namespace it deletes from every collection with the
// prefix, old embedders' included.
func (q *QdrantIndex) Delete(ctx context.Context, f Filter) (int, error) {
	if f.Tenant == "" {
		return 0, errors.New("qdrant: delete without a tenant")
	}
	must := []*qdrant.Condition{qdrant.NewMatchKeyword(fieldTenant, f.Tenant)}
	if f.Scenario != "" {
		must = append(must, qdrant.NewMatchKeyword(fieldScenario, f.Scenario))
	}
	if f.ID != "" {
		must = append(must, qdrant.NewMatchKeyword(fieldEntryID, f.ID))
	}
	var collections []string
	if f.Namespace != "" {
		collections = []string{q.Collection(f.Namespace)}
	} else {
		var err error
		if collections, err = q.collections(ctx); err != nil {
			return 0, err
		}
	}
	removed := 0
	for _, c := range collections {
		n, err := q.deleteIn(ctx, c, &qdrant.Filter{Must: must})
		if err != nil {
			return removed, err
		}
		removed += n
	}
	return removed, nil
}

// deleteIn counts, then deletes, the points of collection that match filter. The count
// is what the caller is told; a point stored between the two calls and matching the
// filter is deleted without being counted.
func (q *QdrantIndex) deleteIn(ctx context.Context, collection string, filter *qdrant.Filter) (int, error) {
	callCtx, cancel := q.call(ctx)
	n, err := q.client.Count(callCtx, &qdrant.CountPoints{CollectionName: collection, Filter: filter, Exact: new(true)})
	cancel()
	if isNotFound(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("qdrant: %w", err)
	}
	if n == 0 {
		return 0, nil
	}
	callCtx, cancel = q.call(ctx)
	defer cancel()
	if _, err := q.client.Delete(callCtx, &qdrant.DeletePoints{
		CollectionName: collection,
		Points:         qdrant.NewPointsSelectorFilter(filter),
		Wait:           new(true),
	}); err != nil {
		return 0, fmt.Errorf("qdrant: %w", err)
	}
	return int(n), nil
}

// collections lists the collections this backend owns (by prefix).
func (q *QdrantIndex) collections(ctx context.Context) ([]string, error) {
	callCtx, cancel := q.call(ctx)
	defer cancel()
	all, err := q.client.ListCollections(callCtx)
	if err != nil {
		return nil, fmt.Errorf("qdrant: %w", err)
	}
	var out []string
	for _, c := range all {
		if strings.HasPrefix(c, q.prefix) {
			out = append(out, c)
		}
	}
	return out, nil
}

// Sweep deletes the points of every owned collection whose StaleUntil has passed at now,
// and returns how many points remain (the entries gauge). Qdrant has no TTL of its own.
func (q *QdrantIndex) Sweep(ctx context.Context, now time.Time) (remaining int, err error) {
	collections, err := q.collections(ctx)
	if err != nil {
		return 0, err
	}
	expired := &qdrant.Filter{Must: []*qdrant.Condition{
		qdrant.NewRange(fieldStaleUntil, &qdrant.Range{Lte: new(float64(now.UnixMilli()))}),
	}}
	for _, c := range collections {
		if _, err := q.deleteIn(ctx, c, expired); err != nil {
			return 0, err
		}
		callCtx, cancel := q.call(ctx)
		n, err := q.client.Count(callCtx, &qdrant.CountPoints{CollectionName: c, Exact: new(false)})
		cancel()
		if err != nil && !isNotFound(err) {
			return 0, fmt.Errorf("qdrant: %w", err)
		}
		remaining += int(n)
	}
	return remaining, nil
}

// ServerVersion asks Qdrant for its version.
func (q *QdrantIndex) ServerVersion(ctx context.Context) (string, error) {
	callCtx, cancel := q.call(ctx)
	defer cancel()
	reply, err := q.client.HealthCheck(callCtx)
	if err != nil {
		return "", fmt.Errorf("qdrant: %w", err)
	}
	return reply.GetVersion(), nil
}

func payloadOf(e Entry) map[string]*qdrant.Value {
	return map[string]*qdrant.Value{
		fieldTenant:     qdrant.NewValueString(e.Tenant),
		fieldPartition:  qdrant.NewValueString(e.Partition.String()),
		fieldKey:        qdrant.NewValueString(e.Key.String()),
		fieldEntryID:    qdrant.NewValueString(e.ID),
		fieldScenario:   qdrant.NewValueString(e.Scenario),
		fieldNamespace:  qdrant.NewValueString(e.Namespace),
		fieldQuestion:   qdrant.NewValueString(e.Question),
		fieldContent:    qdrant.NewValueString(e.Content),
		fieldModel:      qdrant.NewValueString(e.SourceModel),
		fieldFinish:     qdrant.NewValueString(e.FinishReason),
		fieldToolCalls:  qdrant.NewValueString(toolCallsJSON(e.ToolCalls)),
		fieldInput:      qdrant.NewValueInt(e.Usage.InputTokens),
		fieldOutput:     qdrant.NewValueInt(e.Usage.OutputTokens),
		fieldTotal:      qdrant.NewValueInt(e.Usage.TotalTokens),
		fieldCreated:    qdrant.NewValueInt(e.CreatedAt.UnixMilli()),
		fieldExpires:    qdrant.NewValueInt(e.ExpiresAt.UnixMilli()),
		fieldStaleUntil: qdrant.NewValueInt(e.StaleUntil.UnixMilli()),
	}
}

func entryFromPayload(p map[string]*qdrant.Value) (Entry, error) {
	str := func(f string) string { return p[f].GetStringValue() }
	num := func(f string) int64 { return p[f].GetIntegerValue() }
	key, err := parseKey(str(fieldKey))
	if err != nil {
		return Entry{}, fmt.Errorf("qdrant: point payload %s: %w", fieldKey, err)
	}
	partition, err := parseKey(str(fieldPartition))
	if err != nil {
		return Entry{}, fmt.Errorf("qdrant: point payload %s: %w", fieldPartition, err)
	}
	var toolCalls []ToolCall
	if s := str(fieldToolCalls); s != "" {
		if err := json.Unmarshal([]byte(s), &toolCalls); err != nil {
			return Entry{}, fmt.Errorf("qdrant: point payload %s: %w", fieldToolCalls, err)
		}
	}
	return Entry{
		ToolCalls:    toolCalls,
		ID:           str(fieldEntryID),
		Key:          key,
		Partition:    partition,
		Tenant:       str(fieldTenant),
		Scenario:     str(fieldScenario),
		Namespace:    str(fieldNamespace),
		Question:     str(fieldQuestion),
		Content:      str(fieldContent),
		SourceModel:  str(fieldModel),
		FinishReason: str(fieldFinish),
		Usage:        Usage{InputTokens: num(fieldInput), OutputTokens: num(fieldOutput), TotalTokens: num(fieldTotal)},
		CreatedAt:    time.UnixMilli(num(fieldCreated)).UTC(),
		ExpiresAt:    time.UnixMilli(num(fieldExpires)).UTC(),
		StaleUntil:   time.UnixMilli(num(fieldStaleUntil)).UTC(),
	}, nil
}

func parseKey(s string) (Key, error) {
	var k Key
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != len(k) {
		return k, fmt.Errorf("not a %d-byte hex key: %q", len(k), s)
	}
	copy(k[:], b)
	return k, nil
}

// toolCallsJSON is how an entry's tool calls travel in a point's payload; "" for none.
func toolCallsJSON(tcs []ToolCall) string {
	if len(tcs) == 0 {
		return ""
	}
	b, err := json.Marshal(tcs)
	if err != nil {
		return "" // a slice of strings always marshals
	}
	return string(b)
}
