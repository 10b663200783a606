package cache

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mantle-mesh/mantle/pkg/rpc"
)

type fixture struct {
	svc   *Service
	clock *clockwork.FakeClock
	index *MemoryIndex
	reg   *prometheus.Registry
}

func newFixture(t testing.TB, cfg Config) fixture {
	t.Helper()
	clock := clockwork.NewFakeClockAt(epoch)
	reg := prometheus.NewRegistry()
	index := NewMemoryIndex(cfg.MaxEntries)
	svc, err := NewService(cfg, index, clock, reg)
	if err != nil {
		t.Fatalf("NewService: %v", err)
	}
	if err := registerMemoryIndexMetrics(reg, index); err != nil {
		t.Fatalf("registerMemoryIndexMetrics: %v", err)
	}
	return fixture{svc: svc, clock: clock, index: index, reg: reg}
}

// answer is a cacheable answer to p under the default policy.
func answer(p Prompt) StoreRequest {
	return StoreRequest{
		Prompt:       p,
		Content:      "Click “Forgot password” on the sign-in page.",
		SourceModel:  "gpt-4o-mini-2024-07-18",
		FinishReason: "stop",
		Usage:        Usage{InputTokens: 20, OutputTokens: 12, TotalTokens: 32},
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

func (f fixture) lookup(t testing.TB, tenant string, p Prompt) (Entry, bool) {
	t.Helper()
	e, hit, err := f.svc.Lookup(context.Background(), tenant, p)
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	return e, hit
}

func TestStoreThenLookupHits(t *testing.T) {
	t.Parallel()
	f := newFixture(t, DefaultConfig())
	stored := f.mustStore(t, "acme", answer(basePrompt("How do I reset my password?")))

	// Another spelling of the same question finds the same entry.
	got, hit := f.lookup(t, "acme", basePrompt("ＨＯＷ ＤＯ Ｉ  ＲＥＳＥＴ ＭＹ ＰＡＳＳＷＯＲＤ？"))
	if !hit {
		t.Fatalf("Lookup missed; want a hit")
	}
	key, _ := deriveKey("acme", basePrompt("how do i reset my password"))
	want := Entry{
		ID:           stored.EntryID,
		Key:          key,
		Tenant:       "acme",
		Scenario:     "support",
		Content:      "Click “Forgot password” on the sign-in page.",
		SourceModel:  "gpt-4o-mini-2024-07-18",
		FinishReason: "stop",
		Usage:        Usage{InputTokens: 20, OutputTokens: 12, TotalTokens: 32},
		CreatedAt:    epoch,
		ExpiresAt:    epoch.Add(time.Hour),
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Lookup entry\n got %+v\nwant %+v", got, want)
	}
	if stored.EntryID == "" {
		t.Errorf("Store returned an empty entry id")
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
	}
	f := newFixture(t, DefaultConfig())
	f.mustStore(t, "acme", answer(basePrompt("how do i reset my password")))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := basePrompt("how do i reset my password")
			if tt.change != nil {
				tt.change(&p)
			}
			wantHit := tt.change == nil && tt.tenant == "acme"
			if _, hit := f.lookup(t, tt.tenant, p); hit != wantHit {
				t.Errorf("hit = %v, want %v", hit, wantHit)
			}
		})
	}
}

