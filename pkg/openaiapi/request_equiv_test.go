package openaiapi

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// chatBodies are requests as callers send them and the ways a body can be read
// differently (duplicate keys, escapes, surrogates, white space, wrong types, refused and
// unknown fields at every level): the seeds of the comparison with the reference.
var chatBodies = []string{
	`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
	`{"model":"gpt-4o-mini","temperature":0,"max_tokens":256,"messages":[{"role":"system","content":"You are a helpful support agent."},{"role":"user","content":"Benchmark request 12345: how long does a parcel to Lisbon take?"}]}`,
	` { "model" : "m" , "messages" : [ { "role" : "user" , "content" : "spaced\n\"out\" \u00e9 \ud83d\ude00" } ] , "stream" : true , "stream_options" : { "include_usage" : true } } `,
	`{"model":"m","messages":[{"role":"assistant","name":"n","refusal":"r","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","tool_call_id":"c","content":"ok"}]}`,
	`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"https://x/y.png","detail":"high"}},{"type":"input_audio","input_audio":{"data":"AAA","format":"wav"}},{"type":"file","file":{"file_id":"f","filename":"a.pdf","file_data":"x"}},{"type":"refusal","refusal":"no"}]}]}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"get","description":"d","parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":true}}],"tool_choice":{"type":"function","function":{"name":"get"}},"parallel_tool_calls":false}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"auto","response_format":{"type":"json_schema","json_schema":{"name":"s","description":"d","schema":{"type":"object"},"strict":true}}}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"},"stop":"END","seed":-42,"n":2,"top_p":0.5,"presence_penalty":-1.5e0,"frequency_penalty":1E-2,"logprobs":true,"top_logprobs":3}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"stop":["a","b"],"logit_bias":{"50256":-100,"1":2.0},"metadata":{"k":"v"},"user":"u","service_tier":"auto","reasoning_effort":"low","modalities":["text"],"store":false}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"max_completion_tokens":10,"max_tokens":10,"extra_body":{"top_k":5, "nested":{"a":[1,2]}}}`,
	`{"model":"m","messages":[],"max_completion_tokens":10,"max_tokens":11}`,
	`{"model":"a","model":"b","messages":[{"role":"user","role":"system","content":"x"}]}`,
	`{"Model":"m","messages":[]}`,
	`{"model":"m","messages":[{"Role":"user"}]}`,
	`{"model":"m","messages":[{"role":"user","content":[{"Type":"text","text":"a"}]}]}`,
	`{"model":"m","messages":[{"role":"user","content":[{"type":"text","type":"image_url","image_url":{"url":"u"}}]}]}`,
	`{"model":"m","messages":[{"role":"user","content":[{"type":5}]}]}`,
	`{"model":"m","messages":[{"role":"user","content":[null]}]}`,
	`{"mod\u0065l":"m","messages":[{"r\u006fle":"user","content":"\ud800 lone"}]}`,
	`{"model":"\ud800","messages":[{"role":"user","content":"\udc00\ud800"}],"stop":"\ud800","tool_choice":"\u0061uto"}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"functions":[],"audio":{}}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"":1}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"extra_body":{"model":"n"}}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"extra_body":[]}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":[1]}}]}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":{}}`,
	`{"model":"m","messages":{}}`,
	`{"model":"m","messages":"x"}`,
	`{"model":"m","messages":[{"role":"user","content":true}]}`,
	`{"model":"m","messages":[{"role":"user","content":{}}]}`,
	`{"model":"m","messages":[{"role":"user","content":"x","tool_calls":[{"id":1}]}]}`,
	`{"model":"m","messages":[{"role":"user","content":"x","tool_calls":{}}]}`,
	`{"model":"m","messages":[[]]}`,
	`{"model":"m","temperature":"hot","messages":[]}`,
	`{"model":"m","temperature":1e999,"messages":[]}`,
	`{"model":"m","max_tokens":2147483648,"messages":[]}`,
	`{"model":"m","max_tokens":-2147483648,"messages":[]}`,
	`{"model":"m","max_tokens":1.0,"messages":[]}`,
	`{"model":"m","max_tokens":1e2,"messages":[]}`,
	`{"model":"m","max_tokens":-0,"n":123456789,"top_logprobs":1234567890,"messages":[]}`,
	`{"model":"m","stream":"yes","messages":[]}`,
	`{"model":"m","stream":null,"logprobs":null,"temperature":null,"max_tokens":null,"messages":null}`,
	`{"model":"m","stream_options":{"include_usage":1}}`,
	`{"model":"m","stream_options":{"include_usage":true,"x":1}}`,
	`{"model":"m","tool_choice":"maybe"}`,
	`{"model":"m","tool_choice":{"type":"function","function":{}}}`,
	`{"model":"m","response_format":{"type":"text","json_schema":{}}}`,
	`{"model":"m","response_format":{"type":"xml"}}`,
	`{"model":"m","stop":["a","b","c","d","e"]}`,
	`{"model":"m","stop":[1]}`,
	`{"model":"m","logit_bias":{"1":0.5}}`,
	`{"model":"m","metadata":{"k":1}}`,
	`{"model":5}`,
	`{"model":"m"} x`,
	`{"model":"m",}`,
	`{"model":"m"`,
	"{\"model\":\"\xff\"}",
	`[]`,
	`null`,
	`"x"`,
	``,
	`{}`,
}

