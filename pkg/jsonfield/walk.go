package jsonfield

import (
	"encoding/json"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// The walkers below read JSON that json.Valid has accepted: they find where a value,
// member or element ends without checking the syntax again, which is what lets a decoder
// read a body in one validating pass instead of one per level of nesting (json.Unmarshal
// validates all of its input every time it is called). Given input json.Valid refuses,
// they return nonsense but never read out of bounds, and every walk ends.

// Members walks the members of a JSON object in order.
type Members struct {
	b []byte
	i int
}

// OpenObject starts walking v, which must be valid JSON; ok is false when v is not an
// object.
func OpenObject(v []byte) (_ Members, ok bool) {
	i := skipSpace(v, 0)
	if i >= len(v) || v[i] != '{' {
		return Members{}, false
	}
	return Members{b: v, i: i + 1}, true
}

// Next is the next member: its key as written (quoted, escapes left in) and its value
// without the white space around it; ok is false after the last.
func (m *Members) Next() (key, value []byte, ok bool) {
	b := m.b
	i := skipSpace(b, m.i)
	if i < len(b) && b[i] == ',' {
		i = skipSpace(b, i+1)
	}
	if i >= len(b) || b[i] != '"' {
		m.i = len(b)
		return nil, nil, false
	}
	ke := stringEnd(b, i)
	key = b[i:ke:ke]
	i = skipSpace(b, ke)
	if i < len(b) && b[i] == ':' {
		i = skipSpace(b, i+1)
	}
	ve := valueEnd(b, i)
	if ve == i { // no value: not JSON, and the walk must end
		m.i = len(b)
		return nil, nil, false
	}
	value = b[i:ve:ve]
	m.i = ve
	return key, value, true
}

// Elements walks the elements of a JSON array in order.
type Elements struct {
	b []byte
	i int
}

// OpenArray starts walking v, which must be valid JSON; ok is false when v is not an
// array.
func OpenArray(v []byte) (_ Elements, ok bool) {
	i := skipSpace(v, 0)
	if i >= len(v) || v[i] != '[' {
		return Elements{}, false
	}
	return Elements{b: v, i: i + 1}, true
}

// Next is the next element without the white space around it; ok is false after the last.
func (e *Elements) Next() (value []byte, ok bool) {
	b := e.b
	i := skipSpace(b, e.i)
	if i < len(b) && b[i] == ',' {
		i = skipSpace(b, i+1)
	}
	if i >= len(b) || b[i] == ']' {
		e.i = len(b)
		return nil, false
	}
	ve := valueEnd(b, i)
	if ve == i { // no value: not JSON, and the walk must end
		e.i = len(b)
		return nil, false
	}
	e.i = ve
	return b[i:ve:ve], true
}

// Trim is v without the white space around it.
func Trim(v []byte) []byte {
	i := skipSpace(v, 0)
	j := len(v)
	for j > i && isSpace(v[j-1]) {
		j--
	}
	return v[i:j:j]
}

// Unquote is the string the valid JSON string v holds, as json.Unmarshal gives it; ok is
// false when v is not a string, or when it holds invalid UTF-8 or a lone surrogate escape,
// which json.Unmarshal replaces with U+FFFD: a caller that must match it exactly asks
// json.Unmarshal then (they are rare).
func Unquote(v []byte) (_ string, ok bool) {
	if s, ok := PlainString(v); ok {
		return s, true
	}
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return "", false
	}
	in := v[1 : len(v)-1]
	out := make([]byte, 0, len(in))
	for i := 0; i < len(in); {
		c := in[i]
		switch {
		case c == '\\':
			if i+1 >= len(in) {
				return "", false
			}
			switch in[i+1] {
			case '"', '\\', '/':
				out = append(out, in[i+1])
			case 'b':
				out = append(out, '\b')
			case 'f':
				out = append(out, '\f')
			case 'n':
				out = append(out, '\n')
			case 'r':
				out = append(out, '\r')
			case 't':
				out = append(out, '\t')
			case 'u':
				r, ok := hex4(in[i+2:])
				if !ok {
					return "", false
				}
				i += 6
				if utf16.IsSurrogate(r) {
					if i+1 >= len(in) || in[i] != '\\' || in[i+1] != 'u' {
						return "", false
					}
					r2, ok := hex4(in[i+2:])
					if !ok {
						return "", false
					}
					r = utf16.DecodeRune(r, r2)
					if r == unicode.ReplacementChar {
						return "", false
					}
					i += 6
				}
				out = utf8.AppendRune(out, r)
				continue
			default:
				return "", false
			}
			i += 2
		case c < 0x20 || c == '"':
			return "", false
		case c < utf8.RuneSelf:
			out = append(out, c)
			i++
		default:
			r, n := utf8.DecodeRune(in[i:])
			if r == utf8.RuneError && n == 1 {
				return "", false
			}
			out = append(out, in[i:i+n]...)
			i += n
		}
	}
	return string(out), true
}

// Key is the object key k (as Members gives it) unquoted, as json.Unmarshal gives it.
func Key(k []byte) string {
	if s, ok := Unquote(k); ok {
		return s
	}
	var s string
	_ = json.Unmarshal(k, &s) // only the rare key with invalid UTF-8 or a lone surrogate
	return s
}

// NameIndex is the index in names of the object key k (as Members gives it) when k is
// written as that name, quotes aside; -1 otherwise. It copies nothing.
func NameIndex(k []byte, names []string) int {
	if len(k) < 2 {
		return -1
	}
	inner := k[1 : len(k)-1]
	for i, n := range names {
		if string(inner) == n {
			return i
		}
	}
	return -1
}

// Int reads the integer literal v of at most digits digits (at most 18, which always fit
// an int64) as json.Unmarshal reads it into an integer; ok is false for anything else (a
// fraction, an exponent, a leading zero, more digits), which json.Unmarshal then reads or
// refuses.
func Int(v []byte, digits int) (_ int64, ok bool) {
	d := v
	if len(v) > 0 && v[0] == '-' {
		d = v[1:]
	}
	if len(d) == 0 || len(d) > min(digits, 18) || (d[0] == '0' && len(d) > 1) {
		return 0, false
	}
	var n int64
	for _, c := range d {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if len(d) != len(v) {
		n = -n
	}
	return n, true
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r*16 + rune(c)
	}
	return r, true
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// stringEnd is the index after the string that opens at b[i].
func stringEnd(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(b)
}

// valueEnd is the index after the value that starts at b[i].
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return len(b)
	}
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = stringEnd(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return len(b)
	}
	for i < len(b) {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
}
