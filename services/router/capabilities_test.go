package router

import (
	"context"
	"errors"
	"strings"
	"testing"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// visionRequest asks about an image.
func visionRequest(model string) *routerv1.Request {
	return &routerv1.Request{Model: model, Messages: []*mantlev1.ChatMessage{{Role: "user", Parts: []*mantlev1.ContentPart{
		{Part: &mantlev1.ContentPart_Text{Text: "What is in this image?"}},
		{Part: &mantlev1.ContentPart_Image{Image: &mantlev1.ImagePart{Url: "https://example.com/cat.png"}}},
	}}}}
}

// TestCapabilitiesSkipCandidates: a vision request whose primary fails skips the text-only
// backup and reaches the vision-capable third candidate; a route with no vision-capable
// model refuses it, naming the capability, without calling any model.
func TestCapabilitiesSkipCandidates(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	vision := &Capabilities{Vision: true, Tools: true}
	cfg.Models[0].Capabilities = vision          // a: sees images, fails below
	cfg.Models[1].Capabilities = &Capabilities{} // b: text only
	cfg.Models[2].Capabilities = vision          // c: sees images
	cfg.Routes = append(cfg.Routes, RouteConfig{Name: "text", Candidates: []string{"b"}})
	h := newHarness(t, cfg, &harness{providers: map[string]*fakeProvider{
		"a": newFakeProvider(failure(mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, "busy")),
		"b": newFakeProvider(reply("I cannot see images.", 1, 1)),
		"c": newFakeProvider(reply("A cat.", 1, 1)),
	}})

	resp, err := h.router.Complete(context.Background(), visionRequest("chat"))
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if resp.Model != "c" || resp.GetMessage().GetContent() != "A cat." {
		t.Errorf("answered by %s (%q), want c", resp.Model, resp.GetMessage().GetContent())
	}
	if n := h.providers["b"].calls(); n != 0 {
		t.Errorf("the text-only backup was called %d times", n)
	}
	if got := h.providers["c"].requests()[0].Messages[0].Parts; len(got) != 2 || got[1].ImageURL != "https://example.com/cat.png" {
		t.Errorf("c received parts %+v, want the text and the image", got)
	}
	skipped := false
	for _, s := range resp.GetQuality().GetAudit() {
		skipped = skipped || (s.Step == "route" && strings.Contains(s.Detail, "b skipped: capability vision"))
	}
	if !skipped {
		t.Error("the audit trail does not say why b was skipped")
	}

	_, err = h.router.Complete(context.Background(), visionRequest("text"))
	var v *rpc.ValidationError
	if !errors.As(err, &v) || v.Violations[0].Field != "request.messages[0].content" || !strings.Contains(v.Violations[0].Description, "capability vision") {
		t.Fatalf("vision request on a text-only route: %v, want a validation error naming capability vision", err)
	}
	if n := h.providers["b"].calls(); n != 0 {
		t.Errorf("the text-only model was called %d times", n)
	}
}

func TestNeeds(t *testing.T) {
	t.Parallel()
	yes := true
	req := &routerv1.Request{
		Tools:             []*mantlev1.Tool{{Type: "function", Name: "f"}},
		ParallelToolCalls: &yes,
		Logprobs:          &yes,
		MaxTokens:         500,
		ResponseFormat:    &mantlev1.ResponseFormat{Type: mantlev1.ResponseFormat_TYPE_JSON_SCHEMA, JsonSchema: "{}"},
		Messages: []*mantlev1.ChatMessage{{Role: "user", Parts: []*mantlev1.ContentPart{
			{Part: &mantlev1.ContentPart_InputAudio{InputAudio: &mantlev1.AudioPart{Data: "AA==", Format: "wav"}}},
			{Part: &mantlev1.ContentPart_File{File: &mantlev1.FilePart{FileId: "f"}}},
			{Part: &mantlev1.ContentPart_Image{Image: &mantlev1.ImagePart{Url: "u"}}},
		}}},
	}
	var got []string
	for _, n := range needs(req) {
		got = append(got, n.capability+"@"+n.field)
	}
	want := "tools@tools parallel_tools@parallel_tool_calls audio@messages[0].content files@messages[0].content vision@messages[0].content json_schema@response_format logprobs@logprobs max_output@max_tokens"
	if strings.Join(got, " ") != want {
		t.Errorf("needs = %s\nwant    %s", strings.Join(got, " "), want)
	}
	all := &Capabilities{Tools: true, ParallelTools: true, Vision: true, Audio: true, Files: true, JSONSchema: true, Logprobs: true, MaxOutput: 500}
	for _, n := range needs(req) {
		if n.lacks(all) {
			t.Errorf("a model with every capability lacks %s", n.capability)
		}
		if !n.lacks(&Capabilities{MaxOutput: 499}) {
			t.Errorf("a model with none has %s", n.capability)
		}
	}
}

// TestContextWindowSkipsCandidates: the prompt's size as quota counted it (with a tenth off
// for other tokenizers) plus max_tokens is held against each model's context window: a
// model that cannot hold it is not called, one of unknown window is, and when none can the
// request is refused naming the capability, before any call.
func TestContextWindowSkipsCandidates(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		windows   [3]int // a, b, c; 0 is unknown
		prompt    int64  // quota's count; 0 when quota did not say
		maxTokens int32
		want      string // the model that answers; "" for the refusal
		skipped   []string
	}{
		{name: "a prompt a's window cannot hold goes to b", windows: [3]int{1000, 8000, 0}, prompt: 2000, want: "b", skipped: []string{"a"}},
		{name: "max_tokens counts too", windows: [3]int{4000, 8000, 0}, prompt: 2000, maxTokens: 3000, want: "b", skipped: []string{"a"}},
		{name: "a tenth of margin for another tokenizer: near the edge is tried", windows: [3]int{1900, 8000, 0}, prompt: 2000, want: "a"},
		{name: "too large for every known window: the unknown one is tried", windows: [3]int{1000, 8000, 0}, prompt: 20000, want: "c", skipped: []string{"a", "b"}},
		{name: "too large for every window: refused", windows: [3]int{1000, 8000, 16000}, prompt: 20000, skipped: []string{"a", "b", "c"}},
		{name: "quota did not count: nothing skipped", windows: [3]int{1000, 8000, 16000}, want: "a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig()
			for i, w := range tt.windows {
				cfg.Models[i].ContextWindow = w
			}
			h := newHarness(t, cfg, &harness{quota: &fakeQuota{inputTokens: tt.prompt}, providers: map[string]*fakeProvider{
				"a": newFakeProvider(reply("from a", 1, 1)), "b": newFakeProvider(reply("from b", 1, 1)), "c": newFakeProvider(reply("from c", 1, 1)),
			}})
			req := ask("chat")
			req.MaxTokens = tt.maxTokens
			resp, err := h.router.Complete(context.Background(), req)
			for _, m := range tt.skipped {
				if n := h.providers[m].calls(); n != 0 {
					t.Errorf("%s was called %d times; its window cannot hold the request", m, n)
				}
			}
			if tt.want == "" {
				var invalid *rpc.ValidationError
				if !errors.As(err, &invalid) || !strings.Contains(err.Error(), "context_window") {
					t.Fatalf("err = %v, want a validation error naming context_window", err)
				}
				return
			}
			if err != nil || resp.Model != tt.want {
				t.Fatalf("answered by %v (%v), want %s", resp.GetModel(), err, tt.want)
			}
		})
	}
}
