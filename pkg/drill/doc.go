// Package drill runs fault drills: a scenario's simulated providers misbehave while an
// open-loop load runs twice, once through mantle and once through a naive client, on the
// same seed, and the report puts the two side by side.
//
// The seeds insist that resilience is shown by fault injection, not argued. A drill is that
// demonstration, built into the product so that every user can run it against their own
// settings, and so that mantle's published numbers come from a command anyone can repeat.
//
// # A run
//
// A Scenario (YAML; the built-ins are embedded from scenarios/*.yaml, and users can write
// their own) names the simulated models and their sim profiles, the load (rate, duration,
// share of streamed and JSON requests), the route mantle serves it with (candidates,
// hedging, ladder), the router's resilience settings, the naive client's settings, and
// optional targets.
//
// Each side gets its own simulator (pkg/sim behind a loopback listener that logs every
// call), created when its load starts so that the scenario's phases line up on both sides
// and the same seed draws the same outcomes. Mantle's side starts an in-process mesh
// (--target=all, embedded NATS) whose providers are OpenAI-compatible endpoints at that
// simulator, and subscribes to its breaker events; or it drives a running mesh by address.
// The naive side calls the simulator directly with the OpenAI adapter: static timeout,
// fixed retries on any error, no breaker, budget, failover or idempotency.
//
// # Time
//
// Every duration in a scenario is scenario time. A run multiplies all of them by its time
// scale: the simulator's latencies and phases, the load's duration (and divides the rate),
// the route's budget and timeouts, the breaker's window and open period, backoffs, and the
// naive client's timeout and retry delay. A scaled run is therefore the same experiment,
// faster; the report divides measured times by the scale. What does not scale is the
// mesh's own overhead (loopback hops, serialisation, a busy machine), which a strong
// scale inflates: 2 ms of overhead reads as 20 ms at scale 0.1. Use scales of 0.05 and
// above for figures, and stronger ones only for tests.
//
// # What is measured
//
// For each side: answered, correct (the simulator answers deterministically, so the drill
// knows the right answer), wrong answers passed on as if fine, ladder answers and whether
// they were marked, mantle's verifier verdicts, latency percentiles over every request,
// upstream calls per request, billed and duplicate billed calls (from the simulator's
// Idempotency-Key accounting), a cost estimate, answers per ladder level, breaker
// transitions with trip and recovery times and the calls each half-open period let
// through, and a timeline. The report is printed as a table, and written as JSON and as a
// self-contained HTML page with charts.
package drill
