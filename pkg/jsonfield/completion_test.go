package jsonfield

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestCompletion(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		pieces []string
		want   []bool // Complete after each piece
	}{
		{"object in pieces", []string{`{"city":`, `"Paris"`, `}`}, []bool{false, false, true}},
		{"white space around", []string{" \n{", `"a":[1,{"b":2}]`, "}", " \t\r\n"}, []bool{false, false, true, true}},
		{"braces and quotes in strings", []string{`{"a":"}\"`, `]{"`, `}`}, []bool{false, false, true}},
		{"escaped backslash ends a string", []string{`{"a":"\\`, `"}`}, []bool{false, true}},
		{"escape split across pieces", []string{`{"a":"\`, `"`, `"}`}, []bool{false, false, true}},
		{"array", []string{`[1,`, `2]`}, []bool{false, true}},
		{"string at the top", []string{`"ab`, `c"`}, []bool{false, true}},
		{"text after the value", []string{`{}`, ` x`, `}`}, []bool{true, false, false}},
		{"a second value", []string{`{}`, `{}`}, []bool{true, false}},
		{"an invalid value that closes", []string{`{"a":}`, ` `}, []bool{false, false}},
		{"mismatched brackets", []string{`{]`}, []bool{false}},
		{"a number is never complete", []string{`12`, `3`}, []bool{false, false}},
		{"a literal is never complete", []string{`true`}, []bool{false}},
		{"nothing", []string{``, ` `}, []bool{false, false}},
		{"unterminated", []string{`{"a":"}`}, []bool{false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var c Completion
			for i, p := range tt.pieces {
				c.Write(p)
				if got := c.Complete(); got != tt.want[i] {
					t.Errorf("after %q: Complete() = %t, want %t", strings.Join(tt.pieces[:i+1], ""), got, tt.want[i])
				}
			}
		})
	}
}

// FuzzCompletion holds Completion to Valid of the whole text after every piece, for every
// way of cutting the text into pieces (cuts gives the pieces' lengths), whether Complete
// is asked after every piece or only at the end.
func FuzzCompletion(f *testing.F) {
	for _, in := range validSeeds() {
		f.Add([]byte(in), []byte{1, 3, 2})
	}
	f.Add([]byte(`{"a":"\\\"}"}`), []byte{5, 1, 1, 1})
	f.Add([]byte(`{"a":[1,{"b":"]"}]} {}`), []byte{0, 7})
	f.Fuzz(func(t *testing.T, text, cuts []byte) {
		var every, once Completion
		rest := text
		for i := 0; len(rest) > 0; i++ {
			n := len(rest)
			if len(cuts) > 0 {
				n = min(n, int(cuts[i%len(cuts)]%9)) // a piece may be empty
			}
			if i > 2*len(text)+8 {
				n = len(rest) // empty pieces only: finish
			}
			every.Write(string(rest[:n]))
			once.Write(string(rest[:n]))
			rest = rest[n:]
			sofar := text[:len(text)-len(rest)]
			if got, want := every.Complete(), completeJSON(sofar); got != want {
				t.Fatalf("after %q: Complete() = %t, want %t", sofar, got, want)
			}
		}
		if got, want := once.Complete(), completeJSON(text); got != want {
			t.Fatalf("%q asked once: Complete() = %t, want %t", text, got, want)
		}
	})
}

// completeJSON is what Completion answers, from encoding/json: text is one valid JSON
// value, and that value is an object, an array or a string.
func completeJSON(text []byte) bool {
	trimmed := bytes.TrimLeft(text, " \t\r\n")
	return json.Valid(text) && len(trimmed) > 0 && strings.IndexByte(`{["`, trimmed[0]) >= 0
}

// BenchmarkCompletion: a tool call's 32 KB of arguments streamed in 8-byte pieces, with
// Complete asked after each, as the Messages front door does while another tool call's
// pieces wait; against Valid of the whole text after each piece.
//
//	go test -run '^$' -bench BenchmarkCompletion ./pkg/jsonfield/
func BenchmarkCompletion(b *testing.B) {
	args, err := json.Marshal(map[string]any{"rows": strings.Split(strings.Repeat("a row of the table,", 1700), ",")})
	if err != nil {
		b.Fatal(err)
	}
	const piece = 8
	b.Run("completion", func(b *testing.B) {
		b.SetBytes(int64(len(args)))
		for b.Loop() {
			var c Completion
			for i := 0; i < len(args); i += piece {
				c.Write(string(args[i:min(i+piece, len(args))]))
				c.Complete()
			}
			if !c.Complete() {
				b.Fatal("not complete")
			}
		}
	})
	b.Run("valid-each-piece", func(b *testing.B) {
		b.SetBytes(int64(len(args)))
		for b.Loop() {
			var text []byte
			for i := 0; i < len(args); i += piece {
				text = append(text, args[i:min(i+piece, len(args))]...)
				Valid(text)
			}
		}
	})
}
