package cache

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/cache/internal/embed"
	"github.com/mantle-mesh/mantle/services/cache/internal/nearmiss"
	"github.com/mantle-mesh/mantle/services/cache/internal/vector"
)

type fixture struct {
	svc   *Service
	clock *clockwork.FakeClock
	index Index
	reg   *prometheus.Registry
}

// newFixture serves cfg from a fresh embedded index with the lexical embedder.
func newFixture(t testing.TB, cfg Config) fixture {
	t.Helper()
	idx := NewEmbeddedIndex(cfg.MaxEntries, cfg.MaxBytes)
	f := newFixtureWith(t, cfg, idx, embed.NewLexical())
	if err := registerEmbeddedIndexMetrics(f.reg, idx); err != nil {
		t.Fatalf("registerEmbeddedIndexMetrics: %v", err)
	}
	return f
}

func newFixtureWith(t testing.TB, cfg Config, index Index, embedder Embedder) fixture {
	t.Helper()
	clock := clockwork.NewFakeClockAt(epoch)
	reg := prometheus.NewRegistry()
	svc, err := NewService(cfg, Deps{Index: index, Embedder: embedder, Clock: clock, Metrics: reg})
	if err != nil {
		t.Fatalf("NewService: %v", err)
	}
	return fixture{svc: svc, clock: clock, index: index, reg: reg}
}

// answer is a cacheable, verified answer to p under the default policy.
func answer(p Prompt) StoreRequest {
	return StoreRequest{
		Prompt:       p,
		Content:      "Click “Forgot password” on the sign-in page.",
		SourceModel:  "gpt-4o-mini-2024-07-18",
		FinishReason: "stop",
		Usage:        Usage{InputTokens: 20, OutputTokens: 12, TotalTokens: 32},
		Verified:     true,
	}
}

func (f fixture) mustStore(t testing.TB, tenant string, req StoreRequest) StoreResult {
	t.Helper()
	res, err := f.svc.Store(context.Background(), tenant, req)
	if err != nil {
		t.Fatalf("Store: %v", err)
	}
	if !res.Stored {
		t.Fatalf("Store skipped (%s); want stored", res.SkippedReason)
	}
	return res
}

func (f fixture) lookupMode(t testing.TB, tenant string, p Prompt, mode Mode) LookupResult {
	t.Helper()
	res, err := f.svc.Lookup(context.Background(), tenant, LookupRequest{Prompt: p, Mode: mode})
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	return res
}

func (f fixture) lookup(t testing.TB, tenant string, p Prompt) (Entry, bool) {
	t.Helper()
	res := f.lookupMode(t, tenant, p, ModeNormal)
	return res.Entry, res.Hit
}

func TestStoreThenLookupHits(t *testing.T) {
	t.Parallel()
	for _, b := range testBackends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			f := newFixtureWith(t, DefaultConfig(), b.open(t), embed.NewLexical())
			stored := f.mustStore(t, "acme", answer(basePrompt("How do I reset my password?")))
			f.clock.Advance(5 * time.Minute)

			// Another spelling of the same question finds the same entry exactly.
			res := f.lookupMode(t, "acme", basePrompt("ＨＯＷ ＤＯ Ｉ  ＲＥＳＥＴ ＭＹ ＰＡＳＳＷＯＲＤ？"), ModeNormal)
			if !res.Hit || res.Match != MatchExact || res.Similarity != 1 || res.Stale || res.Approximate || res.Age != 5*time.Minute {
				t.Fatalf("Lookup = %+v; want an exact, fresh hit aged 5m", res)
			}
			k := deriveKeys("acme", "lexical-v1", basePrompt("How do I reset my password?"))
			want := Entry{
				ID:           stored.EntryID,
				Key:          k.Exact,
				Partition:    k.Partition,
				Tenant:       "acme",
				Scenario:     "support",
				Namespace:    "lexical-v1",
				Question:     "How do I reset my password?",
				Content:      "Click “Forgot password” on the sign-in page.",
				SourceModel:  "gpt-4o-mini-2024-07-18",
				FinishReason: "stop",
				Usage:        Usage{InputTokens: 20, OutputTokens: 12, TotalTokens: 32},
				CreatedAt:    epoch,
				ExpiresAt:    epoch.Add(time.Hour),
				StaleUntil:   epoch.Add(25 * time.Hour),
			}
			if !entriesEqual(res.Entry, want) {
				t.Errorf("Lookup entry\n got %+v\nwant %+v", res.Entry, want)
			}

			// A reworded question finds it by similarity.
			res = f.lookupMode(t, "acme", basePrompt("How can I reset my password"), ModeNormal)
			if !res.Hit || res.Match != MatchSemantic || res.Entry.ID != stored.EntryID || res.Similarity >= 1 || res.Similarity < 0.9 {
				t.Errorf("Lookup of a rewording = %+v; want a semantic hit on %s", res, stored.EntryID)
			}
		})
	}
}

