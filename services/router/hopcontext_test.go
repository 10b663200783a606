package router

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"
)

type hopKey struct{}

// TestHopContextActsAsWithDeadline runs the same steps on context.WithDeadline (or
// WithCancel, without a deadline; over context.WithoutCancel, detached) and on a hopCtx and compares what each context shows:
// the error, whether Done is closed, the cause, the deadline, the parent's values and a
// derived context's error, whether or not anything asked for Done before.
func TestHopContextActsAsWithDeadline(t *testing.T) {
	t.Parallel()
	past, future := time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
	cause := errors.New("the request ended")
	type step int
	const (
		nothing step = iota
		cancelParent
		cancelHop
	)
	tests := []struct {
		name           string
		deadline       time.Time // zero: none
		parentDeadline time.Time // zero: none
		askDone        bool      // Done (and a derived context) before the step
		step           step
		detached       bool // as context.WithoutCancel(parent)
	}{
		{name: "live", deadline: future},
		{name: "no deadline"},
		{name: "detached", deadline: future, detached: true},
		{name: "detached, the parent's deadline is earlier", deadline: future, parentDeadline: past, detached: true},
		{name: "detached, parent cancelled", deadline: future, step: cancelParent, detached: true},
		{name: "detached, parent cancelled, Done asked for", deadline: future, askDone: true, step: cancelParent, detached: true},
		{name: "detached, deadline passed", deadline: past, detached: true},
		{name: "detached, cancelled", deadline: future, step: cancelHop, detached: true},
		{name: "detached, cancelled after the parent", deadline: future, step: cancelParent + cancelHop, detached: true},
		{name: "no deadline, the parent's", parentDeadline: future},
		{name: "no deadline, parent cancelled", step: cancelParent},
		{name: "no deadline, cancelled", step: cancelHop},
		{name: "no deadline, cancelled, Done asked for", askDone: true, step: cancelHop},
		{name: "no deadline, the parent's passed", parentDeadline: past, step: cancelHop},
		{name: "live, Done asked for", deadline: future, askDone: true},
		{name: "the parent's deadline is earlier", deadline: future, parentDeadline: future.Add(-time.Minute)},
		{name: "deadline passed", deadline: past},
		{name: "deadline passed, Done asked for", deadline: past, askDone: true},
		{name: "parent cancelled", deadline: future, step: cancelParent},
		{name: "parent cancelled, Done asked for", deadline: future, askDone: true, step: cancelParent},
		{name: "cancelled", deadline: future, step: cancelHop},
		{name: "cancelled, Done asked for", deadline: future, askDone: true, step: cancelHop},
		{name: "cancelled after the deadline", deadline: past, step: cancelHop},
		{name: "cancelled after the parent", deadline: future, step: cancelParent + cancelHop},
		{name: "cancelled after the parent, Done asked for", deadline: future, askDone: true, step: cancelParent + cancelHop},
		{name: "the parent's deadline passed", deadline: future, parentDeadline: past},
		{name: "the parent's deadline passed, cancelled", deadline: future, parentDeadline: past, step: cancelHop},
	}
	type seen struct {
		err, cause, derivedErr error
		done                   bool
		deadline               time.Time
		value                  any
	}
	run := func(hop bool, tt int) seen {
		tc := tests[tt]
		parent, cancelParentCause := context.WithCancelCause(context.WithValue(context.Background(), hopKey{}, "v"))
		defer cancelParentCause(nil)
		p := parent
		if !tc.parentDeadline.IsZero() {
			var cancel context.CancelFunc
			p, cancel = context.WithDeadline(parent, tc.parentDeadline)
			defer cancel()
		}
		var ctx context.Context
		var cancel context.CancelFunc
		switch {
		case hop && tc.detached:
			c := detachedHopCtx(p, tc.deadline)
			ctx, cancel = c, c.cancel
		case hop:
			c := newHopCtx(p, tc.deadline, !tc.deadline.IsZero())
			ctx, cancel = c, c.cancel
		case tc.detached:
			ctx, cancel = context.WithDeadline(context.WithoutCancel(p), tc.deadline)
		case tc.deadline.IsZero():
			ctx, cancel = context.WithCancel(p)
		default:
			ctx, cancel = context.WithDeadline(p, tc.deadline)
		}
		defer cancel()
		var derived context.Context
		if tc.askDone {
			_ = ctx.Done()
			var cancelDerived context.CancelFunc
			derived, cancelDerived = context.WithCancel(ctx)
			defer cancelDerived()
		}
		if tc.step == cancelParent || tc.step == cancelParent+cancelHop {
			cancelParentCause(cause)
		}
		if tc.step == cancelHop || tc.step == cancelParent+cancelHop {
			cancel()
		}
		var s seen
		s.err = ctx.Err()
		select {
		case <-ctx.Done():
			s.done = true
		default:
		}
		s.cause = context.Cause(ctx)
		s.deadline, _ = ctx.Deadline()
		s.value = ctx.Value(hopKey{})
		if derived == nil {
			var cancelDerived context.CancelFunc
			derived, cancelDerived = context.WithCancel(ctx)
			defer cancelDerived()
		}
		s.derivedErr = derived.Err()
		return s
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			want, got := run(false, i), run(true, i)
			if got != want {
				t.Errorf("hop context shows %+v, the context package's %+v", got, want)
			}
		})
	}
}

// TestHopContextDerivesWithoutGoroutines: contexts derived from a hop context (through a
// value, as a client interceptor adds metadata) register with it directly, as with the
// context package's own, without a goroutine each. Not parallel, so that no other test's
// goroutines come and go meanwhile.
func TestHopContextDerivesWithoutGoroutines(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	hop := newHopCtx(parent, time.Now().Add(time.Hour), true)
	defer hop.cancel()
	const derived = 100
	before := runtime.NumGoroutine()
	children := make([]context.Context, derived)
	for i := range children {
		var stop context.CancelFunc
		children[i], stop = context.WithCancel(context.WithValue(hop, hopKey{}, i))
		t.Cleanup(stop)
	}
	if grew := runtime.NumGoroutine() - before; grew >= derived/2 {
		t.Errorf("%d derived contexts started %d goroutines, want none", derived, grew)
	}
	cancel()
	for i, c := range children {
		if c.Err() == nil {
			t.Fatalf("derived context %d not cancelled with the parent", i)
		}
	}
}
