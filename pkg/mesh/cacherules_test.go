package mesh_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/pkg/sim"
	"github.com/mantle-mesh/mantle/services/cache"
	"github.com/mantle-mesh/mantle/services/router"
)

// These tests ask through the HTTP front door of a whole mesh whether a cached answer obeys
// the rules of the scenario the caller asked under: the x-mantle-scenario header scopes the
// cache and picks the verifier's rules, and every hit is ruled again before it is served.

const (
	rulesKey    = "sk-cache-rules-test"
	rulesOpsKey = "sk-cache-rules-ops"
)

// The rules of these tests: a block, a mask, a notice and a review.
const (
	blockRefund     = `condition: text.contains("refund")` + "\n    action: {type: block}"
	maskCodename    = `condition: text.contains("BLUEFIN")` + "\n    action: {type: mask, pattern: \"BLUEFIN\", value: \"***\"}"
	noticeLegal     = `condition: text.contains("contract")` + "\n    action: {type: notice, notice: \"This is not legal advice.\"}"
	reviewContract  = `condition: text.contains("contract")` + "\n    action: {type: review}"
	reviewEverytime = `condition: "true"` + "\n    action: {type: review}"
)

// rule is one entry of a rules file: id, applying to scenario, with body's condition and action.
func rule(id, scenario, body string) string {
	return "\n  - id: " + id + "\n    scenarios: [" + scenario + "]\n    " + body
}

// headerRules apply to scenarios callers name in x-mantle-scenario; route chat (scenario
// chat) has none, so its answers are cached plain.
var headerRules = "rules:" + rule("strict-refund", "strict", blockRefund) + rule("masked-codename", "masked", maskCodename) +
	rule("legal-notice", "legal", noticeLegal) + rule("legal-contract-review", "legal", reviewContract) +
	rule("audited-review", "audited", reviewEverytime) + "\n"

// laterRules are the same rules for scenario later, made live after its answers were cached.
var laterRules = rule("later-refund", "later", blockRefund) + rule("later-codename", "later", maskCodename) +
	rule("later-notice", "later", noticeLegal) + rule("later-contract-review", "later", reviewContract) + "\n"

const backupNotice = "Answered by a backup model."

func cacheRulesConfig(rulesFile string) mesh.Config {
	cfg := mesh.Default()
	cfg.Auth.Tenants = []rpc.TenantKey{
		{ID: "acme", KeySHA256: rpc.HashKey(rulesKey)},
	}
	cfg.Auth.Operators = []rpc.TenantKey{{ID: "ops", KeySHA256: rpc.HashKey(rulesOpsKey)}}
	cfg.Verifier.Rules = nil // only the file's rules
	cfg.Verifier.RulesFile = rulesFile
	notCacheable := false
	cfg.Cache.Scenarios = map[string]cache.ScenarioPolicy{"private": {Cacheable: &notCacheable}}
	r := &cfg.Router
	r.SimProfiles = map[string]sim.Profile{"instant": {}, "hang": {Errors: sim.ErrorMix{Hang: 1}}, "503": {Errors: sim.ErrorMix{Overloaded: 1}}}
	r.Providers = []router.ProviderConfig{{Name: "sim", Type: router.ProviderSim, Timeout: 5 * time.Second, SimProfile: "instant", SimSeed: 7}}
	r.Retry.MaxRetries = 0
	r.Models = []router.ModelConfig{
		{Name: "primary", Provider: "sim"},
		{Name: "backup", Provider: "sim"},
		{Name: "hanging", Provider: "sim", SimProfile: "hang"},
		{Name: "down", Provider: "sim", SimProfile: "503"},
	}
	r.Routes = []router.RouteConfig{
		{Name: "chat", Scenario: "chat", Candidates: []string{"primary", "backup"}},
		{Name: "later", Scenario: "later", Candidates: []string{"primary", "backup"}},
		// The first choice never answers; a hedge after 20 ms goes to the backup.
		{Name: "hedged", Scenario: "chat", Candidates: []string{"hanging", "backup"}, Ladder: router.LadderConfig{Notice: backupNotice},
			Hedge: router.HedgeConfig{Enabled: true, MinDelay: 20 * time.Millisecond, MaxDelay: 20 * time.Millisecond}},
		// The first choice fails at once; the backup answers, degraded.
		{Name: "failover", Scenario: "chat", Candidates: []string{"down", "backup"}, Ladder: router.LadderConfig{Notice: backupNotice}},
	}
	return cfg
}

// ruled is what a caller of the front door got.
type ruled struct {
	chatResult
	cache string // x-mantle-cache
}

