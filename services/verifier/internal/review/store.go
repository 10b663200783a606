package review

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// Errors of the key-value layer. Store methods wrap them.
var (
	// ErrNotFound: no such key.
	ErrNotFound = errors.New("not found")
	// errExists: Create found the key already there.
	errExists = errors.New("key exists")
	// errRevision: Update lost a compare-and-swap race.
	errRevision = errors.New("revision changed")
	// ErrUnavailable wraps failures of the store itself (NATS unreachable); callers retry.
	ErrUnavailable = errors.New("review store unavailable")
)

// KV is the little a Store needs from a key-value store: create-if-absent, read with a
// revision, compare-and-swap update, and listing keys by prefix.
type KV interface {
	Create(ctx context.Context, key string, value []byte) (uint64, error)
	Get(ctx context.Context, key string) ([]byte, uint64, error)
	Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error)
	Keys(ctx context.Context, prefix string) ([]string, error)
}

// MemoryKV is an in-process KV for development and tests.
type MemoryKV struct {
	mu      sync.Mutex
	entries map[string]memEntry
	rev     uint64
}

type memEntry struct {
	value []byte
	rev   uint64
}

// NewMemoryKV returns an empty MemoryKV.
func NewMemoryKV() *MemoryKV { return &MemoryKV{entries: map[string]memEntry{}} }

// Create implements KV.
func (m *MemoryKV) Create(_ context.Context, key string, value []byte) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.entries[key]; ok {
		return 0, errExists
	}
	m.rev++
	m.entries[key] = memEntry{value: slices.Clone(value), rev: m.rev}
	return m.rev, nil
}

// Get implements KV.
func (m *MemoryKV) Get(_ context.Context, key string) ([]byte, uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[key]
	if !ok {
		return nil, 0, ErrNotFound
	}
	return slices.Clone(e.value), e.rev, nil
}

// Update implements KV.
func (m *MemoryKV) Update(_ context.Context, key string, value []byte, revision uint64) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[key]
	if !ok || e.rev != revision {
		return 0, errRevision
	}
	m.rev++
	m.entries[key] = memEntry{value: slices.Clone(value), rev: m.rev}
	return m.rev, nil
}

// Keys implements KV.
func (m *MemoryKV) Keys(_ context.Context, prefix string) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var keys []string
	for k := range m.entries {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	return keys, nil
}

// JetStreamKV adapts a JetStream key-value bucket.
type JetStreamKV struct{ KV jetstream.KeyValue }

// Create implements KV.
func (j JetStreamKV) Create(ctx context.Context, key string, value []byte) (uint64, error) {
	rev, err := j.KV.Create(ctx, key, value)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, errExists
	}
	return rev, unavailable(err)
}

// Get implements KV.
func (j JetStreamKV) Get(ctx context.Context, key string) ([]byte, uint64, error) {
	e, err := j.KV.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, ErrNotFound
	}
	if err != nil {
		return nil, 0, unavailable(err)
	}
	return e.Value(), e.Revision(), nil
}

// Update implements KV.
func (j JetStreamKV) Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	rev, err := j.KV.Update(ctx, key, value, revision)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
		return 0, errRevision
	}
	return rev, unavailable(err)
}

// Keys implements KV. prefix must end with a dot (keys are dot-separated tokens).
func (j JetStreamKV) Keys(ctx context.Context, prefix string) ([]string, error) {
	lister, err := j.KV.ListKeysFiltered(ctx, prefix+">")
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return nil, nil
		}
		return nil, unavailable(err)
	}
	// The channel closes once every key was sent; Stop then only reports that the
	// subscription is already gone, so its error says nothing.
	defer func() { _ = lister.Stop() }()
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	if err := ctx.Err(); err != nil {
		return nil, unavailable(err)
	}
	return keys, nil
}

