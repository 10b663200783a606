// Package vector is the arithmetic of the semantic cache: unit-length embeddings, dense or
// sparse, their cosine similarity, and Set, the search structure the embedded index keeps
// per partition.
//
// Set never approximates. Dense vectors are scanned; sparse vectors go through an inverted
// index whose candidate selection and pruning use bounds that skip only vectors that
// provably cannot reach the minimum score (set.go). A cache that misses a close match
// costs one model call; one that returns a wrong match gives a wrong answer, so the
// structure that decides what is close is kept simple enough to be checked against brute
// force, which set_test.go does with random operations.
package vector