func TestLookupMissesOutsideTheScope(t *testing.T) {
	t.Parallel()
	float := func(v float64) *float64 { return &v }
	tests := []struct {
		name   string
		tenant string
		change func(p *Prompt)
	}{
		{name: "same scope hits (control)", tenant: "acme"},
		{name: "other tenant", tenant: "globex"},
		{name: "other model", tenant: "acme", change: func(p *Prompt) { p.Model = "claude-3-5-haiku" }},
		{name: "other scenario", tenant: "acme", change: func(p *Prompt) { p.Scenario = "sales" }},
		{name: "other system prompt", tenant: "acme", change: func(p *Prompt) { p.Messages[0].Content = "Answer in French." }},
		{name: "other temperature bucket", tenant: "acme", change: func(p *Prompt) { p.Temperature = float(0.0) }},
		{name: "other response format", tenant: "acme", change: func(p *Prompt) { p.ResponseFormat.Type = FormatJSONObject }},
		{name: "other max_tokens", tenant: "acme", change: func(p *Prompt) { p.MaxTokens = 16 }},
		{name: "other tools", tenant: "acme", change: func(p *Prompt) { p.ContextFingerprint = "tools:weather" }},
	}
	for _, b := range testBackends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			f := newFixtureWith(t, DefaultConfig(), b.open(t), embed.NewLexical())
			f.mustStore(t, "acme", answer(basePrompt("how do i reset my password")))
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					// Exact and reworded questions alike stay in their scope.
					for _, question := range []string{"how do i reset my password", "How can I reset my password?"} {
						p := basePrompt(question)
						if tt.change != nil {
							tt.change(&p)
						}
						wantHit := tt.change == nil && tt.tenant == "acme"
						if _, hit := f.lookup(t, tt.tenant, p); hit != wantHit {
							t.Errorf("%q: hit = %v, want %v", question, hit, wantHit)
						}
					}
				})
			}
		})
	}
}

// TestTenantIsolation stores the same questions for two tenants with different answers:
// each tenant gets its own, a third gets nothing, and removing one tenant's entries leaves
// the other's. It runs against every backend.
func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	questions := []string{"How do I reset my password?", "怎么重置密码", "What is your refund policy?"}
	rewordings := []string{"How can I reset my password", "如何重置密码", "What is the refund policy"}
	for _, b := range testBackends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			f := newFixtureWith(t, DefaultConfig(), b.open(t), embed.NewLexical())
			for _, tenant := range []string{"acme", "globex"} {
				for _, q := range questions {
					req := answer(basePrompt(q))
					req.Content = tenant + "'s answer to " + q
					f.mustStore(t, tenant, req)
				}
			}
			for _, tenant := range []string{"acme", "globex", "initech"} {
				for i := range questions {
					for _, q := range []string{questions[i], rewordings[i]} {
						for _, mode := range []Mode{ModeNormal, ModeApproximate} {
							res := f.lookupMode(t, tenant, basePrompt(q), mode)
							switch {
							case tenant == "initech" && res.Hit:
								t.Errorf("initech got %q for %q", res.Entry.Content, q)
							case tenant != "initech" && !res.Hit:
								t.Errorf("%s missed %q (mode %d)", tenant, q, mode)
							case res.Hit && (res.Entry.Tenant != tenant || res.Entry.Content != tenant+"'s answer to "+questions[i]):
								t.Errorf("%s asked %q and got %q of %s", tenant, q, res.Entry.Content, res.Entry.Tenant)
							}
						}
					}
				}
			}
			if _, err := f.svc.Invalidate(context.Background(), InvalidateRequest{Tenant: "acme", All: true}); err != nil {
				t.Fatalf("Invalidate: %v", err)
			}
			for _, q := range questions {
				if _, hit := f.lookup(t, "acme", basePrompt(q)); hit {
					t.Errorf("acme still hits %q after invalidating all", q)
				}
				if e, hit := f.lookup(t, "globex", basePrompt(q)); !hit || e.Tenant != "globex" {
					t.Errorf("globex lost %q when acme was invalidated", q)
				}
			}
		})
	}
}

// fixedEmbedder maps questions to chosen dense vectors, so a test can set similarities
// exactly; other questions get a vector orthogonal to all of them.
type fixedEmbedder map[string][]float32

func (fixedEmbedder) Namespace() string { return "fixed-v1" }
func (e fixedEmbedder) Embed(_ context.Context, text string) (vector.Vector, error) {
	if x, ok := e[text]; ok {
		return vector.NewDense(x)
	}
	return vector.NewDense([]float32{0, 0, 1})
}

// at returns a 3-D unit vector whose cosine with (1, 0, 0) is cos.
func at(cos float64) []float32 { return []float32{float32(cos), float32(math.Sqrt(1 - cos*cos)), 0} }

