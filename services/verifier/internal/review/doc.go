// Package review is the verifier's human review queue: the life of a review (pending,
// claimed under a lease, decided or timed out), its audit trail, the rules drafted from
// decisions, and the plumbing that makes sure no review request is lost on the way.
//
// The path of a review request:
//
//	Verify -> Queue.Enqueue: the request is appended to a disk spool (durable before Verify
//	returns) and the flusher publishes it to the JetStream work-queue stream MANTLE_REVIEWS,
//	deleting it from the spool only after JetStream acknowledged it. While NATS is down the
//	spool keeps it; the flusher retries with backoff and drains the spool in order.
//	-> the intake consumer stores the review (Service.Open, idempotent by review id) and
//	holds the stream message un-acknowledged; it is acknowledged only once the review's
//	outcome (a decision, or the timeout's default action) is stored. A message whose holder
//	dies is redelivered after the consumer's ack wait and picked up again.
//
// Without NATS (development, tests) the same Service runs on an in-memory store and
// requests go straight to Open.
//
// State lives in a Store built on a small key-value interface: in memory, or a JetStream
// KV bucket, where every change is a compare-and-swap on the entry's revision, so replicas
// sharing the bucket cannot both claim, decide or time out the same review.
//
// A review not decided by its deadline (15 minutes by default, per scenario) is timed out by
// Service.Sweep, which the owner calls on an injected clock's ticker: the scenario's default
// action (keep, retract or replace the answer) is recorded and announced with a
// ReviewTimeoutEvent. Decisions are announced with a ReviewDecisionEvent, and can draft an
// L2 rule that goes live when approved.
package review