// refDecodeChatRequest is the reference the one-pass decoder must match on every body:
// the same decoder with json.Unmarshal reading, and so checking, every object, list and
// literal (jsonfield.Decoder without Valid), after the same UTF-8 check.
func refDecodeChatRequest(body []byte) (*ChatRequest, error) {
	if !utf8.Valid(body) {
		return nil, rpc.Invalid("body", "the body is not valid UTF-8")
	}
	return decodeChatRequest(body, false)
}

// TestDecodeChatRequestMatchesReference: DecodeChatRequest, and DecodeValidChatRequest on
// bodies the front door lets through, give what the json.Unmarshal reference gives: the
// same request, or the same error naming the same field.
func TestDecodeChatRequestMatchesReference(t *testing.T) {
	t.Parallel()
	for _, body := range chatBodies {
		t.Run("", func(t *testing.T) {
			t.Parallel()
			compareChatDecode(t, []byte(body))
		})
	}
}

func compareChatDecode(t *testing.T, body []byte) {
	t.Helper()
	want, wantErr := refDecodeChatRequest(body)
	got, gotErr := DecodeChatRequest(body)
	sameChatDecode(t, "DecodeChatRequest", body, got, gotErr, want, wantErr)
	if utf8.Valid(body) && json.Valid(body) {
		got, gotErr = DecodeValidChatRequest(body)
		sameChatDecode(t, "DecodeValidChatRequest", body, got, gotErr, want, wantErr)
	} else {
		_, _ = DecodeValidChatRequest(body) // its result is undefined, but it must not panic
	}
}

func sameChatDecode(t *testing.T, name string, body []byte, got *ChatRequest, gotErr error, want *ChatRequest, wantErr error) {
	t.Helper()
	if !reflect.DeepEqual(gotErr, wantErr) {
		t.Fatalf("%s(%q): error %v, want %v", name, body, gotErr, wantErr)
	}
	if (got == nil) != (want == nil) {
		t.Fatalf("%s(%q) = %v, want %v", name, body, got, want)
	}
	if got == nil {
		return
	}
	if !proto.Equal(got.Request, want.Request) || got.Stream != want.Stream || got.IncludeUsage != want.IncludeUsage {
		t.Fatalf("%s(%q)\n got %v stream %v usage %v\nwant %v stream %v usage %v", name, body,
			got.Request, got.Stream, got.IncludeUsage, want.Request, want.Stream, want.IncludeUsage)
	}
}

// FuzzDecodeChatRequestMatchesReference: on any body, and on mutations of real requests
// and of the corpus of FuzzDecodeChatRequest, the decoders give what the reference gives.
func FuzzDecodeChatRequestMatchesReference(f *testing.F) {
	for _, b := range chatBodies {
		f.Add([]byte(b))
	}
	files, _ := filepath.Glob(filepath.Join("testdata", "fuzz", "FuzzDecodeChatRequest", "*"))
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		// The corpus format: a header line, then []byte("...") with a Go-quoted string.
		_, entry, _ := strings.Cut(string(data), "\n")
		entry = strings.TrimSpace(entry)
		s, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(entry, "[]byte("), ")"))
		if err != nil {
			f.Fatalf("%s: %v", name, err)
		}
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		compareChatDecode(t, body)
	})
}

func BenchmarkDecodeValidChatRequest(b *testing.B) {
	body := []byte(`{"model":"gpt-4o-mini","temperature":0,"max_tokens":256,"messages":[` +
		`{"role":"system","content":"You are a helpful support agent for a parcel company."},` +
		`{"role":"user","content":"Benchmark request 12345: how long does a parcel to Lisbon take?"}]}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeValidChatRequest(body); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzDecodeChatRequestShapes: requests of the usual shape with fuzzed keys and values,
// most of them valid JSON, so that the fuzzer explores the one-pass decoder rather than
// bodies json.Valid refuses.
func FuzzDecodeChatRequestShapes(f *testing.F) {
	f.Add("role", `"user"`, "content", `"hi"`, "temperature", `0.5`)
	f.Add("role", `"user"`, "content", `[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u"}}]`, "tools", `[{"type":"function","function":{"name":"f","parameters":{}}}]`)
	f.Add("name", `"n"`, "tool_calls", `[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]`, "tool_choice", `{"type":"function","function":{"name":"f"}}`)
	f.Add("Role", `null`, "content", `"\ud800"`, "stop", `["a"]`)
	f.Add("r\\u006fle", `"user"`, "refusal", `5`, "response_format", `{"type":"json_schema","json_schema":{"name":"s","schema":{}}}`)
	f.Add("role", `"user"`, "content", `"x"`, "extra_body", `{"k":1,"k":2}`)
	f.Add("role", `"user"`, "content", `"x"`, "max_tokens", `2147483647`)
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, k3, v3 string) {
		body := `{"model":"m","messages":[{"` + k1 + `":` + v1 + `,"` + k2 + `":` + v2 + `}],"` + k3 + `":` + v3 + `}`
		compareChatDecode(t, []byte(body))
	})
}
