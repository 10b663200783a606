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

	"github.com/mantle-mesh/mantle/services/cache/internal/embed"
	"github.com/mantle-mesh/mantle/services/cache/internal/vector"
)

// The index benchmarks time EmbeddedIndex.Search alone in one partition of 10k, 100k and 1M
// entries, built directly (no service, no RPC), with the bounded search the index uses and
// the exact search (index=exact: every qualifying vector scored) side by side:
//
//	go test -run '^$' -bench 'IndexLookup' -benchtime 2000x ./services/cache/
//
// Two corpora: support questions (bench_test.go's, sharing words as real ones do) and
// numbered prompts that differ only in a number, which is what `mantle bench-load` sends
// and the worst case for an inverted index (every entry shares every common word).

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

// buildIndexes stores the questions in an index with the default limits and in an exact
// one; both share the vectors.
func buildIndexes(tb testing.TB, questions []string) (bounded, exact *EmbeddedIndex) {
	tb.Helper()
	bounded = NewEmbeddedIndex(len(questions))
	exact = newEmbeddedIndex(len(questions), vector.Limits{})
	e := embed.NewLexical()
	for i, q := range questions {
		v, err := e.Embed(context.Background(), q)
		if err != nil {
			tb.Fatalf("Embed(%q): %v", q, err)
		}
		for _, x := range []*EmbeddedIndex{bounded, exact} {
			if err := x.Put(context.Background(), benchEntry(i), v); err != nil {
				tb.Fatalf("Put: %v", err)
			}
		}
	}
	return bounded, exact
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
	for _, n := range []int{10_000, 100_000, 1_000_000} {
		for _, corpus := range []string{"support", "numbered"} {
			b.Run(fmt.Sprintf("entries=%d/corpus=%s", n, corpus), func(b *testing.B) {
				questions := indexCorpus(corpus, n)
				bounded, exact := buildIndexes(b, questions)
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
				for _, idx := range []struct {
					name string
					x    *EmbeddedIndex
				}{{"bounded", bounded}, {"exact", exact}} {
					for _, qs := range []struct {
						name    string
						queries []Query
					}{{"semantic", semantic}, {"miss", miss}} {
						b.Run(fmt.Sprintf("index=%s/query=%s", idx.name, qs.name), func(b *testing.B) {
							runIndexLookups(b, idx.x, qs.queries)
						})
					}
				}
				runtime.KeepAlive(questions)
			})
		}
	}
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
		cpuStart, cpuOK := threadCPUTime()
		start := time.Now()
		c, err := x.Search(ctx, queries[i%len(queries)])
		wall = append(wall, time.Since(start))
		if cpuEnd, ok := threadCPUTime(); ok && cpuOK {
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
