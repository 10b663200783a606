package admission

import (
	"context"
	"errors"
	"testing"
	"time"

	"pgregory.net/rapid"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/services/quota/internal/ledger"
)

// No priority class starves a higher one: whenever a request is admitted, no request of
// a higher class (from the queue) or of the same or a higher class (admitted at once)
// is waiting for a bucket it takes from. Requests of several tenants and classes share
// an upstream key and their own buckets; the clock moves, refunds arrive.
func TestPropertyNoClassStarvesAHigherOne(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		cfg := testConfig()
		cfg.MaxWait = 10 * time.Minute
		cfg.Size = rapid.IntRange(1, 30).Draw(rt, "queue size")
		h := newHarness(rt, cfg, limits{rpm: 120, tpm: 12_000, keys: map[string]int64{"k": 6000}}, nil)
		q := h.q
		q.onPush = nil
		q.setRunning(true)
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()

		var granted []ledger.Charge
		q.onGrant = func(adm *Request, fromQueue bool) {
			granted = append(granted, adm.Charge)
			q.mu.Lock()
			defer q.mu.Unlock()
			limit := adm.Class - 1 // from the queue: strictly higher classes
			if !fromQueue {
				limit = adm.Class // at once: the same class too
			}
			for c := 0; c <= limit; c++ {
				for _, tq := range q.classes[c].tenants {
					for _, w := range tq.waiters {
						for _, s := range w.short {
							for _, b := range adm.Buckets {
								if s == b {
									rt.Fatalf("a %s request of %s was admitted (from queue: %v) while a %s request of %s waits for %s",
										classNames[adm.Class], adm.Tenant, fromQueue, classNames[c], w.adm.Tenant, b)
								}
							}
						}
					}
				}
			}
		}
		rt.Repeat(map[string]func(*rapid.T){
			"arrive": func(rt *rapid.T) {
				tenant := rapid.SampledFrom([]string{"a", "b", "c"}).Draw(rt, "tenant")
				p := rapid.SampledFrom([]mantlev1.Priority{
					mantlev1.Priority_PRIORITY_CRITICAL, mantlev1.Priority_PRIORITY_HIGH,
					mantlev1.Priority_PRIORITY_NORMAL, mantlev1.Priority_PRIORITY_BATCH,
				}).Draw(rt, "priority")
				cost := rapid.Int64Range(1, 6000).Draw(rt, "cost")
				key := ""
				if rapid.Bool().Draw(rt, "on the key") {
					key = "k"
				}
				if _, _, err := q.enter(ctx, h.request(tenant, p, cost, key)); err != nil && !errors.Is(err, ledger.ErrExhausted) {
					rt.Fatalf("enter: %v", err)
				}
			},
			"wait": func(rt *rapid.T) {
				h.clock.Advance(time.Duration(rapid.Int64Range(0, int64(20*time.Second)).Draw(rt, "wait")))
				q.dispatch()
			},
			"refund": func(rt *rapid.T) {
				if len(granted) == 0 {
					rt.Skip("nothing to settle")
				}
				c := granted[0]
				granted = granted[1:]
				used := rapid.Int64Range(0, c.Tokens).Draw(rt, "used")
				if _, err := h.store.Settle(context.Background(), c.Tenant, c.ID, ledger.Actual{Tokens: used}, false); err != nil {
					rt.Fatalf("settle: %v", err)
				}
				q.dispatch()
			},
		})
	})
}
