package router

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// hopCtx is the context of a call to another service: context.WithDeadline(parent,
// deadline), or context.WithCancel(parent) without one, made only once something asks
// for Done.
//
// A call to a service in the same process runs in the caller's goroutine and reads only
// the context's deadline and Err, and, since handlers seldom derive contexts of their
// own, nothing asks for Done. context.WithDeadline's timer, its registration with the
// parent and its cancel func cost four allocations and two timer-heap updates a hop,
// several hops a request; a hopCtx is one allocation, cancelled by its method. Until
// Done is asked for, Err compares the clock with the deadline itself; a call over the
// network asks for Done at once and gets the context it always had.
type hopCtx struct {
	parent context.Context
	// detached: the parent's values but not its cancellation or deadline, as
	// context.WithoutCancel(parent) would give (whose Value, a method on a value
	// receiver, allocates each time it is called).
	detached    bool
	given       time.Time // the deadline asked for, when givenOK
	givenOK     bool
	deadline    time.Time // the earlier of given and the parent's, when hasDeadline
	hasDeadline bool

	mu sync.Mutex // serialises making inner and ending
	// ended: cancel came before the context was made; endErr is the error it ended with.
	ended  atomic.Bool
	endErr error
	inner  atomic.Pointer[deadlineCtx]
}

type deadlineCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// newHopCtx returns the context of a call to another service, with deadline when ok.
// Call its cancel method when the call is done.
func newHopCtx(parent context.Context, deadline time.Time, ok bool) *hopCtx {
	c := &hopCtx{parent: parent, given: deadline, givenOK: ok, deadline: deadline, hasDeadline: ok}
	if d, pok := parent.Deadline(); pok && (!ok || d.Before(deadline)) {
		c.deadline, c.hasDeadline = d, true
	}
	return c
}

// detachedHopCtx is newHopCtx(context.WithoutCancel(parent), deadline, true): for a call
// that must outlive the request (settling its quota).
func detachedHopCtx(parent context.Context, deadline time.Time) *hopCtx {
	return &hopCtx{parent: parent, detached: true, given: deadline, givenOK: true, deadline: deadline, hasDeadline: true}
}

// parentErr is the parent's error, which a detached context does not share.
func (c *hopCtx) parentErr() error {
	if c.detached {
		return nil
	}
	return c.parent.Err()
}

func (c *hopCtx) Deadline() (time.Time, bool) { return c.deadline, c.hasDeadline }

func (c *hopCtx) Done() <-chan struct{} { return c.made().ctx.Done() }

// Err is nil while the parent is not done, the deadline has not passed and cancel was
// not called; otherwise the context is made (already done, without a timer) and Err is
// its error, so that Err, Done and context.Cause agree from then on.
func (c *hopCtx) Err() error {
	if inner := c.inner.Load(); inner != nil {
		return inner.ctx.Err()
	}
	if !c.ended.Load() && c.parentErr() == nil && !c.expired() {
		return nil
	}
	return c.made().ctx.Err()
}

// Value is the parent's values and, once the context is made, its own too: the context
// package finds a cancellable parent through it.
func (c *hopCtx) Value(key any) any {
	if inner := c.inner.Load(); inner != nil {
		return inner.ctx.Value(key)
	}
	return c.parent.Value(key)
}

func (c *hopCtx) String() string { return "router.hopCtx" }

// expired reports whether the deadline has passed.
func (c *hopCtx) expired() bool { return c.hasDeadline && !time.Now().Before(c.deadline) }

// made returns the context, making it the first time: context.WithDeadline's (or
// WithCancel's), or one already done with endErr when cancel came first.
func (c *hopCtx) made() *deadlineCtx {
	if inner := c.inner.Load(); inner != nil {
		return inner
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if inner := c.inner.Load(); inner != nil {
		return inner
	}
	inner := &deadlineCtx{}
	if c.ended.Load() {
		// Done already: only the parent's values are kept, not its cancellation.
		base := context.WithoutCancel(c.parent)
		if errors.Is(c.endErr, context.DeadlineExceeded) {
			inner.ctx, inner.cancel = context.WithDeadline(base, time.Time{})
		} else {
			inner.ctx, inner.cancel = context.WithCancel(base)
			inner.cancel()
		}
	} else {
		inner.ctx, inner.cancel = c.withParent()
	}
	c.inner.Store(inner)
	return inner
}

// withParent is the context made for real.
func (c *hopCtx) withParent() (context.Context, context.CancelFunc) {
	parent := c.parent
	if c.detached {
		parent = context.WithoutCancel(parent)
	}
	if c.givenOK {
		return context.WithDeadline(parent, c.given)
	}
	return context.WithCancel(parent)
}

// cancel ends the context. One never made keeps the error it would have had now:
// DeadlineExceeded past the deadline, else Canceled; or, when the parent is done, it is
// made now, done already, with the parent's error and cause.
func (c *hopCtx) cancel() {
	c.mu.Lock()
	inner := c.inner.Load()
	if inner == nil && !c.ended.Load() {
		switch {
		case c.parentErr() != nil:
			inner = &deadlineCtx{}
			inner.ctx, inner.cancel = c.withParent()
			c.inner.Store(inner)
		case c.expired():
			c.endErr = context.DeadlineExceeded
		default:
			c.endErr = context.Canceled
		}
		c.ended.Store(true)
	}
	c.mu.Unlock()
	if inner != nil {
		inner.cancel()
	}
}
