package cache

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/mantle-mesh/mantle/pkg/procusage"
	"github.com/mantle-mesh/mantle/services/cache/internal/embed"
	"github.com/mantle-mesh/mantle/services/cache/internal/vector"
)

// The index benchmarks time EmbeddedIndex.Search alone in one partition, built directly
// (no service, no RPC) at run time, of the sizes MANTLE_BENCH_CACHE_ENTRIES lists
// (benchSizes), with the search the index uses (index=graph: the graph past
// sparseGraph.MinLen entries) and, up to 100k entries, the exact search (index=exact:
// every qualifying vector scored) side by side:
//
//	MANTLE_BENCH_CACHE_ENTRIES=10000,100000,1000000 go test -run '^$' -bench 'IndexLookup' -benchtime 2000x -timeout 3h ./services/cache/
//
// Two corpora: support questions (bench_test.go's, sharing words as real ones do) and
// numbered prompts that differ only in a number, which is what `mantle bench-load` sends
// and the worst case for an inverted index (every entry shares every common word) and for
// a graph (every entry is about as close to every other).

// indexCorpus draws n distinct questions of one corpus.
func indexCorpus(kind string, n int) []string {
	out := make([]string, 0, n)
	if kind == "numbered" {
		for i := range n {
			out = append(out, numberedQuestion(i))
		}
		return out
	}
	r := rand.New(rand.NewPCG(1, 2))
	seen := make(map[string]bool, n)
	for len(out) < n {
		q := benchQuestion(r)
		if !seen[q] {
			seen[q] = true
			out = append(out, q)
		}
	}
	return out
}

func numberedQuestion(i int) string {
	return fmt.Sprintf("Benchmark request %d: how long does a parcel to Lisbon take?", i)
}

var benchPartition = Key(sha256.Sum256([]byte("one partition")))

// benchEntry is a minimal entry of the one partition; its key is derived from i.
func benchEntry(i int) Entry {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(i))
	return Entry{ID: fmt.Sprint(i), Key: sha256.Sum256(b[:]), Partition: benchPartition, Tenant: "acme", Namespace: embed.LexicalNamespace,
		ExpiresAt: epoch.Add(time.Hour), StaleUntil: epoch.Add(time.Hour)}
}

// buildIndexes stores the questions in an index as NewEmbeddedIndex makes it and, when
// exact is set, in one that searches exactly; both share the vectors, which are returned.
// Each question is stored as the service stores an answer: looked up first (a miss), then
// put with what that search found near it (PutNear). Vectors are linked into the graph as
// they are stored, as Put does without a linker.
func buildIndexes(tb testing.TB, questions []string, withExact bool) (approx, exact *EmbeddedIndex, vecs []vector.Vector) {
	tb.Helper()
	approx = NewEmbeddedIndex(len(questions), 0)
	if withExact {
		exact = newEmbeddedIndex(len(questions), vector.Limits{}, vector.Graph{}, vector.Graph{})
	}
	e := embed.NewLexical()
	vecs = make([]vector.Vector, 0, len(questions))
	for i, q := range questions {
		v, err := e.Embed(context.Background(), q)
		if err != nil {
			tb.Fatalf("Embed(%q): %v", q, err)
		}
		vecs = append(vecs, v)
		lookupAndPut(tb, approx, benchEntry(i), v)
		if exact != nil {
			if err := exact.Put(context.Background(), benchEntry(i), v, nil); err != nil {
				tb.Fatalf("Put: %v", err)
			}
		}
	}
	return approx, exact, vecs
}

