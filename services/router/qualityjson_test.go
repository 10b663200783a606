package router

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"pgregory.net/rapid"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// TestQualityJSONMatchesProtojson holds appendQualityJSON to protojson: the same members
// with the same values, numbers compared as written. A field added to the proto and not
// to the encoder fails the "every field" case, which sets all of them.
func TestQualityJSONMatchesProtojson(t *testing.T) {
	t.Parallel()
	answer := realAnswerQuality(t)
	every := new(mantlev1.QualityContext)
	fillEveryField(t, every.ProtoReflect())

	for _, tt := range []struct {
		name string
		qc   *mantlev1.QualityContext
	}{
		{"empty", &mantlev1.QualityContext{}},
		{"a real answer", answer},
		{"every field", every},
		{"edge values", &mantlev1.QualityContext{
			RequestId:       "quote \" backslash \\ newline \n tab \t nul \x00 unit \x1f del \x7f é 漢 \u2028",
			Priority:        mantlev1.Priority(99), // unknown: written as a number
			Deadline:        &timestamppb.Timestamp{Seconds: -62135596800},
			CacheSimilarity: 1e-7,
			RiskScore:       math.Copysign(0, -1),
			CostUsd:         1e21,
			Usage:           &mantlev1.Usage{InputTokens: math.MaxInt64, OutputTokens: -1},
			Attempts: []*mantlev1.Attempt{
				{Latency: &durationpb.Duration{Seconds: -1, Nanos: -500}, Ttft: &durationpb.Duration{Nanos: 1000}},
				{Latency: &durationpb.Duration{}, StartedAt: &timestamppb.Timestamp{Seconds: 253402300799, Nanos: 999999999}},
			},
			Verification: &mantlev1.Verification{L3Confidence: math.NaN(), L1Failures: []string{""}},
			Audit:        []*mantlev1.AuditStep{{}, {At: &timestamppb.Timestamp{Nanos: 120000000}}},
		}},
		{"infinities", &mantlev1.QualityContext{CostUsd: math.Inf(1), RiskScore: math.Inf(-1)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			checkQualityJSON(t, tt.qc)
		})
	}
}

// TestQualityJSONFallsBack: what protojson refuses is left to it.
func TestQualityJSONFallsBack(t *testing.T) {
	t.Parallel()
	for name, qc := range map[string]*mantlev1.QualityContext{
		"invalid UTF-8":                {Tenant: "a\xffb"},
		"timestamp before year 1":      {Deadline: &timestamppb.Timestamp{Seconds: -62135596801}},
		"timestamp nanos out of range": {Deadline: &timestamppb.Timestamp{Nanos: -1}},
		"duration signs differ":        {Attempts: []*mantlev1.Attempt{{Latency: &durationpb.Duration{Seconds: 1, Nanos: -1}}}},
		"duration too long":            {Audit: []*mantlev1.AuditStep{{Duration: &durationpb.Duration{Seconds: 315576000001}}}},
	} {
		if b, ok := appendQualityJSON(nil, qc); ok {
			t.Errorf("%s: appendQualityJSON = %s, ok; want it to leave the message to protojson", name, b)
		}
		if _, err := withQuality(struct{}{}, qc); err == nil {
			t.Errorf("%s: withQuality succeeded; want protojson's error", name)
		}
	}
}

func TestQualityJSONProperties(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		qc := new(mantlev1.QualityContext)
		drawFields(rt, qc.ProtoReflect(), 0)
		checkQualityJSON(rt, qc)
	})
}

// realAnswerQuality is the QualityContext of an answer from `mantle dev`
// (testdata/quality.json: 8 audit steps, one attempt).
func realAnswerQuality(tb testing.TB) *mantlev1.QualityContext {
	tb.Helper()
	raw, err := os.ReadFile("testdata/quality.json")
	if err != nil {
		tb.Fatal(err)
	}
	qc := new(mantlev1.QualityContext)
	if err := protojson.Unmarshal(raw, qc); err != nil {
		tb.Fatal(err)
	}
	return qc
}

// failer is what the checks need of *testing.T and *rapid.T.
type failer interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

func checkQualityJSON(t failer, qc *mantlev1.QualityContext) {
	t.Helper()
	got, ok := appendQualityJSON(nil, qc)
	if !ok {
		t.Fatalf("appendQualityJSON(%v) refused", qc)
	}
	want, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(qc)
	if err != nil {
		t.Fatalf("protojson: %v", err)
	}
	if diff := cmp.Diff(decodeJSON(t, want), decodeJSON(t, got)); diff != "" {
		t.Errorf("appendQualityJSON differs from protojson (-protojson +ours):\n%s\nours: %s", diff, got)
	}
	back := new(mantlev1.QualityContext)
	if err := protojson.Unmarshal(got, back); err != nil {
		t.Fatalf("protojson cannot read %s back: %v", got, err)
	}
}

