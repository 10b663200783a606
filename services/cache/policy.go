package cache

import (
	"encoding/json"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/mantle-mesh/mantle/pkg/textsim"
)

// SkipReason says why Store left an answer out of the cache, or why Lookup did not search.
// Skips follow policy; they are not errors.
type SkipReason string

// Skip reasons, as reported in StoreResponse.skipped_reason, LookupResponse.miss_reason and
// the stores metric.
const (
	// SkipNotCacheable: the scenario's policy has cacheable: false.
	SkipNotCacheable SkipReason = "not_cacheable"
	// SkipFinishReason: the answer did not finish with "stop" (cut at max tokens, filtered).
	SkipFinishReason SkipReason = "finish_reason"
	// SkipEmpty: the answer is only white space.
	SkipEmpty SkipReason = "empty"
	// SkipNotVerified: the answer did not pass verification, or carries no verification.
	SkipNotVerified SkipReason = "not_verified"
	// SkipDegraded: the answer is a template or an approximate cached answer from the
	// degradation ladder; storing it would serve a stopgap as the answer to the question.
	SkipDegraded SkipReason = "degraded"
	// SkipCacheHit: the answer came from the cache; storing it again would renew its TTL.
	SkipCacheHit SkipReason = "cache_hit"
	// SkipRefusal: the answer declines to answer (a refusal marker).
	SkipRefusal SkipReason = "refusal"
	// SkipErrorAnswer: the answer is an error object ({"error": ...}) that came back as
	// content.
	SkipErrorAnswer SkipReason = "error_answer"
	// SkipHighTemperature: the answer was sampled above the policy's max_temperature, or
	// at the provider's default temperature (unset), which is usually 1.0.
	SkipHighTemperature SkipReason = "high_temperature"
	// SkipVolatilePrompt: a user turn contains a volatile marker (today, 库存 ...).
	SkipVolatilePrompt SkipReason = "volatile_prompt"
	// SkipPersonalPrompt: a user turn is about one person (my account, an e-mail address,
	// a phone or account number).
	SkipPersonalPrompt SkipReason = "personal_prompt"
	// SkipNoVector: the backend keeps only entries with a vector (Qdrant), and the question
	// had none: the embedder failed, or the question has no words.
	SkipNoVector SkipReason = "no_vector"
)

// skipReasons lists every SkipReason, for the metric's initial series.
var skipReasons = []SkipReason{
	SkipNotCacheable, SkipFinishReason, SkipEmpty, SkipNotVerified, SkipDegraded, SkipCacheHit,
	SkipRefusal, SkipErrorAnswer, SkipHighTemperature, SkipVolatilePrompt, SkipPersonalPrompt,
	SkipNoVector,
}

// finishReasonStop and finishReasonToolCalls (with the tool calls stored) are the finish
// reasons of a complete answer.
const (
	finishReasonStop      = "stop"
	finishReasonToolCalls = "tool_calls"
)

// policy is a Policy prepared for the request path.
type policy struct {
	cacheable            bool
	ttl                  time.Duration
	maxStaleness         time.Duration
	maxTemperatureBucket int64
	thresholds           thresholds
	// Markers are normalised like prompts, so they match the text they are compared with.
	volatile []needle
	personal []needle
	refusals []needle
	patterns []filteredRegexp
	// detectVolatile and detectPersonal turn on the built-in detection (classify.go).
	detectVolatile, detectPersonal bool
}

// compilePolicy prepares p; p must have passed validation.
func compilePolicy(p Policy, defaults thresholds) policy {
	compiled := policy{
		cacheable:            p.Cacheable,
		ttl:                  p.TTL,
		maxStaleness:         p.MaxStaleness,
		maxTemperatureBucket: temperatureBucket(p.MaxTemperature),
		thresholds:           p.thresholds(defaults),
		volatile:             normalizeAll(p.VolatileMarkers),
		personal:             normalizeAll(p.PersonalMarkers),
		refusals:             normalizeAll(p.RefusalMarkers),
		detectVolatile:       p.DetectVolatile,
		detectPersonal:       p.DetectPersonal,
	}
	for _, pattern := range p.PersonalPatterns {
		compiled.patterns = append(compiled.patterns, compileFiltered(pattern))
	}
	return compiled
}

func normalizeAll(markers []string) []needle {
	out := make([]needle, 0, len(markers))
	for _, m := range markers {
		out = append(out, newNeedle(normalizeText(m)))
	}
	return out
}

// promptSkip returns why no answer to p may be stored or served, or "": the scenario is
// not cacheable, the temperature is too high, or a user turn is volatile or personal.
// Store and Lookup apply the same rules, so a lookup never serves what Store would have
// refused (a vector match could otherwise answer "what is the price now?" with the answer
// to "what is the price?").
func (p policy) promptSkip(prompt Prompt, lastUser string) SkipReason {
	switch {
	case !p.cacheable:
		return SkipNotCacheable
	// Compared by bucket, like the key: every request that shares a bucket gets the same
	// decision, and 0.30000000000000004 is not above 0.3.
	case prompt.Temperature == nil || temperatureBucket(*prompt.Temperature) > p.maxTemperatureBucket:
		return SkipHighTemperature
	}
	// Earlier user turns count too: after "what is the latest price?", the answer to "and
	// in euros?" is just as volatile. System and assistant turns do not: system prompts
	// routinely say "the current conversation", and they are part of the scope anyway.
	// A volatile turn anywhere decides; a personal one decides unless a later turn is
	// volatile.
	var stats textStats // one turn's, reused: it is a kilobyte, on the stack
	volatile, personal := p.scanTurn(lastUser, &stats, true)
	if volatile {
		return SkipVolatilePrompt
	}
	for _, m := range prompt.Messages[:len(prompt.Messages)-1] {
		if m.Role != roleUser {
			continue
		}
		volatile, isPersonal := p.scanTurn(normalizeText(m.Content), &stats, !personal)
		if volatile {
			return SkipVolatilePrompt
		}
		personal = personal || isPersonal
	}
	if personal {
		return SkipPersonalPrompt
	}
	return ""
}

