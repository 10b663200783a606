// Package vector is the arithmetic of the semantic cache: unit-length embeddings, dense or
// sparse, their cosine similarity, and Set, the exact search structure the embedded index
// keeps per partition.
//
// Set never approximates. Dense vectors are scanned; sparse vectors go through an inverted
// index pruned with the bound of all-pairs similarity search, which skips only vectors that
// provably cannot reach the minimum score. A cache that misses a close match costs one model
// call; one that returns a wrong match gives a wrong answer, so the structure that decides
// what is close is kept simple enough to check against brute force (set_test.go does).
package vector
