package router

import (
	"math"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/jsonwrite"
)

// appendQualityJSON appends qc as protojson renders it with UseProtoNames (fields in
// declaration order, zero values left out, int64 as strings, enums by name, RFC 3339
// timestamps and "1.5s" durations), without reflection: the front door writes one per
// answer, and protojson cost about 60 µs and 10% of the router's CPU for it
// (BenchmarkWithQuality, docs/performance.md). TestQualityJSONMatchesProtojson holds it
// to protojson's output, field by field, for every field of the message.
//
// ok is false for what only protojson can judge (a timestamp or duration out of range, a
// string that is not UTF-8); the caller then falls back to protojson, which reports it.
func appendQualityJSON(b []byte, qc *mantlev1.QualityContext) (_ []byte, ok bool) {
	// One allocation instead of a dozen growths: a real answer's context is about 2 KB,
	// 200 bytes per audit step and 400 per attempt.
	b = slices.Grow(b, 512+224*len(qc.GetAudit())+448*len(qc.GetAttempts()))
	o := jsonObject{b: b, ok: true}
	o.open()
	o.str("request_id", qc.GetRequestId())
	o.str("idempotency_key", qc.GetIdempotencyKey())
	o.str("trace_id", qc.GetTraceId())
	o.str("tenant", qc.GetTenant())
	o.str("scenario", qc.GetScenario())
	o.enum("priority", qc.GetPriority(), priorityNames)
	o.timestamp("deadline", qc.GetDeadline())
	if attempts := qc.GetAttempts(); len(attempts) > 0 {
		o.name("attempts")
		o.b = append(o.b, '[')
		for i, a := range attempts {
			if i > 0 {
				o.b = append(o.b, ',')
			}
			o.attempt(a)
		}
		o.b = append(o.b, ']')
	}
	o.int("retry_count", int64(qc.GetRetryCount()))
	o.str("current_model", qc.GetCurrentModel())
	o.str("current_provider", qc.GetCurrentProvider())
	o.enum("fallback_level", qc.GetFallbackLevel(), fallbackLevelNames)
	o.str("degradation_reason", qc.GetDegradationReason())
	o.str("user_notice", qc.GetUserNotice())
	o.bool("cache_hit", qc.GetCacheHit())
	o.float("cache_similarity", qc.GetCacheSimilarity())
	if v := qc.GetVerification(); v != nil {
		o.name("verification")
		o.verification(v)
	}
	o.enum("quality_grade", qc.GetQualityGrade(), qualityGradeNames)
	o.float("risk_score", qc.GetRiskScore())
	if u := qc.GetUsage(); u != nil {
		o.name("usage")
		o.usage(u)
	}
	o.float("cost_usd", qc.GetCostUsd())
	if audit := qc.GetAudit(); len(audit) > 0 {
		o.name("audit")
		o.b = append(o.b, '[')
		for i, s := range audit {
			if i > 0 {
				o.b = append(o.b, ',')
			}
			o.auditStep(s)
		}
		o.b = append(o.b, ']')
	}
	o.str("route", qc.GetRoute())
	o.strs("skipped_steps", qc.GetSkippedSteps())
	o.duration("overhead", qc.GetOverhead())
	o.duration("upstream_latency", qc.GetUpstreamLatency())
	o.duration("waited", qc.GetWaited())
	o.bool("cache_stale", qc.GetCacheStale())
	o.str("session_id", qc.GetSessionId())
	o.str("step_id", qc.GetStepId())
	o.bool("session_replayed", qc.GetSessionReplayed())
	o.bool("session_degraded", qc.GetSessionDegraded())
	o.bool("simplified_prompt", qc.GetSimplifiedPrompt())
	if c := qc.GetContextCompression(); c != nil {
		o.name("context_compression")
		o.compression(c)
	}
	o.close()
	return o.b, o.ok
}

func (o *jsonObject) attempt(a *mantlev1.Attempt) {
	o.open()
	o.int("number", int64(a.GetNumber()))
	o.str("model", a.GetModel())
	o.str("provider", a.GetProvider())
	o.str("key_id", a.GetKeyId())
	o.enum("error_class", a.GetErrorClass(), errorClassNames)
	o.str("error_message", a.GetErrorMessage())
	o.duration("latency", a.GetLatency())
	o.duration("ttft", a.GetTtft())
	if u := a.GetUsage(); u != nil {
		o.name("usage")
		o.usage(u)
	}
	o.bool("hedged", a.GetHedged())
	o.timestamp("started_at", a.GetStartedAt())
	o.str("provider_request_id", a.GetProviderRequestId())
	o.close()
}

func (o *jsonObject) verification(v *mantlev1.Verification) {
	o.open()
	o.bool("l1_passed", v.GetL1Passed())
	o.strs("l1_failures", v.GetL1Failures())
	o.strs("l2_rules_applied", v.GetL2RulesApplied())
	o.bool("l3_pending", v.GetL3Pending())
	o.float("l3_confidence", v.GetL3Confidence())
	o.enum("failure_class", v.GetFailureClass(), errorClassNames)
	o.close()
}

