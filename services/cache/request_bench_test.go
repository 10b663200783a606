package cache

import (
	"context"
	"fmt"
	"testing"
)

// The request benchmarks time what a lookup and a store cost besides the vector search:
// validation, keys, the policy's prompt scans, the embedding, the exact get, the lease and
// the put. Each prompt gets a partition of its own (its context fingerprint), so the
// search finds an empty partition and costs next to nothing; the question is the one
// `mantle bench-load` sends, unique per request.
//
//	go test -run '^$' -bench 'LookupStore|PromptSkip|DeriveKeys|LexicalEmbed' -benchmem ./services/cache/

// BenchmarkLookupStore is one miss that takes a lease and the store that answers it, under
// the default configuration (its markers, patterns and detection).
func BenchmarkLookupStore(b *testing.B) {
	cfg := DefaultConfig()
	cfg.MaxEntries = 10_000 // bounded: the evictions are part of a store at capacity
	f := newFixture(b, cfg)
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		p := basePrompt(numberedQuestion(i))
		p.Temperature = new(float64)
		p.ContextFingerprint = fmt.Sprint(i)
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
