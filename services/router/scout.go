package router

import (
	"context"
	"fmt"

	"github.com/mantle-mesh/mantle/pkg/provider"
)

// sideScout sends the scout an open breaker let through as a call of its own, beside the
// request: its outcome is the breaker's (a success ends the open period), and the request
// goes on to its next candidate without waiting for a model that was failing a moment
// ago. The scout holds a bulkhead place and is bounded by the provider's timeout and the
// router's life.
func (r *Router) sideScout(x *exchange, s slot) {
	c, permit, qc := s.c, s.permit, x.qc
	c.exhausted = true // for this request
	release, ok := c.u.bulkhead.TryAcquire()
	if !ok {
		permit.Cancel()
		return
	}
	r.audit(qc, "route", fmt.Sprintf("%s: breaker open; a scout goes beside the request", c.u.model.Name), 0)
	r.deps.Metrics.sideScouts.WithLabelValues(c.u.model.Name).Inc()
	// The scout outlives the loop: it gets its own exchange, which has no QualityContext
	// and no sink (its answer goes nowhere).
	scout := &exchange{rt: x.rt, preq: x.preq, tenant: x.tenant}
	r.scouts.Add(1)
	go func() {
		defer r.scouts.Done()
		defer release()
		ctx, cancel := context.WithTimeout(r.scoutCtx, c.u.timeout)
		defer cancel()
		o := r.call(ctx, scout, s)
		r.deps.Log.Debug("side scout", "model", c.u.model.Name, "class", shortClass(provider.ClassOf(o.err)))
	}()
}

// StopScouts ends the side scouts in flight and waits for them; the router's run loop
// calls it at shutdown.
func (r *Router) StopScouts() {
	r.stopScouts()
	r.scouts.Wait()
}
