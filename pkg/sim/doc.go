// Package sim is mantle's built-in simulated LLM provider: an OpenAI-compatible HTTP server
// whose latency and failures follow a Profile.
//
// It exists so that development, tests and fault drills exercise the same code path as
// production. The router reaches the simulator through the real OpenAI HTTP adapter, so a
// drill that injects "30% of calls take over 8 s" or "429 without Retry-After" tests the
// adapter's error taxonomy, the deadline budget, the breakers and the retry budget exactly as
// a misbehaving vendor would, instead of testing a mock of them.
//
// # What a profile controls
//
//   - Latency as a distribution given by its percentiles (the seed articles' P50 0.7 s,
//     P95 3.2 s, P99 8.5 s by default), a separate time-to-first-token distribution for
//     streams, and a per-chunk delay. Long tails are the point: averages hide them.
//   - An error mix: the probability of every failure mode the seeds describe, from the
//     honest ones (429, 500, 503, connection reset) to the ones that look like success
//     (an error object inside a 200, broken JSON, a refusal, a truncated answer, a stream
//     that stops without [DONE] or stalls forever).
//   - A script that fixes the outcomes of a model's first calls ("500 once, then fine"), for
//     tests and drills that need an exact sequence rather than a probability.
//   - Phases over time (healthy, incident, recovery), measured from the server's start on
//     an injected clock, so a drill can script an incident and its end.
//   - A time scale that shrinks every latency and phase offset, so a ten-minute incident
//     runs in a minute.
//   - Simulated per-minute request and token limits, reported in OpenAI's x-ratelimit-*
//     headers and enforced with 429s, so the quota service's per-key buckets have real
//     headers to learn from.
//
// Outcomes are drawn from a seeded PCG generator, one per model name, so a run is
// reproducible: the same seed and the same sequence of requests to a model give the same
// sequence of outcomes and latencies.
//
// # Waiting and goroutines
//
// The server starts no goroutines of its own; each request is handled on the goroutine
// net/http gives it. Every wait (latency, TTFT, chunk delay) runs on the injected clock and
// also ends when the request's context is done, and the faults that never end by
// themselves (hang, stall) end when the client goes away or when the listener started by
// Start shuts down. Tests drive time with clockwork's fake clock instead of sleeping.
//
// # Using it
//
//	srv := sim.NewServer(sim.ServerConfig{Default: prof, Models: map[string]sim.Profile{...}})
//	addr, wait, err := sim.Start(ctx, "127.0.0.1:0", srv, log)
//
// Built-in profiles are listed by ProfileNames and returned by Builtin; LoadProfile reads a
// custom one from strict YAML. Stats counts calls per model and outcome, including
// duplicate billed calls (the same Idempotency-Key answered twice), which is how drills
// check that retries and hedges did not multiply the bill.
package sim
