// Package logredact keeps secrets and prompt bodies out of mantle's logs. A Redactor wraps
// the process's slog handler: every message and attribute value passes through it, API keys
// (OpenAI and Anthropic sk-... keys, Google AIza... keys, Bearer tokens, x-api-key and
// api_key values in headers, JSON and URLs, and the literal values of the keys the
// configuration names) are replaced by [REDACTED], and attributes carrying request or
// answer bodies are dropped unless log.debug_bodies is on (then they are kept, redacted).
//
// It works on values, not on call sites, so a key inside an upstream's error message or a
// URL in a wrapped error is caught too: the code that logs never has to remember.
package logredact

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
)

// Redacted replaces a secret.
const Redacted = "[REDACTED]"

// Omitted replaces a body attribute while log.debug_bodies is off.
const Omitted = "[omitted: log.debug_bodies is off]"

// BodyKeys are the attribute keys that carry prompts and answers. Code that logs a body
// uses one of them, so the switch can find it.
var BodyKeys = []string{"prompt", "messages", "content", "completion", "answer", "body", "request_body", "response_body"}

// secretKeys are attribute keys whose whole value is a secret, compared case-insensitively
// with '-' and '_' alike.
var secretKeys = []string{"api_key", "apikey", "x_api_key", "authorization", "password", "secret", "token", "access_token", "credential"}

// minSecretLen is the shortest configured secret value that is masked literally: masking a
// one-letter "key" from a test environment would mangle every line.
const minSecretLen = 8

var patterns = []struct {
	re   *regexp.Regexp
	repl string
}{
	// Bearer tokens first, so the header rule below sees "Bearer [REDACTED]" as one value.
	{regexp.MustCompile(`(?i)\bBearer\s+[A-Za-z0-9._~+/\-]+=*`), "Bearer " + Redacted},
	// OpenAI (sk-..., sk-proj-...) and Anthropic (sk-ant-api03-...) keys.
	{regexp.MustCompile(`\bsk-[A-Za-z0-9_\-]{16,}`), Redacted},
	// Google API keys.
	{regexp.MustCompile(`\bAIza[0-9A-Za-z_\-]{30,}`), Redacted},
	// name: value, name=value and "name": "value" for key-like names: headers, JSON, query
	// strings, form bodies. An optional auth scheme stays with its value.
	{regexp.MustCompile(`(?i)\b(x-api-key|api[_-]?key|access[_-]?token|refresh[_-]?token|client[_-]?secret|authorization|password|secret)("?\s*[:=]\s*"?)((?:Bearer|Basic)\s+)?[^"\s,&;}]+`), "${1}${2}" + Redacted},
	// URL query parameters named key or token (?key=AIza... , &token=...).
	// The value does not end in punctuation: "...?key=abc: 401" keeps its colon.
	{regexp.MustCompile(`(?i)([?&](?:key|token|sig|signature)=)[^&\s"#]*[^&\s"#:.,;)]`), "${1}" + Redacted},
}

// Options configure a Redactor.
type Options struct {
	// DebugBodies keeps prompt and answer bodies (BodyKeys) in the logs, redacted. Off (the
	// default, log.debug_bodies: false) they are replaced by Omitted.
	DebugBodies bool
	// Secrets are literal values masked wherever they appear: the API keys the
	// configuration names by environment variable. Empty and short values are ignored.
	Secrets []string
}

// Redactor masks secrets in strings and log records. It is safe for concurrent use.
type Redactor struct {
	debugBodies bool
	secrets     []string
}

// New returns a Redactor.
func New(o Options) *Redactor {
	r := &Redactor{debugBodies: o.DebugBodies}
	for _, s := range o.Secrets {
		if len(s) >= minSecretLen && !slices.Contains(r.secrets, s) {
			r.secrets = append(r.secrets, s)
		}
	}
	// Longest first, so a secret containing another is masked whole.
	slices.SortFunc(r.secrets, func(a, b string) int { return len(b) - len(a) })
	return r
}

// String returns s with every secret it recognises replaced by Redacted.
func (r *Redactor) String(s string) string {
	for _, secret := range r.secrets {
		s = strings.ReplaceAll(s, secret, Redacted)
	}
	for _, p := range patterns {
		s = p.re.ReplaceAllString(s, p.repl)
	}
	return s
}

// Attr returns a with its value redacted: the whole value for secret keys, Omitted for
// bodies when debug bodies are off, every string inside it otherwise.
func (r *Redactor) Attr(a slog.Attr) slog.Attr {
	a.Value = a.Value.Resolve()
	key := normalise(a.Key)
	switch {
	case a.Value.Kind() == slog.KindGroup:
		attrs := a.Value.Group()
		out := make([]slog.Attr, len(attrs))
		for i, g := range attrs {
			out[i] = r.Attr(g)
		}
		return slog.Attr{Key: a.Key, Value: slog.GroupValue(out...)}
	case slices.Contains(secretKeys, key):
		return slog.String(a.Key, Redacted)
	case !r.debugBodies && slices.Contains(BodyKeys, key):
		return slog.String(a.Key, Omitted)
	}
	return slog.Attr{Key: a.Key, Value: r.value(a.Value)}
}

func (r *Redactor) value(v slog.Value) slog.Value {
	switch v.Kind() {
	case slog.KindString:
		return slog.StringValue(r.String(v.String()))
	case slog.KindAny:
	default:
		return v // numbers, booleans, times and durations hold no secrets
	}
	switch x := v.Any().(type) {
	case error:
		return slog.StringValue(r.String(x.Error()))
	case fmt.Stringer:
		return slog.StringValue(r.String(x.String()))
	case []byte:
		return slog.StringValue(r.String(string(x)))
	}
	// Structs, maps and slices: look at them as the JSON handler would print them, and
	// replace the value only when something had to be masked.
	data, err := json.Marshal(v.Any())
	if err != nil {
		return slog.StringValue(r.String(fmt.Sprint(v.Any())))
	}
	if s := r.String(string(data)); s != string(data) {
		return slog.StringValue(s)
	}
	return v
}

func normalise(key string) string {
	return strings.ReplaceAll(strings.ToLower(key), "-", "_")
}

// Handler wraps h so that every record it handles is redacted: message, attributes of the
// call and attributes added with Logger.With.
func (r *Redactor) Handler(h slog.Handler) slog.Handler { return &handler{inner: h, r: r} }

type handler struct {
	inner slog.Handler
	r     *Redactor
}

func (h *handler) Enabled(ctx context.Context, l slog.Level) bool { return h.inner.Enabled(ctx, l) }

func (h *handler) Handle(ctx context.Context, rec slog.Record) error {
	out := slog.NewRecord(rec.Time, rec.Level, h.r.String(rec.Message), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.r.Attr(a))
		return true
	})
	return h.inner.Handle(ctx, out)
}

func (h *handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	out := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		out[i] = h.r.Attr(a)
	}
	return &handler{inner: h.inner.WithAttrs(out), r: h.r}
}

func (h *handler) WithGroup(name string) slog.Handler {
	return &handler{inner: h.inner.WithGroup(name), r: h.r}
}