func unavailable(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// Key layout: review.<id>, draft.<id>, audit.<review id>.<time><seq>. Ids use only
// characters valid in NATS KV keys (letters, digits, '_', '-').
const (
	reviewPrefix = "review."
	draftPrefix  = "draft."
	auditPrefix  = "audit."
)

// Store keeps reviews and their audit trail in one KV, and draft rules in another: reviews
// expire with the bucket's retention, but an approved rule is live configuration and must
// not.
type Store struct {
	kv    KV
	rules KV
	mu    sync.Mutex // guards seq
	// seq breaks ties between audit entries written in the same nanosecond.
	seq uint64
}

// NewStore returns a Store keeping reviews in kv and draft rules in rules (kv when nil).
func NewStore(kv, rules KV) *Store {
	if rules == nil {
		rules = kv
	}
	return &Store{kv: kv, rules: rules}
}

func getJSON[T any](ctx context.Context, kv KV, key string) (T, uint64, error) {
	var v T
	raw, rev, err := kv.Get(ctx, key)
	if err != nil {
		return v, 0, err
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return v, 0, fmt.Errorf("decode %s: %w", key, err)
	}
	return v, rev, nil
}

// createReview stores r unless a review with its id exists, in which case it returns the
// stored one and false.
func (s *Store) createReview(ctx context.Context, r Review) (Review, bool, error) {
	raw, err := json.Marshal(r)
	if err != nil {
		return Review{}, false, err
	}
	_, err = s.kv.Create(ctx, reviewPrefix+r.ID, raw)
	if errors.Is(err, errExists) {
		existing, _, err := s.getReview(ctx, r.ID)
		return existing, false, err
	}
	if err != nil {
		return Review{}, false, err
	}
	return r, true, nil
}

func (s *Store) getReview(ctx context.Context, id string) (Review, uint64, error) {
	return getJSON[Review](ctx, s.kv, reviewPrefix+id)
}

// errStop tells updateReview that change decided not to write (and why, wrapped).
type stopError struct{ err error }

func (e stopError) Error() string { return e.err.Error() }
func (e stopError) Unwrap() error { return e.err }

// updateReview applies change to the stored review with compare-and-swap, retrying when
// another writer got there first. change returns a stopError to abandon the update.
func (s *Store) updateReview(ctx context.Context, id string, change func(*Review) error) (Review, error) {
	for attempt := 0; ; attempt++ {
		r, rev, err := s.getReview(ctx, id)
		if err != nil {
			return Review{}, err
		}
		if err := change(&r); err != nil {
			return r, err
		}
		raw, err := json.Marshal(r)
		if err != nil {
			return Review{}, err
		}
		_, err = s.kv.Update(ctx, reviewPrefix+id, raw, rev)
		if errors.Is(err, errRevision) && attempt < 8 {
			continue
		}
		if err != nil {
			return Review{}, fmt.Errorf("update review %s: %w", id, err)
		}
		return r, nil
	}
}

func (s *Store) listReviews(ctx context.Context) ([]Review, error) {
	keys, err := s.kv.Keys(ctx, reviewPrefix)
	if err != nil {
		return nil, err
	}
	out := make([]Review, 0, len(keys))
	for _, k := range keys {
		r, _, err := getJSON[Review](ctx, s.kv, k)
		if errors.Is(err, ErrNotFound) {
			continue // deleted (expired) between listing and reading
		}
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func (s *Store) appendAudit(ctx context.Context, e AuditEntry) error {
	raw, err := json.Marshal(e)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.seq++
	seq := s.seq
	s.mu.Unlock()
	// Zero-padded so that keys sort in time order; the sequence keeps equal times apart.
	key := fmt.Sprintf("%s%s.%020d%06d", auditPrefix, e.ReviewID, e.At.UnixNano(), seq%1_000_000)
	_, err = s.kv.Create(ctx, key, raw)
	return err
}

func (s *Store) listAudit(ctx context.Context, reviewID string) ([]AuditEntry, error) {
	prefix := auditPrefix
	if reviewID != "" {
		prefix += reviewID + "."
	}
	keys, err := s.kv.Keys(ctx, prefix)
	if err != nil {
		return nil, err
	}
	// Keys order the entries of one review by time and write sequence; the stable sort by
	// time below keeps that order for entries written at the same instant.
	slices.Sort(keys)
	out := make([]AuditEntry, 0, len(keys))
	for _, k := range keys {
		e, _, err := getJSON[AuditEntry](ctx, s.kv, k)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	slices.SortStableFunc(out, func(a, b AuditEntry) int { return a.At.Compare(b.At) })
	return out, nil
}

func (s *Store) createDraft(ctx context.Context, d DraftRule) error {
	raw, err := json.Marshal(d)
	if err != nil {
		return err
	}
	_, err = s.rules.Create(ctx, draftPrefix+d.ID, raw)
	return err
}

func (s *Store) getDraft(ctx context.Context, id string) (DraftRule, uint64, error) {
	return getJSON[DraftRule](ctx, s.rules, draftPrefix+id)
}

func (s *Store) updateDraft(ctx context.Context, d DraftRule, rev uint64) error {
	raw, err := json.Marshal(d)
	if err != nil {
		return err
	}
	_, err = s.rules.Update(ctx, draftPrefix+d.ID, raw, rev)
	return err
}

func (s *Store) listDrafts(ctx context.Context) ([]DraftRule, error) {
	keys, err := s.rules.Keys(ctx, draftPrefix)
	if err != nil {
		return nil, err
	}
	out := make([]DraftRule, 0, len(keys))
	for _, k := range keys {
		d, _, err := getJSON[DraftRule](ctx, s.rules, k)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b DraftRule) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// createJSON stores v under key unless the key exists, in which case it returns the stored
// value and false.
func createJSON[T any](ctx context.Context, kv KV, key string, v T) (T, bool, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return v, false, err
	}
	_, err = kv.Create(ctx, key, raw)
	if errors.Is(err, errExists) {
		existing, _, err := getJSON[T](ctx, kv, key)
		return existing, false, err
	}
	if err != nil {
		return v, false, err
	}
	return v, true, nil
}

// updateJSON replaces the value at key if it is still at revision (errRevision otherwise).
func updateJSON[T any](ctx context.Context, kv KV, key string, v T, revision uint64) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = kv.Update(ctx, key, raw, revision)
	return err
}
