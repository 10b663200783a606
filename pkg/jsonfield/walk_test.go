package jsonfield

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestUnquote(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want string
		ok   bool
	}{
		{`"plain"`, "plain", true},
		{`"a\"b\\c\/d\b\f\n\r\t"`, "a\"b\\c/d\b\f\n\r\t", true},
		{`"\u00e9\u4e2d\ud83d\ude00"`, "é中😀", true},
		{`"\u0000"`, "\x00", true},
		{`"\uD83D\uDE00"`, "😀", true},
		{`"\ufffd"`, "\ufffd", true},
		{`"\ud800"`, "", false},         // a lone surrogate: json.Unmarshal makes it U+FFFD
		{`"\ud800\u0041"`, "", false},   // likewise, before another escape
		{`"\udc00\ud800"`, "", false},   // a low surrogate first
		{"\"bad \xff\"", "", false},     // invalid UTF-8: json.Unmarshal replaces it
		{"\"\xed\xa0\x80\"", "", false}, // a surrogate in UTF-8
		{`"\x"`, "", false},
		{`"\u12"`, "", false},
		{`"a\"`, "", false},
		{`"a"b"`, "", false},
		{"\"a\nb\"", "", false},
		{`null`, "", false},
		{`"`, "", false},
	} {
		got, ok := Unquote([]byte(tc.in))
		if got != tc.want || ok != tc.ok {
			t.Errorf("Unquote(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// FuzzUnquote holds Unquote to json.Unmarshal: whatever it accepts, json.Unmarshal decodes
// to the same string.
func FuzzUnquote(f *testing.F) {
	for _, s := range []string{`"a"`, `"\u00e9\n"`, `"\ud83d\ude00"`, `"\ud800"`, "\"\xff\"", `"a\"`, `""`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		got, ok := Unquote(v)
		if !ok {
			return
		}
		var want string
		if err := json.Unmarshal(v, &want); err != nil {
			t.Fatalf("Unquote accepted %q, json.Unmarshal refuses it: %v", v, err)
		}
		if got != want {
			t.Fatalf("Unquote(%q) = %q, json.Unmarshal gives %q", v, got, want)
		}
	})
}

// TestWalkers: on valid JSON, the walkers split objects and lists as json.Unmarshal does.
func TestWalkers(t *testing.T) {
	t.Parallel()
	for _, v := range []string{
		`{}`, `[]`, ` { "a" : 1 , "b" : [ 1 , { "c" : "}]\"" } ] , "a" : null } `,
		`{"k\u0065y":"v","\ud800":1,"":{"x":[[],{}]}}`, `[1,-2.5e3,"s",true,false,null,{"a":[]},[[]]]`,
		`[ "a" , "b\\" ]`, `7`, `"s"`, `null`, `true`,
	} {
		compareWalkers(t, []byte(v))
	}
}

// FuzzWalkers: on any valid JSON, ObjectOfValid and the list walker give what
// json.Unmarshal gives, errors included; on invalid JSON they do not panic.
func FuzzWalkers(f *testing.F) {
	for _, s := range []string{`{"a":1,"b":[1,{"c":"d"}],"a":2}`, `[1,"x",{}]`, `{"\u0061":"\\"}`, `null`, `{`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		if !json.Valid(v) {
			_, _ = ObjectOfValid(v, "f") // undefined, but no panic
			d := Decoder{Valid: true}
			d.RawList(v, "f", "want a list")
			return
		}
		compareWalkers(t, v)
	})
}

func compareWalkers(t *testing.T, v []byte) {
	t.Helper()
	for _, field := range []string{"", "f"} {
		want, wantErr := Object(v, field)
		got, gotErr := ObjectOfValid(v, field, "a", "b")
		if !reflect.DeepEqual(gotErr, wantErr) || len(got) != len(want) {
			t.Fatalf("ObjectOfValid(%q) = %q, %v; want %q, %v", v, got, gotErr, want, wantErr)
		}
		for k, w := range want {
			if g, ok := got[k]; !ok || string(g) != string(w) {
				t.Fatalf("ObjectOfValid(%q)[%q] = %q, want %q", v, k, g, w)
			}
		}
	}
	var want []json.RawMessage
	wantErr := (&Decoder{}).Decode(v, "f", &want, "want a list")
	d := Decoder{Valid: true}
	got, ok := d.RawList(v, "f", "want a list")
	if IsNull(v) {
		return // callers test for null first; json.Unmarshal takes it as no list
	}
	if ok != wantErr || len(got) != len(want) {
		t.Fatalf("RawList(%q) = %q, %v; want %q, %v", v, got, ok, want, wantErr)
	}
	for i := range want {
		if string(got[i]) != string(want[i]) {
			t.Fatalf("RawList(%q)[%d] = %q, want %q", v, i, got[i], want[i])
		}
	}
	if !ok {
		var ref Decoder
		ref.Decode(v, "f", &want, "want a list")
		if !reflect.DeepEqual(d.Err, ref.Err) {
			t.Fatalf("RawList(%q) error %v, want %v", v, d.Err, ref.Err)
		}
	}
}

// TestWalkersEndOnInvalid: given what json.Valid refuses the walkers' results are
// undefined, but every walk ends (a value that is not there ends it).
func TestWalkersEndOnInvalid(t *testing.T) {
	t.Parallel()
	for _, v := range []string{`[}`, `[1,}`, `["a" } ]`, `{"a"}`, `{"a":}`, `{"a" "b"}`, `[`, `{`, `{"a":1,,}`, `[,,]`, `{"`, `["\`} {
		if m, ok := OpenObject([]byte(v)); ok {
			for n := 0; ; n++ {
				if _, _, more := m.Next(); !more {
					break
				}
				if n > len(v) {
					t.Fatalf("the walk of %q does not end", v)
				}
			}
		}
		if e, ok := OpenArray([]byte(v)); ok {
			for n := 0; ; n++ {
				if _, more := e.Next(); !more {
					break
				}
				if n > len(v) {
					t.Fatalf("the walk of %q does not end", v)
				}
			}
		}
	}
}
