package jsonfield

import (
	"encoding/json"
	"strings"
	"testing"
)

// completion is an OpenAI chat completion as a provider sends it.
const completion = `{"id":"chatcmpl-abc123","object":"chat.completion","created":1733480000,"model":"gpt-4o-mini-2024-07-18","choices":[{"index":0,"message":{"role":"assistant","content":"Parcels to Lisbon usually take three to five working days with standard post, and one to two days with an express courier.","refusal":null},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":19,"completion_tokens":37,"total_tokens":56,"prompt_tokens_details":{"cached_tokens":0}},"system_fingerprint":"fp_0ba0d124f1"}`

func TestValidAgreesWithEncodingJSON(t *testing.T) {
	deep := []string{ // around encoding/json's bound on nesting, 10000
		strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
		strings.Repeat("[", 10000) + strings.Repeat("]", 10000),
		`{"s":"` + strings.Repeat("[", 10001) + `"}`,
		strings.Repeat(`{"a":`, 5000) + "1" + strings.Repeat("}", 5000),
		strings.Repeat(`{"a":`, 10001) + "1" + strings.Repeat("}", 10001),
	}
	for _, in := range append(validSeeds(), deep...) {
		if got, want := Valid([]byte(in)), json.Valid([]byte(in)); got != want {
			t.Errorf("Valid(%.60q) = %t, encoding/json says %t", in, got, want)
		}
	}
}

// FuzzValid holds Valid to encoding/json's Valid on every input: a body Valid accepts and
// encoding/json would not could reach the walkers, which read only valid JSON right. (Its
// seeds are short; TestValidAgreesWithEncodingJSON has the bodies nested past the bound,
// whose size would slow the search down.)
func FuzzValid(f *testing.F) {
	for _, in := range validSeeds() {
		f.Add([]byte(in))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := Valid(b), json.Valid(b); got != want {
			t.Fatalf("Valid(%q) = %t, encoding/json says %t", b, got, want)
		}
	})
}

func validSeeds() []string {
	return []string{
		completion, completion + " \n", " " + completion, completion + "x", completion + completion,
		`{}`, `[]`, `""`, `0`, `-0`, `1e5`, `1E+5`, `-1.5e-3`, `true`, `false`, `null`,
		``, ` `, `{`, `}`, `[`, `{"a":}`, `{"a" 1}`, `{"a":1,}`, `[1,]`, `[,1]`, `{,}`, `{"a":1 "b":2}`,
		`01`, `1.`, `.5`, `+1`, `1e`, `-`, `0x10`, `NaN`, `Infinity`, `tru`, `nul`, `True`,
		`"\u00e9"`, `"\ud83d\ude00"`, `"\ud83d"`, `"\u12"`, `"\x"`, `"\/"`, "\"a\tb\"", "\"a\nb\"", "\"\x7f\"",
		"\"\xff\xfe\"", "\"caf\xc3\xa9\"", "\"\xed\xa0\x80\"", "{\"\xff\":1}",
		"\ufeff{}", "{}\x00", "\x00", "[[[[[1]]]]]", `[[[[{"a":[]}]]]]`,
	}
}

// BenchmarkValid compares Valid with encoding/json's on a chat completion, and on a 256 KB
// request (a long prompt, as retrieval-augmented callers send), past the size at which
// Valid also has the nesting to look at.
//
//	go test -run '^$' -bench BenchmarkValid ./pkg/jsonfield/
func BenchmarkValid(b *testing.B) {
	prompt := strings.Repeat("The parcel left Lisbon on Monday [ref 12] and {per the log} arrives Friday. ", 3500)
	request, err := json.Marshal(map[string]any{"model": "gpt", "messages": []map[string]string{{"role": "user", "content": prompt}}})
	if err != nil {
		b.Fatal(err)
	}
	for _, body := range []struct {
		name string
		b    []byte
	}{{"completion", []byte(completion)}, {"request_256KB", request}} {
		for _, v := range []struct {
			name  string
			valid func([]byte) bool
		}{{"jsonfield", Valid}, {"encoding-json", json.Valid}} {
			b.Run(body.name+"/"+v.name, func(b *testing.B) {
				b.SetBytes(int64(len(body.b)))
				for b.Loop() {
					if !v.valid(body.b) {
						b.Fatal("a valid body refused")
					}
				}
			})
		}
	}
}
