package rpc

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	mathrand "math/rand/v2"
	"strings"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
)

// Metadata keys that carry request identity between services. The router assigns the
// request id; every hop logs it, and the W3C traceparent carries the trace id.
const (
	MetadataRequestID   = "x-request-id"
	MetadataTraceParent = "traceparent"
)

// requestMeta is a request's identity, kept in a context as one value: every call of
// every service sets it from incoming metadata, and one value instead of three saves
// four allocations a call.
type requestMeta struct {
	id       string // the request id
	callerID string // the request id the caller chose; "" when mantle made one up
	traceID  string // without an OpenTelemetry span context, the 32-hex-digit trace id
}

type requestMetaKey struct{}

func metaOf(ctx context.Context) requestMeta {
	m, _ := valueOf[requestMetaKey, requestMeta](ctx)
	return m
}

func withMeta(ctx context.Context, m requestMeta) context.Context {
	return withValue[requestMetaKey](ctx, m)
}

// valueContext is context.WithValue(ctx, K{}, &v) in one allocation instead of two (the
// value context and v boxed in an interface): every call of every service makes a few.
// K is an empty struct type of this package, the key.
type valueContext[K comparable, V any] struct {
	context.Context
	v V
}

func withValue[K comparable, V any](ctx context.Context, v V) context.Context {
	return &valueContext[K, V]{Context: ctx, v: v}
}

// valueOf is the V that withValue[K] put in ctx.
func valueOf[K comparable, V any](ctx context.Context) (V, bool) {
	if p, ok := ctx.Value(*new(K)).(*V); ok {
		return *p, true
	}
	var zero V
	return zero, false
}

func (c *valueContext[K, V]) Value(key any) any {
	if _, ok := key.(K); ok {
		return &c.v
	}
	return c.Context.Value(key)
}

func (c *valueContext[K, V]) String() string { return "rpc.valueContext" }

// WithRequestID returns a context carrying the request id.
func WithRequestID(ctx context.Context, id string) context.Context {
	m := metaOf(ctx)
	m.id = id
	return withMeta(ctx, m)
}

// WithCallerRequestID returns a context carrying a request id the caller chose (an
// x-request-id header or metadata): it identifies the request for idempotent replays too.
func WithCallerRequestID(ctx context.Context, id string) context.Context {
	m := metaOf(ctx)
	m.id, m.callerID = id, id
	return withMeta(ctx, m)
}

// CallerRequestID returns the request id the caller chose, or "" when mantle made one up.
func CallerRequestID(ctx context.Context) string { return metaOf(ctx).callerID }

// RequestID returns the request id of ctx, or "".
func RequestID(ctx context.Context) string { return metaOf(ctx).id }

// WithTraceID returns a context carrying the 32-hex-digit trace id, for a context that
// carries no OpenTelemetry span context (TraceID is "").
func WithTraceID(ctx context.Context, id string) context.Context {
	m := metaOf(ctx)
	m.traceID = id
	return withMeta(ctx, m)
}

// TraceID returns the trace id of ctx, or "". When ctx carries an OpenTelemetry span
// context (tracing is on, or a caller's traceparent was extracted) its trace id wins, so
// logs, the QualityContext and the exported spans always name the same trace.
func TraceID(ctx context.Context) string {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		return sc.TraceID().String()
	}
	return metaOf(ctx).traceID
}

// NewTraceID returns a random W3C trace id.
func NewTraceID() string {
	var buf [32]byte
	return string(appendRandomHex(buf[:0], 16))
}

// NewRequestID returns a random request id.
func NewRequestID() string {
	var buf [28]byte
	return string(appendRandomHex(append(buf[:0], "req_"...), 12))
}

// appendRandomHex appends n random bytes (at most 16) in hex to b. Ids and traceparents
// are made for every request and call: built in a caller's stack buffer, each costs one
// allocation, the final string.
func appendRandomHex(b []byte, n int) []byte {
	var random [16]byte
	_, _ = rand.Read(random[:n]) // crypto/rand.Read never fails on supported platforms
	return hex.AppendEncode(b, random[:n])
}

