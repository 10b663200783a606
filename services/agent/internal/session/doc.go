// Package session keeps agent sessions: the model and tool steps an agent takes under one
// session id, with the session's budgets, the recorded result of every completed step, and
// its degradation state. The router opens and ends model steps (BeginStep, EndStep), the
// agent module tool steps; agents read, cancel and complete their sessions.
//
// # Storage
//
// A session is one key of a Store: a JetStream KV bucket that every agent replica shares
// (so any replica serves the next step, and an agent that crashed resumes on another), or
// process memory for `mantle dev`, tests and single-replica use. Both pass the same tests.
// The key is derived from the tenant and the session id, so one tenant's id never reaches
// another tenant's session. Every change is a compare-and-set on the key's revision;
// replicas changing one session concurrently retry on a conflict and never lose a change.
// Each step's result is a key of its own, written before the session records it, so the
// session's own value stays small (it is rewritten at every step) and a result is never
// half recorded. Every write carries a time to live (JetStream's per-message TTL): the
// session and its results live until the session's deadline plus the retention period.
//
// # Steps
//
// Begin opens a step and answers what is left of the budget for it to run under, whether
// the session is degraded, whether its actions need confirmation and its parallel cap.
// A step that completed before (done, degraded, stale) is replayed from the record: no
// model or tool is called again, and a replay costs no budget. A step whose result was too
// large to record (64 KiB for a model step, 12 KiB for a tool step, 768 KiB per session by
// default) runs again; an action protects itself from a second run with its idempotency
// key. A running step holds its id for its runner's deadline (its lease); after it, the
// runner is presumed gone and the step may run again.
//
// # Budgets
//
// A session has a deadline, a token, a cost and a step budget. A step that would begin
// past one ends the session with a partial result (ended_partial, naming the budget) and
// is recorded as skipped; usage is charged when a step ends, and the step that spends the
// last of a budget ends the session too. The steps recorded until then stay readable and
// replayable: that is the partial result. A required step that fails ends the session the
// same way; an optional one is reported and the session goes on.
//
// # Degradation
//
// A step that completes degraded or stale degrades the session, and it stays degraded
// (sticky) for sticky_for: its steps serve their degraded form, so an agent does not
// flip between a model and its fallback from one step to the next. Then one step at a time
// tries the full form; if it answers fresh the session recovers, otherwise it tries again
// after recovery_interval. From confirm_actions_after degradations on, the session's
// actions need a person's confirmation.
//
// # Parallelism
//
// A session's tool steps run at most parallel_cap at once (Begin waits for a slot). The
// Scheduler lowers the cap of sessions that call a tool whose calls time out: to half, then
// to one at a time, and raises it again one level per quiet window.
//
// # Ending
//
// Cancel ends a session at the caller's request: running steps are cancelled, running
// actions are marked pending_confirmation (nobody knows whether they happened), and
// AwaitEnd returns in every process waiting on the session, which is how a router
// interrupts a model step in flight. Complete ends a finished session. A step that ends
// after its session was cancelled still records its outcome.
package session
