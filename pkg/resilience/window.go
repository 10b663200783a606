package resilience

import (
	"fmt"
	"math"
	"time"

	"github.com/jonboulle/clockwork"
)

// Window counts events over a sliding stretch of time, cut into equal buckets. The breaker
// counts calls, failures and slow calls in one; the budget counts requests and retries in
// another. Each bucket holds one counter per field, so one Window serves any small set of
// counts that must age out together.
//
// The window slides one bucket at a time: Sum covers the current bucket plus the
// Buckets-1 before it, so it sees between (Buckets-1)/Buckets and all of Length of history.
// More buckets make the slide smoother at the cost of a longer Sum loop.
//
// A Window is not safe for concurrent use; its owner guards it with its own mutex (the
// breaker and the budget already hold one for their other state).
type Window struct {
	clock  clockwork.Clock
	origin time.Time     // bucket epochs count from here
	width  time.Duration // length of one bucket
	fields int
	epochs []int64 // epoch each slot currently holds; emptyEpoch when none
	counts []int   // len(epochs)*fields, slot-major
	last   int64   // latest epoch seen, so a clock that steps back does not reopen old slots
}

// emptyEpoch marks a slot that holds no bucket; it is never inside a window.
const emptyEpoch = math.MinInt64

// NewWindow returns a window of the given length cut into buckets slices, with fields
// counters per bucket. Length must be at least buckets nanoseconds; buckets and fields must
// be positive.
func NewWindow(length time.Duration, buckets, fields int, clock clockwork.Clock) (*Window, error) {
	switch {
	case buckets <= 0:
		return nil, fmt.Errorf("window: buckets must be positive, got %d", buckets)
	case fields <= 0:
		return nil, fmt.Errorf("window: fields must be positive, got %d", fields)
	case length < time.Duration(buckets):
		return nil, fmt.Errorf("window: length %s is too short for %d buckets", length, buckets)
	}
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	w := &Window{
		clock:  clock,
		origin: clock.Now(),
		width:  length / time.Duration(buckets),
		fields: fields,
		epochs: make([]int64, buckets),
		counts: make([]int, buckets*fields),
	}
	w.Reset()
	return w, nil
}

// mustWindow is for callers whose config was validated already.
func mustWindow(length time.Duration, buckets, fields int, clock clockwork.Clock) *Window {
	w, err := NewWindow(length, buckets, fields, clock)
	if err != nil {
		panic(err) //nolint:forbidigo // unreachable after Validate
	}
	return w
}

// epochAt is the index of the bucket that holds now.
func (w *Window) epochAt(now time.Time) int64 {
	e := int64(now.Sub(w.origin) / w.width)
	if e < w.last {
		e = w.last
	}
	w.last = e
	return e
}

// Add adds n to field in the current bucket.
func (w *Window) Add(field, n int) { w.AddAt(w.clock.Now(), field, n) }

// AddAt is Add for a caller that already read the clock.
func (w *Window) AddAt(now time.Time, field, n int) {
	e := w.epochAt(now)
	slot := int(e % int64(len(w.epochs)))
	if w.epochs[slot] != e {
		// The slot last held a bucket that has slid out of the window: recycle it.
		w.epochs[slot] = e
		clear(w.counts[slot*w.fields : (slot+1)*w.fields])
	}
	w.counts[slot*w.fields+field] += n
}

// Sum returns the total of field over the window.
func (w *Window) Sum(field int) int {
	e := w.epochAt(w.clock.Now())
	total := 0
	for slot, se := range w.epochs {
		if w.live(se, e) {
			total += w.counts[slot*w.fields+field]
		}
	}
	return total
}

// live reports whether a slot holding epoch se is inside the window that ends at epoch e.
func (w *Window) live(se, e int64) bool {
	return se > e-int64(len(w.epochs)) && se <= e
}

// SumsAt writes the total of every field over the window at now into dst (which must have
// room for every field) and returns it; one pass serves all fields.
func (w *Window) SumsAt(now time.Time, dst []int) []int {
	e := w.epochAt(now)
	dst = dst[:w.fields]
	clear(dst)
	for slot, se := range w.epochs {
		if w.live(se, e) {
			for f := range dst {
				dst[f] += w.counts[slot*w.fields+f]
			}
		}
	}
	return dst
}

// Reset forgets every count.
func (w *Window) Reset() {
	for i := range w.epochs {
		w.epochs[i] = emptyEpoch
	}
	clear(w.counts)
}

// Length is the span the window covers.
func (w *Window) Length() time.Duration { return w.width * time.Duration(len(w.epochs)) }
