// Package cache is mantle's semantic cache: the router asks it for a stored answer before
// calling a model (Lookup), offers it verified answers afterwards (Store), and operators
// remove entries with Invalidate. See README.md for what it matches and how to run it.
//
// A lookup narrows before it compares. The scope (partition) of a prompt is a SHA-256 over
// the tenant, scenario, embedder namespace, model family, temperature bucket, max_tokens,
// response format and a hash of everything but the last user message (deriveKeys says why
// each is there); nothing outside the scope is ever compared. Within it the cache tries an
// exact hash of the normalised last user message, then the cosine similarity of its
// embedding against the scenario's threshold; a candidate that passes the threshold must
// still agree on numbers, dates, negations, quoted strings and names (package nearmiss),
// whatever its score. Entries never cross tenants: the tenant is part of every partition,
// every Qdrant filter, and every invalidation.
//
// Policy decides what is stored and served: only complete ("stop"), verified answers
// sampled at a low temperature; never errors, refusals or degraded answers; never prompts
// with volatile or personal content. Entries expire after their scenario's TTL (reads do
// not renew it); verified entries stay servable, marked stale, for max_staleness more in
// cache-only mode, at a stricter threshold. Lookups with coalesce set share one model call
// for identical prompts through leases (lease.go).
//
// Backends implement Index: EmbeddedIndex (in process, a search of bounded cost per
// partition, a bounded size with LRU eviction, optional snapshot file) and QdrantIndex (github.com/qdrant/
// go-client v1.17.1, for Qdrant server v1.17.x: one collection per embedder namespace,
// cosine distance, the tenant as an is_tenant payload index, expiry swept periodically, a
// short deadline on every call and a miss on failure). Embedders implement Embedder: the
// built-in lexical one or an OpenAI-compatible endpoint (package embed).
package cache
