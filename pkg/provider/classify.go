package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// This file holds the HTTP classification shared by the adapters. OpenAI-compatible servers
// and Anthropic disagree on body shapes and header names but not on what a failure means,
// so the mapping from "what came back" to a Class lives here once; adapters only decide
// where their bodies and headers are.

// APIError is the error object an OpenAI-compatible or Anthropic API puts in a response
// body, reduced to the fields classification looks at.
type APIError struct {
	// Type is the error's category, e.g. "invalid_request_error" or "overloaded_error".
	Type string
	// Code is OpenAI's machine-readable code, e.g. "context_length_exceeded". Some
	// compatible servers send a number (the HTTP status); it is kept as its decimal text.
	Code string
	// Message is the provider's explanation for humans.
	Message string
}

// ParseAPIError extracts the error object from a response body. It understands the shapes
// seen in the wild: OpenAI and DeepSeek {"error":{"type","code","message"}}, Anthropic
// {"type":"error","error":{"type","message"}}, Ollama {"error":"text"} and vLLM's top-level
// {"object":"error","type","code","message"}. It reports false when body is not JSON or
// carries no error, so a successful body never looks like a failure.
func ParseAPIError(body []byte) (APIError, bool) {
	// Every shape above needs the word error as a key or value, in any case (keys match
	// case-insensitively). A body without it, and without a \u escape that could spell
	// it, is not decoded: most bodies are answers, and decoding each one twice cost 2% of
	// the mesh's CPU.
	if !containsFold(body, "error") && !bytes.Contains(body, []byte(`\u`)) {
		return APIError{}, false
	}
	var env struct {
		Error   json.RawMessage `json:"error"`
		Object  string          `json:"object"`
		Type    string          `json:"type"`
		Code    json.RawMessage `json:"code"`
		Message string          `json:"message"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return APIError{}, false
	}
	if raw := strings.TrimSpace(string(env.Error)); raw != "" {
		switch raw {
		case "null", "false", `""`:
			return APIError{}, false
		}
		var obj struct {
			Type    string          `json:"type"`
			Code    json.RawMessage `json:"code"`
			Message string          `json:"message"`
		}
		if err := json.Unmarshal(env.Error, &obj); err == nil {
			return APIError{Type: obj.Type, Code: codeText(obj.Code), Message: obj.Message}, true
		}
		var text string
		if err := json.Unmarshal(env.Error, &text); err == nil {
			return APIError{Message: text}, true
		}
		return APIError{Message: raw}, true
	}
	if env.Object == "error" {
		return APIError{Type: env.Type, Code: codeText(env.Code), Message: env.Message}, true
	}
	return APIError{}, false
}

// containsFold reports whether b contains word, an ASCII lower-case word, in any case.
// ASCII folding is enough: encoding/json folds no other letter into e, o or r.
func containsFold(b []byte, word string) bool {
	for i := 0; i+len(word) <= len(b); i++ {
		if b[i]|0x20 == word[0] && bytes.EqualFold(b[i:i+len(word)], []byte(word)) {
			return true
		}
	}
	return false
}

// codeText renders a JSON code that may be a string, a number or null.
func codeText(raw json.RawMessage) string {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err == nil {
		return n.String()
	}
	return ""
}

// ClassifyHTTP classifies a non-2xx response from its status, headers and (already read,
// possibly truncated) body. The status decides first because it is the one signal every
// server sends; the body only refines 4xx answers, where one status (400) covers failures
// the router must treat very differently: a context overflow fails over to a larger model,
// a content-policy refusal must not be retried anywhere, a plain bad request is final.
// now turns absolute reset times into durations; nil means time.Now. A 2xx status
// returns nil.
func ClassifyHTTP(status int, h http.Header, body []byte, now func() time.Time) *Error {
	if status >= 200 && status < 300 {
		return nil
	}
	apiErr, parsed := ParseAPIError(body)
	e := &Error{
		StatusCode: status,
		RequestID:  RequestID(h),
		RetryAfter: explicitRetryAfter(h, now),
	}
	if parsed {
		e.Message = apiErr.Message
	} else {
		e.Message = snippet(body)
	}
	if status >= 300 && status < 400 {
		// Provider clients do not follow redirects (RefuseRedirects); the operator needs
		// the address.
		e.Message = RedirectMessage(status, h.Get("Location"))
	}
	named := namedClass(apiErr)
	switch {
	case status == http.StatusTooManyRequests && named == mantlev1.ErrorClass_ERROR_CLASS_AUTH:
		// OpenAI answers 429 both for "slow down" and for "this key has no credit left"
		// (insufficient_quota); waiting cures only the first, another key the second.
		e.Class = mantlev1.ErrorClass_ERROR_CLASS_AUTH
	case status == http.StatusTooManyRequests:
		e.Class = mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED
		e.RetryAfter = RetryAfter(h, now)
	case status == http.StatusServiceUnavailable || status == 529: // 529: Anthropic's "overloaded"
		e.Class = mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED
	case status >= 500:
		e.Class = mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT
	case status == http.StatusRequestTimeout:
		e.Class = mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT
	case status == http.StatusUnauthorized || status == http.StatusForbidden ||
		status == http.StatusPaymentRequired: // 402: DeepSeek's "insufficient balance"
		e.Class = mantlev1.ErrorClass_ERROR_CLASS_AUTH
	case status >= 400:
		switch named {
		case mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED,
			mantlev1.ErrorClass_ERROR_CLASS_CONTEXT_LENGTH_EXCEEDED:
			e.Class = named
		default:
			e.Class = mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST
		}
	default:
		e.Class = mantlev1.ErrorClass_ERROR_CLASS_UNKNOWN
	}
	return e
}

// ClassifyEmbedded classifies an error a provider reported inside a successful response: a
// 200 body with an error object, or an error event in the middle of a stream. Such errors are
// HIDDEN_ERROR (they slipped past the status code, and are worth retrying) unless they name
// a class that changes what the router must do next: a content-policy refusal (never
// retry, propagate the reason), a context overflow (go to a larger model), a rate limit or
// overload (cool the key down or count against the breaker) or an auth failure (another key).
// The caller fills in RequestID and StatusCode.
func ClassifyEmbedded(apiErr APIError) *Error {
	e := &Error{Class: mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR, Message: apiErr.Message}
	if e.Message == "" {
		e.Message = strings.TrimSpace(apiErr.Type + " " + apiErr.Code)
	}
	switch named := namedClass(apiErr); named {
	case mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED,
		mantlev1.ErrorClass_ERROR_CLASS_CONTEXT_LENGTH_EXCEEDED,
		mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED,
		mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED,
		mantlev1.ErrorClass_ERROR_CLASS_AUTH:
		e.Class = named
	}
	return e
}

// namedClass is the class an error object names by its code, type or message, or
// UNSPECIFIED when it names none. Codes are checked before types because they are more
// specific: OpenAI reports an invalid key as type "invalid_request_error", code
// "invalid_api_key".
func namedClass(e APIError) Class {
	switch {
	case isContentFilter(e):
		return mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED
	case isContextOverflow(e):
		return mantlev1.ErrorClass_ERROR_CLASS_CONTEXT_LENGTH_EXCEEDED
	}
	for _, name := range []string{e.Code, e.Type} {
		switch name {
		case "rate_limit_error", "rate_limit_exceeded":
			return mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED
		case "overloaded_error":
			return mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED
		case "authentication_error", "permission_error", "invalid_api_key",
			"insufficient_quota", "billing_error":
			return mantlev1.ErrorClass_ERROR_CLASS_AUTH
		case "api_error", "server_error":
			return mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT
		case "timeout_error":
			return mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT
		case "invalid_request_error", "not_found_error", "request_too_large":
			return mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST
		}
	}
	return mantlev1.ErrorClass_ERROR_CLASS_UNSPECIFIED
}

// isContextOverflow recognises "the prompt does not fit this model". Providers rarely give
// it a code of its own (Anthropic and vLLM only say so in prose), so messages count too.
func isContextOverflow(e APIError) bool {
	if e.Code == "context_length_exceeded" || e.Type == "context_length_exceeded" {
		return true
	}
	return containsAny(strings.ToLower(e.Message),
		"maximum context length",     // OpenAI, DeepSeek, vLLM
		"context_length_exceeded",    // proxies that put the code in the text
		"context length exceeded",    //
		"prompt is too long",         // Anthropic
		"exceed context limit",       // Anthropic: input length and `max_tokens` exceed context limit
		"exceeds the context window", // OpenAI Responses-style wording
	)
}

// isContentFilter recognises a refusal by the provider's safety system. The message matters
// as much as the code: it is the reason the caller is owed.
func isContentFilter(e APIError) bool {
	for _, name := range []string{e.Code, e.Type} {
		switch name {
		case "content_filter", "content_policy_violation",
			"data_inspection_failed": // Qwen (DashScope) compatible mode
			return true
		}
	}
	return containsAny(strings.ToLower(e.Message),
		"content management policy", // Azure OpenAI
		"content_policy_violation",
		"content policy violation",
	)
}

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// RefuseRedirects is the CheckRedirect of every HTTP client that calls a model provider:
// Go's client would resend a redirected POST (301, 302, 303) as a GET without its body,
// and a 307's or 308's body and credentials to wherever the answer points. The redirect
// comes back as the response instead, a failure whose message (RedirectMessage) names
// where it pointed.
func RefuseRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// RedirectMessage says that a provider redirected with status to location, named without
// its credentials, query or fragment (a signed URL's secrets stay out of logs and errors).
func RedirectMessage(status int, location string) string {
	target := "no Location"
	if u, err := url.Parse(location); err == nil && location != "" {
		u.User, u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment = nil, "", false, "", ""
		target = snippet([]byte(u.String()))
	} else if location != "" {
		target = "an unparseable Location"
	}
	return fmt.Sprintf("provider redirected (HTTP %d) to %s; redirects are not followed, set the provider's base_url to the address that answers", status, target)
}

// snippet turns a non-JSON error body (an HTML page from a gateway, say) into a short,
// printable message.
func snippet(body []byte) string {
	const limit = 256
	s := strings.TrimSpace(string(body))
	if len(s) > limit {
		s = s[:limit]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
		s += "..."
	}
	return strings.ToValidUTF8(s, "?")
}

// ClassifyTransport classifies a failure to get or read a response: err is what
// http.Client.Do or a body read returned and must not be nil. When ctx is done its error
// decides, whatever the transport said, because after a cancellation the transport reports
// arbitrary symptoms (closed connections, EOF) of what was really the caller's decision.
func ClassifyTransport(ctx context.Context, err error) *Error {
	if err == nil {
		return nil
	}
	if pe, ok := errors.AsType[*Error](err); ok {
		return pe
	}
	if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
		err = fmt.Errorf("%w: %w", ctxErr, err)
	}
	e := &Error{Class: mantlev1.ErrorClass_ERROR_CLASS_UNKNOWN, Err: err}
	var netErr net.Error
	switch {
	case errors.Is(err, context.Canceled):
		e.Class = mantlev1.ErrorClass_ERROR_CLASS_CANCELED
	case errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &netErr) && netErr.Timeout():
		e.Class = mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNABORTED), errors.Is(err, syscall.EPIPE),
		errors.Is(err, net.ErrClosed):
		e.Class = mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT
	default:
		// Any other failure at the socket level (DNS, unreachable network) is worth
		// trying again; what remains (bad URL scheme, TLS trust) is left UNKNOWN.
		if _, ok := errors.AsType[*net.OpError](err); ok {
			e.Class = mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT
		} else if _, ok := errors.AsType[*net.DNSError](err); ok {
			e.Class = mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT
		}
	}
	return e
}

// RequestID is the provider's request id: OpenAI and most compatible servers send
// x-request-id, Anthropic sends request-id.
func RequestID(h http.Header) string {
	if id := h.Get("X-Request-Id"); id != "" {
		return id
	}
	return h.Get("Request-Id")
}

// RetryAfter is how long a rate-limited caller should wait, from the headers of a 429. An
// explicit Retry-After (seconds or an HTTP date) or OpenAI's retry-after-ms wins; otherwise
// the rate-limit reset headers answer, preferring the limit that is exhausted. It is 0 when
// the headers say nothing. now turns absolute times into durations; nil means time.Now.
func RetryAfter(h http.Header, now func() time.Time) time.Duration {
	if d := explicitRetryAfter(h, now); d > 0 {
		return d
	}
	var exhausted, longest time.Duration
	for _, l := range rateLimitHeaders {
		reset, ok := parseReset(h.Get(l.reset), now)
		if !ok {
			continue
		}
		longest = max(longest, reset)
		if remaining, ok := parseCount(h.Get(l.remaining)); ok && remaining <= 0 {
			exhausted = max(exhausted, reset)
		}
	}
	if exhausted > 0 {
		return exhausted
	}
	// No limit admits to being exhausted (a burst or concurrency limit, say): waiting for
	// the slowest window is the safe guess, and the router can pick another key meanwhile.
	return longest
}

// explicitRetryAfter reads the headers that are a retry hint on any status (a 503 may carry
// Retry-After too), unlike reset headers, which OpenAI sends on every response.
func explicitRetryAfter(h http.Header, now func() time.Time) time.Duration {
	if v := strings.TrimSpace(h.Get("Retry-After-Ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms > 0 {
			return durationOf(ms, time.Millisecond)
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseFloat(v, 64); err == nil {
		return durationOf(secs, time.Second)
	}
	if t, err := http.ParseTime(v); err == nil {
		return untilPositive(t, now)
	}
	return 0
}

// limitHeaders names the pair of headers that describe one rate limit. OpenAI sends resets
// as durations ("6m0s"), Anthropic as RFC 3339 times; parseReset takes both.
type limitHeaders struct{ remaining, reset string }

var (
	openAIRequests        = limitHeaders{"X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests"}
	openAITokens          = limitHeaders{"X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens"}
	anthropicRequests     = limitHeaders{"Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Requests-Reset"}
	anthropicTokens       = limitHeaders{"Anthropic-Ratelimit-Tokens-Remaining", "Anthropic-Ratelimit-Tokens-Reset"}
	anthropicInputTokens  = limitHeaders{"Anthropic-Ratelimit-Input-Tokens-Remaining", "Anthropic-Ratelimit-Input-Tokens-Reset"}
	anthropicOutputTokens = limitHeaders{"Anthropic-Ratelimit-Output-Tokens-Remaining", "Anthropic-Ratelimit-Output-Tokens-Reset"}

	rateLimitHeaders = []limitHeaders{
		openAIRequests, openAITokens,
		anthropicRequests, anthropicTokens, anthropicInputTokens, anthropicOutputTokens,
	}
)

// read returns the limit's remaining count and reset; ok is false when the count is absent.
func (l limitHeaders) read(h http.Header, now func() time.Time) (remaining int64, reset time.Duration, ok bool) {
	remaining, ok = parseCount(h.Get(l.remaining))
	if ok {
		reset, _ = parseReset(h.Get(l.reset), now)
	}
	return remaining, reset, ok
}

// ParseRateLimit reads the key's remaining capacity from OpenAI's x-ratelimit-* or
// Anthropic's anthropic-ratelimit-* headers, so the quota service can feed per-key buckets
// from what the provider itself says. Anthropic's tokens-remaining already is the tightest
// token limit in effect; when it is missing the tighter of input and output stands in.
// now turns Anthropic's absolute reset times into durations; nil means time.Now.
func ParseRateLimit(h http.Header, now func() time.Time) RateLimit {
	rl := RateLimit{RemainingRequests: -1, RemainingTokens: -1}
	for _, l := range []limitHeaders{openAIRequests, anthropicRequests} {
		if n, reset, ok := l.read(h, now); ok {
			rl.RemainingRequests, rl.ResetRequests, rl.Known = n, reset, true
			break
		}
	}
	for _, l := range []limitHeaders{openAITokens, anthropicTokens} {
		if n, reset, ok := l.read(h, now); ok {
			rl.RemainingTokens, rl.ResetTokens, rl.Known = n, reset, true
			return rl
		}
	}
	for _, l := range []limitHeaders{anthropicInputTokens, anthropicOutputTokens} {
		if n, reset, ok := l.read(h, now); ok && (rl.RemainingTokens < 0 || n < rl.RemainingTokens) {
			rl.RemainingTokens, rl.ResetTokens, rl.Known = n, reset, true
		}
	}
	return rl
}

func parseCount(v string) (int64, bool) {
	if v == "" {
		return 0, false // most answers carry no such header: no error value to build
	}
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	// An over-drawn limit is an exhausted one; -1 is ParseRateLimit's "not said".
	return max(n, 0), err == nil
}

// parseReset reads a reset header: a Go-style duration as OpenAI sends it ("1s", "6m0s",
// "20ms"), bare seconds as some compatible servers send, or an RFC 3339 time as Anthropic
// sends it.
func parseReset(v string, now func() time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if d, err := time.ParseDuration(v); err == nil {
		return min(max(d, 0), maxRetryHint), true
	}
	if secs, err := strconv.ParseFloat(v, 64); err == nil {
		return durationOf(secs, time.Second), true
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return untilPositive(t, now), true
	}
	return 0, false
}

// maxRetryHint bounds every retry hint read from a provider's headers: no rate limit resets
// further away than a day, and the hint is added to clock readings downstream, where a
// duration near int64's limit would wrap.
const maxRetryHint = 24 * time.Hour

// durationOf turns a count of units read from a header into a retry hint: 0 for a
// non-positive or NaN count, at most maxRetryHint (a float beyond int64's range would
// otherwise convert to an arbitrary value, often the most negative one).
func durationOf(n float64, unit time.Duration) time.Duration {
	switch d := n * float64(unit); {
	case !(d > 0):
		return 0
	case d >= float64(maxRetryHint):
		return maxRetryHint
	default:
		return time.Duration(d)
	}
}

func untilPositive(t time.Time, now func() time.Time) time.Duration {
	if now == nil {
		now = time.Now
	}
	return min(max(t.Sub(now()), 0), maxRetryHint)
}