// TestNearMissGuardWhateverTheScore gives every question the same vector, so every
// candidate scores 1: only the near-miss check can tell them apart.
func TestNearMissGuardWhateverTheScore(t *testing.T) {
	t.Parallel()
	tests := []struct {
		stored, query string
		wantReason    nearmiss.Reason
	}{
		{"How do I return an iPhone 15?", "How do I return an iPhone 14?", nearmiss.Number},
		{"三天内能退货吗", "七天内能退货吗", nearmiss.Number},
		{"Is the store open on Saturday?", "Is the store open on Sunday?", nearmiss.Date},
		{"为什么能退款", "为什么不能退款", nearmiss.Negation},
		{"Why can I log in?", "Why can't I log in?", nearmiss.Negation},
		{`What does "idempotent" mean?`, `What does "immutable" mean?`, nearmiss.Quote},
		{"How do I cancel Netflix?", "How do I cancel Spotify?", nearmiss.Entity},
		{"How do I reset my password?", "how can i reset my password", ""},
	}
	same := make(fixedEmbedder)
	for _, tt := range tests {
		same[foldText(tt.stored)], same[foldText(tt.query)] = at(1), at(1)
	}
	for _, b := range testBackends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			for _, tt := range tests {
				t.Run(tt.query, func(t *testing.T) {
					f := newFixtureWith(t, DefaultConfig(), b.open(t), same)
					stored := f.mustStore(t, "acme", answer(basePrompt(tt.stored)))
					res := f.lookupMode(t, "acme", basePrompt(tt.query), ModeApproximate)
					if tt.wantReason == "" {
						if !res.Hit || res.Match != MatchSemantic {
							t.Errorf("Lookup = %+v, want a semantic hit", res)
						}
						return
					}
					if res.Hit {
						t.Fatalf("Lookup hit %q for %q at similarity %v; want a rejection", tt.stored, tt.query, res.Similarity)
					}
					if r := res.Rejected; r == nil || r.Reason != string(tt.wantReason) || r.EntryID != stored.EntryID || r.Similarity != 1 || r.Detail == "" {
						t.Errorf("rejected = %+v, want entry %s rejected for %s at similarity 1, with a detail", r, stored.EntryID, tt.wantReason)
					}
				})
			}
		})
	}
}

func TestSemanticLookupWithTheLexicalEmbedder(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.DefaultPolicy.Threshold = 0.85 // low, so that the near-miss check has work to do
	tests := []struct {
		name, stored, query string
		wantHit             bool
		wantReason          string
	}{
		{"rewording hits", "How do I reset my password?", "how to reset my password", true, ""},
		{"chinese rewording hits", "怎么重置密码", "请问如何重置密码？", true, ""},
		{"changed number", "How do I return an iPhone 15 that I bought online last month from your store?",
			"How do I return an iPhone 14 that I bought online last month from your store?", false, string(nearmiss.Number)},
		{"negation", "为什么能退款到原来的支付账户", "为什么不能退款到原来的支付账户", false, string(nearmiss.Negation)},
		{"english negation", "Why can I log in to the admin dashboard from my phone?", "Why can't I log in to the admin dashboard from my phone?", false, string(nearmiss.Negation)},
		{"other product scores low", "How do I cancel Netflix?", "How do I cancel Spotify?", false, ""},
		{"unrelated", "How do I reset my password?", "What is your refund policy?", false, ""},
	}
	for _, b := range testBackends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					f := newFixtureWith(t, cfg, b.open(t), embed.NewLexical())
					stored := f.mustStore(t, "acme", answer(basePrompt(tt.stored)))
					res := f.lookupMode(t, "acme", basePrompt(tt.query), ModeNormal)
					if res.Hit != tt.wantHit {
						t.Fatalf("hit = %v (rejected %+v), want %v", res.Hit, res.Rejected, tt.wantHit)
					}
					if tt.wantReason != "" {
						r := res.Rejected
						if r == nil || r.Reason != tt.wantReason || r.EntryID != stored.EntryID || r.Similarity < 0.85 {
							t.Errorf("rejected = %+v, want entry %s rejected for %s at 0.85 or more", r, stored.EntryID, tt.wantReason)
						}
					}
				})
			}
		})
	}
}

func TestThresholdsPerScenario(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.Scenarios = map[string]ScenarioPolicy{"strict": {Threshold: new(0.99)}}
	f := newFixture(t, cfg)
	for _, scenario := range []string{"support", "strict"} {
		p := basePrompt("How do I reset my password?")
		p.Scenario = scenario
		f.mustStore(t, "acme", answer(p))
	}
	for _, tt := range []struct {
		scenario   string
		wantHit    bool
		wantReason string
	}{{"support", true, ""}, {"strict", false, rejectBelowThreshold}} {
		p := basePrompt("How can I reset my password") // about 0.98 to the stored question
		p.Scenario = tt.scenario
		res := f.lookupMode(t, "acme", p, ModeNormal)
		if res.Hit != tt.wantHit || (tt.wantReason != "" && (res.Rejected == nil || res.Rejected.Reason != tt.wantReason)) {
			t.Errorf("%s: %+v, want hit %v (rejected for %q)", tt.scenario, res, tt.wantHit, tt.wantReason)
		}
	}
}

