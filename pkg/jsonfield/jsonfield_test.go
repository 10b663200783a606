package jsonfield

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestDecoderNamesTheField: each helper's refusal names the field's path and says what was
// wanted; the first error sticks and later calls do nothing.
func TestDecoderNamesTheField(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		run     func(d *Decoder)
		wantErr string // "" for none
	}{
		{"a known key", func(d *Decoder) { d.Obj(json.RawMessage(`{"a":1}`), "x", "a", "b") }, ""},
		{"an unknown key", func(d *Decoder) { d.Obj(json.RawMessage(`{"c":1}`), "x", "a", "b") }, "x.c: unknown field (want one of a, b)"},
		{"of unknown keys the first in order", func(d *Decoder) { d.Obj(json.RawMessage(`{"z":1,"a":1,"d":1,"c":1}`), "x", "a", "b") }, "x.c: unknown field"},
		{"a refused key says why", func(d *Decoder) {
			d.Refused = map[string]string{"c": "not carried"}
			d.Obj(json.RawMessage(`{"c":1}`), "x", "a")
		}, "x.c: not supported: not carried"},
		{"an empty key is quoted", func(d *Decoder) { d.Obj(json.RawMessage(`{"":1}`), "", "a") }, `"": unknown field`},
		{"the body is not an object", func(d *Decoder) { d.Obj(json.RawMessage(`[1]`), "") }, "body: the body must be a JSON object"},
		{"a member is not an object", func(d *Decoder) { d.Obj(json.RawMessage(`7`), "x") }, "x: want an object, got 7"},
		{"too long a list", func(d *Decoder) { d.List(json.RawMessage(`[1,2,3]`), "l", "numbers", 2) }, "l: at most 2 numbers, got 3"},
		{"too many strings", func(d *Decoder) {
			var s []string
			d.Strings(json.RawMessage(`["a","b"]`), "s", &s, 1)
		}, "s: at most 1 entries, got 2"},
		{"a wrong type, shortened", func(d *Decoder) { d.Float(json.RawMessage(`"`+strings.Repeat("é", 50)+`"`), "f") }, `f: want a number, got "` + strings.Repeat("é", 39) + "..."},
		{"null is absent", func(d *Decoder) {
			if d.Float(json.RawMessage(`null`), "f") != nil || d.Bool(nil, "b") != nil || d.Int32(json.RawMessage(" null "), "i") != nil {
				d.Fail("null", "decoded")
			}
		}, ""},
		{"the first error sticks", func(d *Decoder) {
			d.Int32(json.RawMessage(`1.5`), "first")
			d.Bool(json.RawMessage(`3`), "second")
		}, "first: want an integer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var d Decoder
			tt.run(&d)
			switch {
			case tt.wantErr == "" && d.Err != nil:
				t.Errorf("error %v, want none", d.Err)
			case tt.wantErr != "" && (d.Err == nil || !strings.Contains(d.Err.Error(), tt.wantErr)):
				t.Errorf("error %v, want one containing %q", d.Err, tt.wantErr)
			}
		})
	}
}

func TestPlainString(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
		ok   bool
	}{
		{`"hello"`, "hello", true},
		{`""`, "", true},
		{`"中文 é 😀"`, "中文 é 😀", true},
		{`"a\"b"`, "", false},       // an escape: json.Unmarshal decodes it
		{`"a\nb"`, "", false},       // likewise
		{"\"a\tb\"", "", false},     // a raw control character: json.Unmarshal refuses it
		{"\"bad \xff\"", "", false}, // invalid UTF-8: json.Unmarshal replaces it
		{`null`, "", false},
		{`42`, "", false},
		{` "x"`, "", false},
		{`"`, "", false},
	} {
		got, ok := PlainString(json.RawMessage(tc.in))
		if got != tc.want || ok != tc.ok {
			t.Errorf("PlainString(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// FuzzPlainString holds PlainString to json.Unmarshal: whatever it accepts, json.Unmarshal
// decodes to the same string.
func FuzzPlainString(f *testing.F) {
	for _, s := range []string{`"a"`, `"\u00e9"`, "\"\xff\"", `"a\"`, `""`, `"<&>"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		got, ok := PlainString(v)
		if !ok {
			return
		}
		var want string
		if err := json.Unmarshal(v, &want); err != nil {
			t.Fatalf("PlainString accepted %q, json.Unmarshal refuses it: %v", v, err)
		}
		if got != want {
			t.Fatalf("PlainString(%q) = %q, json.Unmarshal gives %q", v, got, want)
		}
	})
}