// review is the review the verifier opened for the answer, from its audit step.
func (r ruled) review() string {
	for _, s := range r.quality.GetAudit() {
		if s.Service == "verifier" {
			if _, id, ok := strings.Cut(s.Detail, "review="); ok {
				return id
			}
		}
	}
	return ""
}

func (r ruled) rules() []string { return r.quality.GetVerification().GetL2RulesApplied() }

// postRuled sends a cacheable (temperature 0) question to route, as a stream when stream
// is set, under scenario when it is not empty. The body is closed when the test ends.
func postRuled(t *testing.T, addr, route, scenario, question string, stream bool) *http.Response {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"model": route, "temperature": 0, "stream": stream,
		"messages": []map[string]string{{"role": "user", "content": question}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // a hang fails, not blocks
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+rulesKey)
	req.Header.Set("Content-Type", "application/json")
	if scenario != "" {
		req.Header.Set(router.HeaderScenario, scenario)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", route, err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// askRuled asks question on route (see postRuled) and decodes the answer.
func askRuled(t *testing.T, addr, route, scenario, question string) ruled {
	t.Helper()
	resp := postRuled(t, addr, route, scenario, question, false)
	out := ruled{chatResult: chatResult{status: resp.StatusCode, fallback: resp.Header.Get(router.HeaderFallbackLevel)}, cache: resp.Header.Get(router.HeaderCache)}
	var v completionBody
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatalf("%s: decode: %v", route, err)
	}
	v.apply(t, &out.chatResult)
	return out
}

// streamedCacheHeader asks question on route as a stream and returns its x-mantle-cache.
func streamedCacheHeader(t *testing.T, addr, route, question string) string {
	t.Helper()
	resp := postRuled(t, addr, route, "", question, true)
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatalf("%s: read stream: %v", route, err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: stream status %d", route, resp.StatusCode)
	}
	return resp.Header.Get(router.HeaderCache)
}

func writeRules(t *testing.T, path, rules string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestCachedAnswersObeyTheCallersScenario(t *testing.T) {
	t.Parallel()
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rulesFile, headerRules)
	m := meshtest.Start(t, cacheRulesConfig(rulesFile), meshtest.All)
	addr := m.HTTPAddr

	// cached stores a plain answer to question on route chat and checks it is served from
	// the cache there.
	cached := func(t *testing.T, question string) ruled {
		t.Helper()
		first := askRuled(t, addr, "chat", "", question)
		again := askRuled(t, addr, "chat", "", question)
		if first.status != http.StatusOK || again.cache != "hit" || again.content != first.content {
			t.Fatalf("route chat: %d then %s %q, want an answer and its cached repeat\nfirst's audit: %v\nrepeat's audit: %v",
				first.status, again.cache, again.content, first.quality.GetAudit(), again.quality.GetAudit())
		}
		return first
	}

	t.Run("a strict rule blocks what chat cached", func(t *testing.T) {
		t.Parallel()
		q := "What is the refund policy for orders placed online?"
		plain := cached(t, q)
		got := askRuled(t, addr, "chat", "strict", q)
		if got.cache == "hit" || (got.status == http.StatusOK && got.content == plain.content) {
			t.Fatalf("strict got the chat entry: %d %s %q", got.status, got.cache, got.content)
		}
		// Scoped by its scenario, strict's lookup does not even find chat's entry.
		if !slices.ContainsFunc(got.quality.GetAudit(), func(s *mantlev1.AuditStep) bool {
			return s.Service == "router" && s.Step == "lookup" && strings.HasPrefix(s.Detail, "miss")
		}) {
			t.Errorf("strict's lookup was not a miss: audit %v", got.quality.GetAudit())
		}
		// Every model's answer is blocked too: the request fails, it is not answered.
		if got.status == http.StatusOK {
			t.Errorf("strict answered %q (rules %v), want the block to fail the request", got.content, got.rules())
		}
	})

	t.Run("a mask rule masks what chat cached, and the masked answer is not cached", func(t *testing.T) {
		t.Parallel()
		q := "Tell me about the project called BLUEFIN please"
		cached(t, q)
		for i := range 2 {
			got := askRuled(t, addr, "chat", "masked", q)
			if got.status != http.StatusOK || strings.Contains(got.content, "BLUEFIN") || !strings.Contains(got.content, "***") {
				t.Fatalf("masked #%d: %d %q, want the code name masked", i, got.status, got.content)
			}
			if got.cache != "miss" || !slices.Contains(got.rules(), "masked-codename") {
				t.Errorf("masked #%d: cache %s rules %v, want a fresh answer the mask applied to", i, got.cache, got.rules())
			}
		}
	})

	t.Run("the legal notice and review run on what chat cached", func(t *testing.T) {
		t.Parallel()
		q := "Can a supplier end our contract early?"
		cached(t, q)
		for i := range 2 {
			got := askRuled(t, addr, "chat", "legal", q)
			if got.status != http.StatusOK || got.quality.GetUserNotice() != "This is not legal advice." || got.review() == "" {
				t.Fatalf("legal #%d: %d notice %q review %q, want the notice and a review", i, got.status, got.quality.GetUserNotice(), got.review())
			}
			// Noticed and reviewed answers are not cached: the second asks the model again.
			if got.cache != "miss" || got.quality.GetQualityGrade() == mantlev1.QualityGrade_QUALITY_GRADE_HIGH {
				t.Errorf("legal #%d: cache %s grade %s, want a fresh answer below high", i, got.cache, got.quality.GetQualityGrade())
			}
		}
	})

	t.Run("cacheable false holds for a scenario named in the header", func(t *testing.T) {
		t.Parallel()
		q := "How long does standard shipping take to Lyon?"
		cached(t, q)
		for i := range 2 {
			if got := askRuled(t, addr, "chat", "private", q); got.status != http.StatusOK || got.cache != "miss" || got.quality.GetCacheHit() {
				t.Errorf("private #%d: %d cache %s, want a miss every time", i, got.status, got.cache)
			}
		}
		// What private asked was not stored for chat either (it was not stored at all).
		if got := askRuled(t, addr, "chat", "", "How long does standard shipping take to Nice?"); got.cache != "miss" {
			t.Errorf("chat after private: cache %s, want a miss", got.cache)
		}
	})

	t.Run("an answer under review is not served from the cache", func(t *testing.T) {
		t.Parallel()
		q := "Which documents do I need to open a business account?"
		for i := range 2 {
			got := askRuled(t, addr, "chat", "audited", q)
			if got.status != http.StatusOK || got.review() == "" {
				t.Fatalf("audited #%d: %d review %q, want an answer under review", i, got.status, got.review())
			}
			if got.cache != "miss" || got.quality.GetQualityGrade() == mantlev1.QualityGrade_QUALITY_GRADE_HIGH {
				t.Errorf("audited #%d: cache %s grade %s, want a fresh answer, graded below high", i, got.cache, got.quality.GetQualityGrade())
			}
		}
	})

	t.Run("rules that go live after the answers were cached apply to the hits", func(t *testing.T) {
		// Not parallel: it runs before the parallel subtests resume, and reloads the rule
		// set they use too (adding rules of scenario later only).
		block, mask, notice := "What is the refund window for gift cards?", "Who leads the BLUEFIN project?", "Who signs the contract for a new office lease?"
		for _, q := range []string{block, mask, notice} {
			askRuled(t, addr, "later", "", q)
			if got := askRuled(t, addr, "later", "", q); got.cache != "hit" || len(got.rules()) != 0 {
				t.Fatalf("before the rules: %q cache %s rules %v, want a plain hit", q, got.cache, got.rules())
			}
		}
		writeRules(t, rulesFile, headerRules+laterRules)
		ops := verifierv1.NewVerifierServiceClient(meshtest.Dial(t, m.GRPCAddr))
		if _, err := ops.ReloadRules(authed(rulesOpsKey), &verifierv1.ReloadRulesRequest{}); err != nil {
			t.Fatalf("ReloadRules: %v", err)
		}

		got := askRuled(t, addr, "later", "", block)
		if got.cache == "hit" || got.status == http.StatusOK {
			t.Errorf("blocked hit: %d cache %s %q, want it refused (and the models' answers blocked too)", got.status, got.cache, got.content)
		}

		got = askRuled(t, addr, "later", "", mask)
		if got.status != http.StatusOK || got.cache != "hit" || strings.Contains(got.content, "BLUEFIN") || !slices.Contains(got.rules(), "later-codename") {
			t.Errorf("masked hit: %d cache %s %q rules %v, want the hit, masked, with the rule in its QualityContext", got.status, got.cache, got.content, got.rules())
		}
		if g := got.quality.GetQualityGrade(); g != mantlev1.QualityGrade_QUALITY_GRADE_MEDIUM {
			t.Errorf("masked hit graded %s, want medium", g)
		}

		got = askRuled(t, addr, "later", "", notice)
		if got.status != http.StatusOK || got.cache != "hit" || got.quality.GetUserNotice() != "This is not legal advice." || got.review() == "" {
			t.Errorf("noticed hit: %d cache %s notice %q review %q, want the hit with the notice and a review", got.status, got.cache, got.quality.GetUserNotice(), got.review())
		}
	})
}

// TestStaleCachedAnswerIsMarked: with the route forced to its cache (cache-only mode), an
// entry past its time to live still answers from the ladder's cache rung, and says so in x-mantle-cache and in the
// QualityContext. The cache and the router share a fake clock, so the hours pass at once.
func TestStaleCachedAnswerIsMarked(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClockAt(time.Now())
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rulesFile, headerRules)
	cfg := cacheRulesConfig(rulesFile)
	faq := router.RouteConfig{Name: "faq", Scenario: "faq", Candidates: []string{"primary"}, Ladder: router.LadderConfig{Cache: true}}
	cfg.Router.Routes = append(cfg.Router.Routes, faq)
	m := meshtest.StartWith(t, cfg, meshtest.All, mesh.Options{Clock: clock})

	q := "Which countries does the shop deliver to?"
	first := askRuled(t, m.HTTPAddr, "faq", "", q)
	if first.status != http.StatusOK || first.cache != "miss" {
		t.Fatalf("first: %d cache %s, want a fresh answer", first.status, first.cache)
	}
	forced := cfg
	forced.Router.Routes = slices.Clone(cfg.Router.Routes)
	faq.Ladder.ForceLevel = router.ForceCache
	forced.Router.Routes[len(forced.Router.Routes)-1] = faq
	if err := m.Router.Reload(context.Background(), forced); err != nil {
		t.Fatalf("Reload: %v", err)
	}

	steps := []struct {
		name     string
		advance  time.Duration
		fallback string
		cache    string
		stale    bool
	}{
		{"within the TTL (1h): an ordinary hit", 0, "primary", "hit", false},
		{"past the TTL, within max_staleness (24h): the ladder's cache rung", 2 * time.Hour, "cached_approximate", "stale", true},
	}
	for _, st := range steps {
		clock.Advance(st.advance)
		got := askRuled(t, m.HTTPAddr, "faq", "", q)
		if got.status != http.StatusOK || got.content != first.content || got.fallback != st.fallback {
			t.Fatalf("%s: %d %s %q, want the cached answer at level %s", st.name, got.status, got.fallback, got.content, st.fallback)
		}
		if got.cache != st.cache || got.quality.GetCacheStale() != st.stale || !got.quality.GetCacheHit() {
			t.Errorf("%s: x-mantle-cache %s, cache_stale %t, cache_hit %t; want %s, %t, true", st.name, got.cache, got.quality.GetCacheStale(), got.quality.GetCacheHit(), st.cache, st.stale)
		}
		if h := streamedCacheHeader(t, m.HTTPAddr, "faq", q); h != st.cache {
			t.Errorf("%s, streamed: x-mantle-cache %s, want %s", st.name, h, st.cache)
		}
	}
}

