package cache

import (
	"crypto/sha256"
	"encoding/binary"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"golang.org/x/text/unicode/norm"
	"pgregory.net/rapid"
)

// The prompt scans and the keys have fast paths (prefilter.go, stack buffers, text that
// needs no folding). The references below are the plain forms they replace: every marker
// and trigger searched, every pattern run, every buffer allocated. The tests hold the fast
// paths to them on arbitrary prompts, so decisions and keys cannot drift.

// referencePromptSkip is promptSkip without prefilters: each user turn searched for every
// marker, trigger and pattern, the volatile checks over all turns before the personal ones.
func referencePromptSkip(p policy, prompt Prompt, lastUser string) SkipReason {
	switch {
	case !p.cacheable:
		return SkipNotCacheable
	case prompt.Temperature == nil || temperatureBucket(*prompt.Temperature) > p.maxTemperatureBucket:
		return SkipHighTemperature
	}
	userTurns := []string{lastUser}
	for _, m := range prompt.Messages[:len(prompt.Messages)-1] {
		if m.Role == roleUser {
			userTurns = append(userTurns, normalizeText(m.Content))
		}
	}
	for _, text := range userTurns {
		if referenceContainsMarker(text, p.volatile) || (p.detectVolatile && referenceMatchesAny(classifierText(text), volatileRules)) {
			return SkipVolatilePrompt
		}
	}
	for _, text := range userTurns {
		ctext := classifierText(text)
		if referenceContainsMarker(text, p.personal) ||
			(p.detectPersonal && referenceMatchesAny(ctext, personalRules) && !referenceMatchesAny(ctext, generalFrames)) {
			return SkipPersonalPrompt
		}
		for _, pattern := range p.patterns {
			if pattern.re.MatchString(text) {
				return SkipPersonalPrompt
			}
		}
	}
	return ""
}

func referenceContainsMarker(text string, markers []needle) bool {
	for _, m := range markers {
		marker := m.word
		for from := 0; from < len(text); {
			i := strings.Index(text[from:], marker)
			if i < 0 {
				break
			}
			start, end := from+i, from+i+len(marker)
			if boundaryBefore(text, start, marker) && boundaryAfter(text, end, marker) {
				return true
			}
			from = start + 1
		}
	}
	return false
}

func referenceMatchesAny(text string, b byScript) bool {
	return referenceMatch(text, b.ascii) || (!isASCII(text) && referenceMatch(text, b.other))
}

func referenceMatch(text string, r rules) bool {
	for _, l := range r.literals {
		if strings.Contains(text, l.word) {
			return true
		}
	}
	for _, g := range r.gated {
		for _, t := range g.triggers {
			if strings.Contains(text, t.word) {
				if g.re.re.MatchString(text) {
					return true
				}
				break
			}
		}
	}
	return false
}

// referenceFoldText is foldText without its fast path.
func referenceFoldText(s string) string {
	s = norm.NFKC.String(s)
	var b strings.Builder
	b.Grow(len(s))
	pendingSpace := false
	for _, r := range s {
		if unicode.IsSpace(r) {
			pendingSpace = b.Len() > 0
			continue
		}
		if pendingSpace {
			b.WriteByte(' ')
			pendingSpace = false
		}
		b.WriteRune(r)
	}
	return b.String()
}

