package openai

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/pkg/provider/internal/httpcall"
)

// refParseCompletion is parseCompletion with json.Unmarshal alone: the reference the fast
// decoder must match on every input.
func refParseCompletion(body []byte) (provider.Response, *provider.Error) {
	var cr chatResponse
	if err := unmarshalCompletion(body, &cr); err != nil {
		return provider.Response{}, err
	}
	return completionResponse(cr)
}

// completions are answers as servers send them, the seeds of the comparison.
var completions = []string{
	`{"id":"chatcmpl-1","object":"chat.completion","created":1733000000,"model":"gpt-4o-mini-2024-07-18","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help?","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":7,"total_tokens":19,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}},"service_tier":"default","system_fingerprint":"fp_1"}`,
	`{"id":"x","choices":[{"message":{"role":"assistant","content":"line one\nline \"two\"\t\u00e9\ud83d\ude00 caf\u00e9 \/ \\"},"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`,
	`{"id":"x","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Lisbon\"}"}},{"index":1,"id":"call_2","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}`,
	`{"choices":[{"message":{"content":"x"},"logprobs":{"content":[{"token":"x","logprob":-0.1,"bytes":[120],"top_logprobs":[]}]},"finish_reason":"stop"}]}`,
	`{"choices":[{"message":{"refusal":"I can't help with that."},"finish_reason":"stop"}]}`,
	`{"choices":[{"message":{"content":""},"finish_reason":"content_filter"}]}`,
	` { "model" : "m" , "choices" : [ { "message" : { "content" : "spaced" } , "finish_reason" : "stop" } ] , "usage" : null } `,
	`{"choices":[{"message":{"content":"a"}},{"message":{"content":"b"}}],"usage":{"prompt_tokens":-0,"completion_tokens":123456789012345678}}`,
	`{"choices":[],"model":"m"}`,
	`{"error":{"message":"bad","type":"invalid_request_error"}}`,
	`{"choices":null}`,
	`null`,
	`[]`,
	``,
	`{"choices":[{"message":{"content":"日本語のテキスト"}}]}`,
}

// TestDecodeCompletionMatchesReflection: the fast decoder gives what json.Unmarshal gives,
// answers and errors, on answers as servers send them and on every way json.Unmarshal
// reads a body differently from the plain reading (key case, duplicates, escapes, types).
func TestDecodeCompletionMatchesReflection(t *testing.T) {
	t.Parallel()
	cases := append([]string{}, completions...)
	cases = append(cases,
		`{"MODEL":"m","Choices":[{"Message":{"Content":"folded keys"}}]}`,
		`{"choices":[{"message":{"content":"a"}}],"choices":[{"finish_reason":"stop"}]}`,
		`{"model":"a","model":"b","choices":[{"message":{"content":"x"}}]}`,
		`{"model":"a","model":null,"choices":[{"message":{"content":"x","content":null}}]}`,
		`{"choices":[{"message":{"content":"bad \ud800 surrogate"}}]}`,
		"{\"choices\":[{\"message\":{\"content\":\"bad \xff utf-8\"}}]}",
		"{\"choices\":[{\"message\":{\"content\":\"x\"}}],\"\xffmodel\":1}",
		`{"mod\u0065l":"escaped key","choices":[{"message":{"content":"x"}}]}`,
		"{\"choices\":[{\"message\":{\"content\":\"x\"}}],\"usage\":{\"prompt_\u212Aokens\":1}}",
		`{"choices":[{"message":{"content":5}}]}`,
		`{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":1.5}}`,
		`{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":1e3}}`,
		`{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":99999999999999999999}}`,
		`{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":"1"}}`,
		`{"choices":[{"message":{"content":"x"}}],"usage":[]}`,
		`{"choices":[null,{"message":{"content":"x"}}]}`,
		`{"choices":[{"message":null,"finish_reason":null,"logprobs":null}]}`,
		`{"choices":[{"message":{"tool_calls":[{"index":"0","function":{"name":"f"}}]}}]}`,
		`{"choices":[{"message":{"tool_calls":[{"index":1.5}]}}]}`,
		`{"choices":[{"message":{"tool_calls":[null]}}]}`,
		`{"choices":[{"message":{"tool_calls":[{"function":null}]}}]}`,
		`{"choices":{}}`,
		`{"choices":[{"message":{"content":"x"}}]} trailing`,
		`{"choices":[{"message":{"content":"x"}}]`,
		`{"choices":[{"message":{"content":"x"}}],}`,
		`"a string"`,
		`{"choices":[{"message":{"content":"x"}}],"unknown":{"deep":[1,{"a":"}]"}]}}`,
	)
	for _, body := range cases {
		t.Run("", func(t *testing.T) {
			t.Parallel()
			compareWithReference(t, []byte(body))
		})
	}
}

