package router

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// TestLazyDeadline holds the lazily armed hop context to context.WithDeadline's behaviour:
// the same deadline, error and Done, whether or not anything armed it, and contexts
// derived from it cancelled with it at once.
func TestLazyDeadline(t *testing.T) {
	const reserve = 200 * time.Millisecond
	r := &Router{}
	cfg := Config{HopReserve: reserve}
	r.cfg.Store(&cfg)

	tests := []struct {
		name string
		// budget is the parent's time left; a hop with less than the reserve is born late.
		budget   time.Duration
		cancelIt bool // the hop's own cancel
		parent   bool // the parent's cancel
		arm      bool // ask for Done before looking
		want     error
	}{
		{name: "live", budget: time.Hour},
		{name: "live armed", budget: time.Hour, arm: true},
		{name: "past its deadline", budget: reserve / 2, want: context.DeadlineExceeded},
		{name: "past its deadline armed", budget: reserve / 2, arm: true, want: context.DeadlineExceeded},
		{name: "cancelled", budget: time.Hour, cancelIt: true, want: context.Canceled},
		{name: "cancelled armed", budget: time.Hour, arm: true, cancelIt: true, want: context.Canceled},
		{name: "cancelled after its deadline", budget: reserve / 2, cancelIt: true, want: context.DeadlineExceeded},
		{name: "parent cancelled", budget: time.Hour, parent: true, want: context.Canceled},
		{name: "parent cancelled armed", budget: time.Hour, parent: true, arm: true, want: context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			parent, cancelParent := context.WithTimeout(context.WithValue(context.Background(), ctxKey{}, "v"), tt.budget)
			defer cancelParent()
			pdl, _ := parent.Deadline()
			hop, cancel := r.hopContext(parent)
			defer cancel()
			if _, ok := hop.(*lazyDeadline); !ok {
				t.Fatalf("hopContext under a deadline = %T, want the lazy *lazyDeadline", hop)
			}
			if dl, ok := hop.Deadline(); !ok || !dl.Equal(pdl.Add(-reserve)) {
				t.Fatalf("Deadline() = %v, %v; want %v, true", dl, ok, pdl.Add(-reserve))
			}
			if got := hop.Value(ctxKey{}); got != "v" {
				t.Fatalf("Value = %v, want the parent's", got)
			}
			if tt.arm {
				_ = hop.Done()
			}
			if tt.parent {
				cancelParent()
			}
			if tt.cancelIt {
				cancel()
			}
			if err := hop.Err(); !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("Err() = %v, want %v", err, tt.want)
			}
			// Done is closed by then, as context.WithDeadline's is: one armed with a deadline
			// already past is cancelled as it is made.
			select {
			case <-hop.Done():
				if tt.want == nil {
					t.Fatal("Done closed on a live context")
				}
			default:
				if tt.want != nil {
					t.Fatalf("Done open on a context whose Err is %v", tt.want)
				}
			}
			if err := hop.Err(); !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("Err() after Done = %v, want %v", err, tt.want)
			}
			if tt.want == nil {
				// A context derived before anything armed the hop is cancelled with it, in
				// the same call, as under context.WithDeadline.
				child, stop := context.WithCancel(hop)
				defer stop()
				cancel()
				if !errors.Is(child.Err(), context.Canceled) {
					t.Fatalf("derived context's Err() right after the hop's cancel = %v, want context.Canceled", child.Err())
				}
			}
		})
	}
}

type ctxKey struct{}

// TestLazyDeadlineConcurrent arms, reads and cancels a hop context from several goroutines
// at once (run under -race).
func TestLazyDeadlineConcurrent(t *testing.T) {
	r := &Router{}
	cfg := Config{HopReserve: time.Millisecond}
	r.cfg.Store(&cfg)
	parent, cancelParent := context.WithTimeout(context.Background(), time.Hour)
	defer cancelParent()
	for range 50 {
		hop, cancel := r.hopContext(parent)
		var wg sync.WaitGroup
		wg.Go(func() { <-hop.Done() })
		wg.Go(func() { _ = hop.Err() })
		wg.Go(func() { child, stop := context.WithCancel(hop); <-child.Done(); stop() })
		wg.Go(cancel)
		wg.Wait()
		if !errors.Is(hop.Err(), context.Canceled) {
			t.Fatalf("Err() after cancel = %v", hop.Err())
		}
	}
}