// referenceDeriveKeys is deriveKeys with buffers allocated to size.
func referenceDeriveKeys(tenant, namespace string, p Prompt) keys {
	question := referenceFoldText(p.Messages[len(p.Messages)-1].Content)
	normalized := trimText(question)
	turns := p.Messages[:len(p.Messages)-1]
	size := 8 + len(p.ContextFingerprint) + binary.MaxVarintLen64
	for _, m := range turns {
		size += len(m.Role) + len(m.Name) + len(m.Content) + 3*binary.MaxVarintLen64
	}
	h := make([]byte, 0, size)
	h = binary.AppendUvarint(h, uint64(len(turns)))
	for _, m := range turns {
		h = appendField(h, m.Role)
		h = appendField(h, m.Name)
		h = appendField(h, m.Content)
	}
	h = appendField(h, p.ContextFingerprint)
	history := sha256.Sum256(h)
	family := p.ModelFamily
	if family == "" {
		family = p.Model
	}
	b := make([]byte, 0, 160+len(p.ResponseFormat.JSONSchema))
	b = appendField(b, keyVersion)
	b = appendField(b, tenant)
	b = appendField(b, p.Scenario)
	b = appendField(b, namespace)
	b = appendField(b, family)
	b = appendField(b, temperatureField(p.Temperature))
	b = appendField(b, strconv.FormatInt(int64(p.MaxTokens), 10))
	b = appendField(b, string(p.ResponseFormat.typeOrText()))
	b = appendField(b, p.ResponseFormat.JSONSchema)
	required := slices.Sorted(slices.Values(p.ResponseFormat.RequiredFields))
	b = binary.AppendUvarint(b, uint64(len(required)))
	for _, f := range required {
		b = appendField(b, f)
	}
	b = appendField(b, string(history[:]))
	partition := sha256.Sum256(b)
	e := make([]byte, 0, len(partition)+len(normalized)+binary.MaxVarintLen64)
	e = append(e, partition[:]...)
	e = appendField(e, normalized)
	return keys{Partition: partition, Exact: sha256.Sum256(e), Question: question, Normalized: normalized}
}

// promptFragments are the material of random user turns: every default marker, every
// classifier trigger and literal, pieces of the sentences the classifier reads, and what
// the default patterns look for, with their near misses.
func promptFragments() []string {
	frags := slices.Concat(defaultVolatileMarkers, defaultPersonalMarkers, defaultRefusalMarkers, []string{
		"what", "what's", "what’s", "is", "it", "the", "my", "i", "do", "did", "have", "how", "much", "many", "can", "where",
		"order", "balance", "points", "account", "package", "refund", "subscription", "time", "date", "day", "today", "price",
		"bitcoin", "usd", "to", "cny", "down", "working", "not", "right", "now", "score", "game", "news", "left", "owe",
		"我的", "我", "还有", "多少", "余额", "积分", "订单", "怎么", "修改", "可以", "几点", "天气", "到哪了",
		"jane.doe@example.com", "a@b", "@", "x@y.z", "+1 415 555 0100", "+86 138 1234 5678", "415-555-0100", "415 555 010",
		"2024-01-01", "6222021234567890123", "123456789", "1234567890", "1,000,000", "Benchmark request 123456:",
		"HOW", "MY", "Today", "ＭＹ", "１２３４５６７８９０", "\u212a", "ſ",
	})
	for _, b := range []byScript{volatileRules, personalRules, generalFrames} {
		for _, r := range []rules{b.ascii, b.other} {
			for _, l := range r.literals {
				frags = append(frags, l.word)
			}
			for _, g := range r.gated {
				for _, t := range g.triggers {
					frags = append(frags, t.word)
				}
			}
		}
	}
	return frags
}

var fragmentSeparators = []string{" ", "", " ", ", ", "?", "？", "  ", "\n", "\t", "-", "'", "’", "。", "\xff"}

func drawTurn(t *rapid.T, frags []string, label string) string {
	n := rapid.IntRange(1, 10).Draw(t, label+"-n")
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteString(rapid.SampledFrom(fragmentSeparators).Draw(t, label+"-sep"))
		}
		b.WriteString(rapid.OneOf(rapid.SampledFrom(frags), rapid.String()).Draw(t, label+"-frag"))
	}
	return b.String()
}

