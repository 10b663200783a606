// Package resilience holds the protection primitives of the router and the agent: a circuit
// breaker per upstream key (or tool), a retry budget, full-jitter backoff, a bulkhead, a 429
// cooldown, and the sliding window and latency tracker they are built from. The router's
// attempt loop and the agent's tool gears decide what to do with a failure; these types only
// answer "may I call now?" and remember what happened.
//
// They exist because of the incident in the seeds: a provider's long tail (30% of calls over
// 8 s), static timeouts and fixed retries without a budget turned into P99 12 s, 47% errors
// and a 3.2x bill. Each type closes one of the holes:
//
//   - Breaker stops calling a key that fails, including one that answers correctly but
//     slowly: a slow-call rate trips it, so a provider at P99 40 s with 0% errors opens.
//     Re-trips double the open period (capped), and every period is jittered so that router
//     replicas do not probe a recovering provider in lock-step. While open, one scout call
//     per scout interval checks whether the provider is back, so a long outage's backoff
//     does not delay the recovery. Half-open admits a few probes per period (a probe that
//     was sent counts even when its result never came: Permit.Abandon) and closes only when
//     every probe with a verdict succeeded in time.
//   - Budget caps retries and hedges as a share of requests, and past a retry rate lets only
//     format retries through, so an incident cannot multiply the load.
//   - Backoff spreads retries over the whole interval ("full jitter").
//   - Bulkhead bounds calls in flight and never queues, so a full bulkhead fails over at once.
//   - Cooldown rests a key that answered 429 for the hinted period; a 429 is not a breaker
//     failure (Permit.Abandon records nothing).
//
// Why not failsafe-go (v0.9.8, which we considered): its circuit breaker reads time through an
// unexported clock field set to the wall clock in an internal package, so its open period
// cannot be driven by a fake clock and tests of every state would have to sleep; it has no
// slow-call-rate threshold (only a failure threshold, so "slow" would have to be folded into
// "failure" and the two rates could not have their own thresholds or reasons); its delay
// function is handed the execution, not the number of re-trips, so growing open periods
// would need a counter kept alongside it by state-change listeners; and its jitter draws
// from the global random source. What we need is a few hundred lines with
// an injected clockwork.Clock and an injected random source, which makes every test here
// deterministic and sleep-free.
//
// Time comes only from the injected clock and randomness only from the injected
// func() float64 (uniform in [0, 1)). Nothing here starts a goroutine: an open breaker
// becomes half-open lazily, on the next Allow or Snapshot after its period.
package resilience
