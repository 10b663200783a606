// Package jsonfield decodes a JSON request body field by field and names the path of the
// first field that is wrong, as an rpc.ValidationError that the front doors answer with a
// 400 naming the field. The OpenAI and Anthropic request decoders (pkg/openaiapi,
// pkg/anthropicapi) are built on it, so that both refuse unknown and malformed fields the
// same way.
package jsonfield

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// Decoder holds the first error; every method is a no-op after it.
type Decoder struct {
	Err error
	// Refused names keys that Obj refuses with a reason ("not supported: ...") instead of
	// as unknown fields.
	Refused map[string]string
	// Valid says that every value the decoder is given is part of a body json.Valid has
	// accepted: objects and lists are then split by the walkers (walk.go) and literals read
	// directly, without json.Unmarshal's validating pass over them and its reflection,
	// with the same results and errors.
	Valid bool
}

// Fail records a field error unless one is recorded already.
func (d *Decoder) Fail(field, format string, args ...any) {
	if d.Err == nil {
		d.Err = rpc.Invalid(field, format, args...)
	}
}

// Decode unmarshals v into into, failing field with want when it does not fit.
func (d *Decoder) Decode(v json.RawMessage, field string, into any, want string) bool {
	if d.Err != nil {
		return false
	}
	if err := json.Unmarshal(v, into); err != nil {
		d.Fail(field, "%s, got %s", want, Shorten(v))
		return false
	}
	return true
}

// Str decodes a string; null leaves into as it is.
func (d *Decoder) Str(v json.RawMessage, field string, into *string) {
	if d.Err != nil {
		return
	}
	if s, ok := PlainString(v); ok {
		*into = s
		return
	}
	if d.Valid {
		if s, ok := Unquote(v); ok {
			*into = s
			return
		}
	}
	if !IsNull(v) {
		d.Decode(v, field, into, "want a string")
	}
}

// PlainString returns the string v holds when v is a JSON string with no escape, control
// character or invalid UTF-8 in it, which is what most strings in a request are; ok is
// false for anything else, which json.Unmarshal then decodes (or refuses). It is the same
// string json.Unmarshal would give, without its validating pass over v and reflection.
func PlainString(v json.RawMessage) (_ string, ok bool) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return "", false
	}
	inner := v[1 : len(v)-1]
	ascii := true
	for _, c := range inner {
		if c < 0x20 || c == '"' || c == '\\' {
			return "", false
		}
		if c >= utf8.RuneSelf {
			ascii = false
		}
	}
	if !ascii && !utf8.Valid(inner) {
		return "", false
	}
	return string(inner), true
}

// Float decodes a number; nil for null or an error.
func (d *Decoder) Float(v json.RawMessage, field string) *float64 {
	if d.Valid && d.Err == nil && len(v) > 0 && (v[0] == '-' || '0' <= v[0] && v[0] <= '9') {
		// A number literal, as json.Unmarshal reads it; out of range is its error below.
		if f, err := strconv.ParseFloat(string(v), 64); err == nil {
			return &f
		}
	}
	var f float64
	if IsNull(v) || !d.Decode(v, field, &f, "want a number") {
		return nil
	}
	return &f
}

// Int32 decodes an integer; nil for null or an error.
func (d *Decoder) Int32(v json.RawMessage, field string) *int32 {
	if d.Valid && d.Err == nil {
		// Nine digits always fit an int32.
		if n, ok := Int(v, 9); ok {
			n32 := int32(n)
			return &n32
		}
	}
	var n int32
	if IsNull(v) || !d.Decode(v, field, &n, "want an integer") {
		return nil
	}
	return &n
}

// Bool decodes true or false; nil for null or an error.
func (d *Decoder) Bool(v json.RawMessage, field string) *bool {
	if d.Valid && d.Err == nil {
		switch string(v) {
		case "true":
			b := true
			return &b
		case "false":
			b := false
			return &b
		}
	}
	var b bool
	if IsNull(v) || !d.Decode(v, field, &b, "want true or false") {
		return nil
	}
	return &b
}

// Strings decodes a list of at most limit strings.
func (d *Decoder) Strings(v json.RawMessage, field string, into *[]string, limit int) {
	if IsNull(v) || !d.Decode(v, field, into, "want a list of strings") {
		return
	}
	if len(*into) > limit {
		d.Fail(field, "at most %d entries, got %d", limit, len(*into))
	}
}

// List decodes v as a JSON list of at most limit members.
func (d *Decoder) List(v json.RawMessage, field, what string, limit int) []json.RawMessage {
	if IsNull(v) {
		return nil
	}
	l, ok := d.RawList(v, field, "want a list of "+what)
	if !ok {
		return nil
	}
	if len(l) > limit {
		d.Fail(field, "at most %d %s, got %d", limit, what, len(l))
		return nil
	}
	return l
}

