package cache

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/mantle-mesh/mantle/pkg/procusage"
	"github.com/mantle-mesh/mantle/services/cache/internal/embed"
	"github.com/mantle-mesh/mantle/services/cache/internal/vector"
)

// nopIndex keeps nothing: every get and search misses, every put succeeds.
type nopIndex struct{}

func (nopIndex) Get(context.Context, string, Key, time.Time) (Entry, bool, error) {
	return Entry{}, false, nil
}
func (nopIndex) Search(context.Context, Query) ([]Candidate, error)            { return nil, nil }
func (nopIndex) Put(context.Context, Entry, vector.Vector, *vector.Near) error { return nil }
func (nopIndex) Delete(context.Context, Filter) (int, error)                   { return 0, nil }

// The request benchmarks time what a lookup and a store cost besides the index: validation,
// keys, the policy's prompt scans, the embedding, the lease and the metrics. The index
// keeps nothing (nopIndex), so its get, search and put cost nothing; the question is the
// one `mantle bench-load` sends, unique per request.
//
//	go test -run '^$' -bench 'LookupStore|PromptSkip|DeriveKeys|LexicalEmbed' -benchmem ./services/cache/

// BenchmarkLookupStore is one miss that takes a lease and the store that answers it, under
// the default configuration (its markers, patterns and detection).
func BenchmarkLookupStore(b *testing.B) {
	f := newFixtureWith(b, DefaultConfig(), nopIndex{}, embed.NewLexical())
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		p := basePrompt(numberedQuestion(i))
		p.Temperature = new(float64)
		res, err := f.svc.Lookup(ctx, "acme", LookupRequest{Prompt: p, Coalesce: true})
		if err != nil || res.Hit || res.Lease == nil {
			b.Fatalf("Lookup = (%+v, %v), want a miss with a lease", res, err)
		}
		req := answer(p)
		req.LeaseID = res.Lease.ID
		if st, err := f.svc.Store(ctx, "acme", req); err != nil || !st.Stored {
			b.Fatalf("Store = (%+v, %v)", st, err)
		}
		i++
	}
}

// benchPromptTexts are user turns for the prompt scans: the bench-load question, support
// questions in English and Chinese, and turns that the personal patterns or markers catch.
var benchPromptTexts = []struct{ name, text string }{
	{"numbered", numberedQuestion(123456)},
	{"support", "How do I reset my Acme router A123 after a power cut?"},
	{"chinese", "华为手机 B456买了30天还能退货吗"},
	{"long", "Our team of twelve engineers is migrating a monolith to services over the next quarter; we deploy twice a week, run 3 regions and 40 nodes, and want to know which rollout strategy keeps the error budget intact while schema changes land in between."},
	{"phone", "Call me at +1 415 555 0100 about the order"},
	{"email", "Send the invoice to jane.doe@example.com"},
}

// BenchmarkPromptSkip is the policy's prompt scans under the default policy.
func BenchmarkPromptSkip(b *testing.B) {
	pol := compilePolicy(DefaultConfig().DefaultPolicy, defaultThresholds(EmbedderLexical))
	for _, tt := range benchPromptTexts {
		b.Run(tt.name, func(b *testing.B) {
			p := basePrompt(tt.text)
			p.Temperature = new(float64)
			lastUser := normalizeText(tt.text)
			b.ReportAllocs()
			for b.Loop() {
				pol.promptSkip(p, lastUser)
			}
		})
	}
}

// BenchmarkDeriveKeys is the naming of one prompt.
func BenchmarkDeriveKeys(b *testing.B) {
	for _, tt := range benchPromptTexts[:3] {
		b.Run(tt.name, func(b *testing.B) {
			p := basePrompt(tt.text)
			b.ReportAllocs()
			for b.Loop() {
				deriveKeys("acme", "lexical-v1", p)
			}
		})
	}
}

// BenchmarkMissStore is what `mantle bench-load --temperature 0` costs the cache per
// request: a lookup of a prompt never asked before (a miss that takes a lease), the store
// of its answer, and the linking of its vector into the partition's graph, in an index
// as the module runs it (NewEmbeddedIndex under the default bounds, RunLinker beside the
// requests). It is warmed with prompts of the same template in one partition until the
// bounds evict (about 35k entries), so that every store also evicts the least recently
// used entry. cpu-ns/op is the CPU time of the whole process (the linker and the collector
// included) per request; the vectors still waiting when the loop ends are linked before it
// is read.
//
//	go test -run '^$' -bench 'MissStore' -benchtime 20000x -count 6 ./services/cache/
func BenchmarkMissStore(b *testing.B) {
	cfg := DefaultConfig()
	x := NewEmbeddedIndex(cfg.MaxEntries, cfg.MaxBytes)
	f := newFixtureWith(b, cfg, x, embed.NewLexical())
	ctx := context.Background()
	request := func(i int) {
		p := basePrompt(numberedQuestion(i))
		p.Temperature = new(float64)
		res, err := f.svc.Lookup(ctx, "acme", LookupRequest{Prompt: p, Coalesce: true})
		if err != nil || res.Hit || res.Lease == nil {
			b.Fatalf("Lookup(%d) = (%+v, %v), want a miss with a lease", i, res, err)
		}
		req := answer(p)
		req.LeaseID = res.Lease.ID
		if st, err := f.svc.Store(ctx, "acme", req); err != nil || !st.Stored {
			b.Fatalf("Store(%d) = (%+v, %v)", i, st, err)
		}
	}
	// Warmed without the linker: each store links its vector before it returns.
	i := 0
	for ; x.Evictions() == 0; i++ {
		if i == cfg.MaxEntries {
			b.Fatalf("%d entries in %d bytes evicted none", x.Len(), x.Bytes())
		}
		request(i)
	}
	warm := i
	linkCtx, stopLinking := context.WithCancel(ctx)
	linked := make(chan struct{})
	go func() {
		defer close(linked)
		x.RunLinker(linkCtx, clockwork.NewRealClock())
	}()
	runtime.GC()
	b.ReportAllocs()
	cpuStart, startOK := procusage.CPU()
	for b.Loop() {
		request(i)
		i++
	}
	stopLinking()
	<-linked
	x.linkAll()
	if cpuEnd, ok := procusage.CPU(); ok && startOK {
		b.ReportMetric(float64(cpuEnd-cpuStart)/float64(i-warm), "cpu-ns/op")
	}
	b.ReportMetric(float64(x.Len()), "entries")
}
