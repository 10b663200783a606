package cache

import (
	"crypto/rand"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mantle-mesh/mantle/services/cache/internal/vector"
)

// A lease coalesces identical requests (task merging: one upstream call for a burst of the same question): the first lookup that
// misses for a prompt gets the lease and answers it; identical lookups that arrive while
// it does wait for that answer instead of calling the model too. The lease ends when the
// holder stores the answer (the waiters get it), releases it, or it expires (the waiters
// look again, and one of them gets a new lease). A stored answer is handed to the waiters
// before it is written to the index (answer), and the lease stays until the write is done:
// an identical lookup in between joins it too, rather than missing an answer that is on
// its way in.
//
// Leases live in the memory of one cache replica. With several replicas, identical prompts
// coalesce when they reach the same replica; the others each answer once.
type lease struct {
	id      string
	key     Key
	tenant  string
	expires time.Time
	// question and vector are the lookup's embedding of the question the lease is for (a
	// zero vector when it had none), so that storing the answer need not embed it again:
	// with a remote embedder that is a second paid call and its latency on every miss.
	question string
	vector   vector.Vector
	// near is what the lookup's search found near the vector (nil when the index recorded
	// nothing), so that linking the stored vector need not search again.
	near *vector.Near
	// done is closed when the lease is answered or ends; entry is set before that when it
	// has an answer, and never changes after.
	done   chan struct{}
	entry  *Entry
	closed bool
}

type leases struct {
	mu    sync.Mutex
	byKey map[Key]*lease
	byID  map[string]*lease
	// ended records, per bucket of keys, when a lease of one of them last ended (a count
	// of ends; written under mu, read without it). A lookup reads its key's bucket before
	// it reads the index, and again once it got a new lease: a change means a lease on its
	// key may have ended meanwhile, its entry written after the lookup's read, and the
	// lookup reads its key once more instead of missing an answer that is in (see
	// Service.coalesceMiss). Buckets, not keys, keep this at a fixed size; a bucket shared
	// by two keys costs the other key one more read, never a missed answer.
	ended [endedBuckets]atomic.Uint64
	ends  uint64
}

const endedBuckets = 1024

func bucketOf(key Key) int { return int(binary.BigEndian.Uint16(key[:2])) % endedBuckets }

// version is what ended records for key's bucket now.
func (l *leases) version(key Key) uint64 { return l.ended[bucketOf(key)].Load() }

func newLeases() *leases {
	return &leases{byKey: map[Key]*lease{}, byID: map[string]*lease{}}
}

// acquire gives the caller a new lease on key (mine), or returns the live lease another
// caller holds (theirs). An expired lease is ended and replaced. emb is the caller's
// embedding of the question, kept with a new lease for the store that answers it.
func (l *leases) acquire(key Key, tenant string, now, expires time.Time, emb embedding) (mine, theirs *lease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if held, ok := l.byKey[key]; ok {
		if now.Before(held.expires) {
			return nil, held
		}
		l.end(held, nil)
	}
	le := &lease{id: "lease-" + rand.Text(), key: key, tenant: tenant, expires: expires,
		question: emb.question, vector: emb.vector, near: emb.near, done: make(chan struct{})}
	l.byKey[key], l.byID[le.id] = le, le
	return le, nil
}

// embedding is a question and its vector; the vector is zero when it was not embedded.
// near is what the index's search found near the vector, when it recorded that.
type embedding struct {
	question string
	vector   vector.Vector
	near     *vector.Near
}

// vectorFor returns the lease's vector, and what the lookup found near it, when the vector
// is the embedding of question.
func (le *lease) vectorFor(question string) (vector.Vector, *vector.Near, bool) {
	if le == nil || le.question != question || le.vector.Len() == 0 {
		return vector.Vector{}, nil, false
	}
	return le.vector, le.near, true
}

// find returns tenant's live lease with id.
func (l *leases) find(id, tenant string) *lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	le, ok := l.byID[id]
	if !ok || le.tenant != tenant {
		return nil
	}
	return le
}

// finish ends tenant's lease id, handing e (nil for none) to its waiters; it reports
// whether the lease was live.
func (l *leases) finish(id, tenant string, e *Entry) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	le, ok := l.byID[id]
	if !ok || le.tenant != tenant {
		return false
	}
	l.end(le, e)
	return true
}

// answer hands e to tenant's lease id's waiters, and to identical lookups until finish
// ends the lease; it reports whether the lease was live.
func (l *leases) answer(id, tenant string, e *Entry) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	le, ok := l.byID[id]
	if !ok || le.tenant != tenant {
		return false
	}
	l.wake(le, e)
	return true
}

// expire ends le if it is still the live lease and has expired at now.
func (l *leases) expire(le *lease, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byID[le.id] == le && !now.Before(le.expires) {
		l.end(le, nil)
	}
}

// sweep ends every lease expired at now: a holder that never stored nor released, with
// nobody waiting, would otherwise stay in the maps.
func (l *leases) sweep(now time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, le := range l.byID {
		if !now.Before(le.expires) {
			l.end(le, nil)
			n++
		}
	}
	return n
}

// len returns the number of live leases.
func (l *leases) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.byID)
}

// end removes le and wakes its waiters (with e, unless answered before); l.mu must be
// held.
func (l *leases) end(le *lease, e *Entry) {
	delete(l.byID, le.id)
	if l.byKey[le.key] == le {
		delete(l.byKey, le.key)
	}
	l.ends++
	l.ended[bucketOf(le.key)].Store(l.ends)
	l.wake(le, e)
}

// wake closes le.done once, with e as its answer; l.mu must be held.
func (l *leases) wake(le *lease, e *Entry) {
	if le.closed {
		return
	}
	le.entry, le.closed = e, true
	close(le.done)
}