// RawList decodes v as a JSON list of raw values, failing field with want when it is not
// one (null included: callers that allow it test IsNull first).
func (d *Decoder) RawList(v json.RawMessage, field, want string) ([]json.RawMessage, bool) {
	if d.Err != nil {
		return nil, false
	}
	if !d.Valid {
		var l []json.RawMessage
		ok := d.Decode(v, field, &l, want)
		return l, ok
	}
	arr, ok := OpenArray(v)
	if !ok {
		d.Fail(field, "%s, got %s", want, Shorten(v))
		return nil, false
	}
	var l []json.RawMessage
	for {
		e, more := arr.Next()
		if !more {
			return l, true
		}
		l = append(l, e)
	}
}

// Object is Object, or ObjectOfValid with names when the decoder is Valid: v's members,
// keys unchecked.
func (d *Decoder) Object(v json.RawMessage, field string, names ...string) (map[string]json.RawMessage, error) {
	if d.Valid {
		return ObjectOfValid(v, field, names...)
	}
	return Object(v, field)
}

// Obj decodes v as an object for field, checking that its keys are among allowed; a key of
// Refused is refused with its reason, any other as unknown.
func (d *Decoder) Obj(v json.RawMessage, field string, allowed ...string) map[string]json.RawMessage {
	if d.Err != nil {
		return nil
	}
	m, err := d.Object(v, field, allowed...)
	if err != nil {
		d.Err = err
		return nil
	}
	// Sorting the keys (so that the first error is the same every time) is for an object
	// with a key to refuse; most have none.
	if allAllowed(m, allowed) {
		return m
	}
	for _, k := range SortedKeys(m) {
		if slices.Contains(allowed, k) {
			continue
		}
		if why, ok := d.Refused[k]; ok {
			d.Fail(Join(field, k), "not supported: %s", why)
		} else {
			d.Fail(Join(field, k), "unknown field (want one of %s)", strings.Join(allowed, ", "))
		}
		return nil
	}
	return m
}

func allAllowed(m map[string]json.RawMessage, allowed []string) bool {
	for k := range m {
		if !slices.Contains(allowed, k) {
			return false
		}
	}
	return true
}

// Object decodes v as a JSON object; field names it in the error ("" is the body).
func Object(v json.RawMessage, field string) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(v, &m); err != nil || m == nil {
		if field == "" {
			msg := "null"
			if err != nil {
				msg = err.Error()
			}
			return nil, rpc.Invalid("body", "the body must be a JSON object: %s", msg)
		}
		return nil, rpc.Invalid(field, "want an object, got %s", Shorten(v))
	}
	return m, nil
}

// ObjectOfValid is Object for v that json.Valid accepts (or a member of such a body),
// without a second pass over it and reflection; the values are v's own bytes, not copies.
// A key among names is that string, not a new one: names are the keys expected.
func ObjectOfValid(v json.RawMessage, field string, names ...string) (map[string]json.RawMessage, error) {
	obj, ok := OpenObject(v)
	if !ok {
		return Object(v, field) // its error, the same as ever
	}
	m := make(map[string]json.RawMessage)
	for {
		k, val, more := obj.Next()
		if !more {
			return m, nil
		}
		m[knownKey(k, names)] = val // the last of duplicate keys wins, as with json.Unmarshal
	}
}

// knownKey is Key(k), the string of names that it equals if any.
func knownKey(k []byte, names []string) string {
	if i := NameIndex(k, names); i >= 0 {
		return names[i] // a name has no character to escape, so written as is
	}
	return Key(k)
}

// IsNull reports an absent member or JSON null.
func IsNull(v json.RawMessage) bool {
	return len(v) == 0 || string(bytes.TrimSpace(v)) == "null"
}

// OrNull is v, or JSON null for an absent member, which Obj reports as "want an object".
func OrNull(v json.RawMessage) json.RawMessage {
	if v == nil {
		return json.RawMessage("null")
	}
	return v
}

// Compact is v without insignificant white space (v itself when it is not JSON).
func Compact(v json.RawMessage) []byte {
	var b bytes.Buffer
	if json.Compact(&b, v) != nil {
		return v
	}
	return b.Bytes()
}

// Shorten is v cut to 40 characters for an error message; invalid UTF-8 becomes U+FFFD,
// because the message must be UTF-8.
func Shorten(v json.RawMessage) string {
	r := []rune(string(v))
	if len(r) > 40 {
		return string(r[:40]) + "..."
	}
	return string(r)
}

// Join is the path of key k of field.
func Join(field, k string) string {
	if field == "" {
		return keyName(k)
	}
	return field + "." + keyName(k)
}

// keyName is k as a field name; an empty key is shown quoted, so that the error still
// names it.
func keyName(k string) string {
	if k == "" {
		return `""`
	}
	return k
}

// SortedKeys are m's keys in order, so that the first error is the same every time.
// The slice is made at its final size: collected from an iterator it grew by doubling,
// four allocations for a request body's usual keys.
func SortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
