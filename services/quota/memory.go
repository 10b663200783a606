package quota

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// MemoryStore is the in-memory Store: for `mantle dev`, tests and single-replica
// deployments. One mutex makes every operation atomic; each holds it for a few map
// lookups, so it is not a bottleneck at the request rates one replica serves.
type MemoryStore struct {
	mu           sync.Mutex
	buckets      map[string]*keyBuckets // by key; a missing entry means both buckets are full
	reservations map[string]openReservation
}

type keyBuckets struct {
	requests bucket
	tokens   bucket
}

type openReservation struct {
	key       string
	tokens    int64
	expiresAt time.Time
}

// NewMemoryStore returns an empty store: every bucket starts full.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{
		buckets:      make(map[string]*keyBuckets),
		reservations: make(map[string]openReservation),
	}
}

var _ Store = (*MemoryStore)(nil)

// Reserve implements Store.
func (s *MemoryStore) Reserve(ctx context.Context, now time.Time, key string, limits RateLimits, res Reservation) (Levels, error) {
	if err := ctx.Err(); err != nil {
		return Levels{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()

	if _, taken := s.reservations[res.ID]; taken {
		return Levels{}, fmt.Errorf("reservation id %s is already in use", res.ID)
	}
	b := s.bucketsOf(key)
	// Check both buckets before touching either: that is what makes a TPM refusal leave
	// the RPM bucket alone. Report the longer wait, since both must be covered.
	var refusal *ExhaustedError
	for _, c := range []struct {
		name        string
		b           *bucket
		cost, limit int64
	}{
		{"rpm", &b.requests, res.Cost.Requests, limits.RPM},
		{"tpm", &b.tokens, res.Cost.Tokens, limits.TPM},
	} {
		wait := c.b.wait(now, c.cost, c.limit)
		if wait > 0 && (refusal == nil || wait > refusal.RetryAfter) {
			refusal = &ExhaustedError{
				Bucket:     key + ":" + c.name,
				Cost:       c.cost,
				Remaining:  c.b.remaining(now, c.limit),
				RetryAfter: wait,
			}
		}
	}
	if refusal != nil {
		return Levels{}, refusal
	}

	b.requests.take(now, res.Cost.Requests, limits.RPM)
	b.tokens.take(now, res.Cost.Tokens, limits.TPM)
	s.reservations[res.ID] = openReservation{key: key, tokens: res.Cost.Tokens, expiresAt: res.ExpiresAt}
	return levelsOf(b, now, limits), nil
}

// Settle implements Store.
func (s *MemoryStore) Settle(ctx context.Context, now time.Time, key string, limits RateLimits, id string, actualTokens int64) (Settlement, error) {
	if err := ctx.Err(); err != nil {
		return Settlement{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()

	r, ok := s.reservations[id]
	if !ok || r.key != key {
		// Another key's reservation is "not found" too, so tenants cannot probe each
		// other's reservation ids.
		return Settlement{}, ErrReservationNotFound
	}
	delete(s.reservations, id)
	if !now.Before(r.expiresAt) {
		return Settlement{}, ErrReservationNotFound
	}

	b := s.bucketsOf(key)
	b.tokens.take(now, actualTokens-r.tokens, limits.TPM)
	return Settlement{Refunded: r.tokens - actualTokens, Levels: levelsOf(b, now, limits)}, nil
}

// Sweep implements Store. It also forgets buckets that have refilled completely: a
// missing entry reads as full, so memory stays proportional to recently active keys.
func (s *MemoryStore) Sweep(ctx context.Context, now time.Time) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()

	expired := 0
	for id, r := range s.reservations {
		if !now.Before(r.expiresAt) {
			delete(s.reservations, id)
			expired++
		}
	}
	for key, b := range s.buckets {
		if b.requests.debt(now) == 0 && b.tokens.debt(now) == 0 {
			delete(s.buckets, key)
		}
	}
	return expired, nil
}

// bucketsOf returns key's buckets, creating full ones on first use. Callers hold s.mu.
func (s *MemoryStore) bucketsOf(key string) *keyBuckets {
	b, ok := s.buckets[key]
	if !ok {
		b = &keyBuckets{}
		s.buckets[key] = b
	}
	return b
}

func levelsOf(b *keyBuckets, now time.Time, limits RateLimits) Levels {
	return Levels{
		Requests: Level{Limit: limits.RPM, Remaining: b.requests.remaining(now, limits.RPM), Reset: b.requests.debt(now)},
		Tokens:   Level{Limit: limits.TPM, Remaining: b.tokens.remaining(now, limits.TPM), Reset: b.tokens.debt(now)},
	}
}
