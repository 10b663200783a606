// Package quota implements mantle.quota.v1.QuotaService: token-aware admission for the
// mesh. The router asks quota before every provider call and tells it afterwards what
// the call really cost. One runaway client or one long-document batch must not burn the
// provider quota for everyone, and because requests
// differ by orders of magnitude in tokens, admission counts tokens, not requests.
//
// # Buckets
//
// Every bucket is a token bucket whose capacity is its per-minute limit and which
// refills continuously at limit/60 s per second (bucket.go: the GCRA form, one instant
// per bucket, exact to the nanosecond). A request may charge:
//
//   - the tenant's RPM and TPM (default_limits, tenants);
//   - the tenant x model RPM and TPM, when model_limits has an entry;
//   - the tenant's daily money budget (budgets), priced per model from a price table;
//   - the upstream key's RPM and TPM (upstream_keys), which mirror a provider key's own
//     limits and are corrected from its rate-limit headers by ObserveUpstream, so that
//     mantle slows down before the provider answers 429.
//
// Reserve charges one request and input + max output tokens (a configured default when
// max_output_tokens is 0; messages are counted when input_tokens is 0) to every
// applicable bucket, all or nothing. Settle replaces the estimate by the real usage:
// unused tokens go back, an overrun is charged and may leave a bucket in debt, which
// delays the tenant's next requests until it has refilled. A request no bucket could
// ever hold is refused at once as REQUEST_TOO_LARGE: waiting cannot help.
//
// Any rule may be in shadow mode: its buckets are charged when they can be, and a
// request they would refuse is admitted and reported (SHADOW_ events, a metric), so new
// limits can be watched before they bite. A bucket past near_limit_ratio (80%) raises a
// QuotaNearLimitEvent.
//
// # Waiting and priorities
//
// A refused request whose call has a deadline waits in a per-replica queue (queue.go)
// for at most that deadline: strict priority classes (critical, high, normal, batch),
// weighted fair sharing between tenants within a class, and no bypassing: buckets a
// waiting request is short on are reserved for it against requests of its class and
// below. When the queue is full the lowest class is shed first; a refusal is
// RESOURCE_EXHAUSTED with RetryInfo and QuotaFailure.
//
// The queue, its priorities, fair shares and "spoken for" buckets live in one replica;
// replicas share buckets through the Store but not their queues. So with several
// replicas the guarantees hold within each replica's traffic only. A critical request
// waiting on replica A does not stop replica B from granting a batch request the refill
// it waits for; B's waiters never see A's, so tenants' fair shares are fair per replica,
// and a tenant whose requests land on fewer replicas gets no share of the others'
// queues. What still holds mesh-wide is the limits themselves (every grant is charged
// in Redis). The gap is smallest when the load balancer spreads each tenant's requests
// evenly and the queues are short; making the queue global would need the waiters (or
// at least the spoken-for buckets per class) in Redis, consulted on every Reserve,
// which this version does not do.
//
// # Reservations
//
// A reservation can be settled once. Settling it again, settling one that does not
// exist or belongs to another tenant, and settling one older than reservation_ttl all
// answer NOT_FOUND with reason RESERVATION_NOT_FOUND. That makes Settle safe to retry:
// a retried Settle whose first attempt succeeded gets NOT_FOUND and can never refund
// twice, so callers treat NOT_FOUND after a retry as "already settled".
//
// A reservation that is never settled is released as a record, but its charge stands:
// the caller may have made the provider call and crashed before settling, and refunding
// on expiry would let a misbehaving client spend tokens it never pays for. The tokens
// come back the normal way, through refill.
//
// # Retry budget
//
// AcquireRetry hands out retries from a mesh-wide budget (a share of requests over a
// sliding window, per upstream key and overall, with a small floor), counted where all
// router replicas see it, so the budget holds however many routers there are.
//
// # Token counting
//
// CountTokens (and Reserve without input_tokens) counts exactly with OpenAI's BPE
// vocabularies for OpenAI models (cl100k_base, o200k_base, embedded in the binary by
// github.com/tiktoken-go/tokenizer) and estimates other families with calibrated
// per-script rates, chat framing included. Every part of a prompt is counted, in one place
// (tokencount.collectPrompt): text, names, tool definitions, earlier tool calls and results, images by
// the provider's rule, audio and files by a conservative estimate (docs/quota.md lists
// the rules). Estimates are corrected by the ratio of the input tokens providers report
// in Settle to the estimate, learned per model.
//
// # State
//
// Everything that must be shared lives behind the stateStore interface, which this
// package owns; the types the stores share (charges, grants, levels, refusals, the
// token-bucket arithmetic) are in internal/ledger. memstore.Store (internal/memstore)
// serves `mantle dev`, tests and single replicas. redisstore.Store (internal/redisstore)
// serves many replicas: every
// operation on a tenant's (or a key's) buckets is one Lua operation of a function
// library (a script on Redis before 7.0), atomic in Redis and decided at Redis's TIME,
// with hash tags that put a tenant's keys in one cluster slot.
// failoverStore (this package) wraps it: when Redis does not answer (a refusal is an answer), each
// replica enforces limit/replicas locally and says so (metric, /readyz, DegradationEvent),
// and money budgets fail closed; buckets are handed over conservatively both ways,
// also to a Redis that lost its data (docs/quota.md). The same test suite runs against
// both backends. quota calls no other service.
package quota
