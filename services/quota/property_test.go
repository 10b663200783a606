package quota

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"pgregory.net/rapid"

	"github.com/mantle-mesh/mantle/services/quota/internal/ledger"
)

// Property tests (pgregory.net/rapid): random sequences of operations, shrunk to a
// minimal counterexample on failure. Each runs against both backends where the
// property is about the Store.

// rapidTenant gives every rapid iteration fresh buckets on a shared Redis prefix.
var rapidTenant atomic.Int64

func nextTenant() string { return fmt.Sprint("t", rapidTenant.Add(1)) }

// Tokens stay within [debt floor, capacity]: whatever is reserved, settled (refunds,
// overruns far beyond the limit), observed or waited, a bucket never holds more than
// its limit, never owes more than maxDebt, and what it reports is consistent.
func TestPropertyLevelsStayWithinBounds(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b backend) {
		clock := clockwork.NewFakeClockAt(t0)
		store := b.newStore(t, clock)
		rapid.Check(t, func(rt *rapid.T) {
			limit := rapid.SampledFrom([]int64{1, 7, 60, 6000, 1_000_000_007}).Draw(rt, "limit")
			tenant := nextTenant()
			spec := ledger.BucketSpec{Group: ledger.TenantGroup(tenant), Field: ledger.FieldTPM, Kind: ledger.KindTokens, Limit: limit}
			var open []string
			next := 0
			check := func(l ledger.BucketLevel) {
				if l.Remaining < 0 || l.Remaining > limit || l.Reset < 0 || l.Reset > ledger.MaxDebt {
					rt.Fatalf("level out of bounds: %+v (limit %d, max debt %v)", l, limit, ledger.MaxDebt)
				}
				if want := ledger.RemainingAt(l.Reset, limit); l.Remaining != want {
					rt.Fatalf("remaining %d disagrees with a debt of %v (%d)", l.Remaining, l.Reset, want)
				}
			}
			rt.Repeat(map[string]func(*rapid.T){
				"reserve": func(rt *rapid.T) {
					s := spec
					s.Cost = rapid.Int64Range(0, limit).Draw(rt, "cost")
					next++
					id := fmt.Sprint(tenant, "-", next)
					g, err := store.Reserve(context.Background(), ledger.Charge{ID: id, Tenant: tenant, TTL: 365 * 24 * time.Hour, Tokens: s.Cost, Buckets: []ledger.BucketSpec{s}})
					if err == nil {
						check(g.Levels[0])
						open = append(open, id)
					} else if _, ok := errors.AsType[*ledger.ExhaustedError](err); !ok {
						rt.Fatalf("reserve: %v", err)
					}
				},
				"settle": func(rt *rapid.T) {
					if len(open) == 0 {
						rt.Skip("nothing to settle")
					}
					i := rapid.IntRange(0, len(open)-1).Draw(rt, "which")
					actual := rapid.SampledFrom([]int64{0, 1, limit, 1000 * limit, math.MaxInt64}).Draw(rt, "actual")
					st, err := store.Settle(context.Background(), tenant, open[i], ledger.Actual{Tokens: actual}, false)
					if err != nil {
						rt.Fatalf("settle: %v", err)
					}
					open = append(open[:i], open[i+1:]...)
					for _, l := range st.Levels {
						check(l)
					}
				},
				"observe": func(rt *rapid.T) {
					rem := rapid.Int64Range(-1, limit+1).Draw(rt, "remaining")
					reset := time.Duration(rapid.Int64Range(0, int64(48*time.Hour)).Draw(rt, "reset"))
					levels, err := store.Observe(context.Background(), []ledger.Observation{{Bucket: spec, Remaining: min(rem, limit), Reset: reset}})
					if err != nil {
						rt.Fatalf("observe: %v", err)
					}
					check(levels[0])
				},
				"wait": func(rt *rapid.T) {
					clock.Advance(time.Duration(rapid.Int64Range(0, int64(2*time.Minute)).Draw(rt, "wait")))
				},
			})
		})
	})
}

