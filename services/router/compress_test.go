package router

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
)

func TestSplitTranscript(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("漢字とかな", 500) // 7500 bytes, three-byte runes
	for _, tt := range []struct {
		name      string
		turns     []string
		limit     int
		wantParts int
	}{
		{"short turns share a part", []string{"user: hi", "assistant: hello"}, 2048, 1},
		{"turns that do not fit together go apart", []string{strings.Repeat("a", 1500), strings.Repeat("b", 1500)}, 2048, 2},
		{"a turn longer than a part is cut", []string{long}, 2048, 4},
		{"nothing to split", nil, 2048, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			parts := splitTranscript(tt.turns, tt.limit)
			if len(parts) != tt.wantParts {
				t.Fatalf("%d parts, want %d", len(parts), tt.wantParts)
			}
			var joined strings.Builder
			for i, p := range parts {
				if len(p) > tt.limit+1 {
					t.Errorf("part %d has %d bytes, over the limit %d", i, len(p), tt.limit)
				}
				if !utf8.ValidString(p) {
					t.Errorf("part %d cuts a character in two", i)
				}
				joined.WriteString(strings.ReplaceAll(p, "\n", ""))
			}
			if want := strings.Join(tt.turns, ""); joined.String() != want {
				t.Errorf("the parts lost or changed text: %d bytes, want %d", joined.Len(), len(want))
			}
		})
	}
}

// longConversation is a system message and n alternating turns, the last a user's, with a
// tool call and its result in the middle.
func longConversation(n int) []*mantlev1.ChatMessage {
	msgs := []*mantlev1.ChatMessage{{Role: "system", Content: "You are the support assistant."}}
	for i := range n {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, &mantlev1.ChatMessage{Role: role, Content: fmt.Sprintf("turn %d: %s", i, strings.Repeat("words ", 40))})
	}
	return msgs
}

