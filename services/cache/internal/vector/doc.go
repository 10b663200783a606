// Package vector is the arithmetic of the semantic cache: unit-length embeddings, dense or
// sparse, their cosine similarity, and Set, the search structure the embedded index keeps
// per partition.
//
// Set's search is exact unless it is given Limits. Dense vectors are scanned; sparse
// vectors go through an inverted index whose candidate selection and pruning use bounds
// that skip only vectors that provably cannot reach the minimum score (set.go). Limits cap
// the postings a search reads and the candidates it scores, so that its cost stops growing
// with the set; past them a close vector may be missed, but every score returned is still
// exact, so a bounded search can lose a hit, never report a wrong one. A cache that misses
// a close match costs one model call; one that returns a wrong match gives a wrong answer,
// so the structure is kept simple enough to be checked against brute force, which
// set_test.go does with random operations, with and without limits.
package vector