// TestHedgeWonByTheBackupIsNotDegraded: a hedge the backup wins while the first choice is
// merely slow is a healthy answer, without the route's degraded-answer notice; a backup
// that answers because the first choice failed carries it.
func TestHedgeWonByTheBackupIsNotDegraded(t *testing.T) {
	t.Parallel()
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rulesFile, headerRules)
	m := meshtest.Start(t, cacheRulesConfig(rulesFile), meshtest.All)

	got := askRuled(t, m.HTTPAddr, "hedged", "", "Which sizes does the blue jacket come in?")
	if got.status != http.StatusOK || got.model != "backup" || strings.Join(got.attempts(), " ") != "hanging:canceled backup:none" {
		t.Fatalf("hedged: %d from %q after %v, want the hedge's answer from backup", got.status, got.model, got.attempts())
	}
	if got.fallback != "backup_model" || got.quality.GetUserNotice() != "" || got.quality.GetDegradationReason() != "" {
		t.Errorf("hedged: level %s notice %q reason %q; want backup_model, no notice, no degradation", got.fallback, got.quality.GetUserNotice(), got.quality.GetDegradationReason())
	}

	got = askRuled(t, m.HTTPAddr, "failover", "", "Which sizes does the red jacket come in?")
	if got.status != http.StatusOK || got.model != "backup" || got.quality.GetUserNotice() != backupNotice || got.quality.GetDegradationReason() == "" {
		t.Errorf("failover: %d from %q notice %q reason %q, want the backup's answer with the notice and a reason", got.status, got.model, got.quality.GetUserNotice(), got.quality.GetDegradationReason())
	}
}