// TestContextCompression: a conversation no model of the route can hold is summarised by
// the route's small model and goes on, marked and billed; without compression, or when it
// cannot help, the request fails as it did before.
func TestContextCompression(t *testing.T) {
	t.Parallel()
	route := func(c *Config) {
		c.Models = []ModelConfig{
			{Name: "a", Provider: "p", ContextWindow: 1000},
			{Name: "b", Provider: "p", ContextWindow: 1000},
			{Name: "summariser", Provider: "p", ContextWindow: 16000, InputPricePerMillion: 1},
		}
		c.Routes[0].Candidates = []string{"a", "b"}
		c.Routes[0].ContextCompression = ContextCompressionConfig{Model: "summariser", KeepRecent: 3}
	}
	for _, tt := range []struct {
		name         string
		cfg          func(*Config)
		promptTokens int64 // as quota counts it; 0: unknown
		turns        int
		results      map[string][]result
		wantCode     codes.Code
		wantCalls    map[string]int
		compressed   bool
	}{
		{
			name: "counted too large for every window: summarised before any call", cfg: route,
			promptTokens: 5000, turns: 20,
			results:   map[string][]result{"summariser": {reply("They discussed a late parcel.", 900, 40)}, "a": {reply("answer", 300, 5)}},
			wantCalls: map[string]int{"summariser": 1, "a": 1}, compressed: true,
		},
		{
			name: "a provider's context-length error with no larger window: summarised, then asked again", cfg: route,
			turns: 20,
			results: map[string][]result{
				"a":          {failure(classContext, "maximum context length"), reply("answer", 300, 5)},
				"summariser": {reply("They discussed a late parcel.", 900, 40)},
			},
			// b's window is no larger than a's: not tried on the long prompt.
			wantCalls: map[string]int{"a": 2, "summariser": 1}, compressed: true,
		},
		{
			name: "no context_compression: refused as before",
			cfg: func(c *Config) {
				route(c)
				c.Routes[0].ContextCompression = ContextCompressionConfig{}
			},
			promptTokens: 5000, turns: 20, wantCode: codes.InvalidArgument, wantCalls: map[string]int{},
		},
		{
			name: "nothing older than the kept messages: refused", cfg: route,
			promptTokens: 5000, turns: 3, wantCode: codes.InvalidArgument, wantCalls: map[string]int{},
		},
		{
			name: "the summariser fails: refused as before", cfg: route,
			promptTokens: 5000, turns: 20,
			results:  map[string][]result{"summariser": {failure(classOverloaded, "busy")}},
			wantCode: codes.InvalidArgument, wantCalls: map[string]int{"summariser": 1},
		},
		{
			// A longer budget might have been enough: not the refusal of a request no budget
			// could serve.
			name: "the summariser takes the whole budget: the budget ran out", cfg: route,
			promptTokens: 5000, turns: 20,
			results: map[string][]result{"summariser": {{
				err:     &provider.Error{Class: classTimeout, Message: "context deadline exceeded"},
				advance: time.Hour,
			}}},
			wantCode: codes.DeadlineExceeded, wantCalls: map[string]int{"summariser": 1},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig()
			tt.cfg(&cfg)
			providers := map[string]*fakeProvider{}
			for name, rs := range tt.results {
				providers[name] = newFakeProvider(rs...)
			}
			h := newHarness(t, cfg, &harness{providers: providers, quota: &fakeQuota{inputTokens: tt.promptTokens}})
			req := &routerv1.Request{Model: "chat", Messages: longConversation(tt.turns)}
			resp, err := h.router.Complete(context.Background(), req)
			if status.Code(toStatus(err)) != tt.wantCode {
				t.Fatalf("code %v (%v), want %v", status.Code(toStatus(err)), err, tt.wantCode)
			}
			for _, name := range []string{"a", "b", "summariser"} {
				if got := h.calls(name); got != tt.wantCalls[name] {
					t.Errorf("%s called %d times, want %d", name, got, tt.wantCalls[name])
				}
			}
			if !tt.compressed {
				return
			}
			if h.cache.stored() != 0 {
				t.Error("an answer to the compressed conversation was stored for the whole one")
			}
			cc := resp.GetQuality().GetContextCompression()
			if cc.GetModel() != "summariser" || cc.GetCalls() != 1 || cc.GetUsage().GetInputTokens() != 900 {
				t.Errorf("context_compression = %v; want the summariser's one call of 900 input tokens", cc)
			}
			// system + 20 turns; the last 3 are kept, the 17 before them summarised.
			if cc.GetMessagesSummarized() != 17 {
				t.Errorf("messages_summarized = %d, want 17", cc.GetMessagesSummarized())
			}
			if tt.promptTokens > 0 && (cc.GetPromptTokensAfter() <= 0 || cc.GetPromptTokensAfter() >= tt.promptTokens) {
				t.Errorf("prompt tokens %d after, %d before: want fewer after", cc.GetPromptTokensAfter(), tt.promptTokens)
			}
			if got := resp.GetQuality().GetUsage().GetInputTokens(); got != 1200 {
				t.Errorf("usage input tokens = %d, want the answer's 300 and the summary's 900", got)
			}
			reqs := h.providers["a"].requests()
			sent := reqs[len(reqs)-1].Messages
			if len(sent) != 5 || sent[0].Content != "You are the support assistant." ||
				!strings.Contains(sent[1].Content, "They discussed a late parcel.") || sent[4].Content != req.Messages[20].Content {
				t.Errorf("the model got %d messages; want the system message, the summary and the last 3", len(sent))
			}
			summarised := h.providers["summariser"].requests()[0].Messages[1].Content
			if !strings.Contains(summarised, "turn 0:") || !strings.Contains(summarised, "turn 16:") || strings.Contains(summarised, "turn 17:") {
				t.Error("the summariser did not get exactly the turns before the kept ones")
			}
		})
	}
}