// ValidRequestID reports whether a caller-supplied request id may be adopted: it ends up
// in logs, events and provider headers, so it is short and made of safe characters.
//
// Every call of every service checks the one it receives. Every allowed character is
// ASCII, so the bytes are checked without decoding runes (FuzzValidRequestID compares
// this with the rune loop it replaced).
func ValidRequestID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		switch c := id[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.', c == ':':
		default:
			return false
		}
	}
	return true
}

// TraceIDFromTraceParent extracts the trace id of a W3C traceparent header
// ("00-<32 hex trace id>-<16 hex parent id>-<flags>"). Like the W3C Trace Context spec
// asks, a header with upper-case hex, an all-zero trace or parent id, version ff, or
// extra fields on version 00 is ignored rather than propagated.
//
// Every call of every service reads one; cutting the fields off in place spares the
// slice strings.Split would allocate.
func TraceIDFromTraceParent(tp string) (string, bool) {
	version, rest, ok1 := strings.Cut(tp, "-")
	traceID, rest, ok2 := strings.Cut(rest, "-")
	parentID, rest, ok3 := strings.Cut(rest, "-")
	flags, _, extra := strings.Cut(rest, "-")
	if !ok1 || !ok2 || !ok3 {
		return "", false
	}
	if !isLowerHex(version, 2) || version == "ff" || (version == "00" && extra) {
		return "", false
	}
	if !isLowerHex(traceID, 32) || traceID == zeroTraceID ||
		!isLowerHex(parentID, 16) || parentID == zeroTraceID[:16] ||
		!isLowerHex(flags, 2) {
		return "", false
	}
	return traceID, true
}

// zeroTraceID is the all-zero trace id, which W3C Trace Context says is invalid; its
// first 16 digits are the all-zero parent id.
const zeroTraceID = "00000000000000000000000000000000"

// isLowerHex reports whether s is n lower-case hex digits. Hex digits are ASCII, so it
// checks bytes: a byte of a multi-byte character is no digit either.
func isLowerHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// traceParent formats a traceparent for an outgoing call on trace id, in one allocation:
// every call between services makes one.
func traceParent(traceID string) string {
	var buf [55]byte // a traceparent's length, with a 32-digit trace id
	b := append(append(append(buf[:0], "00-"...), traceID...), '-')
	// The parent id only tells one call's span from another's and guards nothing, so
	// the runtime's generator makes it, at a fraction of the cost of crypto/rand's read.
	var parent [8]byte
	binary.LittleEndian.PutUint64(parent[:], mathrand.Uint64())
	return string(append(hex.AppendEncode(b, parent[:]), "-01"...))
}

// requestMetaFromIncoming fills request id and trace id from incoming metadata, generating
// a trace id when the caller sent none. With tracing on, the server span the stats handler
// started already holds the trace id (the caller's, or a new one), and it is kept.
func requestMetaFromIncoming(ctx context.Context) context.Context {
	m := metaOf(ctx)
	// ValueFromIncomingContext reads one key without copying the whole metadata, as
	// FromIncomingContext does; every call of every service comes through here.
	if v := metadata.ValueFromIncomingContext(ctx, MetadataRequestID); len(v) > 0 && ValidRequestID(v[0]) {
		m.id, m.callerID = v[0], v[0]
	}
	if !trace.SpanContextFromContext(ctx).IsValid() {
		traceID := ""
		if v := metadata.ValueFromIncomingContext(ctx, MetadataTraceParent); len(v) > 0 {
			traceID, _ = TraceIDFromTraceParent(v[0])
		}
		if traceID == "" {
			traceID = NewTraceID()
		}
		m.traceID = traceID
	}
	return withMeta(ctx, m)
}
