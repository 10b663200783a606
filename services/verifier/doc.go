// Package verifier checks an LLM answer before it reaches the caller and sends the rare risky
// one to people. It implements mantle.verifier.v1.VerifierService: the router calls Verify
// once per candidate answer and routes on the verdict (a failed verification is a verdict,
// not an RPC error); reviewers use the review RPCs and `mantle review`.
//
// # Layers
//
// L1 (format, synchronous; BenchmarkVerifyL1 keeps it well under 1 ms) is
// package formatcheck, shared with the router, which runs it itself when the verifier is
// unreachable: truncation, encoding and mojibake, empty answers, refusal phrases, decoding
// loops (repetition), leaked HTML and unclosed code fences (warnings), and for JSON
// requests markdown fences (a warning; the answer is unwrapped), parsing, the top-level
// type, JSON Schema, required fields and the model's own confidence. The verifier's
// configuration keys confidence_threshold, refusal_phrases, repetition_threshold,
// schema_cache_size, max_schema_findings and degraded.confidence_threshold tune it; the
// verifier compiles a request's schema first and rejects an invalid one as
// INVALID_ARGUMENT.
//
// Classes: truncated -> ERROR_CLASS_TRUNCATED, refusal -> ERROR_CLASS_REFUSAL,
// low_confidence and L2 block/degrade -> ERROR_CLASS_VERIFICATION_FAILED (well-formed but
// untrustworthy); every other blocking finding is ERROR_CLASS_MALFORMED_OUTPUT. Findings are
// listed in a fixed order (formatcheck's, then L2's) and the verdict's class is the class of
// the first blocking one.
//
// L2 (business rules, synchronous): CEL rules from the configuration, a watched rules file
// and approved review drafts, compiled once, evaluated under a cost limit against the
// request, the parsed answer and the QualityContext (package internal/rules). Actions:
// block, degrade (the router should serve its degraded form: VerifyResponse.degrade), mask
// or replace a field, append a notice, send to review. The answer is rewritten in
// VerifyResponse.content. Sample rules (medical hedging, work-injury citations) ship in DefaultConfig.
//
// L3 (semantic, asynchronous): relevance to the question, consistency with reference
// snippets and divergence from earlier answers to the same question, through an Embedder
// (a built-in lexical one by default), plus an optional LLM judge called through the router
// (package internal/semantic). Verify returns with l3_pending; the result is published as a
// QualityFollowUpEvent, kept for GetFollowUp, and can still open a review.
//
// # Degraded answers
//
// When the router has fallen back, checks must fit the model that answered. A
// degraded answer (fallback level other than primary) is held to degraded.confidence_threshold,
// its review threshold is multiplied by degraded.review_threshold_factor (1.3: DESIGN.md's
// "30% higher threshold", so acceptable degraded answers do not flood the review pool), it is
// skipped by L3 at the template and cached levels, and rules see degraded == true.
//
// # Risk and review
//
// Risk (risk.go) = weighted input risk (sensitive terms, long input, garbled input), output
// risk (failed, repetition of key values, rule rewrites, format warnings; after L3, low
// confidence and divergence) and context risk (a run of degraded answers in the session,
// user dissatisfaction reported with ReportFeedback, many retries). Weights and the review
// threshold (0.75) are per scenario. A delivered answer at or above the threshold, or one a
// review rule matched, goes to human review (package internal/review): through a disk spool
// and a JetStream work-queue stream when NATS is configured, so no request is lost while
// NATS is down; claims are leases; decisions record a root cause and a corrective action and
// may draft a rule for approval; a review not decided in time gets the scenario's default
// action; everything is in an audit trail.
//
// # State
//
// Rules, sessions (context risk), L3 history and follow-ups live in memory per replica.
// Review state lives in a JetStream KV bucket (memory without NATS).
package verifier