// drawPolicy draws the default policy, or one with other markers, patterns and detection.
func drawPolicy(t *rapid.T, frags []string) policy {
	p := DefaultConfig().DefaultPolicy
	if rapid.Bool().Draw(t, "custom") {
		p.VolatileMarkers = rapid.SliceOfN(rapid.SampledFrom(frags), 0, 5).Draw(t, "volatile")
		p.PersonalMarkers = rapid.SliceOfN(rapid.SampledFrom(frags), 0, 5).Draw(t, "personal")
		p.PersonalPatterns = nil
		for _, expr := range rapid.SliceOfN(rapid.Custom(func(t *rapid.T) string {
			if rapid.Bool().Draw(t, "default") {
				return rapid.SampledFrom(defaultPersonalPatterns).Draw(t, "pattern")
			}
			return drawRegexp(t, 3)
		}), 0, 4).Draw(t, "patterns") {
			if _, err := syntaxCheck(expr); err == nil {
				p.PersonalPatterns = append(p.PersonalPatterns, expr)
			}
		}
		p.DetectVolatile = rapid.Bool().Draw(t, "detectVolatile")
		p.DetectPersonal = rapid.Bool().Draw(t, "detectPersonal")
	}
	return compilePolicy(p, defaultThresholds(EmbedderLexical))
}

func TestPromptSkipMatchesReference(t *testing.T) {
	t.Parallel()
	frags := promptFragments()
	rapid.Check(t, func(t *rapid.T) {
		pol := drawPolicy(t, frags)
		var messages []Message
		for i := range rapid.IntRange(0, 3).Draw(t, "earlier") {
			role := rapid.SampledFrom([]string{roleUser, roleUser, "assistant", "system"}).Draw(t, "role")
			messages = append(messages, Message{Role: role, Content: drawTurn(t, frags, "turn"+strconv.Itoa(i))})
		}
		last := drawTurn(t, frags, "last")
		messages = append(messages, Message{Role: roleUser, Content: last})
		temperature := 0.0
		prompt := Prompt{Messages: messages, Temperature: &temperature}
		lastUser := normalizeText(last)
		if got, want := pol.promptSkip(prompt, lastUser), referencePromptSkip(pol, prompt, lastUser); got != want {
			t.Fatalf("promptSkip(%q) = %q, reference %q", messages, got, want)
		}
	})
}

// TestPromptSkipMatchesReferenceOnExamples runs both on the classifier's and the policy's
// example questions, alone and after one another.
func TestPromptSkipMatchesReferenceOnExamples(t *testing.T) {
	t.Parallel()
	frags := promptFragments()
	pol := compilePolicy(DefaultConfig().DefaultPolicy, defaultThresholds(EmbedderLexical))
	temperature := 0.0
	for i, q := range frags {
		for _, earlier := range []string{"", frags[(i*7+3)%len(frags)]} {
			p := Prompt{Messages: []Message{{Role: roleUser, Content: q}}, Temperature: &temperature}
			if earlier != "" {
				p.Messages = []Message{{Role: roleUser, Content: earlier}, {Role: "assistant", Content: "ok"}, {Role: roleUser, Content: q}}
			}
			if got, want := pol.promptSkip(p, normalizeText(q)), referencePromptSkip(pol, p, normalizeText(q)); got != want {
				t.Errorf("promptSkip(%q after %q) = %q, reference %q", q, earlier, got, want)
			}
		}
	}
}

// TestPromptSkipTurnOrder puts volatile, personal and plain turns in every order: a
// volatile turn anywhere decides over a personal one anywhere.
func TestPromptSkipTurnOrder(t *testing.T) {
	t.Parallel()
	pol := compilePolicy(DefaultConfig().DefaultPolicy, defaultThresholds(EmbedderLexical))
	temperature := 0.0
	turns := []string{"How do I reset my password?", "What is the latest version?", "What is my balance?", "mail jane.doe@example.com"}
	for _, a := range turns {
		for _, b := range turns {
			for _, c := range turns {
				p := Prompt{Messages: []Message{
					{Role: "system", Content: "Be brief."}, {Role: roleUser, Content: a}, {Role: "assistant", Content: "ok"},
					{Role: roleUser, Content: b}, {Role: roleUser, Content: c},
				}, Temperature: &temperature}
				if got, want := pol.promptSkip(p, normalizeText(c)), referencePromptSkip(pol, p, normalizeText(c)); got != want {
					t.Errorf("promptSkip(%q, %q, %q) = %q, reference %q", a, b, c, got, want)
				}
			}
		}
	}
}

