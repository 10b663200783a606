// Package procusage reads what this process has used so far: its CPU time (the whole
// process's, or the calling thread's), its peak resident set and its threads' context
// switches. Benchmarks report CPU time beside wall time because on a shared machine the
// wall clock measures the neighbours as much as the code; bench-load reports both per run.
//
// Each reading says whether it was measured: where the system does not provide it
// (getrusage outside Unix, the thread's clock outside Linux), it is zero and not ok.
package procusage