// TestStaleAndApproximateModes walks an entry through its life: fresh, stale (served only
// in cache-only mode, and only to close questions), then gone; and serves a related answer
// below the normal threshold only in approximate mode.
func TestStaleAndApproximateModes(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.DefaultPolicy.Threshold, cfg.DefaultPolicy.StaleThreshold, cfg.DefaultPolicy.ApproximateThreshold = 0.92, 0.95, 0.85
	cfg.DefaultPolicy.MaxStaleness = 6 * time.Hour
	const (
		stored  = "How do I reset my password?"
		near    = "How should I reset my password?"        // 0.97: above normal and stale
		mid     = "Please tell me how to reset a password" // 0.93: above normal, below stale
		far     = "I want to reset my password, how?"      // 0.88: approximate only
		distant = "What is a password?"                    // 0.70: never
	)
	emb := fixedEmbedder{stored: at(1), near: at(0.97), mid: at(0.93), far: at(0.88), distant: at(0.70)}
	for _, b := range testBackends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			f := newFixtureWith(t, cfg, b.open(t), emb)
			f.mustStore(t, "acme", answer(basePrompt(stored)))

			type want struct{ hit, stale, approximate bool }
			check := func(at string, q string, mode Mode, w want) {
				t.Helper()
				res := f.lookupMode(t, "acme", basePrompt(q), mode)
				if res.Hit != w.hit || res.Stale != w.stale || res.Approximate != w.approximate {
					t.Errorf("%s, %q, mode %d: hit %v stale %v approximate %v (similarity %.2f, rejected %+v); want %+v",
						at, q, mode, res.Hit, res.Stale, res.Approximate, res.Similarity, res.Rejected, w)
				}
			}
			modes := []Mode{ModeNormal, ModeCacheOnly, ModeApproximate}
			for _, mode := range modes {
				check("fresh", stored, mode, want{hit: true})
				check("fresh", near, mode, want{hit: true})
				check("fresh", mid, mode, want{hit: true})
				check("fresh", distant, mode, want{})
			}
			check("fresh", far, ModeNormal, want{})
			check("fresh", far, ModeCacheOnly, want{})
			check("fresh", far, ModeApproximate, want{hit: true, approximate: true})

			f.clock.Advance(time.Hour) // past the TTL: stale
			for _, q := range []string{stored, near, mid, far} {
				check("stale", q, ModeNormal, want{})
			}
			check("stale", stored, ModeCacheOnly, want{hit: true, stale: true})
			check("stale", near, ModeCacheOnly, want{hit: true, stale: true})
			check("stale", mid, ModeCacheOnly, want{}) // 0.93 is below the stale threshold
			check("stale", far, ModeApproximate, want{hit: true, stale: true, approximate: true})
			check("stale", distant, ModeApproximate, want{})

			f.clock.Advance(6 * time.Hour) // past max_staleness: gone
			for _, mode := range modes {
				check("expired", stored, mode, want{})
			}
		})
	}
}

func TestStoreTTL(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		requested  time.Duration
		wantExpiry time.Duration
	}{
		{"zero uses the policy", 0, time.Hour},
		{"shorter is honoured", 10 * time.Minute, 10 * time.Minute},
		{"longer is capped at the policy", 24 * time.Hour, time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, DefaultConfig())
			req := answer(basePrompt("hello"))
			req.TTL = tt.requested
			f.mustStore(t, "acme", req)
			got, hit := f.lookup(t, "acme", req.Prompt)
			if !hit {
				t.Fatalf("miss right after Store")
			}
			if want := epoch.Add(tt.wantExpiry); !got.ExpiresAt.Equal(want) {
				t.Errorf("ExpiresAt = %v, want %v", got.ExpiresAt, want)
			}
			if want := epoch.Add(tt.wantExpiry + 24*time.Hour); !got.StaleUntil.Equal(want) {
				t.Errorf("StaleUntil = %v, want %v (ExpiresAt + max_staleness)", got.StaleUntil, want)
			}
		})
	}
}

func TestLookupDoesNotRenewTTL(t *testing.T) {
	t.Parallel()
	f := newFixture(t, DefaultConfig()) // ttl 1h
	p := basePrompt("how do i reset my password")
	f.mustStore(t, "acme", answer(p))
	f.clock.Advance(59 * time.Minute)
	if _, hit := f.lookup(t, "acme", p); !hit {
		t.Fatalf("after 59m: miss, want a hit")
	}
	f.clock.Advance(time.Minute)
	if _, hit := f.lookup(t, "acme", p); hit {
		t.Errorf("after 60m: hit, want a miss: the read must not have renewed the TTL")
	}
}

