package anthropic

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"slices"
	"testing"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/pkg/provider/internal/providertest"
)

// recorder answers every request with answer and hands the body it received to the test.
func recorder(t *testing.T, answer string) (*Client, <-chan []byte) {
	t.Helper()
	bodies := make(chan []byte, 1)
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		providertest.Offer(t, bodies, b)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, answer)
	}))
	return c, bodies
}

// sameJSON reports the top-level members where got and want (JSON objects) differ.
func sameJSON(t *testing.T, got []byte, want string) {
	t.Helper()
	var g, w map[string]any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("body %s: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("want %s: %v", want, err)
	}
	keys := map[string]bool{}
	for k := range g {
		keys[k] = true
	}
	for k := range w {
		keys[k] = true
	}
	for k := range keys {
		if !reflect.DeepEqual(g[k], w[k]) {
			gj, _ := json.Marshal(g[k])
			wj, _ := json.Marshal(w[k])
			t.Errorf("%s = %s\nwant %s", k, gj, wj)
		}
	}
}

const okAnswer = `{"type":"message","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":1}}`

var (
	weatherTool = provider.Tool{Type: "function", Name: "get_weather", Description: "Weather of a city",
		Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`)}
	weatherJSON = `{"name":"get_weather","description":"Weather of a city","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}`
	question    = provider.Message{Role: "user", Content: "weather in Paris?"}
)

func ptr[T any](v T) *T { return &v }

// TestRequestMapping sends requests through Complete to a recording server and compares the
// whole body Anthropic received, member by member.
func TestRequestMapping(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		req  provider.Request
		want string // the whole body
	}{
		{
			name: "tools, auto choice, no parallel calls",
			req: provider.Request{Messages: []provider.Message{question}, Tools: []provider.Tool{weatherTool, {Type: "function", Name: "now", Strict: ptr(true)}},
				ToolChoice: "auto", ParallelToolCalls: ptr(false)},
			want: `{"model":"m","max_tokens":1024,"messages":[{"role":"user","content":"weather in Paris?"}],
				"tools":[` + weatherJSON + `,{"name":"now","input_schema":{"type":"object","properties":{}},"strict":true}],
				"tool_choice":{"type":"auto","disable_parallel_tool_use":true}}`,
		},
		{
			name: "parallel_tool_calls false without a choice",
			req:  provider.Request{Messages: []provider.Message{question}, Tools: []provider.Tool{weatherTool}, ParallelToolCalls: ptr(false)},
			want: `{"model":"m","max_tokens":1024,"messages":[{"role":"user","content":"weather in Paris?"}],"tools":[` + weatherJSON + `],
				"tool_choice":{"type":"auto","disable_parallel_tool_use":true}}`,
		},
		{
			name: "parallel_tool_calls true is Anthropic's default",
			req:  provider.Request{Messages: []provider.Message{question}, Tools: []provider.Tool{weatherTool}, ParallelToolCalls: ptr(true), ToolChoice: "required"},
			want: `{"model":"m","max_tokens":1024,"messages":[{"role":"user","content":"weather in Paris?"}],"tools":[` + weatherJSON + `],"tool_choice":{"type":"any"}}`,
		},
		{
			name: "named function",
			req:  provider.Request{Messages: []provider.Message{question}, Tools: []provider.Tool{weatherTool}, ToolChoice: "function", ToolChoiceFunction: "get_weather", ParallelToolCalls: ptr(false)},
			want: `{"model":"m","max_tokens":1024,"messages":[{"role":"user","content":"weather in Paris?"}],"tools":[` + weatherJSON + `],
				"tool_choice":{"type":"tool","name":"get_weather","disable_parallel_tool_use":true}}`,
		},
		{
			name: "none",
			req:  provider.Request{Messages: []provider.Message{question}, Tools: []provider.Tool{weatherTool}, ToolChoice: "none", ParallelToolCalls: ptr(false)},
			want: `{"model":"m","max_tokens":1024,"messages":[{"role":"user","content":"weather in Paris?"}],"tools":[` + weatherJSON + `],"tool_choice":{"type":"none"}}`,
		},
		{
			name: "auto without tools means nothing",
			req:  provider.Request{Messages: []provider.Message{question}, ToolChoice: "auto", ParallelToolCalls: ptr(false)},
			want: `{"model":"m","max_tokens":1024,"messages":[{"role":"user","content":"weather in Paris?"}]}`,
		},
		{
			name: "a tool loop: parallel calls, their results in one user turn, then the user",
			req: provider.Request{Tools: []provider.Tool{weatherTool}, Messages: []provider.Message{
				{Role: "system", Content: "be brief"},
				question,
				{Role: "assistant", ContentNull: true, ToolCalls: []provider.ToolCall{
					{ID: "call_1", Type: "function", Name: "get_weather", Arguments: `{"city": "Paris"}`},
					{ID: "call_2", Type: "function", Name: "now", Arguments: ``},
				}},
				{Role: "tool", ToolCallID: "call_1", Content: "sunny"},
				{Role: "tool", ToolCallID: "call_2", Content: ""},
				{Role: "user", Content: "and tomorrow?"},
				{Role: "assistant", Content: "Let me check.", ToolCalls: []provider.ToolCall{{ID: "call_3", Type: "function", Name: "get_weather", Arguments: `{"city":"Paris","day":1}`}}},
				{Role: "tool", ToolCallID: "call_3", Parts: []provider.Part{{Type: provider.PartText, Text: "rain"}, {Type: provider.PartImage, ImageURL: "https://x/map.png"}}},
			}},
			want: `{"model":"m","max_tokens":1024,"system":"be brief","tools":[` + weatherJSON + `],"messages":[
				{"role":"user","content":"weather in Paris?"},
				{"role":"assistant","content":[
					{"type":"tool_use","id":"call_1","name":"get_weather","input":{"city":"Paris"}},
					{"type":"tool_use","id":"call_2","name":"now","input":{}}]},
				{"role":"user","content":[
					{"type":"tool_result","tool_use_id":"call_1","content":"sunny"},
					{"type":"tool_result","tool_use_id":"call_2"},
					{"type":"text","text":"and tomorrow?"}]},
				{"role":"assistant","content":[
					{"type":"text","text":"Let me check."},
					{"type":"tool_use","id":"call_3","name":"get_weather","input":{"city":"Paris","day":1}}]},
				{"role":"user","content":[
					{"type":"tool_result","tool_use_id":"call_3","content":[
						{"type":"text","text":"rain"},
						{"type":"image","source":{"type":"url","url":"https://x/map.png"}}]}]}]}`,
		},
		{
			name: "images and PDFs",
			req: provider.Request{Messages: []provider.Message{{Role: "user", Parts: []provider.Part{
				{Type: provider.PartText, Text: "what is this?"},
				{Type: provider.PartImage, ImageURL: "https://x/y.png", Detail: "auto"},
				{Type: provider.PartImage, ImageURL: "data:image/png;base64,iVBORw0KGgo=", Detail: "high"},
				{Type: provider.PartFile, Filename: "a.pdf", FileData: "JVBERg=="},
				{Type: provider.PartFile, FileData: "data:application/pdf;base64,JVBERi0x"},
			}}}},
			want: `{"model":"m","max_tokens":1024,"messages":[{"role":"user","content":[
				{"type":"text","text":"what is this?"},
				{"type":"image","source":{"type":"url","url":"https://x/y.png"}},
				{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},
				{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBERg=="},"title":"a.pdf"},
				{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBERi0x"}}]}]}`,
		},
		{
			name: "system parts, refusal turn, sampling fields, user, service tier",
			req: provider.Request{
				Messages: []provider.Message{
					{Role: "developer", Parts: []provider.Part{{Type: provider.PartText, Text: "be "}, {Type: provider.PartText, Text: "kind"}}},
					question,
					{Role: "assistant", ContentNull: true, Refusal: "I can't."},
					{Role: "user", Content: "please"},
				},
				MaxTokens: 300, MaxTokensIsCompletion: true, Temperature: ptr(0.2), TopP: ptr(0.9), Stop: []string{"END", " STOP\n"},
				User: "u-1", ServiceTier: "default", N: ptr(1), Logprobs: ptr(false), Store: ptr(false), Modalities: []string{"text"},
				JSON: true,
			},
			want: `{"model":"m","max_tokens":300,"system":"be kind","temperature":0.2,"top_p":0.9,"stop_sequences":["END"," STOP\n"],
				"metadata":{"user_id":"u-1"},"service_tier":"standard_only","messages":[
				{"role":"user","content":"weather in Paris?"},
				{"role":"assistant","content":[{"type":"text","text":"I can't."}]},
				{"role":"user","content":"please"}]}`,
		},
		{
			name: "metadata user_id, service tier auto",
			req:  provider.Request{Messages: []provider.Message{question}, Metadata: map[string]string{"user_id": "u-2"}, ServiceTier: "auto"},
			want: `{"model":"m","max_tokens":1024,"metadata":{"user_id":"u-2"},"service_tier":"auto","messages":[{"role":"user","content":"weather in Paris?"}]}`,
		},
		{
			name: "reasoning effort without max_tokens",
			req:  provider.Request{Messages: []provider.Message{question}, ReasoningEffort: "medium", Temperature: ptr(1.0), TopP: ptr(0.95)},
			want: `{"model":"m","max_tokens":9216,"temperature":1,"top_p":0.95,"thinking":{"type":"enabled","budget_tokens":8192},"messages":[{"role":"user","content":"weather in Paris?"}]}`,
		},
		{
			name: "reasoning effort within max_tokens",
			req:  provider.Request{Messages: []provider.Message{question}, ReasoningEffort: "high", MaxTokens: 10000},
			want: `{"model":"m","max_tokens":10000,"thinking":{"type":"enabled","budget_tokens":5000},"messages":[{"role":"user","content":"weather in Paris?"}]}`,
		},
		{
			name: "reasoning effort minimal and none",
			req:  provider.Request{Messages: []provider.Message{question}, ReasoningEffort: "minimal", MaxTokens: 4096},
			want: `{"model":"m","max_tokens":4096,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[{"role":"user","content":"weather in Paris?"}]}`,
		},
		{
			name: "reasoning effort none is no thinking",
			req:  provider.Request{Messages: []provider.Message{question}, ReasoningEffort: "none"},
			want: `{"model":"m","max_tokens":1024,"messages":[{"role":"user","content":"weather in Paris?"}]}`,
		},
		{
			name: "thinking after a finished tool loop",
			req: provider.Request{Tools: []provider.Tool{weatherTool}, ReasoningEffort: "low", Messages: []provider.Message{
				question,
				{Role: "assistant", ToolCalls: []provider.ToolCall{{ID: "c", Name: "get_weather", Arguments: `{}`}}},
				{Role: "tool", ToolCallID: "c", Content: "sunny"},
				{Role: "assistant", Content: "Sunny."},
				{Role: "user", Content: "thanks"},
			}},
			want: `{"model":"m","max_tokens":5120,"thinking":{"type":"enabled","budget_tokens":4096},"tools":[` + weatherJSON + `],"messages":[
				{"role":"user","content":"weather in Paris?"},
				{"role":"assistant","content":[{"type":"tool_use","id":"c","name":"get_weather","input":{}}]},
				{"role":"user","content":[{"type":"tool_result","tool_use_id":"c","content":"sunny"}]},
				{"role":"assistant","content":"Sunny."},
				{"role":"user","content":"thanks"}]}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, bodies := recorder(t, okAnswer)
			req := tt.req
			req.Model = "m"
			if f := c.Unsupported(req); f != "" {
				t.Fatalf("Unsupported = %q", f)
			}
			if _, err := c.Complete(context.Background(), req); err != nil {
				t.Fatalf("Complete: %v", err)
			}
			sameJSON(t, <-bodies, tt.want)
		})
	}
}

func TestUnsupportedFields(t *testing.T) {
	t.Parallel()
	user := []provider.Message{question}
	tools := []provider.Tool{weatherTool}
	parts := func(p ...provider.Part) []provider.Message {
		return []provider.Message{{Role: "user", Parts: p}}
	}
	toolLoop := []provider.Message{question, {Role: "assistant", ToolCalls: []provider.ToolCall{{ID: "c", Name: "get_weather", Arguments: `{}`}}}, {Role: "tool", ToolCallID: "c", Content: "sunny"}}
	tests := []struct {
		name string
		req  provider.Request
		want string
	}{
		{name: "n", req: provider.Request{Messages: user, N: ptr(2)}, want: "n"},
		{name: "seed", req: provider.Request{Messages: user, Seed: ptr(int64(1))}, want: "seed"},
		{name: "presence_penalty", req: provider.Request{Messages: user, PresencePenalty: ptr(0.1)}, want: "presence_penalty"},
		{name: "frequency_penalty", req: provider.Request{Messages: user, FrequencyPenalty: ptr(0.1)}, want: "frequency_penalty"},
		{name: "logit_bias", req: provider.Request{Messages: user, LogitBias: map[string]int{"1": 2}}, want: "logit_bias"},
		{name: "logprobs", req: provider.Request{Messages: user, Logprobs: ptr(true)}, want: "logprobs"},
		{name: "top_logprobs", req: provider.Request{Messages: user, TopLogprobs: ptr(2)}, want: "top_logprobs"},
		{name: "audio output", req: provider.Request{Messages: user, Modalities: []string{"text", "audio"}}, want: "modalities"},
		{name: "store", req: provider.Request{Messages: user, Store: ptr(true)}, want: "store"},
		{name: "extra_body", req: provider.Request{Messages: user, ExtraBody: json.RawMessage(`{"top_k":3}`)}, want: "extra_body"},
		{name: "service_tier flex", req: provider.Request{Messages: user, ServiceTier: "flex"}, want: "service_tier"},
		{name: "metadata", req: provider.Request{Messages: user, Metadata: map[string]string{"app": "x"}}, want: "metadata"},
		{name: "metadata user_id other than user", req: provider.Request{Messages: user, User: "a", Metadata: map[string]string{"user_id": "b"}}, want: "metadata"},
		{name: "white space stop", req: provider.Request{Messages: user, Stop: []string{"END", "\n"}}, want: "stop (white space only)"},
		{name: "name", req: provider.Request{Messages: []provider.Message{{Role: "user", Content: "hi", Name: "ann"}}}, want: "messages[].name"},
		{name: "unknown role", req: provider.Request{Messages: []provider.Message{{Role: "function", Content: "x"}}}, want: "messages[].role"},
		{name: "audio input", req: provider.Request{Messages: parts(provider.Part{Type: provider.PartInputAudio, AudioData: "UklGRg==", AudioFormat: "wav"})}, want: "messages[].content (input_audio part)"},
		{name: "file_id", req: provider.Request{Messages: parts(provider.Part{Type: provider.PartFile, FileID: "file-1"})}, want: "messages[].content (file part with file_id)"},
		{name: "file that is not a PDF", req: provider.Request{Messages: parts(provider.Part{Type: provider.PartFile, Filename: "a.txt", FileData: "aGk="})}, want: "messages[].content (file part that is not a PDF)"},
		{name: "image detail low", req: provider.Request{Messages: parts(provider.Part{Type: provider.PartImage, ImageURL: "https://x", Detail: "low"})}, want: "messages[].content (image_url detail low)"},
		{name: "inline image of another type", req: provider.Request{Messages: parts(provider.Part{Type: provider.PartImage, ImageURL: "data:image/tiff;base64,AAAA"})}, want: "messages[].content (image_url data that is not base64 JPEG, PNG, GIF or WebP)"},
		{name: "inline image not base64", req: provider.Request{Messages: parts(provider.Part{Type: provider.PartImage, ImageURL: "data:image/png,rawbytes"})}, want: "messages[].content (image_url data that is not base64 JPEG, PNG, GIF or WebP)"},
		{name: "image in a system turn", req: provider.Request{Messages: []provider.Message{{Role: "system", Parts: []provider.Part{{Type: provider.PartImage, ImageURL: "https://x"}}}}}, want: "messages[].content (image_url part in a system turn)"},
		{name: "file in a tool result", req: provider.Request{Tools: tools, Messages: append(toolLoop[:2:2], provider.Message{Role: "tool", ToolCallID: "c", Parts: []provider.Part{{Type: provider.PartFile, FileData: "JVBERg=="}}})}, want: "messages[].content (file part)"},
		{name: "tool turn without id", req: provider.Request{Tools: tools, Messages: append(user, provider.Message{Role: "tool", Content: "x"})}, want: "messages[].role tool without tool_call_id"},
		{name: "tool turns without tools", req: provider.Request{Messages: toolLoop}, want: "messages[].tool_calls (without tools)"},
		{name: "arguments that are not JSON", req: provider.Request{Tools: tools, Messages: []provider.Message{question, {Role: "assistant", ToolCalls: []provider.ToolCall{{ID: "c", Name: "f", Arguments: `{"city":`}}}}}, want: "messages[].tool_calls[].function.arguments (not a JSON object)"},
		{name: "arguments that are not an object", req: provider.Request{Tools: tools, Messages: []provider.Message{question, {Role: "assistant", ToolCalls: []provider.ToolCall{{ID: "c", Name: "f", Arguments: `[1]`}}}}}, want: "messages[].tool_calls[].function.arguments (not a JSON object)"},
		{name: "unknown reasoning effort", req: provider.Request{Messages: user, ReasoningEffort: "extreme"}, want: "reasoning_effort"},
		{name: "thinking with temperature", req: provider.Request{Messages: user, ReasoningEffort: "low", Temperature: ptr(0.5)}, want: "reasoning_effort (with temperature)"},
		{name: "thinking with low top_p", req: provider.Request{Messages: user, ReasoningEffort: "low", TopP: ptr(0.9)}, want: "reasoning_effort (with top_p below 0.95)"},
		{name: "thinking with a forced tool", req: provider.Request{Messages: user, Tools: tools, ToolChoice: "required", ReasoningEffort: "low"}, want: "reasoning_effort (with a forced tool_choice)"},
		{name: "thinking with a prefill", req: provider.Request{Messages: user, Prefill: "The", ReasoningEffort: "low"}, want: "reasoning_effort (with a prefill)"},
		{name: "thinking inside a tool loop", req: provider.Request{Messages: toolLoop, Tools: tools, ReasoningEffort: "low"}, want: "reasoning_effort (continuing a tool call)"},
		{name: "thinking with little max_tokens", req: provider.Request{Messages: user, ReasoningEffort: "low", MaxTokens: 2000}, want: "reasoning_effort (max_tokens below 2048)"},
		// Carried: none of these is refused.
		{name: "plain text with a JSON format", req: provider.Request{Messages: user, JSON: true}},
		{name: "n of 1", req: provider.Request{Messages: user, N: ptr(1)}},
		{name: "logprobs false", req: provider.Request{Messages: user, Logprobs: ptr(false)}},
		{name: "store false", req: provider.Request{Messages: user, Store: ptr(false)}},
		{name: "text modality", req: provider.Request{Messages: user, Modalities: []string{"text"}}},
		{name: "tool loop", req: provider.Request{Messages: toolLoop, Tools: tools}},
	}
	c := New(Config{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := c.Unsupported(tt.req); got != tt.want {
				t.Errorf("Unsupported = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestUnsupportedIsNeverSent: a request the router should not have sent fails with a
// BAD_REQUEST naming the field, and nothing reaches Anthropic.
func TestUnsupportedIsNeverSent(t *testing.T) {
	t.Parallel()
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("the request reached the server")
	}))
	req := provider.Request{Model: "m", Messages: []provider.Message{question}, Seed: ptr(int64(3))}
	_, err := c.Complete(context.Background(), req)
	if pe := providertest.AsError(t, err); pe.Class != mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST || pe.Message != "the Anthropic Messages API cannot carry seed" {
		t.Errorf("Complete: %v", err)
	}
	_, err = c.Stream(context.Background(), req)
	if pe := providertest.AsError(t, err); pe.Class != mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST {
		t.Errorf("Stream: %v", err)
	}
}

func TestToolUseAnswer(t *testing.T) {
	t.Parallel()
	c, _ := recorder(t, `{"type":"message","model":"claude-x","content":[
		{"type":"thinking","thinking":"the user wants weather","signature":"sig"},
		{"type":"redacted_thinking","data":"xyz"},
		{"type":"text","text":"Checking."},
		{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{ "city" : "Paris" }},
		{"type":"tool_use","id":"toolu_2","name":"now","input":{}},
		{"type":"tool_use","id":"toolu_3","name":"now"}],
		"stop_reason":"tool_use","usage":{"input_tokens":10,"output_tokens":20}}`)
	resp, err := c.Complete(context.Background(), provider.Request{Model: "m", Messages: []provider.Message{question}, Tools: []provider.Tool{weatherTool}})
	if err != nil {
		t.Fatal(err)
	}
	want := provider.Response{
		Content:      "Checking.",
		FinishReason: "tool_calls",
		ToolCalls: []provider.ToolCall{
			{ID: "toolu_1", Type: "function", Name: "get_weather", Arguments: `{"city":"Paris"}`},
			{ID: "toolu_2", Type: "function", Name: "now", Arguments: `{}`},
			{ID: "toolu_3", Type: "function", Name: "now", Arguments: `{}`},
		},
		Usage: provider.Usage{InputTokens: 10, OutputTokens: 20},
		Model: "claude-x",
	}
	resp.RateLimit = provider.RateLimit{}
	if !reflect.DeepEqual(resp, want) {
		t.Errorf("response = %+v\nwant       %+v", resp, want)
	}
}

func TestStreamToolCalls(t *testing.T) {
	t.Parallel()
	delta := func(index int, typ, field, value string) sse {
		b, _ := json.Marshal(map[string]any{"type": "content_block_delta", "index": index, "delta": map[string]string{"type": typ, field: value}})
		return sse{"content_block_delta", string(b)}
	}
	start := func(index int, block string) sse {
		return sse{"content_block_start", `{"type":"content_block_start","index":` + string(rune('0'+index)) + `,"content_block":` + block + `}`}
	}
	stop := func(index int) sse {
		return sse{"content_block_stop", `{"type":"content_block_stop","index":` + string(rune('0'+index)) + `}`}
	}
	c := newTestClient(t, events(messageStart,
		start(0, `{"type":"thinking","thinking":""}`),
		delta(0, "thinking_delta", "thinking", "they want weather"),
		delta(0, "signature_delta", "signature", "sig"),
		stop(0),
		start(1, `{"type":"text","text":""}`),
		delta(1, "text_delta", "text", "Checking."),
		stop(1),
		start(2, `{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{}}`),
		delta(2, "input_json_delta", "partial_json", ""),
		delta(2, "input_json_delta", "partial_json", `{"city": `),
		start(3, `{"type":"tool_use","id":"toolu_2","name":"now","input":{}}`),
		delta(2, "input_json_delta", "partial_json", `"Paris"}`),
		stop(2),
		stop(3),
		ping,
		messageDelta("tool_use", 30),
		messageStop,
	))
	s, err := c.Stream(context.Background(), provider.Request{Model: "m", Messages: []provider.Message{question}, Tools: []provider.Tool{weatherTool}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	chunks := providertest.Collect(t, s)
	want := []provider.Chunk{
		{Content: "Checking."},
		{ToolCalls: []provider.ToolCallDelta{{Index: 0, ID: "toolu_1", Type: "function", Name: "get_weather"}}},
		{ToolCalls: []provider.ToolCallDelta{{Index: 0, Arguments: `{"city": `}}},
		{ToolCalls: []provider.ToolCallDelta{{Index: 1, ID: "toolu_2", Type: "function", Name: "now"}}},
		{ToolCalls: []provider.ToolCallDelta{{Index: 0, Arguments: `"Paris"}`}}},
		{ToolCalls: []provider.ToolCallDelta{{Index: 1, Arguments: `{}`}}},
		{FinishReason: "tool_calls", Usage: &provider.Usage{InputTokens: 30, OutputTokens: 30}},
	}
	if !reflect.DeepEqual(chunks, want) {
		t.Errorf("chunks:\n%s\nwant:\n%s", dump(chunks), dump(want))
	}
	var deltas []provider.ToolCallDelta
	for _, ch := range chunks {
		deltas = append(deltas, ch.ToolCalls...)
	}
	var assembled provider.ToolCallAssembler
	if err := assembled.Add(deltas); err != nil {
		t.Fatalf("Add: %v", err)
	}
	calls := assembled.Calls()
	wantCalls := []provider.ToolCall{
		{ID: "toolu_1", Type: "function", Name: "get_weather", Arguments: `{"city": "Paris"}`},
		{ID: "toolu_2", Type: "function", Name: "now", Arguments: `{}`},
	}
	if !slices.Equal(calls, wantCalls) {
		t.Errorf("assembled %+v, want %+v", calls, wantCalls)
	}
}

func dump(chunks []provider.Chunk) string {
	b, _ := json.MarshalIndent(chunks, "", " ")
	return string(b)
}
