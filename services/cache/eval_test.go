package cache

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/mantle-mesh/mantle/services/cache/internal/embed"
	"github.com/mantle-mesh/mantle/services/cache/internal/vector"
)

// evalPair is one labelled line of testdata/eval.jsonl.
type evalPair struct {
	ID string `json:"id"`
	// Kind: paraphrase, negation, number, date, product, quote, intent, tenant, operator,
	// unit, emoji, direction, opposite, volatile, personal.
	Kind   string `json:"kind"`
	Lang   string `json:"lang"` // en, zh
	Stored string `json:"stored"`
	Query  string `json:"query"`
	// Hit says whether the cache should answer Query with Stored's answer.
	Hit bool `json:"hit"`
	// Tenant is "other" when Query is asked by another tenant than the one that stored.
	Tenant string `json:"tenant"`
	// Policy "default" runs the pair under the default prompt policy (volatile and personal
	// detection on), stored for end user alice and asked by end user bob of the same
	// tenant. Other pairs run with the prompt filters off, to measure matching alone.
	Policy string `json:"policy"`
}

// newFamilies are the kinds the near-miss check and the prompt policy must cover, with at
// least minFamilySize pairs each.
var newFamilies = []string{"operator", "unit", "emoji", "direction", "opposite", "volatile", "personal"}

const minFamilySize = 50

// recallFloor is the lexical embedder's recall at its default threshold before the
// families above joined the set; growing the set and the check must not lower it.
const recallFloor = 0.425

// evalSetPath is testdata/eval.jsonl, or MANTLE_EVAL_SET to score another set with the
// same code (for example an earlier version of this one, to compare like with like).
func evalSetPath() string {
	if p := os.Getenv("MANTLE_EVAL_SET"); p != "" {
		return p
	}
	return "testdata/eval.jsonl"
}

func loadEvalSet(t testing.TB) []evalPair {
	t.Helper()
	f, err := os.Open(evalSetPath())
	if err != nil {
		t.Fatalf("open evaluation set: %v", err)
	}
	defer func() { _ = f.Close() }() // read-only
	var pairs []evalPair
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var p evalPair
		if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
			t.Fatalf("evaluation set line %d: %v", len(pairs)+1, err)
		}
		if p.ID == "" { // the comment line
			continue
		}
		pairs = append(pairs, p)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read evaluation set: %v", err)
	}
	return pairs
}

// evalScore counts one run over the evaluation set.
type evalScore struct {
	tp, fp, fn, tn int
	falseHits      map[string]int // by kind
	languages      map[string]*evalScore
}

func (s *evalScore) add(p evalPair, hit bool) {
	switch {
	case p.Hit && hit:
		s.tp++
	case p.Hit:
		s.fn++
	case hit:
		s.fp++
		if s.falseHits == nil {
			s.falseHits = map[string]int{}
		}
		s.falseHits[p.Kind]++
	default:
		s.tn++
	}
}

func (s evalScore) precision() float64 { return ratio(s.tp, s.tp+s.fp) }
func (s evalScore) recall() float64    { return ratio(s.tp, s.tp+s.fn) }

// falseHitRate is the share of pairs that must not hit that did.
func (s evalScore) falseHitRate() float64 { return ratio(s.fp, s.fp+s.tn) }

func ratio(a, b int) float64 {
	if b == 0 {
		return 1 // nothing to get wrong
	}
	return float64(a) / float64(b)
}

// evalConfig is the default config with the policy's prompt filters off, so the evaluation
// measures matching, not which prompts policy keeps out, and with threshold th (0: the
// embedder's default).
func evalConfig(kind string, th float64) Config {
	cfg := evalPolicyConfig(kind, th)
	cfg.DefaultPolicy.VolatileMarkers, cfg.DefaultPolicy.PersonalMarkers, cfg.DefaultPolicy.PersonalPatterns = []string{}, []string{}, []string{}
	cfg.DefaultPolicy.DetectVolatile, cfg.DefaultPolicy.DetectPersonal = false, false
	return cfg
}

// evalPolicyConfig is the default config, prompt policy included, at threshold th.
func evalPolicyConfig(kind string, th float64) Config {
	cfg := DefaultConfig()
	cfg.Embedder.Kind = kind
	cfg.DefaultPolicy.Threshold = th
	cfg.MaxEntries = 10_000
	return cfg
}

