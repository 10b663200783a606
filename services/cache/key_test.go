package cache

import (
	"testing"
)

func TestNormalizeText(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in, want string
	}{
		{"full-width latin and digits", "ＧＰＴ－４ ｉｓ ２", "gpt-4 is 2"},
		{"half-width katakana", "ｶﾀｶﾅ", "カタカナ"},
		{"upper case", "Reset My PASSWORD", "reset my password"},
		{"runs of white space", "  reset \t my\n\npassword  ", "reset my password"},
		{"ideographic space", "重置\u3000密码", "重置 密码"},
		{"trailing ascii punctuation", "reset my password?!", "reset my password"},
		{"trailing cjk punctuation", "怎么重置密码？。！", "怎么重置密码"},
		{"leading punctuation", "¿¡hola", "hola"},
		{"cjk comma and enumeration comma at the end", "退货，、", "退货"},
		{"punctuation inside stays", "1,000 or 1.5?", "1,000 or 1.5"},
		{"only punctuation", "？？？", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := normalizeText(tt.in); got != tt.want {
				t.Errorf("normalizeText(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

// exactKey is the exact key of tenant's prompt under the lexical embedder.
func exactKey(tenant string, p Prompt) Key { return deriveKeys(tenant, "lexical-v1", p).Exact }

func TestFoldTextKeepsCaseAndPunctuation(t *testing.T) {
	t.Parallel()
	got := foldText("  Ｉs the ｉPhone “15”\u3000ok？ ")
	if want := "Is the iPhone “15” ok?"; got != want {
		t.Errorf("foldText = %q, want %q", got, want)
	}
	if n := trimText(got); n != normalizeText("  Ｉs the ｉPhone “15”\u3000ok？ ") {
		t.Errorf("trimText(foldText(s)) = %q, want normalizeText(s)", n)
	}
}

// basePrompt is the prompt the key tests vary.
func basePrompt(user string) Prompt {
	temperature := 0.2
	return Prompt{
		Scenario:    "support",
		Model:       "gpt-4o-mini",
		Temperature: &temperature,
		MaxTokens:   512,
		Messages: []Message{
			{Role: "system", Content: "You are a helpful support agent."},
			{Role: "user", Content: user},
		},
	}
}

func TestDeriveKeyIgnoresSpellingDifferences(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, a, b string
	}{
		{"full-width vs half-width", "ＨＯＷ ＤＯ Ｉ ＲＥＳＥＴ ＭＹ ＰＡＳＳＷＯＲＤ１２３", "HOW DO I RESET MY PASSWORD123"},
		{"full-width cjk question mark", "怎么重置密码？", "怎么重置密码?"},
		{"case", "How do I reset my password", "how do i reset my PASSWORD"},
		{"spaces", "how do  i reset\tmy password ", " how do i reset my password"},
		{"trailing punctuation", "how do i reset my password???", "how do i reset my password"},
		{"cjk punctuation around", "「怎么重置密码」。", "怎么重置密码"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			keyA, keyB := exactKey("acme", basePrompt(tt.a)), exactKey("acme", basePrompt(tt.b))
			if keyA != keyB {
				t.Errorf("keys differ for %q and %q; want the same key", tt.a, tt.b)
			}
		})
	}
}

func TestDeriveKeySeparatesScopes(t *testing.T) {
	t.Parallel()
	float := func(v float64) *float64 { return &v }
	tests := []struct {
		name          string
		tenant        string
		namespace     string
		change        func(p *Prompt)
		samePartition bool
	}{
		{name: "different numbers", change: func(p *Prompt) { p.Messages[1].Content = "what is 1+2" }, samePartition: true},
		{name: "different tenant", tenant: "globex"},
		{name: "different embedder namespace", namespace: "openai-text-embedding-3-small-1536"},
		{name: "model family replaces the model", change: func(p *Prompt) { p.ModelFamily = "gpt-4o" }},
		{name: "context fingerprint (tools)", change: func(p *Prompt) { p.ContextFingerprint = "tools:sha256:abc" }},
		{name: "different scenario", change: func(p *Prompt) { p.Scenario = "sales" }},
		{name: "different model", change: func(p *Prompt) { p.Model = "gpt-4o" }},
		{name: "different system prompt", change: func(p *Prompt) { p.Messages[0].Content = "You are a pirate." }},
		{name: "different role of an earlier turn", change: func(p *Prompt) { p.Messages[0].Role = "assistant" }},
		{name: "extra earlier turn", change: func(p *Prompt) {
			p.Messages = append([]Message{{Role: "user", Content: "hi"}}, p.Messages...)
		}},
		{name: "different temperature bucket", change: func(p *Prompt) { p.Temperature = float(0.3) }},
		{name: "temperature unset", change: func(p *Prompt) { p.Temperature = nil }},
		{name: "different max_tokens", change: func(p *Prompt) { p.MaxTokens = 64 }},
		{name: "json object format", change: func(p *Prompt) { p.ResponseFormat.Type = FormatJSONObject }},
		{name: "json schema", change: func(p *Prompt) {
			p.ResponseFormat = ResponseFormat{Type: FormatJSONSchema, JSONSchema: `{"type":"object"}`}
		}},
		{name: "required fields", change: func(p *Prompt) { p.ResponseFormat.RequiredFields = []string{"answer"} }},
	}
	base := deriveKeys("acme", "lexical-v1", basePrompt("what is 1+1"))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, tenant := basePrompt("what is 1+1"), "acme"
			if tt.tenant != "" {
				tenant = tt.tenant
			}
			if tt.change != nil {
				tt.change(&p)
			}
			ns := "lexical-v1"
			if tt.namespace != "" {
				ns = tt.namespace
			}
			got := deriveKeys(tenant, ns, p)
			if got.Exact == base.Exact {
				t.Errorf("key equals the base prompt's key; want a different key")
			}
			// Everything but the last message is the partition: only a change of the
			// question itself stays within it.
			if samePartition := got.Partition == base.Partition; samePartition != tt.samePartition {
				t.Errorf("same partition = %v, want %v", samePartition, tt.samePartition)
			}
		})
	}
}