func (o *jsonObject) compression(c *mantlev1.ContextCompression) {
	o.open()
	o.str("model", c.GetModel())
	o.int("messages_summarized", int64(c.GetMessagesSummarized()))
	o.int64("prompt_tokens_before", c.GetPromptTokensBefore())
	o.int64("prompt_tokens_after", c.GetPromptTokensAfter())
	if u := c.GetUsage(); u != nil {
		o.name("usage")
		o.usage(u)
	}
	o.int("calls", int64(c.GetCalls()))
	o.close()
}

func (o *jsonObject) usage(u *mantlev1.Usage) {
	o.open()
	o.int64("input_tokens", u.GetInputTokens())
	o.int64("output_tokens", u.GetOutputTokens())
	o.int64("total_tokens", u.GetTotalTokens())
	o.close()
}

func (o *jsonObject) auditStep(s *mantlev1.AuditStep) {
	o.open()
	o.timestamp("at", s.GetAt())
	o.str("service", s.GetService())
	o.str("step", s.GetStep())
	o.str("detail", s.GetDetail())
	o.duration("duration", s.GetDuration())
	o.close()
}

// jsonObject writes one JSON object's members; objects nest by calling open and close in
// turn. ok turns false for a value protojson would refuse.
type jsonObject struct {
	b     []byte
	first bool // no member written yet in the innermost open object
	ok    bool
}

func (o *jsonObject) open() {
	o.b = append(o.b, '{')
	o.first = true
}

func (o *jsonObject) close() {
	o.b = append(o.b, '}')
	o.first = false
}

func (o *jsonObject) name(n string) {
	if !o.first {
		o.b = append(o.b, ',')
	}
	o.first = false
	o.b = append(o.b, '"')
	o.b = append(o.b, n...)
	o.b = append(o.b, '"', ':')
}

func (o *jsonObject) str(n, v string) {
	if v != "" {
		o.name(n)
		o.quote(v)
	}
}

func (o *jsonObject) strs(n string, vs []string) {
	if len(vs) == 0 {
		return
	}
	o.name(n)
	o.b = append(o.b, '[')
	for i, v := range vs {
		if i > 0 {
			o.b = append(o.b, ',')
		}
		o.quote(v)
	}
	o.b = append(o.b, ']')
}

func (o *jsonObject) int(n string, v int64) {
	if v != 0 {
		o.name(n)
		o.b = strconv.AppendInt(o.b, v, 10)
	}
}

// int64 is a 64-bit integer field, which protojson writes as a string.
func (o *jsonObject) int64(n string, v int64) {
	if v != 0 {
		o.name(n)
		o.b = append(o.b, '"')
		o.b = strconv.AppendInt(o.b, v, 10)
		o.b = append(o.b, '"')
	}
}

func (o *jsonObject) bool(n string, v bool) {
	if v {
		o.name(n)
		o.b = append(o.b, "true"...)
	}
}

// float writes a double as protojson does: encoding/json's shortest form, exponents
// outside [1e-6, 1e21), and NaN and the infinities as strings. A negative zero is
// populated (its bits are not zero), as protojson sees it.
func (o *jsonObject) float(n string, v float64) {
	if math.Float64bits(v) == 0 {
		return
	}
	o.name(n)
	switch {
	case math.IsNaN(v):
		o.b = append(o.b, `"NaN"`...)
		return
	case math.IsInf(v, 1):
		o.b = append(o.b, `"Infinity"`...)
		return
	case math.IsInf(v, -1):
		o.b = append(o.b, `"-Infinity"`...)
		return
	}
	o.b = jsonwrite.Float(o.b, v)
}

// enum writes e by name, as protojson does: from names (enumNames) when it holds e's
// number, else from e's descriptor (a negative number), else as a number (one the enum
// does not declare).
func (o *jsonObject) enum(n string, e protoreflect.Enum, names []string) {
	num := e.Number()
	if num == 0 {
		return
	}
	o.name(n)
	if num > 0 && int(num) < len(names) && names[num] != "" {
		o.b = append(o.b, '"')
		o.b = append(o.b, names[num]...)
		o.b = append(o.b, '"')
		return
	}
	if v := e.Descriptor().Values().ByNumber(num); v != nil {
		o.b = append(o.b, '"')
		o.b = append(o.b, v.Name()...)
		o.b = append(o.b, '"')
		return
	}
	o.b = strconv.AppendInt(o.b, int64(num), 10)
}

// The names of the enums a QualityContext holds, by number: an index per value written,
// where the descriptor's lookup cost a third of the context's rendering.
var (
	priorityNames      = enumNames(mantlev1.Priority(0).Descriptor())
	fallbackLevelNames = enumNames(mantlev1.FallbackLevel(0).Descriptor())
	qualityGradeNames  = enumNames(mantlev1.QualityGrade(0).Descriptor())
	errorClassNames    = enumNames(mantlev1.ErrorClass(0).Descriptor())
)