// runEval stores every pair's question and asks its query through the service, each pair
// in a scenario of its own so pairs never meet.
func runEval(t testing.TB, pairs []evalPair, kind string, embedder Embedder, th float64, mode Mode) evalScore {
	t.Helper()
	matching := newFixtureWith(t, evalConfig(kind, th), NewEmbeddedIndex(10_000, 0), embedder)
	withPolicy := newFixtureWith(t, evalPolicyConfig(kind, th), NewEmbeddedIndex(10_000, 0), embedder)
	score := evalScore{languages: map[string]*evalScore{"en": {}, "zh": {}}}
	for _, p := range pairs {
		stored, query := basePrompt(p.Stored), basePrompt(p.Query)
		stored.Scenario, query.Scenario = p.ID, p.ID
		f := matching
		if p.Policy == "default" {
			// One end user stores, another asks: personal answers stay with their user,
			// general ones are shared.
			f = withPolicy
			stored.EndUser, query.EndUser = "alice", "bob"
		}
		// The policy may decline to store (that is what volatile and personal pairs test).
		if _, err := f.svc.Store(context.Background(), "acme", answer(stored)); err != nil {
			t.Fatalf("Store(%s): %v", p.ID, err)
		}
		asker := "acme"
		if p.Tenant == "other" {
			asker = "globex"
		}
		res, err := f.svc.Lookup(context.Background(), asker, LookupRequest{Prompt: query, Mode: mode})
		if err != nil {
			t.Fatalf("Lookup(%s): %v", p.ID, err)
		}
		score.add(p, res.Hit)
		score.languages[p.Lang].add(p, res.Hit)
	}
	return score
}

// similarityOnly scores the pairs on cosine similarity alone, without scope or near-miss
// check: what a cache that only thresholds would do (tenant pairs count as hits when
// similar, as they would in a cache without tenant scoping).
func similarityOnly(t testing.TB, pairs []evalPair, embedder Embedder, th float64) evalScore {
	t.Helper()
	var score evalScore
	for _, p := range pairs {
		a, errA := embedder.Embed(context.Background(), foldText(p.Stored))
		b, errB := embedder.Embed(context.Background(), foldText(p.Query))
		if errA != nil || errB != nil {
			t.Fatalf("Embed(%s): %v, %v", p.ID, errA, errB)
		}
		score.add(p, float64(vector.Dot(a, b)) >= th)
	}
	return score
}

var evalThresholds = []float64{0.85, 0.88, 0.90, 0.92, 0.94, 0.96, 0.98}