func TestStorePolicySkips(t *testing.T) {
	t.Parallel()
	float := func(v float64) *float64 { return &v }
	tests := []struct {
		name   string
		config func(c *Config)
		change func(r *StoreRequest)
		want   SkipReason
		// lookupToo: the prompt itself is refused, so a lookup does not even search.
		lookupToo bool
	}{
		{name: "scenario not cacheable", config: func(c *Config) {
			c.Scenarios = map[string]ScenarioPolicy{"support": {Cacheable: new(false)}}
		}, want: SkipNotCacheable, lookupToo: true},
		{name: "default not cacheable", config: func(c *Config) { c.DefaultPolicy.Cacheable = false }, want: SkipNotCacheable, lookupToo: true},
		{name: "volatile english marker", change: func(r *StoreRequest) {
			r.Prompt.Messages[1].Content = "What is the latest version?"
		}, want: SkipVolatilePrompt, lookupToo: true},
		{name: "volatile chinese marker", change: func(r *StoreRequest) {
			r.Prompt.Messages[1].Content = "我的订单到哪了？"
		}, want: SkipVolatilePrompt, lookupToo: true},
		{name: "volatile marker in an earlier user turn", change: func(r *StoreRequest) {
			r.Prompt.Messages = []Message{
				{Role: "user", Content: "今天金价多少"},
				{Role: "assistant", Content: "…"},
				{Role: "user", Content: "换算成美元呢"},
			}
		}, want: SkipVolatilePrompt, lookupToo: true},
		{name: "scenario's own markers", config: func(c *Config) {
			c.Scenarios = map[string]ScenarioPolicy{"support": {VolatileMarkers: []string{"password"}}}
		}, want: SkipVolatilePrompt, lookupToo: true},
		{name: "personal marker", change: func(r *StoreRequest) {
			r.Prompt.Messages[1].Content = "我的积分怎么还没到账"
		}, want: SkipPersonalPrompt, lookupToo: true},
		{name: "personal identifier", change: func(r *StoreRequest) {
			r.Prompt.Messages[1].Content = "Why was alice@example.com locked out?"
		}, want: SkipPersonalPrompt, lookupToo: true},
		{name: "temperature above the maximum", change: func(r *StoreRequest) { r.Prompt.Temperature = float(0.7) }, want: SkipHighTemperature, lookupToo: true},
		{name: "temperature unset", change: func(r *StoreRequest) { r.Prompt.Temperature = nil }, want: SkipHighTemperature, lookupToo: true},
		{name: "scenario's lower maximum", config: func(c *Config) {
			c.Scenarios = map[string]ScenarioPolicy{"support": {MaxTemperature: new(0.0)}}
		}, want: SkipHighTemperature, lookupToo: true},
		{name: "finish reason length", change: func(r *StoreRequest) { r.FinishReason = "length" }, want: SkipFinishReason},
		{name: "finish reason missing", change: func(r *StoreRequest) { r.FinishReason = "" }, want: SkipFinishReason},
		{name: "white space content", change: func(r *StoreRequest) { r.Content = " \n\t" }, want: SkipEmpty},
		{name: "not verified", change: func(r *StoreRequest) { r.Verified = false }, want: SkipNotVerified},
		{name: "degraded answer", change: func(r *StoreRequest) { r.Degraded = true }, want: SkipDegraded},
		{name: "answer from the cache", change: func(r *StoreRequest) { r.FromCache = true }, want: SkipCacheHit},
		{name: "refusal", change: func(r *StoreRequest) { r.Content = "I'm sorry, but I can't help with that." }, want: SkipRefusal},
		{name: "chinese refusal", change: func(r *StoreRequest) { r.Content = "抱歉，我无法回答这个问题。" }, want: SkipRefusal},
		{name: "error object", change: func(r *StoreRequest) { r.Content = `{"error": {"message": "overloaded"}}` }, want: SkipErrorAnswer},
		{name: "cacheable (control)", want: ""},
		{name: "temperature at the maximum (control)", change: func(r *StoreRequest) { r.Prompt.Temperature = float(0.1 + 0.2) }, want: ""},
		{name: "other scenario keeps the default (control)", config: func(c *Config) {
			c.Scenarios = map[string]ScenarioPolicy{"sales": {Cacheable: new(false)}}
		}, want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := DefaultConfig()
			if tt.config != nil {
				tt.config(&cfg)
			}
			f := newFixture(t, cfg)
			req := answer(basePrompt("how do i reset my password"))
			if tt.change != nil {
				tt.change(&req)
			}

			res, err := f.svc.Store(context.Background(), "acme", req)
			if err != nil {
				t.Fatalf("Store: %v (a policy skip is not an error)", err)
			}
			if res.SkippedReason != tt.want {
				t.Errorf("SkippedReason = %q, want %q", res.SkippedReason, tt.want)
			}
			wantStored := tt.want == ""
			if res.Stored != wantStored || (res.EntryID != "") != wantStored {
				t.Errorf("Stored = %v with id %q, want stored %v", res.Stored, res.EntryID, wantStored)
			}
			look := f.lookupMode(t, "acme", req.Prompt, ModeNormal)
			if look.Hit != wantStored {
				t.Errorf("Lookup hit = %v, want %v", look.Hit, wantStored)
			}
			if tt.lookupToo && look.MissReason != string(tt.want) {
				t.Errorf("Lookup miss reason = %q, want %q", look.MissReason, tt.want)
			}
			outcome := outcomeStored
			if !wantStored {
				outcome = string(tt.want)
			}
			if got := metricValue(t, f.reg, "mantle_cache_stores_total", map[string]string{"outcome": outcome}); got != 1 {
				t.Errorf("stores{outcome=%q} = %v, want 1", outcome, got)
			}
		})
	}
}

