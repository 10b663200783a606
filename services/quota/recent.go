package quota

import (
	"errors"
	"sync"
	"time"

	"github.com/mantle-mesh/mantle/services/quota/internal/ledger"
)

// maxRecentBuckets bounds what a FailoverStore remembers. A replica that used more
// buckets in one window hands over the first ones only; the others start full on the
// other side, as they did before anything was handed over.
const maxRecentBuckets = 100_000

// recentBuckets are the buckets a FailoverStore used in the last window: their spec
// with the full limit, the level Redis last reported, and whether the local limiter
// charged them while Redis was away. It is what the store hands over when it switches.
type recentBuckets struct {
	mu sync.Mutex
	m  map[string]*recentBucket
}

type recentBucket struct {
	spec ledger.BucketSpec // Cost unused
	// remaining is the level Redis last reported, seen at seen; -1 when unknown.
	remaining int64
	seen      time.Time
	// used is the last charge, on Redis or locally.
	used time.Time
	// local: the local limiter charged it during the current outage.
	local bool
}

// entry returns name's entry, creating it (unless the map is full). Callers hold r.mu.
func (r *recentBuckets) entry(now time.Time, spec ledger.BucketSpec) *recentBucket {
	e, ok := r.m[spec.Name()]
	if ok {
		e.spec.Limit = spec.Limit // the latest limit applies, as it does in the stores
		return e
	}
	if len(r.m) >= maxRecentBuckets {
		r.pruneLocked(now)
		if len(r.m) >= maxRecentBuckets {
			return nil
		}
	}
	spec.Cost = 0
	e = &recentBucket{spec: spec, remaining: -1}
	r.m[spec.Name()] = e
	return e
}

// sawRedis records Redis's answer to a Reserve: every level of a grant, the short
// buckets of a refusal (the longest wait's level is known; the others' are taken as
// empty, as the over-limit cache takes them).
func (r *recentBuckets) sawRedis(now time.Time, c ledger.Charge, g ledger.Grant, err error) {
	refusal, refused := errors.AsType[*ledger.ExhaustedError](err)
	if err != nil && !refused {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, b := range c.Buckets {
		if b.Shadow {
			continue
		}
		level := int64(-1)
		switch {
		case !refused && i < len(g.Levels):
			level = g.Levels[i].Remaining
		case refused && b.Name() == refusal.Bucket:
			level = refusal.Remaining
		case refused:
			for _, name := range refusal.Short {
				if name == b.Name() {
					level = 0
				}
			}
		}
		if level < 0 && refused {
			continue // a bucket the refusal says nothing about
		}
		if e := r.entry(now, b); e != nil {
			e.remaining, e.seen = level, now
			if !refused {
				e.used = now
			}
		}
	}
}

// spentLocally records a grant of the local limiter.
func (r *recentBuckets) spentLocally(now time.Time, c ledger.Charge) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range c.Buckets {
		if b.Shadow {
			continue
		}
		if e := r.entry(now, b); e != nil {
			e.local, e.used = true, now
		}
	}
}

// snapshot copies the entries used or seen in the last window, or charged locally.
func (r *recentBuckets) snapshot(now time.Time) []recentBucket {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]recentBucket, 0, len(r.m))
	for _, e := range r.m {
		if now.Sub(e.used) < ledger.Window || now.Sub(e.seen) < ledger.Window || e.local {
			out = append(out, *e)
		}
	}
	return out
}

// handedOver clears the local marks, once the local levels are in Redis.
func (r *recentBuckets) handedOver() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.m {
		e.local = false
	}
}

// prune forgets entries that have nothing left to hand over.
func (r *recentBuckets) prune(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pruneLocked(now)
}

func (r *recentBuckets) pruneLocked(now time.Time) {
	for name, e := range r.m {
		if now.Sub(e.used) >= ledger.Window && now.Sub(e.seen) >= ledger.Window && !e.local {
			delete(r.m, name)
		}
	}
}
