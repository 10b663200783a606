// Package qdranttest is an in-process Qdrant for tests: a gRPC server on 127.0.0.1:0 built
// from the go-client's exported CollectionsServer, PointsServer and QdrantServer
// interfaces, so the real client (github.com/qdrant/go-client) talks to it over a real
// connection. It implements the subset the cache uses, with Qdrant's semantics: collections
// with a dense vector (cosine) or named sparse vectors (dot product), payload filters
// (must/should/must_not with keyword, integer and boolean matches, numeric ranges, has_id),
// field indexes, upsert, get, query, count and delete by ids or filter. Anything else
// answers Unimplemented, so a test that starts using more fails loudly instead of passing
// against a fake that guesses.
//
// It is not a vector database: search is brute force, and nothing is persisted. It lives
// outside internal/ so that end-to-end tests (the mesh harness) can run the cache's Qdrant
// backend too: start one, and point cache.qdrant.address at Server.Addr.
package qdranttest
