// Package idempotency makes a request id (or a client Idempotency-Key) identify one
// request across retries, duplicates and router replicas. The router calls Begin before it
// does any billed work: the first caller for a key owns it and later calls Complete with the
// outcome (or Abandon when the request failed in a way the client may retry); a caller that
// arrives after Complete gets the recorded outcome instead of calling a provider again; a
// caller that arrives while the owner is still running waits for it and then gets the same
// outcome.
//
// Two stores implement Store. JetStream keeps the state in a NATS JetStream KV bucket and is
// what replicas share in production; Memory keeps it in process memory for `mantle dev`,
// tests and single-replica use. Both pass the same test suite.
//
// # What it guarantees
//
//   - At most one owner per key at a time, across every replica sharing a bucket: claims are
//     made with a create-if-absent and taken over with a compare-and-set on the key's
//     revision, so of N concurrent callers exactly one owns the key, and when an owner
//     abandons, exactly one waiter becomes the next owner.
//   - A duplicate that arrives while the owner runs waits (on a KV watch, or a channel in
//     memory; never by polling) and returns the owner's record. It stops waiting when its
//     context is done, and leaves nothing behind when it does.
//   - An owner's result is never lost to a race. Complete replaces the claim with the
//     record; if the claim was taken over because the owner outlived inflightTTL, Complete
//     still stores the record unless one is already there. The first record wins and is
//     what every later duplicate sees; an owner that finishes second returns its own
//     (equally valid) answer to its own caller.
//   - Records expire ttl after they were recorded (Record.At), exactly: expiry is checked on
//     every read against the store's clock. JetStream also sets the bucket's TTL so the
//     server reclaims the space; Memory drops expired entries when a key is touched and in
//     Sweep.
//   - An owner that dies (replica crash, lost connection) blocks its key for at most
//     inflightTTL: then a waiter, or the next caller, takes the claim over.
//
// # What it does not guarantee
//
//   - Exactly-once billing. The store prevents a second provider call for a key while a
//     record or a live claim exists; a provider that is retried after a takeover (or after
//     Abandon) is called again. Exactly-once at the provider is only as strong as the
//     provider's own Idempotency-Key support, which is why the router also forwards the key.
//   - Durability of the answer between the provider and Complete. A crash after the provider
//     answered but before Complete loses that answer: the next duplicate calls the provider
//     again after inflightTTL.
//   - Availability over consistency. When NATS is unreachable, Begin, Complete and Abandon
//     return errors; whether a request then proceeds without idempotency (fail open) or is
//     refused is the caller's decision. A Create whose reply is lost (context cancelled in
//     flight, connection drop) may leave a claim nobody holds; it blocks the key for
//     inflightTTL, like a dead owner.
//   - Per-caller ownership tokens. Complete and Abandon act on the claim this Store value
//     holds for the key. If inflightTTL is longer than any request may run (the request
//     deadline plus a margin), a live owner is never taken over and this is unambiguous;
//     with a shorter inflightTTL a slow owner's Abandon can release a claim that a caller on
//     the same replica took over from it, which costs an extra provider call, not a wrong
//     answer.
//   - Clock agreement. A JetStream claim carries its deadline as a timestamp written by the
//     owner's clock and read by the waiters' clocks; replicas should run NTP, and a skew of
//     s moves a takeover by s.
//
// Keys may contain any characters: JetStream stores the SHA-256 of the router's key, so
// keys must already carry their tenant scope (the router prefixes the tenant). Callers must
// pass Complete and Abandon a context that is not the request's own when the request has
// been cancelled (context.WithoutCancel plus a short timeout); otherwise a cancelled request
// leaves its claim for inflightTTL.
package idempotency