// scanTurn reports whether one normalised user turn is volatile and, when checkPersonal
// is set, whether it is personal. stats is scratch space for the turn's prefilter.
func (p policy) scanTurn(text string, stats *textStats, checkPersonal bool) (volatile, personal bool) {
	stats.reset(text)
	// The classifier reads the text with ASCII apostrophes; when that is another text
	// (rarely), its rules run without the prefilter.
	ctext, cstats := classifierText(text), stats
	if ctext != text {
		cstats = nil
	}
	if containsMarker(text, stats, p.volatile) || (p.detectVolatile && matchesAny(ctext, cstats, volatileRules)) {
		return true, false
	}
	if !checkPersonal {
		return false, false
	}
	if containsMarker(text, stats, p.personal) || (p.detectPersonal && personalQuestion(ctext, cstats)) {
		return false, true
	}
	for i := range p.patterns {
		if p.patterns[i].matchString(text, stats) {
			return false, true
		}
	}
	return false, false
}

// storeSkip returns why req may not be stored, or "" when it may. prompt is promptSkip's
// reason for req's prompt, which the caller has already needed (the prompt scans are the
// dearest checks, so they run once). Cheap checks run first.
func (p policy) storeSkip(req StoreRequest, prompt SkipReason) SkipReason {
	switch {
	case !p.cacheable:
		return SkipNotCacheable
	case req.FinishReason != finishReasonStop && (req.FinishReason != finishReasonToolCalls || len(req.ToolCalls) == 0):
		return SkipFinishReason
	case strings.TrimSpace(req.Content) == "" && len(req.ToolCalls) == 0:
		return SkipEmpty
	case !req.Verified:
		return SkipNotVerified
	case req.Degraded:
		return SkipDegraded
	case req.FromCache:
		return SkipCacheHit
	case containsMarker(normalizeText(req.Content), nil, p.refusals):
		return SkipRefusal
	case isErrorObject(req.Content):
		return SkipErrorAnswer
	}
	if prompt == SkipPersonalPrompt && req.Prompt.EndUser != "" {
		return "" // kept in the end user's own scope (endUserScope)
	}
	return prompt
}

// isErrorObject reports whether content is a JSON object with a top-level "error" member,
// the shape of provider errors that arrive as a 200 response's content.
func isErrorObject(content string) bool {
	trimmed := strings.TrimSpace(content)
	if !strings.HasPrefix(trimmed, "{") {
		return false
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal([]byte(trimmed), &obj) != nil {
		return false
	}
	_, ok := obj["error"]
	return ok
}

// containsMarker reports whether normalised text contains a marker. A marker edge that is a
// letter or digit of a script written with spaces must sit on a word boundary, so "now"
// matches "now?" and "right now" but not "know" or "nowhere". Chinese and Japanese are
// written without spaces, and Korean attaches particles to its words, so their markers
// match anywhere ("今天" in "今天天气"). stats, when not nil, are text's: markers they rule
// out are not searched.
func containsMarker(text string, stats *textStats, markers []needle) bool {
	for i := range markers {
		if !stats.mayContain(&markers[i]) {
			continue
		}
		marker := markers[i].word
		for from := 0; from < len(text); {
			i := strings.Index(text[from:], marker)
			if i < 0 {
				break
			}
			start, end := from+i, from+i+len(marker)
			if boundaryBefore(text, start, marker) && boundaryAfter(text, end, marker) {
				return true
			}
			// UTF-8 is self-synchronising: a match can only start at a rune start, so
			// stepping one byte cannot produce a false match.
			from = start + 1
		}
	}
	return false
}

func boundaryBefore(text string, start int, marker string) bool {
	first, _ := utf8.DecodeRuneInString(marker)
	if start == 0 || !needsWordBoundary(first) {
		return true
	}
	prev, _ := utf8.DecodeLastRuneInString(text[:start])
	return !isWordRune(prev)
}

func boundaryAfter(text string, end int, marker string) bool {
	last, _ := utf8.DecodeLastRuneInString(marker)
	if end == len(text) || !needsWordBoundary(last) {
		return true
	}
	next, _ := utf8.DecodeRuneInString(text[end:])
	return !isWordRune(next)
}

func isWordRune(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }

// needsWordBoundary reports whether r belongs to words delimited by spaces. Chinese,
// Japanese, Thai, Lao, Khmer and Burmese do not space their words, and Korean attaches
// its particles to them (오늘은 is 오늘, today, and 은): a marker in those scripts matches
// anywhere.
func needsWordBoundary(r rune) bool {
	return isWordRune(r) && !textsim.IsCJK(r) && !unicode.In(r, unicode.Thai, unicode.Lao, unicode.Khmer, unicode.Myanmar)
}