// lookupAndPut stores e as the service stores the answer to a lookup that missed: the
// lookup's search records what it found near v, and the put links v from that.
func lookupAndPut(tb testing.TB, x *EmbeddedIndex, e Entry, v vector.Vector) {
	tb.Helper()
	near := new(vector.Near)
	th := defaultThresholds(EmbedderLexical)
	q := Query{Tenant: e.Tenant, Partition: e.Partition, Namespace: e.Namespace, Vector: v,
		Limit: candidateLimit, MinScore: float32(th.normal - reportMargin), Now: epoch, FreshOnly: true, Near: near}
	if _, err := x.Search(context.Background(), q); err != nil {
		tb.Fatalf("Search: %v", err)
	}
	if err := x.Put(context.Background(), e, v, near); err != nil {
		tb.Fatalf("Put: %v", err)
	}
}

// lexicalQuery is the query the service sends for question in normal mode.
func lexicalQuery(tb testing.TB, question string) Query {
	tb.Helper()
	v, err := embed.NewLexical().Embed(context.Background(), question)
	if err != nil {
		tb.Fatalf("Embed(%q): %v", question, err)
	}
	th := defaultThresholds(EmbedderLexical)
	return Query{Tenant: "acme", Partition: benchPartition, Namespace: embed.LexicalNamespace, Vector: v,
		Limit: candidateLimit, MinScore: float32(th.normal - reportMargin), Now: epoch, FreshOnly: true}
}

// rewordedQuestion is q asked in other words, as reworded does for prompts.
func rewordedQuestion(q string) string {
	p := reworded(basePrompt(q))
	return p.Messages[1].Content
}

func BenchmarkIndexLookup(b *testing.B) {
	for _, n := range benchSizes(b) {
		for _, corpus := range []string{"support", "numbered"} {
			b.Run(fmt.Sprintf("entries=%d/corpus=%s", n, corpus), func(b *testing.B) {
				questions := indexCorpus(corpus, n)
				approx, exact, vecs := buildIndexes(b, questions, n <= 100_000)
				// Queries are embedded beforehand: only the search is timed.
				r := rand.New(rand.NewPCG(3, 4))
				var semantic, miss []Query
				for range 1024 {
					semantic = append(semantic, lexicalQuery(b, rewordedQuestion(questions[r.IntN(n)])))
					fresh := benchQuestion(r) + " today"
					if corpus == "numbered" {
						fresh = numberedQuestion(n + r.IntN(n))
					}
					miss = append(miss, lexicalQuery(b, fresh))
				}
				indexes := []struct {
					name string
					x    *EmbeddedIndex
				}{{"graph", approx}, {"exact", exact}}
				for _, idx := range indexes {
					if idx.x == nil {
						continue
					}
					for _, qs := range []struct {
						name    string
						queries []Query
					}{{"semantic", semantic}, {"miss", miss}} {
						b.Run(fmt.Sprintf("index=%s/query=%s", idx.name, qs.name), func(b *testing.B) {
							runIndexLookups(b, idx.x, qs.queries)
							if idx.name == "graph" {
								b.ReportMetric(recallAt1(b, idx.x, qs.queries[:100], vecs), "recall@1")
							}
						})
					}
				}
				runtime.KeepAlive(questions)
			})
		}
	}
}

// recallAt1 is the share of queries whose best candidate has the best score any stored
// vector reaches (at or above the query's minimum), by scoring every vector.
func recallAt1(tb testing.TB, x *EmbeddedIndex, queries []Query, vecs []vector.Vector) float64 {
	tb.Helper()
	found, asked := 0, 0
	for _, q := range queries {
		best := float32(0)
		for _, v := range vecs {
			best = max(best, vector.Dot(q.Vector, v))
		}
		if best < q.MinScore || best <= 0 {
			continue // nothing to find
		}
		asked++
		got, err := x.Search(context.Background(), q)
		if err != nil {
			tb.Fatalf("Search: %v", err)
		}
		if len(got) > 0 && got[0].Score == best {
			found++
		}
	}
	if asked == 0 {
		return 1
	}
	return float64(found) / float64(asked)
}

