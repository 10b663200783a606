package cache

import (
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// SkipReason says why Store left an answer out of the cache. Skips follow policy; they are
// not errors.
type SkipReason string

// Skip reasons, as reported in StoreResponse.skipped_reason and the stores metric.
const (
	// SkipNotCacheable: the scenario's policy has cacheable: false.
	SkipNotCacheable SkipReason = "not_cacheable"
	// SkipFinishReason: the answer did not finish with "stop" (cut at max tokens, filtered).
	SkipFinishReason SkipReason = "finish_reason"
	// SkipEmpty: the answer is only white space.
	SkipEmpty SkipReason = "empty"
	// SkipNotVerified: the verifier rejected the answer.
	SkipNotVerified SkipReason = "not_verified"
	// SkipDegraded: the answer is a template or an approximate cached answer from the
	// degradation ladder; storing it would serve a stopgap as the answer to the question.
	SkipDegraded SkipReason = "degraded"
	// SkipCacheHit: the answer came from the cache; storing it again would renew its TTL.
	SkipCacheHit SkipReason = "cache_hit"
	// SkipHighTemperature: the answer was sampled above the policy's max_temperature, or
	// at the provider's default temperature (unset), which is usually 1.0.
	SkipHighTemperature SkipReason = "high_temperature"
	// SkipVolatilePrompt: a user turn contains a volatile marker (today, 库存 ...).
	SkipVolatilePrompt SkipReason = "volatile_prompt"
)

// skipReasons lists every SkipReason, for the metric's initial series.
var skipReasons = []SkipReason{
	SkipNotCacheable, SkipFinishReason, SkipEmpty, SkipNotVerified, SkipDegraded,
	SkipCacheHit, SkipHighTemperature, SkipVolatilePrompt,
}

// finishReasonStop is the only finish reason of a complete answer.
const finishReasonStop = "stop"

// policy is a Policy prepared for the request path.
type policy struct {
	cacheable            bool
	ttl                  time.Duration
	maxTemperatureBucket int64
	// markers are normalised like prompts, so they match the text they are compared with.
	markers []string
}

func compilePolicy(p Policy) policy {
	markers := make([]string, 0, len(p.VolatileMarkers))
	for _, m := range p.VolatileMarkers {
		markers = append(markers, normalizeText(m))
	}
	return policy{
		cacheable:            p.Cacheable,
		ttl:                  p.TTL,
		maxTemperatureBucket: temperatureBucket(p.MaxTemperature),
		markers:              markers,
	}
}

// skipReason returns why req may not be stored, or "" when it may. lastUser is the
// normalised last user message. Cheap checks run first; the marker scan runs last.
func (p policy) skipReason(req StoreRequest, lastUser string) SkipReason {
	switch {
	case !p.cacheable:
		return SkipNotCacheable
	case req.FinishReason != finishReasonStop:
		return SkipFinishReason
	case strings.TrimSpace(req.Content) == "":
		return SkipEmpty
	case req.VerificationFailed:
		return SkipNotVerified
	case req.Degraded:
		return SkipDegraded
	case req.FromCache:
		return SkipCacheHit
	// Compared by bucket, like the key: every request that shares a bucket gets the same
	// decision, and 0.30000000000000004 is not above 0.3.
	case req.Prompt.Temperature == nil || temperatureBucket(*req.Prompt.Temperature) > p.maxTemperatureBucket:
		return SkipHighTemperature
	case p.isVolatile(req.Prompt.Messages, lastUser):
		return SkipVolatilePrompt
	}
	return ""
}

// isVolatile reports whether any user turn contains a marker. Earlier user turns count
// too: after "what is the latest price?", the answer to "and in euros?" is just as
// volatile. System and assistant turns do not: system prompts routinely say "the current
// conversation", and they are part of the key anyway.
func (p policy) isVolatile(messages []Message, lastUser string) bool {
	if len(p.markers) == 0 {
		return false
	}
	if p.containsMarker(lastUser) {
		return true
	}
	for _, m := range messages[:len(messages)-1] {
		if m.Role == roleUser && p.containsMarker(normalizeText(m.Content)) {
			return true
		}
	}
	return false
}

// containsMarker reports whether normalised text contains a marker. A marker edge that is a
// letter or digit of a script written with spaces must sit on a word boundary, so "now"
// matches "now?" and "right now" but not "know" or "nowhere". Chinese and Japanese are
// written without spaces, so their markers match anywhere ("今天" in "今天天气").
func (p policy) containsMarker(text string) bool {
	for _, marker := range p.markers {
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

// needsWordBoundary reports whether r belongs to words delimited by spaces.
func needsWordBoundary(r rune) bool {
	return isWordRune(r) && !unicode.In(r, unicode.Han, unicode.Hiragana, unicode.Katakana, unicode.Thai, unicode.Lao, unicode.Khmer, unicode.Myanmar)
}