func FuzzPromptSkip(f *testing.F) {
	for _, q := range []string{"What is my balance?", "Send it to jane.doe@example.com", "我的订单到哪了", "what’s the time", "call +1 415 555 0100"} {
		f.Add(q, "How do I reset my password?")
	}
	pol := compilePolicy(DefaultConfig().DefaultPolicy, defaultThresholds(EmbedderLexical))
	temperature := 0.0
	f.Fuzz(func(t *testing.T, last, earlier string) {
		p := Prompt{Messages: []Message{{Role: roleUser, Content: earlier}, {Role: roleUser, Content: last}}, Temperature: &temperature}
		if got, want := pol.promptSkip(p, normalizeText(last)), referencePromptSkip(pol, p, normalizeText(last)); got != want {
			t.Fatalf("promptSkip(%q after %q) = %q, reference %q", last, earlier, got, want)
		}
	})
}

func TestDeriveKeysMatchesReference(t *testing.T) {
	t.Parallel()
	frags := promptFragments()
	rapid.Check(t, func(t *rapid.T) {
		p := basePrompt(drawTurn(t, frags, "question"))
		if rapid.Bool().Draw(t, "spaces") {
			p.Messages[1].Content = rapid.SampledFrom([]string{" ", "\u3000", "\t", ""}).Draw(t, "lead") + p.Messages[1].Content + rapid.SampledFrom([]string{" ", "\n", ""}).Draw(t, "trail")
		}
		p.Messages[0].Content = rapid.String().Draw(t, "system")
		p.ContextFingerprint = rapid.String().Draw(t, "fingerprint")
		p.MaxTokens = rapid.Int32Range(0, 1<<31-1).Draw(t, "maxTokens")
		p.ResponseFormat.JSONSchema = strings.Repeat(rapid.String().Draw(t, "schema"), rapid.IntRange(0, 40).Draw(t, "schemaRepeat"))
		p.ResponseFormat.RequiredFields = rapid.SliceOfN(rapid.SampledFrom([]string{"a", "b", "id", "name", ""}), 0, 5).Draw(t, "required")
		if rapid.Bool().Draw(t, "long") {
			p.Messages[1].Content = strings.Repeat(p.Messages[1].Content, 50)
			p.Messages[0].Content = strings.Repeat("system ", 100)
		}
		tenant := rapid.String().Draw(t, "tenant")
		if got, want := deriveKeys(tenant, "lexical-v1", p), referenceDeriveKeys(tenant, "lexical-v1", p); got != want {
			t.Fatalf("deriveKeys(%+v) = %+v, reference %+v", p, got, want)
		}
		s := rapid.String().Draw(t, "text")
		if got, want := foldText(s), referenceFoldText(s); got != want {
			t.Fatalf("foldText(%q) = %q, reference %q", s, got, want)
		}
	})
}

func TestFoldTextMatchesReference(t *testing.T) {
	t.Parallel()
	for _, s := range []string{
		"", " ", "a", " a", "a ", "a  b", "a b", "a\tb", "a\u00a0b", "a\u3000b", "\u0085", "a\u0085b", "ＡＢＣ", "\xff", "a\xffb",
		"\xe6\x97", "\ufffd", "e\u0301", "How do I reset my password?", "华为手机 B456买了30天还能退货吗", "x\u2028y", "\u200b",
	} {
		if got, want := foldText(s), referenceFoldText(s); got != want {
			t.Errorf("foldText(%q) = %q, reference %q", s, got, want)
		}
	}
}

// syntaxCheck reports whether expr is a valid personal pattern.
func syntaxCheck(expr string) (*regexp.Regexp, error) { return regexp.Compile(expr) }