// TestDecodeCompletionIsTaken: the answers servers send are read by the fast decoder, not
// handed back to json.Unmarshal, which would make it useless.
func TestDecodeCompletionIsTaken(t *testing.T) {
	t.Parallel()
	for _, body := range completions[:9] {
		var cr chatResponse
		if !decodeCompletion([]byte(body), &cr) {
			t.Errorf("not decoded: %s", body)
		}
	}
}

func compareWithReference(t *testing.T, body []byte) {
	t.Helper()
	want, wantErr := refParseCompletion(body)
	got, gotErr := parseCompletion(body)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("body %q\n got %#v\nwant %#v", body, got, want)
	}
	if (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("body %q: error %v, want %v", body, gotErr, wantErr)
	}
	if gotErr == nil {
		return
	}
	if gotErr.Class != wantErr.Class || gotErr.Message != wantErr.Message || gotErr.StatusCode != wantErr.StatusCode ||
		fmt.Sprint(gotErr.Err) != fmt.Sprint(wantErr.Err) {
		t.Fatalf("body %q: error %+v (%v)\nwant %+v (%v)", body, gotErr, gotErr.Err, wantErr, wantErr.Err)
	}
}

// FuzzParseCompletionMatchesReflection: on any body, and on mutations of real answers,
// parseCompletion returns exactly what the reflection reference returns.
func FuzzParseCompletionMatchesReflection(f *testing.F) {
	for _, c := range completions {
		f.Add([]byte(c))
	}
	f.Add([]byte(`{"Choices":[{"message":{"content":"x"}}],"choices":null}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		compareWithReference(t, body)
	})
}

func BenchmarkParseCompletion(b *testing.B) {
	body := []byte(completions[0])
	for _, impl := range []struct {
		name  string
		parse func([]byte) (provider.Response, *provider.Error)
	}{{"fast", parseCompletion}, {"reflection", refParseCompletion}} {
		b.Run(impl.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := impl.parse(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// FuzzParseCompletionShapes: answers of the usual shape with fuzzed keys and values, most
// of them valid JSON, so that the fuzzer explores the fast decoder rather than bodies
// json.Valid refuses.
func FuzzParseCompletionShapes(f *testing.F) {
	f.Add("model", `"m"`, "content", `"hi\n\u00e9"`, `"stop"`, `null`, "prompt_tokens", `3`)
	f.Add("Model", `null`, "tool_calls", `[{"index":0,"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]`, `"tool_calls"`, `{"content":[]}`, "completion_tokens", `-7`)
	f.Add("id", `"x"`, "refusal", `"no"`, `null`, `[]`, "PROMPT_TOKENS", `1.5`)
	f.Add("choices", `[]`, "\\u0063ontent", `"x"`, `5`, `"\ud800"`, "prompt_tokens", `"3"`)
	f.Fuzz(func(t *testing.T, topKey, topValue, msgKey, msgValue, finish, logprobs, usageKey, usageValue string) {
		body := `{"` + topKey + `":` + topValue + `,"choices":[{"message":{"role":"assistant","` + msgKey + `":` + msgValue +
			`},"finish_reason":` + finish + `,"logprobs":` + logprobs + `}],"usage":{"` + usageKey + `":` + usageValue + `}}`
		compareWithReference(t, []byte(body))
	})
}

// refApply is decoder.Apply with json.Unmarshal alone: the reference the fast decoder of
// streamed events must match on every input.
func refApply(d *decoder, ev provider.Event) (provider.Chunk, bool, *provider.Error) {
	if strings.TrimSpace(ev.Data) == "[DONE]" {
		return provider.Chunk{}, true, nil
	}
	var chunk streamChunk
	if err := json.Unmarshal([]byte(ev.Data), &chunk); err != nil {
		return provider.Chunk{}, false, httpcall.Undecodable(ev, fmt.Errorf("decode stream event: %w", err))
	}
	return d.fold(ev, chunk)
}

// streamEvents are events as servers stream them, the seeds of the comparison.
var streamEvents = []string{
	`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1733000000,"model":"gpt-4o-mini","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}`,
	`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1733000000,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"Hello \"there\"\n\u00e9"},"logprobs":null,"finish_reason":null}]}`,
	`{"id":"chatcmpl-1","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}`,
	`{"id":"chatcmpl-1","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":7,"total_tokens":19,"prompt_tokens_details":{"cached_tokens":0}}}`,
	`{"choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]},"finish_reason":null}]}`,
	`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]},"finish_reason":null}]}`,
	`{"choices":[{"delta":{"content":"x"},"logprobs":{"content":[{"token":"x","logprob":-0.1,"bytes":[120],"top_logprobs":[]}]}}]}`,
	`{"choices":[{"delta":{"refusal":"I can't"},"finish_reason":null}]}`,
	`{"choices":[{"delta":{},"finish_reason":"content_filter"}]}`,
	`{"error":{"message":"overloaded","type":"server_error"}}`,
	` { "choices" : [ { "delta" : { "content" : "spaced" } } ] , "usage" : null } `,
}

// TestDecodeStreamChunkMatchesReflection: the fast decoder of streamed events gives what
// json.Unmarshal gives, pieces, errors and the decoder's state, on events as servers send
// them and on every way json.Unmarshal reads a body differently from the plain reading.
func TestDecodeStreamChunkMatchesReflection(t *testing.T) {
	t.Parallel()
	cases := append([]string{}, streamEvents...)
	cases = append(cases,
		`{"Choices":[{"Delta":{"Content":"folded keys"}}]}`,
		`{"choices":[{"delta":{"content":"a"}}],"choices":[{"finish_reason":"stop"}]}`,
		`{"choices":[{"delta":{"content":"a","content":null}}]}`,
		`{"choices":[{"delta":{"cont\u0065nt":"escaped key"}}]}`,
		`{"choices":[{"delta":{"content":"bad \ud800 surrogate"}}]}`,
		"{\"choices\":[{\"delta\":{\"content\":\"bad \xff utf-8\"}}]}",
		`{"choices":[{"delta":{"content":5}}]}`,
		`{"choices":[{"delta":null,"finish_reason":null,"logprobs":null}]}`,
		`{"choices":[null,{"delta":{"content":"x"}}]}`,
		`{"choices":null,"usage":{"prompt_tokens":1.5}}`,
		`{"choices":[],"usage":{"prompt_tokens":"1"}}`,
		`{"choices":[{"delta":{"tool_calls":[{"index":"0"}]}}]}`,
		`{"choices":[{"delta":{"tool_calls":null}}]}`,
		`{"choices":[{"delta":{"tool_calls":[]}}]}`,
		`{"choices":{}}`,
		`{"error":null,"choices":[{"delta":{"content":"x"}}]}`,
		`{"error":"plain","choices":[]}`,
		`{"choices":[{"delta":{"content":"x"}}]} trailing`,
		`{"choices":[{"delta":{"content":"x"}}]`,
		`[DONE]`,
		` [DONE] `,
		`null`,
		``,
	)
	for _, data := range cases {
		t.Run("", func(t *testing.T) {
			t.Parallel()
			compareStreamWithReference(t, data)
		})
	}
}

// TestDecodeStreamChunkIsTaken: the events servers send are read by the fast decoder, not
// handed back to json.Unmarshal.
func TestDecodeStreamChunkIsTaken(t *testing.T) {
	t.Parallel()
	for _, data := range streamEvents {
		var sc streamChunk
		if !decodeStreamChunk([]byte(data), &sc) {
			t.Errorf("not decoded: %s", data)
		}
	}
}

func compareStreamWithReference(t *testing.T, data string) {
	t.Helper()
	ev := provider.Event{Data: data}
	var fast, ref decoder
	got, gotDone, gotErr := fast.Apply(ev)
	want, wantDone, wantErr := refApply(&ref, ev)
	if !reflect.DeepEqual(got, want) || gotDone != wantDone {
		t.Fatalf("event %q\n got %#v (done %t)\nwant %#v (done %t)", data, got, gotDone, want, wantDone)
	}
	if (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("event %q: error %v, want %v", data, gotErr, wantErr)
	}
	if gotErr != nil && (gotErr.Class != wantErr.Class || gotErr.Message != wantErr.Message || fmt.Sprint(gotErr.Err) != fmt.Sprint(wantErr.Err)) {
		t.Fatalf("event %q: error %+v (%v)\nwant %+v (%v)", data, gotErr, gotErr.Err, wantErr, wantErr.Err)
	}
	if fast.finishReason != ref.finishReason || !reflect.DeepEqual(fast.usage, ref.usage) || fast.refusal.String() != ref.refusal.String() {
		t.Fatalf("event %q: decoder state %q %v %q, want %q %v %q", data,
			fast.finishReason, fast.usage, fast.refusal.String(), ref.finishReason, ref.usage, ref.refusal.String())
	}
}

// FuzzDecodeStreamChunkMatchesReflection: on any event, and on mutations of real ones,
// Apply returns exactly what the reflection reference returns.
func FuzzDecodeStreamChunkMatchesReflection(f *testing.F) {
	for _, e := range streamEvents {
		f.Add(e)
	}
	f.Add(`{"Choices":[{"delta":{"content":"x"}}],"choices":null}`)
	f.Fuzz(func(t *testing.T, data string) {
		compareStreamWithReference(t, data)
	})
}

func BenchmarkApplyStreamEvent(b *testing.B) {
	ev := provider.Event{Data: streamEvents[1]}
	for _, impl := range []struct {
		name  string
		apply func(*decoder, provider.Event) (provider.Chunk, bool, *provider.Error)
	}{{"fast", (*decoder).Apply}, {"reflection", refApply}} {
		b.Run(impl.name, func(b *testing.B) {
			b.ReportAllocs()
			var d decoder
			for b.Loop() {
				if _, _, err := impl.apply(&d, ev); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