// runIndexLookups times searches and reports the percentiles of their wall and CPU time
// (as runLookups does) and the share that found a candidate.
func runIndexLookups(b *testing.B, x *EmbeddedIndex, queries []Query) {
	ctx := context.Background()
	wall := make([]time.Duration, 0, 1<<14)
	cpu := make([]time.Duration, 0, 1<<14)
	found := 0
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		cpuStart, cpuOK := procusage.ThreadCPU()
		start := time.Now()
		c, err := x.Search(ctx, queries[i%len(queries)])
		wall = append(wall, time.Since(start))
		if cpuEnd, ok := procusage.ThreadCPU(); ok && cpuOK {
			cpu = append(cpu, cpuEnd-cpuStart)
		}
		if err != nil {
			b.Fatalf("Search: %v", err)
		}
		if len(c) > 0 {
			found++
		}
		i++
	}
	b.StopTimer()
	reportPercentiles(b, wall, cpu)
	b.ReportMetric(float64(found)/float64(len(wall)), "found-ratio")
}

// BenchmarkIndexLink times storing one new entry, and linking its vector into the graph,
// in a partition of linkBase entries of one corpus (past sparseGraph.MinLen, so every new
// entry is linked, as under `mantle bench-load`): what the linker spends per stored answer,
// after a lookup of the same vector (after=lookup, as the service stores an answer: the
// lookup is not timed, and its walk stands in for the linking's search) and without one
// (after=none: a store without a lease, or whose lookup did not walk the graph).
// The partition grows by one entry per op; run it with a fixed -benchtime (2000x) so that
// runs compare the same sizes.
//
//	go test -run '^$' -bench 'IndexLink' -benchtime 2000x -count 6 ./services/cache/
func BenchmarkIndexLink(b *testing.B) {
	const linkBase = 20_000
	for _, corpus := range []string{"support", "numbered"} {
		for _, after := range []string{"lookup", "none"} {
			b.Run("corpus="+corpus+"/after="+after, func(b *testing.B) {
				// The base and the new questions are drawn together, so that the new ones
				// are as distinct from the base as from each other.
				questions := indexCorpus(corpus, linkBase+20_000)
				x, _, _ := buildIndexes(b, questions[:linkBase], false)
				e := embed.NewLexical()
				extra := questions[linkBase:]
				vecs := make([]vector.Vector, len(extra))
				for i, q := range extra {
					v, err := e.Embed(context.Background(), q)
					if err != nil {
						b.Fatalf("Embed(%q): %v", q, err)
					}
					vecs[i] = v
				}
				ctx := context.Background()
				th := defaultThresholds(EmbedderLexical)
				// The linking runs on this goroutine (no linker), so the thread's CPU time
				// is its cost, which neighbours on a shared machine disturb less than wall
				// time.
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				b.ReportAllocs()
				var cpu time.Duration
				i := 0
				for b.Loop() {
					if i == len(vecs) {
						b.Fatalf("more than %d ops: use a fixed -benchtime", len(vecs))
					}
					var near *vector.Near
					if after == "lookup" {
						b.StopTimer()
						near = new(vector.Near)
						q := Query{Tenant: "acme", Partition: benchPartition, Namespace: embed.LexicalNamespace, Vector: vecs[i],
							Limit: candidateLimit, MinScore: float32(th.normal - reportMargin), Now: epoch, FreshOnly: true, Near: near}
						if _, err := x.Search(ctx, q); err != nil {
							b.Fatalf("Search: %v", err)
						}
						b.StartTimer()
					}
					cpuStart, startOK := procusage.ThreadCPU()
					if err := x.Put(ctx, benchEntry(linkBase+i), vecs[i], near); err != nil {
						b.Fatalf("Put: %v", err)
					}
					if cpuEnd, ok := procusage.ThreadCPU(); ok && startOK {
						cpu += cpuEnd - cpuStart
					}
					i++
				}
				if i > 0 && cpu > 0 {
					b.ReportMetric(float64(cpu)/float64(i), "cpu-ns/op")
				}
				if n := x.LinkBacklog(); n != 0 {
					b.Fatalf("%d vectors left unlinked", n)
				}
			})
		}
	}
}
