// Package agent is mantle's tool gateway for agents. It implements
// mantle.agent.v1.ToolService (CallTool, ListTools, DescribeTools) over a registry of typed
// tools from the configuration (agent.tools), and mantle.agent.v1.SessionService, which
// groups an agent's model and tool calls into sessions with budgets and checkpoints.
//
// The router is the agent's front: it serves GET /v1/tools, POST /v1/tools/{name}/call and
// the MCP endpoint /mcp on its HTTP door and reaches this module only over gRPC, as it
// reaches the others. The agent calls the verifier to open "confirm outcome" reviews.
//
// # Tools
//
// A tool has a kind, which decides how its failures are met:
//
//   - query: no side effects. A failed call climbs gears: a retry with backoff (first
//     0.5-1 s, then 2-4 s, never past the call's deadline), the backup tool, the last good
//     result of the same call marked stale with its age, then TOOL_UNAVAILABLE.
//   - external: a third party's query, under its own rate limit; the same gears.
//   - action: side effects. Never retried. Every call runs under an idempotency key (the
//     caller's, or derived from tenant, session and step), claimed before the backend is
//     called and forwarded to it as Idempotency-Key; a repeated key answers with the
//     recorded result. An outcome that is unknown (a timeout, a reset connection) is not
//     retried either: a person confirms whether it happened through the verifier's review
//     queue, and the call answers pending_confirmation until then.
//
// # Confirming an unknown outcome
//
// verifierConfirmer opens the "confirm outcome" item (OpenConfirmation) and reads its
// decision (GetConfirmation) over gRPC with this module's service identity; a tenant key
// cannot call either, and only operators list and decide them (mantle review
// --confirmations, mantle review decide cf_... --happened | --not-happened). "Happened"
// makes every later call with the key answer the person's result without a backend call;
// "not happened" lets the next call run the action once, and an unknown outcome of that
// run is a new confirmation (actionRecord.Run). When the verifier cannot be reached,
// nothing runs: the call stays pending and the next one opens or reads the confirmation.
// A module with no verifier to dial uses noConfirmer and warns at start. The reasons are
// in docs/design/004-action-outcome-confirmation.md; the operator's view in
// docs/verification.md.
//
// Each tool has its own circuit breaker, bulkhead (max_in_flight) and retry budget
// (package resilience, shared with the router). Arguments are checked before any backend
// call: size, depth and node count, then the tool's input schema. A malformed call never
// reaches a backend.
package agent
