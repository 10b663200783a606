package resilience

import (
	"sync"
	"sync/atomic"
)

// Bulkhead bounds the calls in flight to one provider/model. It never queues: when it is
// full the router fails over at once instead of waiting behind a slow provider, which is
// how one slow upstream stops eating every goroutine and connection of the router.
type Bulkhead struct {
	max      int64
	inFlight atomic.Int64
}

// NewBulkhead returns a bulkhead admitting max concurrent calls; max <= 0 means unlimited
// (it still counts calls in flight).
func NewBulkhead(max int) *Bulkhead {
	return &Bulkhead{max: int64(max)}
}

// TryAcquire takes a place if one is free. It never blocks. release gives the place back;
// calling it more than once is harmless.
func (b *Bulkhead) TryAcquire() (release func(), ok bool) {
	for {
		n := b.inFlight.Load()
		if b.max > 0 && n >= b.max {
			return func() {}, false
		}
		if b.inFlight.CompareAndSwap(n, n+1) {
			var once sync.Once
			return func() { once.Do(func() { b.inFlight.Add(-1) }) }, true
		}
	}
}

// InFlight is the number of places taken.
func (b *Bulkhead) InFlight() int { return int(b.inFlight.Load()) }

// Max is the bound; 0 means unlimited.
func (b *Bulkhead) Max() int { return int(max(b.max, 0)) }