// TestEvaluation reports precision, recall and false-hit rate on the labelled evaluation set
// per embedder and threshold (run with -v to see the table), and fails if the lexical
// embedder at its default threshold, or on the related-answer rung, lets any pair that
// must not match hit, if its recall at the default threshold falls below recallFloor, if
// any pair asked by another tenant hits at all, or if a family has fewer than
// minFamilySize pairs.
//
// An OpenAI-compatible embedder joins the table when MANTLE_EVAL_EMBEDDINGS_URL (the API
// root, for example http://localhost:11434/v1) and MANTLE_EVAL_EMBEDDINGS_MODEL are set
// (MANTLE_EVAL_EMBEDDINGS_KEY for a key).
func TestEvaluation(t *testing.T) {
	t.Parallel()
	pairs := loadEvalSet(t)
	counts := map[string]int{}
	for _, p := range pairs {
		counts[p.Lang+"/"+fmt.Sprint(p.Hit)]++
		counts[p.Kind]++
	}
	for _, kind := range newFamilies {
		if os.Getenv("MANTLE_EVAL_SET") == "" && counts[kind] < minFamilySize {
			t.Errorf("evaluation set has %d %s pairs; want at least %d", counts[kind], kind, minFamilySize)
		}
	}
	if len(pairs) < 200 || counts["en/true"] == 0 || counts["zh/true"] == 0 || counts["en/false"] == 0 || counts["zh/false"] == 0 {
		t.Fatalf("evaluation set has %d pairs (%v); want at least 200, hits and near misses in both languages", len(pairs), counts)
	}

	type embedderUnderTest struct {
		name, kind string
		embedder   Embedder
	}
	embedders := []embedderUnderTest{{"lexical", EmbedderLexical, embed.NewLexical()}}
	if url, model := os.Getenv("MANTLE_EVAL_EMBEDDINGS_URL"), os.Getenv("MANTLE_EVAL_EMBEDDINGS_MODEL"); url != "" && model != "" {
		e, err := embed.NewOpenAI(embed.OpenAIConfig{BaseURL: url, Model: model, APIKey: os.Getenv("MANTLE_EVAL_EMBEDDINGS_KEY")})
		if err != nil {
			t.Fatalf("NewOpenAI: %v", err)
		}
		embedders = append(embedders, embedderUnderTest{"openai:" + model, EmbedderOpenAI, e})
	}

	var table strings.Builder
	fmt.Fprintf(&table, "%d pairs (%d should hit, %d must not)\n", len(pairs), counts["en/true"]+counts["zh/true"], counts["en/false"]+counts["zh/false"])
	fmt.Fprintf(&table, "%-24s %-9s %9s %7s %9s %9s %9s  %s\n", "embedder", "threshold", "precision", "recall", "false-hit", "recall-en", "recall-zh", "false hits by kind")
	row := func(name, th string, s evalScore) {
		var kinds []string
		for _, k := range slices.Sorted(maps.Keys(s.falseHits)) {
			kinds = append(kinds, fmt.Sprintf("%s:%d", k, s.falseHits[k]))
		}
		en, zh := "", ""
		if s.languages != nil {
			en, zh = fmt.Sprintf("%.3f", s.languages["en"].recall()), fmt.Sprintf("%.3f", s.languages["zh"].recall())
		}
		fmt.Fprintf(&table, "%-24s %-9s %9.3f %7.3f %9.3f %9s %9s  %s\n", name, th, s.precision(), s.recall(), s.falseHitRate(), en, zh, strings.Join(kinds, " "))
	}

	exact := runEval(t, pairs, EmbedderNone, nil, 0, ModeNormal)
	row("exact only", "-", exact)
	for _, e := range embedders {
		def := defaultThresholds(e.kind).normal
		for _, th := range evalThresholds {
			s := runEval(t, pairs, e.kind, e.embedder, th, ModeNormal)
			label := fmt.Sprintf("%.2f", th)
			if th == def {
				label += "*"
			}
			row(e.name, label, s)
			if s.falseHits["tenant"] > 0 {
				t.Errorf("%s at %.2f: %d pairs asked by another tenant hit", e.name, th, s.falseHits["tenant"])
			}
		}
		// The degradation ladder's related-answer rung, at the approximate floor.
		approx := defaultThresholds(e.kind).approximate
		approximate := runEval(t, pairs, e.kind, e.embedder, 0, ModeApproximate)
		row(e.name+" (approximate)", fmt.Sprintf("%.2f*", approx), approximate)
		if e.kind == EmbedderLexical && approximate.fp != 0 {
			t.Errorf("lexical related-answer rung at %.2f: %d false hits (%v); want none", approx, approximate.fp, approximate.falseHits)
		}
		for _, th := range []float64{0.80, def} {
			row(e.name+" (cosine only)", fmt.Sprintf("%.2f", th), similarityOnly(t, pairs, e.embedder, th))
		}
	}
	t.Logf("evaluation on %s (* = default threshold; cosine only = no scope, no near-miss check):\n%s", evalSetPath(), table.String())

	lexical := runEval(t, pairs, EmbedderLexical, embed.NewLexical(), 0, ModeNormal)
	if lexical.fp != 0 {
		t.Errorf("lexical embedder at its default threshold %.2f: false-hit rate %.3f (%v), want 0",
			defaultThresholds(EmbedderLexical).normal, lexical.falseHitRate(), lexical.falseHits)
	}
	if r := lexical.recall(); r < recallFloor {
		t.Errorf("lexical embedder at its default threshold: recall %.3f, want at least %.3f", r, recallFloor)
	}
	if exact.fp != 0 {
		t.Errorf("exact matching alone had %d false hits (%v); want none", exact.fp, exact.falseHits)
	}
}