// decodeJSON decodes keeping numbers as written, so that formatting differences show.
func decodeJSON(t failer, b []byte) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("not JSON: %v: %s", err, b)
	}
	return v
}

// fillEveryField sets every field of m (recursively) to a value that is not its zero.
func fillEveryField(t *testing.T, m protoreflect.Message) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		switch {
		case fd.IsList():
			l := m.Mutable(fd).List()
			for range 2 {
				if fd.Kind() == protoreflect.MessageKind {
					e := l.NewElement()
					fillEveryField(t, e.Message())
					l.Append(e)
				} else {
					l.Append(scalar(t, fd, 1))
				}
			}
		case fd.Kind() == protoreflect.MessageKind:
			fillMessage(t, m.Mutable(fd).Message())
		default:
			m.Set(fd, scalar(t, fd, 1))
		}
	}
}

func fillMessage(t *testing.T, m protoreflect.Message) {
	switch v := m.Interface().(type) {
	case *timestamppb.Timestamp:
		v.Seconds, v.Nanos = 1764532800, 123456789
	case *durationpb.Duration:
		v.Seconds, v.Nanos = 2, 500000000
	default:
		fillEveryField(t, m)
	}
}

func scalar(t *testing.T, fd protoreflect.FieldDescriptor, n int64) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(string(fd.Name()) + " \"x\"\n")
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.Int32Kind:
		return protoreflect.ValueOfInt32(int32(n) + 6)
	case protoreflect.Int64Kind:
		return protoreflect.ValueOfInt64(n + 1<<40)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(0.125 + float64(n))
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(protoreflect.EnumNumber(n))
	}
	t.Fatalf("field %s: kind %v has no test value; teach the test and appendQualityJSON", fd.FullName(), fd.Kind())
	return protoreflect.Value{}
}

// drawFields sets each field of m or leaves it, with values from the whole range of
// its kind.
func drawFields(t *rapid.T, m protoreflect.Message, depth int) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if !rapid.Bool().Draw(t, "set "+string(fd.Name())) {
			continue
		}
		switch {
		case fd.IsList():
			l := m.Mutable(fd).List()
			for range rapid.IntRange(0, 3).Draw(t, "len") {
				if fd.Kind() == protoreflect.MessageKind {
					e := l.NewElement()
					drawMessage(t, e.Message(), depth+1)
					l.Append(e)
				} else {
					l.Append(drawScalar(t, fd))
				}
			}
		case fd.Kind() == protoreflect.MessageKind:
			drawMessage(t, m.Mutable(fd).Message(), depth+1)
		default:
			m.Set(fd, drawScalar(t, fd))
		}
	}
}

func drawMessage(t *rapid.T, m protoreflect.Message, depth int) {
	switch v := m.Interface().(type) {
	case *timestamppb.Timestamp:
		v.Seconds = rapid.Int64Range(-62135596800, 253402300799).Draw(t, "ts seconds")
		v.Nanos = drawNanos(t, 0)
	case *durationpb.Duration:
		v.Seconds = rapid.Int64Range(-315576000000, 315576000000).Draw(t, "duration seconds")
		switch {
		case v.Seconds > 0:
			v.Nanos = drawNanos(t, 0)
		case v.Seconds < 0:
			v.Nanos = -drawNanos(t, 0)
		default:
			v.Nanos = drawNanos(t, -999999999)
		}
	default:
		drawFields(t, m, depth)
	}
}

// drawNanos favours the round values that print with 0, 3 or 6 digits.
func drawNanos(t *rapid.T, lowest int32) int32 {
	n := rapid.Int32Range(lowest, 999999999).Draw(t, "nanos")
	switch rapid.IntRange(0, 3).Draw(t, "round") {
	case 1:
		n -= n % 1000
	case 2:
		n -= n % 1000000
	case 3:
		n = 0
	}
	return n
}

func drawScalar(t *rapid.T, fd protoreflect.FieldDescriptor) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(rapid.String().Draw(t, string(fd.Name())))
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(rapid.Bool().Draw(t, string(fd.Name())))
	case protoreflect.Int32Kind:
		return protoreflect.ValueOfInt32(rapid.Int32().Draw(t, string(fd.Name())))
	case protoreflect.Int64Kind:
		return protoreflect.ValueOfInt64(rapid.Int64().Draw(t, string(fd.Name())))
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(rapid.Float64().Draw(t, string(fd.Name())))
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(protoreflect.EnumNumber(rapid.Int32Range(-2, 25).Draw(t, string(fd.Name()))))
	}
	t.Fatalf("field %s: kind %v has no generator", fd.FullName(), fd.Kind())
	return protoreflect.Value{}
}