// enumNames lists d's value names by number, from 0 to the largest number it declares
// (negative ones are left to the descriptor); of aliases, values that share a number, the
// first declared, which is the one protojson writes.
func enumNames(d protoreflect.EnumDescriptor) []string {
	values := d.Values()
	top := protoreflect.EnumNumber(0)
	for i := range values.Len() {
		top = max(top, values.Get(i).Number())
	}
	names := make([]string, top+1)
	for i := range values.Len() {
		if v := values.Get(i); v.Number() >= 0 && names[v.Number()] == "" {
			names[v.Number()] = string(v.Name())
		}
	}
	return names
}

// Bounds protojson enforces: timestamps in years 1 to 9999, durations within ±10,000 years.
const (
	minTimestampSeconds = -62135596800
	maxTimestampSeconds = 253402300799
	maxDurationSeconds  = 315576000000
)

func (o *jsonObject) timestamp(n string, t *timestamppb.Timestamp) {
	if t == nil {
		return
	}
	secs, nanos := t.GetSeconds(), t.GetNanos()
	if secs < minTimestampSeconds || secs > maxTimestampSeconds || nanos < 0 || nanos >= 1e9 {
		o.ok = false
		return
	}
	o.name(n)
	o.b = append(o.b, '"')
	o.b = appendDateTime(o.b, time.Unix(secs, 0).UTC())
	o.fraction(nanos)
	o.b = append(o.b, 'Z', '"')
}

// appendDateTime appends t as "2006-01-02T15:04:05" (t's year is within 1 to 9999):
// digit by digit, for a fifth of what time.Time.AppendFormat spends parsing its layout,
// and answers carry a timestamp or more each.
func appendDateTime(b []byte, t time.Time) []byte {
	year, month, day := t.Date()
	hour, minute, sec := t.Clock()
	b = append(b, byte('0'+year/1000), byte('0'+year/100%10), byte('0'+year/10%10), byte('0'+year%10), '-')
	b = append(b, byte('0'+month/10), byte('0'+month%10), '-', byte('0'+day/10), byte('0'+day%10), 'T')
	return append(b, byte('0'+hour/10), byte('0'+hour%10), ':', byte('0'+minute/10), byte('0'+minute%10), ':',
		byte('0'+sec/10), byte('0'+sec%10))
}

func (o *jsonObject) duration(n string, d *durationpb.Duration) {
	if d == nil {
		return
	}
	secs, nanos := d.GetSeconds(), d.GetNanos()
	if secs < -maxDurationSeconds || secs > maxDurationSeconds || nanos <= -1e9 || nanos >= 1e9 ||
		(secs > 0 && nanos < 0) || (secs < 0 && nanos > 0) {
		o.ok = false
		return
	}
	o.name(n)
	o.b = append(o.b, '"')
	if secs < 0 || nanos < 0 {
		o.b = append(o.b, '-')
		secs, nanos = -secs, -nanos
	}
	o.b = strconv.AppendInt(o.b, secs, 10)
	o.fraction(nanos)
	o.b = append(o.b, 's', '"')
}

// fraction appends nanoseconds with 0, 3, 6 or 9 digits, the fewest that are exact.
func (o *jsonObject) fraction(nanos int32) {
	if nanos == 0 {
		return
	}
	var d [9]byte
	for i := len(d) - 1; i >= 0; i-- {
		d[i] = byte('0' + nanos%10)
		nanos /= 10
	}
	n := len(d)
	for n > 3 && string(d[n-3:n]) == "000" {
		n -= 3
	}
	o.b = append(o.b, '.')
	o.b = append(o.b, d[:n]...)
}

// quote appends v as a JSON string, escaped as protojson escapes it.
func (o *jsonObject) quote(v string) {
	if !utf8.ValidString(v) {
		o.ok = false
		return
	}
	o.b = append(o.b, '"')
	start := 0
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c >= ' ' && c != '"' && c != '\\' {
			continue
		}
		o.b = append(o.b, v[start:i]...)
		o.b = append(o.b, '\\')
		switch c {
		case '"', '\\':
			o.b = append(o.b, c)
		case '\b':
			o.b = append(o.b, 'b')
		case '\f':
			o.b = append(o.b, 'f')
		case '\n':
			o.b = append(o.b, 'n')
		case '\r':
			o.b = append(o.b, 'r')
		case '\t':
			o.b = append(o.b, 't')
		default:
			o.b = append(o.b, 'u', '0', '0', hexDigit[c>>4], hexDigit[c&0xf])
		}
		start = i + 1
	}
	o.b = append(o.b, v[start:]...)
	o.b = append(o.b, '"')
}

const hexDigit = "0123456789abcdef"