func TestDeriveKeySharesEquivalentScopes(t *testing.T) {
	t.Parallel()
	float := func(v float64) *float64 { return &v }
	tests := []struct {
		name string
		a, b func(p *Prompt)
	}{
		{
			name: "temperatures in one bucket",
			a:    func(p *Prompt) { p.Temperature = float(0.1 + 0.2) }, // 0.30000000000000004
			b:    func(p *Prompt) { p.Temperature = float(0.3) },
		},
		{
			name: "unset format is text",
			a:    func(p *Prompt) { p.ResponseFormat.Type = "" },
			b:    func(p *Prompt) { p.ResponseFormat.Type = FormatText },
		},
		{
			name: "model family names the model",
			a:    func(p *Prompt) { p.Model, p.ModelFamily = "gpt-4o-2024-08-06", "gpt-4o" },
			b:    func(p *Prompt) { p.Model, p.ModelFamily = "gpt-4o-2024-11-20", "gpt-4o" },
		},
		{
			name: "required fields are a set",
			a:    func(p *Prompt) { p.ResponseFormat.RequiredFields = []string{"answer", "confidence"} },
			b:    func(p *Prompt) { p.ResponseFormat.RequiredFields = []string{"confidence", "answer"} },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a, b := basePrompt("hello"), basePrompt("hello")
			tt.a(&a)
			tt.b(&b)
			if exactKey("acme", a) != exactKey("acme", b) {
				t.Errorf("keys differ; want the same key")
			}
		})
	}
}

func TestDeriveKeyTemperatureZeroIsNotUnset(t *testing.T) {
	t.Parallel()
	zero := 0.0
	set, unset := basePrompt("hello"), basePrompt("hello")
	set.Temperature, unset.Temperature = &zero, nil
	if exactKey("acme", set) == exactKey("acme", unset) {
		t.Errorf("temperature 0 and unset share a key; want different keys")
	}
}

func TestDeriveKeyFieldsDoNotRunTogether(t *testing.T) {
	t.Parallel()
	// Without length prefixes, tenant "ab" + scenario "c" and tenant "a" + scenario "bc"
	// would hash the same bytes.
	p1, p2 := basePrompt("hello"), basePrompt("hello")
	p1.Scenario, p2.Scenario = "c", "bc"
	if exactKey("ab", p1) == exactKey("a", p2) {
		t.Errorf("(ab, c) and (a, bc) share a key; want different keys")
	}
}