func TestLookupExpiresByTTLWithoutRenewal(t *testing.T) {
	t.Parallel()
	f := newFixture(t, DefaultConfig()) // ttl 1h
	p := basePrompt("how do i reset my password")
	f.mustStore(t, "acme", answer(p))

	f.clock.Advance(59 * time.Minute)
	if _, hit := f.lookup(t, "acme", p); !hit {
		t.Fatalf("after 59m: miss, want a hit")
	}
	// The read above must not have renewed the TTL.
	f.clock.Advance(time.Minute)
	if _, hit := f.lookup(t, "acme", p); hit {
		t.Errorf("after 60m: hit, want a miss")
	}
	if n := f.index.Len(); n != 0 {
		t.Errorf("index holds %d entries after the expired lookup, want 0", n)
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
		})
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
	}{
		{name: "scenario not cacheable", config: func(c *Config) {
			c.Scenarios = map[string]ScenarioPolicy{"support": {Cacheable: new(false)}}
		}, want: SkipNotCacheable},
		{name: "default not cacheable", config: func(c *Config) { c.DefaultPolicy.Cacheable = false }, want: SkipNotCacheable},
		{name: "volatile english marker", change: func(r *StoreRequest) {
			r.Prompt.Messages[1].Content = "What is the latest version?"
		}, want: SkipVolatilePrompt},
		{name: "volatile chinese marker", change: func(r *StoreRequest) {
			r.Prompt.Messages[1].Content = "我的订单到哪了？"
		}, want: SkipVolatilePrompt},
		{name: "volatile marker in an earlier user turn", change: func(r *StoreRequest) {
			r.Prompt.Messages = []Message{
				{Role: "user", Content: "今天金价多少"},
				{Role: "assistant", Content: "…"},
				{Role: "user", Content: "换算成美元呢"},
			}
		}, want: SkipVolatilePrompt},
		{name: "scenario's own markers", config: func(c *Config) {
			c.Scenarios = map[string]ScenarioPolicy{"support": {VolatileMarkers: []string{"password"}}}
		}, want: SkipVolatilePrompt},
		{name: "temperature above the maximum", change: func(r *StoreRequest) { r.Prompt.Temperature = float(0.7) }, want: SkipHighTemperature},
		{name: "temperature unset", change: func(r *StoreRequest) { r.Prompt.Temperature = nil }, want: SkipHighTemperature},
		{name: "scenario's lower maximum", config: func(c *Config) {
			c.Scenarios = map[string]ScenarioPolicy{"support": {MaxTemperature: new(0.0)}}
		}, want: SkipHighTemperature},
		{name: "finish reason length", change: func(r *StoreRequest) { r.FinishReason = "length" }, want: SkipFinishReason},
		{name: "finish reason missing", change: func(r *StoreRequest) { r.FinishReason = "" }, want: SkipFinishReason},
		{name: "white space content", change: func(r *StoreRequest) { r.Content = " \n\t" }, want: SkipEmpty},
		{name: "verification failed", change: func(r *StoreRequest) { r.VerificationFailed = true }, want: SkipNotVerified},
		{name: "degraded answer", change: func(r *StoreRequest) { r.Degraded = true }, want: SkipDegraded},
		{name: "answer from the cache", change: func(r *StoreRequest) { r.FromCache = true }, want: SkipCacheHit},
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
			if _, hit := f.lookup(t, "acme", req.Prompt); hit != wantStored {
				t.Errorf("Lookup hit = %v, want %v", hit, wantStored)
			}
			outcome := outcomeStored
			if !wantStored {
				outcome = string(tt.want)
			}
			if got := metricValue(t, f.reg, "mantle_cache_stores_total", "outcome", outcome); got != 1 {
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
			_, _, err = f.svc.Lookup(context.Background(), "acme", req.Prompt)
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
	if _, _, err := f.svc.Lookup(context.Background(), "", p); !errors.Is(err, ErrNoTenant) {
		t.Errorf("Lookup error = %v, want ErrNoTenant", err)
	}
	if _, err := f.svc.Store(context.Background(), "", answer(p)); !errors.Is(err, ErrNoTenant) {
		t.Errorf("Store error = %v, want ErrNoTenant", err)
	}
	if _, err := f.svc.Invalidate(context.Background(), InvalidateRequest{All: true}); !errors.Is(err, ErrNoTenant) {
		t.Errorf("Invalidate error = %v, want ErrNoTenant", err)
	}
}

func TestInvalidate(t *testing.T) {
	t.Parallel()
	// Each tenant gets the same three prompts, two in support and one in sales.
	prompts := map[string]Prompt{"s1": basePrompt("one"), "s2": basePrompt("two"), "x1": basePrompt("three")}
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
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, DefaultConfig())
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

func TestStoreEvictsLeastRecentlyUsedWhenFull(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.MaxEntries = 2
	f := newFixture(t, cfg)
	first, second, third := basePrompt("first"), basePrompt("second"), basePrompt("third")
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
	if got := metricValue(t, f.reg, "mantle_cache_evictions_total", "", ""); got != 1 {
		t.Errorf("evictions = %v, want 1", got)
	}
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	f := newFixture(t, DefaultConfig())
	p := basePrompt("hello")
	f.lookup(t, "acme", p)
	f.mustStore(t, "acme", answer(p))
	f.mustStore(t, "acme", answer(basePrompt("bye")))
	f.lookup(t, "acme", p)
	f.lookup(t, "acme", p)

	for _, c := range []struct {
		name, label, value string
		want               float64
	}{
		{"mantle_cache_lookups_total", "result", "hit", 2},
		{"mantle_cache_lookups_total", "result", "miss", 1},
		{"mantle_cache_stores_total", "outcome", "stored", 2},
		{"mantle_cache_stores_total", "outcome", "volatile_prompt", 0},
		{"mantle_cache_entries", "", "", 2},
	} {
		if got := metricValue(t, f.reg, c.name, c.label, c.value); got != c.want {
			t.Errorf("%s{%s=%q} = %v, want %v", c.name, c.label, c.value, got, c.want)
		}
	}
}

// metricValue returns the value of the counter or gauge name whose label has value (any
// series when label is empty).
func metricValue(t testing.TB, reg *prometheus.Registry, name, label, value string) float64 {
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
			matches := label == ""
			for _, l := range m.GetLabel() {
				matches = matches || (l.GetName() == label && l.GetValue() == value)
			}
			if !matches {
				continue
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s{%s=%q} not found", name, label, value)
	return 0
}

func BenchmarkLookupHit(b *testing.B) {
	f := newFixture(b, DefaultConfig())
	p := basePrompt("How do I reset my password if I no longer have access to my email address?")
	f.mustStore(b, "acme", answer(p))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, hit, err := f.svc.Lookup(ctx, "acme", p); err != nil || !hit {
			b.Fatalf("Lookup = (hit %v, err %v), want a hit", hit, err)
		}
	}
}
