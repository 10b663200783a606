// Package cache is mantle's answer cache: the router asks it for a stored answer before
// calling a model (Lookup) and offers it verified answers afterwards (Store); operators
// remove entries with Invalidate.
//
// This version matches exactly. A key is a SHA-256 over the tenant, scenario, model,
// temperature bucket, max_tokens, response format, a hash of the conversation before the
// last user message, and that message normalised (NFKC, lower case, collapsed spaces,
// surrounding punctuation removed); deriveKey documents why each part is there. Entries
// never cross tenants: the tenant is part of every key and of every invalidation.
//
// A per-scenario policy decides what is stored: only complete ("stop") answers sampled at a
// low temperature, never prompts that mention volatile things (today, 库存, 订单 ...), and
// for a TTL. Policy skips are reported, not failed.
//
// The service calls no other service. Its state is the entries, kept behind the Index
// interface; MemoryIndex holds them in process memory, bounded and evicted least recently
// used first. A Qdrant backend with vector similarity will implement the same interface.
package cache