// Over any window, admitted cost never exceeds capacity plus refill: for any two grants
// at t_i <= t_j, the tokens granted from i to j are at most limit + tokensIn(t_j - t_i).
// Settles here only charge overruns: refunds give tokens back on purpose.
func TestPropertyAdmittedCostWithinCapacityPlusRefill(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b backend) {
		clock := clockwork.NewFakeClockAt(t0)
		cfg := testConfig()
		cfg.DefaultLimits = RateLimits{RPM: 1_000_000, TPM: 6000}
		f := newFixtureWith(t, b.newStore(t, clock), clock, cfg)
		rapid.Check(t, func(rt *rapid.T) {
			tenant := nextTenant()
			limit := int64(6000)
			type grant struct {
				at   time.Time
				cost int64
			}
			var grants []grant
			type reservation struct {
				reserveOutcome
				at time.Time
			}
			var open []reservation
			rt.Repeat(map[string]func(*rapid.T){
				"reserve": func(rt *rapid.T) {
					cost := rapid.Int64Range(1, limit).Draw(rt, "cost")
					r, err := f.svc.Reserve(context.Background(), reserveRequest{Tenant: tenant, Model: "m", InputTokens: cost, MaxOutputTokens: 0})
					if err == nil {
						grants = append(grants, grant{clock.Now(), r.ReservedTokens})
						open = append(open, reservation{r, clock.Now()})
					}
				},
				"overrun": func(rt *rapid.T) {
					// Waits add up past the reservation TTL; an expired reservation is gone
					// by design (another test covers that), so only live ones are settled.
					for len(open) > 0 && clock.Since(open[0].at) >= cfg.ReservationTTL {
						open = open[1:]
					}
					if len(open) == 0 {
						rt.Skip("nothing to settle")
					}
					r := open[0]
					open = open[1:]
					extra := rapid.Int64Range(0, limit).Draw(rt, "extra")
					if _, err := f.svc.Settle(context.Background(), settleRequest{Tenant: tenant, ReservationID: r.ReservationID, Usage: &tokenUsage{TotalTokens: r.ReservedTokens + extra}}); err != nil {
						rt.Fatalf("settle: %v", err)
					}
				},
				"wait": func(rt *rapid.T) {
					clock.Advance(time.Duration(rapid.Int64Range(0, int64(30*time.Second)).Draw(rt, "wait")))
				},
				"": func(rt *rapid.T) {
					for i := range grants {
						var sum int64
						for j := i; j < len(grants); j++ {
							sum += grants[j].cost
							if bound := limit + ledger.TokensIn(grants[j].at.Sub(grants[i].at), limit); sum > bound {
								rt.Fatalf("granted %d tokens between %v and %v, more than capacity plus refill %d",
									sum, grants[i].at.Sub(t0), grants[j].at.Sub(t0), bound)
							}
						}
					}
				},
			})
			clock.Advance(time.Hour) // the next iteration starts from full buckets anyway
		})
	})
}

// Reserved minus refunds plus extra charges equals the usage reported: per settlement,
// and in the bucket itself, whose debt is exactly the net tokens charged (the clock is
// frozen and W/limit is a whole number of nanoseconds, so there is no rounding).
func TestPropertyAccountingBalances(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b backend) {
		clock := clockwork.NewFakeClockAt(t0)
		cfg := testConfig()
		cfg.DefaultLimits = RateLimits{RPM: 1_000_000, TPM: 60_000} // 1µs per token
		f := newFixtureWith(t, b.newStore(t, clock), clock, cfg)
		const nsPerToken = int64(ledger.Window) / 60_000
		rapid.Check(t, func(rt *rapid.T) {
			tenant := nextTenant()
			var (
				open              = map[string]int64{} // id -> reserved
				ids               []string
				reserved, settled int64 // open reservations; usage of settled ones
				settledReserved   int64 // what the settled reservations had reserved
				refunded, extra   int64
			)
			rt.Repeat(map[string]func(*rapid.T){
				"reserve": func(rt *rapid.T) {
					in := rapid.Int64Range(1, 5000).Draw(rt, "input")
					out := rapid.Int64Range(0, 5000).Draw(rt, "max output")
					r, err := f.svc.Reserve(context.Background(), reserveRequest{Tenant: tenant, Model: "m", InputTokens: in, MaxOutputTokens: max(out, 1)})
					if err != nil {
						return // exhausted: charges nothing
					}
					open[r.ReservationID] = r.ReservedTokens
					ids = append(ids, r.ReservationID)
					reserved += r.ReservedTokens
				},
				"settle": func(rt *rapid.T) {
					if len(ids) == 0 {
						rt.Skip("nothing to settle")
					}
					i := rapid.IntRange(0, len(ids)-1).Draw(rt, "which")
					id := ids[i]
					ids = append(ids[:i], ids[i+1:]...)
					in := rapid.Int64Range(0, 8000).Draw(rt, "actual input")
					out := rapid.Int64Range(0, 8000).Draw(rt, "actual output")
					st, err := f.svc.Settle(context.Background(), settleRequest{Tenant: tenant, ReservationID: id, Usage: &tokenUsage{InputTokens: in, OutputTokens: out}})
					if err != nil {
						rt.Fatalf("settle: %v", err)
					}
					if st.Reserved != open[id] || st.Reserved-st.Refunded != in+out {
						rt.Fatalf("settlement reserved %d refunded %d for usage %d; reserved was %d", st.Reserved, st.Refunded, in+out, open[id])
					}
					reserved -= open[id]
					settledReserved += open[id]
					delete(open, id)
					settled += in + out
					if st.Refunded > 0 {
						refunded += st.Refunded
					} else {
						extra -= st.Refunded
					}
				},
				"": func(rt *rapid.T) {
					// Totals: what settled reservations had reserved, less refunds, plus
					// extra charges, is the usage reported.
					if settledReserved-refunded+extra != settled {
						rt.Fatalf("reserved %d - refunded %d + extra %d != usage %d", settledReserved, refunded, extra, settled)
					}
					// The bucket owes exactly the net charge: open reservations at their
					// estimate, settled ones at their usage.
					r, err := f.svc.store.Observe(context.Background(), []ledger.Observation{{Bucket: ledger.BucketSpec{Group: ledger.TenantGroup(tenant), Field: ledger.FieldTPM, Limit: 60_000}, Remaining: -1}})
					if err != nil {
						rt.Fatal(err)
					}
					net := reserved + settled
					want := time.Duration(min(net*nsPerToken, int64(ledger.MaxDebt)))
					if r[0].Reset != want {
						rt.Fatalf("bucket owes %v, want %v for %d tokens net (%d open, %d used)", r[0].Reset, want, net, reserved, settled)
					}
				},
			})
		})
	})
}
