package idempotency

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// Memory is a Store in process memory, for `mantle dev`, tests and single-replica use. It
// gives duplicates on the same replica the same guarantees as JetStream gives a fleet.
// Expired entries are dropped when a key is next touched and by Sweep.
type Memory struct {
	ttl, inflightTTL time.Duration
	clock            clockwork.Clock

	// perTenant bounds the entries one tenant may hold (0: no bound), so that a tenant
	// sending endless distinct keys fills only its own share of memory.
	perTenant int

	mu      sync.Mutex
	entries map[string]*memEntry
	counts  map[string]int // entries per tenant, when perTenant > 0
	swept   time.Time      // the last sweep a full tenant caused
}

// ErrTenantFull is Begin's answer when the key's tenant holds its limit of entries (after
// expired ones are dropped): that tenant's new keys go unprotected until some expire.
var ErrTenantFull = errors.New("idempotency: the tenant's records fill its share of the store")

// memEntry is either a claim (rec == nil) or a record.
type memEntry struct {
	rec *Record

	// expires is the record's expiry, or the claim's deadline.
	expires time.Time
	// wake is closed when the claim ends (completed, abandoned, taken over or swept), so
	// that waiters look again. Nil for records.
	wake chan struct{}
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty store. Records expire ttl after they are recorded; a claim
// whose owner has not completed or abandoned it within inflightTTL may be taken over. A nil
// clock means the real clock. Both durations must be positive: they come from validated
// configuration, so anything else is a programming error and panics.
func NewMemory(ttl, inflightTTL time.Duration, clock clockwork.Clock) *Memory {
	if ttl <= 0 || inflightTTL <= 0 {
		panic(fmt.Sprintf("idempotency.NewMemory: ttl (%s) and inflightTTL (%s) must be positive", ttl, inflightTTL)) //nolint:forbidigo // validated configuration: a programming error
	}
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	return &Memory{ttl: ttl, inflightTTL: inflightTTL, clock: clock, entries: make(map[string]*memEntry), counts: map[string]int{}}
}

// LimitPerTenant bounds the entries (claims and records) each tenant may hold to n; keys
// are "<tenant>/<key>". Call it before the store is used. 0 means no bound.
func (m *Memory) LimitPerTenant(n int) *Memory {
	m.perTenant = n
	return m
}

// tenantOf is the tenant part of a key ("<tenant>/<key>").
func tenantOf(key string) string {
	t, _, _ := strings.Cut(key, "/")
	return t
}

// add stores e under key, counting it for its tenant. m.mu must be held.
func (m *Memory) add(key string, e *memEntry) {
	if _, ok := m.entries[key]; !ok && m.perTenant > 0 {
		m.counts[tenantOf(key)]++
	}
	m.entries[key] = e
}

// full reports whether key's tenant holds its limit, after dropping expired entries once
// it seems to. m.mu must be held.
func (m *Memory) full(key string, now time.Time) bool {
	if m.perTenant <= 0 || m.counts[tenantOf(key)] < m.perTenant {
		return false
	}
	// A sweep reads every entry: a tenant at its limit causes at most one a second.
	if now.Sub(m.swept) >= time.Second {
		m.swept = now
		m.sweepLocked(now)
	}
	return m.counts[tenantOf(key)] >= m.perTenant
}

// Begin implements Store.
func (m *Memory) Begin(ctx context.Context, key string) (*Record, bool, error) {
	for {
		if err := ctx.Err(); err != nil {
			return nil, false, err
		}
		m.mu.Lock()
		now := m.clock.Now()
		e := m.live(key, now)
		if e == nil {
			if m.full(key, now) {
				m.mu.Unlock()
				return nil, false, ErrTenantFull
			}
			m.add(key, &memEntry{expires: now.Add(m.inflightTTL), wake: make(chan struct{})})
			m.mu.Unlock()
			return nil, true, nil
		}
		if e.rec != nil {
			rec := e.rec.clone()
			m.mu.Unlock()
			return &rec, false, nil
		}
		// Another caller owns the key. Wait for its claim to end or to expire; wake was
		// taken under the lock, so an end that happens from here on is not missed.
		wake, wait := e.wake, e.expires.Sub(now)
		m.mu.Unlock()

		timer := m.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, false, ctx.Err()
		case <-wake:
		case <-timer.Chan():
		}
		timer.Stop()
	}
}

// live returns the entry for key, first dropping it when it has expired: an expired record
// is gone, and an expired claim belongs to a dead owner. m.mu must be held.
func (m *Memory) live(key string, now time.Time) *memEntry {
	e, ok := m.entries[key]
	if !ok {
		return nil
	}
	if now.Before(e.expires) {
		return e
	}
	m.drop(key, e)
	return nil
}

// drop removes e and wakes its waiters. m.mu must be held.
func (m *Memory) drop(key string, e *memEntry) {
	delete(m.entries, key)
	if m.perTenant > 0 {
		t := tenantOf(key)
		if m.counts[t]--; m.counts[t] <= 0 {
			delete(m.counts, t)
		}
	}
	if e.wake != nil {
		close(e.wake)
	}
}

// Complete implements Store.
func (m *Memory) Complete(_ context.Context, key string, rec Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	e := m.live(key, now)
	if e != nil && e.rec != nil {
		return nil // first record wins; see Store.Complete
	}
	if rec.At.IsZero() {
		rec.At = now
	}
	stored := rec.clone()
	if e != nil {
		close(e.wake) // the claim ends: its waiters return the record
	}
	m.add(key, &memEntry{rec: &stored, expires: stored.At.Add(m.ttl)})
	return nil
}

// Abandon implements Store.
func (m *Memory) Abandon(_ context.Context, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.entries[key]; ok && e.rec == nil {
		m.drop(key, e)
	}
	return nil
}

// Sweep removes expired records and expired claims and returns how many it removed. Begin
// never returns an expired entry, so Sweep only bounds memory; the owner calls it
// periodically (every minute is plenty).
func (m *Memory) Sweep() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sweepLocked(m.clock.Now())
}

// sweepLocked is Sweep with m.mu held.
func (m *Memory) sweepLocked(now time.Time) int {
	n := 0
	for key, e := range m.entries {
		if !now.Before(e.expires) {
			m.drop(key, e)
			n++
		}
	}
	return n
}

// len reports how many entries (claims and records, expired or not) the store holds.
func (m *Memory) len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.entries)
}