func TestValidation(t *testing.T) {
	t.Parallel()
	float := func(v float64) *float64 { return &v }
	tests := []struct {
		name       string
		change     func(r *StoreRequest)
		wantFields []string
	}{
		{name: "no messages", change: func(r *StoreRequest) { r.Prompt.Messages = nil }, wantFields: []string{"prompt.messages"}},
		{name: "last message from the assistant", change: func(r *StoreRequest) {
			r.Prompt.Messages = append(r.Prompt.Messages, Message{Role: "assistant", Content: "ok"})
		}, wantFields: []string{"prompt.messages[2].role"}},
		{name: "empty last message", change: func(r *StoreRequest) { r.Prompt.Messages[1].Content = "" }, wantFields: []string{"prompt.messages[1].content"}},
		{name: "negative temperature", change: func(r *StoreRequest) { r.Prompt.Temperature = float(-0.1) }, wantFields: []string{"prompt.temperature"}},
		{name: "negative max tokens", change: func(r *StoreRequest) { r.Prompt.MaxTokens = -1 }, wantFields: []string{"prompt.max_tokens"}},
		{name: "store without content", change: func(r *StoreRequest) { r.Content = "" }, wantFields: []string{"content"}},
		{name: "negative ttl", change: func(r *StoreRequest) { r.TTL = -time.Second }, wantFields: []string{"ttl"}},
		{name: "several at once", change: func(r *StoreRequest) {
			r.Prompt.Messages, r.Content = nil, ""
		}, wantFields: []string{"prompt.messages", "content"}},
	}
	f := newFixture(t, DefaultConfig())
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			req := answer(basePrompt("hello"))
			tt.change(&req)

			_, err := f.svc.Store(context.Background(), "acme", req)
			if got := violationFields(err); !slices.Equal(got, tt.wantFields) {
				t.Errorf("Store violations = %v (err %v), want %v", got, err, tt.wantFields)
			}
			// Lookup checks the prompt the same way; the other fields are Store's alone.
			wantLookup := slices.DeleteFunc(slices.Clone(tt.wantFields), func(f string) bool { return f == "content" || f == "ttl" })
			_, err = f.svc.Lookup(context.Background(), "acme", LookupRequest{Prompt: req.Prompt})
			if got := violationFields(err); !slices.Equal(got, wantLookup) {
				t.Errorf("Lookup violations = %v (err %v), want %v", got, err, wantLookup)
			}
		})
	}
}

func violationFields(err error) []string {
	var invalid *rpc.ValidationError
	if !errors.As(err, &invalid) {
		return nil
	}
	var fields []string
	for _, v := range invalid.Violations {
		fields = append(fields, v.Field)
	}
	return fields
}

func TestCallsWithoutTenantFail(t *testing.T) {
	t.Parallel()
	f := newFixture(t, DefaultConfig())
	p := basePrompt("hello")
	if _, err := f.svc.Lookup(context.Background(), "", LookupRequest{Prompt: p}); !errors.Is(err, ErrNoTenant) {
		t.Errorf("Lookup error = %v, want ErrNoTenant", err)
	}
	if _, err := f.svc.Store(context.Background(), "", answer(p)); !errors.Is(err, ErrNoTenant) {
		t.Errorf("Store error = %v, want ErrNoTenant", err)
	}
	if _, err := f.svc.Invalidate(context.Background(), InvalidateRequest{All: true}); !errors.Is(err, ErrNoTenant) {
		t.Errorf("Invalidate error = %v, want ErrNoTenant", err)
	}
	if _, err := f.svc.Release(context.Background(), "", "lease-x"); !errors.Is(err, ErrNoTenant) {
		t.Errorf("Release error = %v, want ErrNoTenant", err)
	}
}

func TestInvalidate(t *testing.T) {
	t.Parallel()
	// Each tenant gets the same three prompts, two in support and one in sales.
	prompts := map[string]Prompt{"s1": basePrompt("first question"), "s2": basePrompt("second question"), "x1": basePrompt("third question")}
	x1 := prompts["x1"]
	x1.Scenario = "sales"
	prompts["x1"] = x1
	names := []string{"s1", "s2", "x1"}

	tests := []struct {
		name        string
		req         func(ids map[string]string) InvalidateRequest
		wantRemoved int
		wantLeft    []string // acme's prompts still cached
		wantInvalid bool
	}{
		{name: "by scenario", req: func(map[string]string) InvalidateRequest {
			return InvalidateRequest{Tenant: "acme", Scenario: "support"}
		}, wantRemoved: 2, wantLeft: []string{"x1"}},
		{name: "by entry id", req: func(ids map[string]string) InvalidateRequest {
			return InvalidateRequest{Tenant: "acme", EntryID: ids["acme/s2"]}
		}, wantRemoved: 1, wantLeft: []string{"s1", "x1"}},
		{name: "another tenant's entry id removes nothing", req: func(ids map[string]string) InvalidateRequest {
			return InvalidateRequest{Tenant: "acme", EntryID: ids["globex/s1"]}
		}, wantRemoved: 0, wantLeft: []string{"s1", "s2", "x1"}},
		{name: "by namespace", req: func(map[string]string) InvalidateRequest {
			return InvalidateRequest{Tenant: "acme", Namespace: "lexical-v1"}
		}, wantRemoved: 3, wantLeft: nil},
		{name: "another namespace removes nothing", req: func(map[string]string) InvalidateRequest {
			return InvalidateRequest{Tenant: "acme", Namespace: "openai-text-embedding-3-small-1536"}
		}, wantRemoved: 0, wantLeft: []string{"s1", "s2", "x1"}},
		{name: "all", req: func(map[string]string) InvalidateRequest {
			return InvalidateRequest{Tenant: "acme", All: true}
		}, wantRemoved: 3, wantLeft: nil},
		{name: "all narrowed by scenario", req: func(map[string]string) InvalidateRequest {
			return InvalidateRequest{Tenant: "acme", Scenario: "sales", All: true}
		}, wantRemoved: 1, wantLeft: []string{"s1", "s2"}},
		{name: "nothing selected", req: func(map[string]string) InvalidateRequest {
			return InvalidateRequest{Tenant: "acme"}
		}, wantInvalid: true, wantLeft: []string{"s1", "s2", "x1"}},
	}
	for _, b := range testBackends() {
		for _, tt := range tests {
			t.Run(b.name+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				f := newFixtureWith(t, DefaultConfig(), b.open(t), embed.NewLexical())
				ids := map[string]string{}
				for _, tenant := range []string{"acme", "globex"} {
					for _, name := range names {
						ids[tenant+"/"+name] = f.mustStore(t, tenant, answer(prompts[name])).EntryID
					}
				}

				removed, err := f.svc.Invalidate(context.Background(), tt.req(ids))
				if got := violationFields(err); tt.wantInvalid != (got != nil) {
					t.Fatalf("Invalidate error = %v, want invalid %v", err, tt.wantInvalid)
				}
				if !tt.wantInvalid && err != nil {
					t.Fatalf("Invalidate: %v", err)
				}
				if removed != tt.wantRemoved {
					t.Errorf("removed %d, want %d", removed, tt.wantRemoved)
				}
				var left []string
				for _, name := range names {
					if _, hit := f.lookup(t, "acme", prompts[name]); hit {
						left = append(left, name)
					}
					if _, hit := f.lookup(t, "globex", prompts[name]); !hit {
						t.Errorf("globex lost %s; invalidation crossed tenants", name)
					}
				}
				if !slices.Equal(left, tt.wantLeft) {
					t.Errorf("acme has %v left, want %v", left, tt.wantLeft)
				}
			})
		}
	}
}