// TestCompressionKeepsToolResultsWithTheirCall: the boundary between summarised and kept
// messages never separates a tool's result from the assistant turn that called it.
func TestCompressionKeepsToolResultsWithTheirCall(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Models = []ModelConfig{{Name: "a", Provider: "p", ContextWindow: 1000}, {Name: "summariser", Provider: "p"}}
	cfg.Routes[0].Candidates = []string{"a"}
	cfg.Routes[0].ContextCompression = ContextCompressionConfig{Model: "summariser", KeepRecent: 2}
	h := newHarness(t, cfg, &harness{quota: &fakeQuota{inputTokens: 5000}, providers: map[string]*fakeProvider{
		"summariser": newFakeProvider(reply("earlier: small talk", 10, 5)),
	}})
	msgs := longConversation(6)
	msgs = append(msgs,
		&mantlev1.ChatMessage{Role: "assistant", ToolCalls: []*mantlev1.ToolCall{{Id: "t1", Type: "function", Name: "track", Arguments: `{"id":"42"}`}}},
		&mantlev1.ChatMessage{Role: "tool", ToolCallId: "t1", Content: "in transit"},
		&mantlev1.ChatMessage{Role: "tool", ToolCallId: "t2", Content: "paid"},
	)
	resp, err := h.router.Complete(context.Background(), &routerv1.Request{Model: "chat", Messages: msgs})
	if err != nil {
		t.Fatal(err)
	}
	// Keeping 2 would start at a tool result: the kept part starts at the call instead.
	if got := resp.GetQuality().GetContextCompression().GetMessagesSummarized(); got != 6 {
		t.Errorf("messages_summarized = %d, want 6 (the call and both results kept)", got)
	}
	sent := h.providers["a"].requests()[0].Messages
	if len(sent) != 5 || len(sent[2].ToolCalls) != 1 || sent[3].Role != "tool" || sent[4].Role != "tool" {
		t.Errorf("the model got %d messages; want system, summary, the call and its two results", len(sent))
	}
}

// TestStreamRescueAfterCompression: a stream cut mid-answer is finished on the
// conversation the models were given (compressed), never on the caller's whole one, and
// never by the fast-answer rung, which answers another request.
func TestStreamRescueAfterCompression(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	streamLimits(&cfg)
	cfg.Models = []ModelConfig{
		{Name: "a", Provider: "p", ContextWindow: 1000},
		{Name: "b", Provider: "p", ContextWindow: 1000},
		{Name: "quick", Provider: "p", ContextWindow: 1000, AcceptsPrefill: true},
		{Name: "summariser", Provider: "p", ContextWindow: 16000},
	}
	cfg.Routes[0].Candidates = []string{"a", "b"}
	cfg.Routes[0].Ladder.FastAnswer = FastAnswerConfig{Model: "quick", Prompt: "Be brief."}
	cfg.Routes[0].ContextCompression = ContextCompressionConfig{Model: "summariser", KeepRecent: 3}
	truncated := &provider.Error{Class: mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED, Message: "stream ended before [DONE]"}
	h := newHarness(t, cfg, &harness{quota: &fakeQuota{inputTokens: 5000}, providers: map[string]*fakeProvider{
		"a":          newFakeProvider(result{stream: []chunk{{content: "Hello "}, {err: truncated}}}),
		"b":          newFakeProvider(streamOf("Hello ", "from b")),
		"summariser": newFakeProvider(reply("earlier: a late parcel", 900, 20)),
	}})
	rec := newRecorder()
	d := await(t, h.startStream(&routerv1.Request{Model: "chat", Messages: longConversation(20)}, rec))
	if d.err != nil {
		t.Fatal(d.err)
	}
	if rec.text() != "Hello from b" || d.resp.GetQuality().GetSimplifiedPrompt() {
		t.Errorf("the caller got %q (simplified %v), want b's restart spliced on", rec.text(), d.resp.GetQuality().GetSimplifiedPrompt())
	}
	if n := h.calls("quick"); n != 0 {
		t.Errorf("the fast-answer rung was asked %d times to rescue the stream", n)
	}
	if sent := h.providers["b"].requests()[0].Messages; len(sent) != 5 {
		t.Errorf("the rescue got %d messages, want the compressed 5 (system, summary, the last 3)", len(sent))
	}
}
