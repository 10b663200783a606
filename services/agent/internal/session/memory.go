package session

import (
	"bytes"
	"context"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// Memory is a Store in process memory, for `mantle dev`, tests and single-replica use. Keys
// expire against its clock: an expired key reads as absent and is dropped when touched and
// by Sweep. It holds at most maxKeys keys.
type Memory struct {
	clock   clockwork.Clock
	maxKeys int

	mu      sync.Mutex
	entries map[string]*memEntry
	rev     uint64
}

type memEntry struct {
	value    []byte
	revision uint64
	expires  time.Time
	watchers map[*memWatch]struct{}
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty store of at most maxKeys keys (at least one) on clock (nil:
// the real clock).
func NewMemory(maxKeys int, clock clockwork.Clock) *Memory {
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	return &Memory{clock: clock, maxKeys: max(maxKeys, 1), entries: map[string]*memEntry{}}
}

// live returns the entry of key if it exists and has not expired; the caller holds mu.
func (m *Memory) live(key string) *memEntry {
	e := m.entries[key]
	if e == nil || e.value == nil {
		return nil
	}
	if !m.clock.Now().Before(e.expires) {
		m.expire(key, e)
		return nil
	}
	return e
}

// expire drops an expired entry, keeping it only as long as watchers hold it; the caller
// holds mu.
func (m *Memory) expire(key string, e *memEntry) {
	e.value, e.revision = nil, 0
	e.notify()
	if len(e.watchers) == 0 {
		delete(m.entries, key)
	}
}

// Get implements Store.
func (m *Memory) Get(ctx context.Context, key string) ([]byte, uint64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.live(key)
	if e == nil {
		return nil, 0, ErrNotFound
	}
	return bytes.Clone(e.value), e.revision, nil
}

// Create implements Store.
func (m *Memory) Create(ctx context.Context, key string, value []byte, ttl time.Duration) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.live(key) != nil {
		return 0, ErrConflict
	}
	e := m.entries[key]
	if e == nil {
		if m.keys() >= m.maxKeys {
			m.sweep()
			if m.keys() >= m.maxKeys {
				return 0, ErrFull
			}
		}
		e = &memEntry{}
		m.entries[key] = e
	}
	return m.write(e, value, ttl), nil
}

// Update implements Store.
func (m *Memory) Update(ctx context.Context, key string, value []byte, revision uint64, ttl time.Duration) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.live(key)
	if e == nil {
		return 0, ErrNotFound
	}
	if e.revision != revision {
		return 0, ErrConflict
	}
	return m.write(e, value, ttl), nil
}

// write stores value in e and tells its watchers; the caller holds mu.
func (m *Memory) write(e *memEntry, value []byte, ttl time.Duration) uint64 {
	m.rev++
	e.value, e.revision, e.expires = bytes.Clone(value), m.rev, m.clock.Now().Add(ttl)
	e.notify()
	return e.revision
}

// keys counts the keys held with a value; the caller holds mu.
func (m *Memory) keys() int {
	n := 0
	for _, e := range m.entries {
		if e.value != nil {
			n++
		}
	}
	return n
}

// Sweep drops every expired key.
func (m *Memory) Sweep() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sweep()
}

func (m *Memory) sweep() {
	now := m.clock.Now()
	for k, e := range m.entries {
		if e.value != nil && !now.Before(e.expires) {
			m.expire(k, e)
		}
	}
}

// Watch implements Store.
func (m *Memory) Watch(ctx context.Context, key string) (Watch, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entries[key]
	if e == nil {
		e = &memEntry{}
		m.entries[key] = e
	}
	if e.watchers == nil {
		e.watchers = map[*memWatch]struct{}{}
	}
	w := &memWatch{m: m, key: key, ch: make(chan struct{}, 1)}
	e.watchers[w] = struct{}{}
	return w, nil
}

func (e *memEntry) notify() {
	for w := range e.watchers {
		select {
		case w.ch <- struct{}{}:
		default: // a change is already pending: changes coalesce
		}
	}
}

type memWatch struct {
	m    *Memory
	key  string
	ch   chan struct{}
	once sync.Once
}

func (w *memWatch) Changes() <-chan struct{} { return w.ch }

func (w *memWatch) Stop() {
	w.once.Do(func() {
		w.m.mu.Lock()
		defer w.m.mu.Unlock()
		e := w.m.entries[w.key]
		if e == nil {
			return
		}
		delete(e.watchers, w)
		if len(e.watchers) == 0 && e.value == nil {
			delete(w.m.entries, w.key)
		}
	})
}