func TestStoreEvictsLeastRecentlyUsedWhenFull(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.MaxEntries = 2
	f := newFixture(t, cfg)
	first, second, third := basePrompt("first question"), basePrompt("second question"), basePrompt("third question")
	f.mustStore(t, "acme", answer(first))
	f.mustStore(t, "acme", answer(second))
	f.lookup(t, "acme", first) // a read is a use: second is now the least recently used
	f.mustStore(t, "acme", answer(third))

	for _, c := range []struct {
		name string
		p    Prompt
		want bool
	}{{"first", first, true}, {"second", second, false}, {"third", third, true}} {
		if _, hit := f.lookup(t, "acme", c.p); hit != c.want {
			t.Errorf("%s: hit = %v, want %v", c.name, hit, c.want)
		}
	}
	if got := metricValue(t, f.reg, "mantle_cache_evictions_total", nil); got != 1 {
		t.Errorf("evictions = %v, want 1", got)
	}
}

func TestExactOnlyWithoutEmbedder(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.Embedder.Kind = EmbedderNone
	f := newFixtureWith(t, cfg, NewEmbeddedIndex(10, 0), nil)
	f.mustStore(t, "acme", answer(basePrompt("How do I reset my password?")))
	if res := f.lookupMode(t, "acme", basePrompt("how do i reset my password"), ModeNormal); !res.Hit || res.Namespace != "exact" {
		t.Errorf("exact lookup = %+v, want a hit in namespace exact", res)
	}
	if _, hit := f.lookup(t, "acme", basePrompt("How can I reset my password?")); hit {
		t.Errorf("a rewording hit without an embedder")
	}
}

// failingEmbedder fails every call.
type failingEmbedder struct{ calls int }

func (*failingEmbedder) Namespace() string { return "lexical-v1" }
func (e *failingEmbedder) Embed(context.Context, string) (vector.Vector, error) {
	e.calls++
	return vector.Vector{}, errors.New("embedding endpoint down")
}

func TestEmbedderFailureKeepsExactMatches(t *testing.T) {
	t.Parallel()
	idx := NewEmbeddedIndex(10, 0)
	good := newFixtureWith(t, DefaultConfig(), idx, embed.NewLexical())
	good.mustStore(t, "acme", answer(basePrompt("How do I reset my password?")))

	emb := &failingEmbedder{}
	f := newFixtureWith(t, DefaultConfig(), idx, emb)
	if res := f.lookupMode(t, "acme", basePrompt("how do i reset my password"), ModeNormal); !res.Hit || res.Match != MatchExact {
		t.Errorf("exact lookup with a failing embedder = %+v, want an exact hit", res)
	}
	res := f.lookupMode(t, "acme", basePrompt("How can I reset my password"), ModeNormal)
	if res.Hit || res.MissReason != MissEmbedderError {
		t.Errorf("similarity lookup with a failing embedder = %+v, want a miss with reason %s", res, MissEmbedderError)
	}
	// Storing still works: the entry serves exact matches.
	f.mustStore(t, "acme", answer(basePrompt("What is your refund policy?")))
	if _, hit := good.lookup(t, "acme", basePrompt("what is your refund policy")); !hit {
		t.Errorf("the entry stored without a vector is not found exactly")
	}
	// After repeated failures the embedder is skipped for a while, then tried again.
	for range 10 {
		f.lookupMode(t, "acme", basePrompt("How can I reset my password"), ModeNormal)
	}
	before := emb.calls
	f.lookupMode(t, "acme", basePrompt("How can I reset my password"), ModeNormal)
	if emb.calls != before {
		t.Errorf("a failing embedder was called during its cooldown")
	}
	f.clock.Advance(10 * time.Second)
	f.lookupMode(t, "acme", basePrompt("How can I reset my password"), ModeNormal)
	if emb.calls != before+1 {
		t.Errorf("the embedder was not tried again after its cooldown")
	}
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.DefaultPolicy.Threshold = 0.85 // the negation below scores 0.89
	f := newFixture(t, cfg)
	p := basePrompt("Why can I log in to the admin dashboard from my phone?")
	f.lookup(t, "acme", p)
	f.mustStore(t, "acme", answer(p))
	f.mustStore(t, "acme", answer(basePrompt("bye")))
	f.lookup(t, "acme", p)
	f.lookup(t, "acme", basePrompt("why can i log in to the admin dashboard from my phone please"))
	f.lookup(t, "acme", basePrompt("Why can't I log in to the admin dashboard from my phone?"))
	f.lookup(t, "acme", basePrompt("What is the weather today?"))

	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"mantle_cache_lookups_total", map[string]string{"scenario": "support", "result": "hit", "match": "exact"}, 1},
		{"mantle_cache_lookups_total", map[string]string{"scenario": "support", "result": "hit", "match": "semantic"}, 1},
		{"mantle_cache_lookups_total", map[string]string{"scenario": "support", "result": "miss", "match": "none"}, 3},
		{"mantle_cache_rejections_total", map[string]string{"scenario": "support", "reason": "negation"}, 1},
		{"mantle_cache_lookup_skips_total", map[string]string{"scenario": "support", "reason": "volatile_prompt"}, 1},
		{"mantle_cache_stores_total", map[string]string{"outcome": "stored"}, 2},
		{"mantle_cache_stores_total", map[string]string{"outcome": "volatile_prompt"}, 0},
		{"mantle_cache_entries", nil, 2},
	} {
		if got := metricValue(t, f.reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if n := histogramCount(t, f.reg, "mantle_cache_similarity", map[string]string{"scenario": "support", "outcome": "hit"}); n != 1 {
		t.Errorf("similarity{outcome=hit} has %d observations, want 1 (the semantic hit)", n)
	}
	if n := histogramCount(t, f.reg, "mantle_cache_similarity", map[string]string{"scenario": "support", "outcome": "rejected"}); n != 1 {
		t.Errorf("similarity{outcome=rejected} has %d observations, want 1 (the negation)", n)
	}
}

func TestScenarioLabelsAreBounded(t *testing.T) {
	t.Parallel()
	m, err := newMetrics(prometheus.NewRegistry(), []string{"support"})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i := range 3 * maxScenarioLabels {
		seen[m.scenario(string(rune('a'+i%26))+string(rune('a'+i/26)))] = true
	}
	if len(seen) > maxScenarioLabels+1 || !seen["_other"] {
		t.Errorf("%d distinct labels (other: %v); want at most %d plus _other", len(seen), seen["_other"], maxScenarioLabels)
	}
	if m.scenario("support") != "support" {
		t.Errorf("a configured scenario lost its label")
	}
}

// metricValue returns the value of the counter or gauge name whose labels include labels.
func metricValue(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !hasLabels(m.GetLabel(), labels) {
				continue
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
		return 0 // the family exists; this series has not been touched
	}
	t.Fatalf("metric %s not found", name)
	return 0
}

func histogramCount(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) uint64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if hasLabels(m.GetLabel(), labels) {
				return m.GetHistogram().GetSampleCount()
			}
		}
	}
	return 0
}

func hasLabels(got []*dto.LabelPair, want map[string]string) bool {
	for k, v := range want {
		found := false
		for _, l := range got {
			found = found || (l.GetName() == k && l.GetValue() == v)
		}
		if !found {
			return false
		}
	}
	return true
}

// deadlineEmbedder records whether Embed got a deadline, and says whether it computes in
// place.
type deadlineEmbedder struct {
	inPlace, sawDeadline bool
}

func (*deadlineEmbedder) Namespace() string       { return "lexical-v1" }
func (e *deadlineEmbedder) ComputesInPlace() bool { return e.inPlace }
func (e *deadlineEmbedder) Embed(ctx context.Context, text string) (vector.Vector, error) {
	_, e.sawDeadline = ctx.Deadline()
	return embed.NewLexical().Embed(ctx, text)
}

// TestEmbedderDeadline: an embedder that may wait (a remote one) gets embedder.timeout as
// its deadline; one that only computes in place gets none, as it could not heed it.
func TestEmbedderDeadline(t *testing.T) {
	t.Parallel()
	if !computesInPlace(embed.NewLexical()) {
		t.Errorf("the lexical embedder does not say it computes in place")
	}
	for _, inPlace := range []bool{false, true} {
		emb := &deadlineEmbedder{inPlace: inPlace}
		f := newFixtureWith(t, DefaultConfig(), NewEmbeddedIndex(10, 0), emb)
		f.lookupMode(t, "acme", basePrompt("How do I reset my password?"), ModeNormal)
		if emb.sawDeadline == inPlace {
			t.Errorf("computes in place %v: Embed saw a deadline %v, want %v", inPlace, emb.sawDeadline, !inPlace)
		}
	}
}
