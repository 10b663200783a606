package router

import (
	"encoding/base64"
	"encoding/json"
	"fmt"

	"google.golang.org/protobuf/proto"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/openaiapi"
	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// This file carries the chat fields beyond model, messages' text and temperature (tools,
// content parts, sampling fields, the pass-through body) between the router's request,
// the providers and the answer.

// validateChat adds the problems of req's chat fields to v.
func validateChat(v *rpc.ValidationError, req *routerv1.Request) {
	if n := req.N; n != nil && *n != 1 {
		v.Add("request.n", "mantle answers with one choice: n must be 1, got %d", *n)
	}
	if len(req.Tools) > openaiapi.MaxTools {
		v.Add("request.tools", "at most %d tools, got %d", openaiapi.MaxTools, len(req.Tools))
	}
	for i, t := range req.Tools {
		if t.GetType() != "function" {
			v.Add(fmt.Sprintf("request.tools[%d].type", i), "want function, got %q", t.GetType())
		}
		if t.GetName() == "" {
			v.Add(fmt.Sprintf("request.tools[%d].function.name", i), "required")
		}
		if p := t.GetParameters(); p != "" && !isJSONObject(p) {
			v.Add(fmt.Sprintf("request.tools[%d].function.parameters", i), "must be a JSON object")
		}
	}
	switch req.ToolChoice {
	case "", "auto", "none", "required":
		if req.ToolChoiceFunction != "" {
			v.Add("request.tool_choice", "must be function when tool_choice_function is set")
		}
	case "function":
		if req.ToolChoiceFunction == "" {
			v.Add("request.tool_choice_function", "required when tool_choice is function")
		}
	default:
		v.Add("request.tool_choice", "want auto, none, required or function, got %q", req.ToolChoice)
	}
	if len(req.Stop) > openaiapi.MaxStop {
		v.Add("request.stop", "at most %d sequences, got %d", openaiapi.MaxStop, len(req.Stop))
	}
	if len(req.LogitBias) > openaiapi.MaxLogitBias {
		v.Add("request.logit_bias", "at most %d entries, got %d", openaiapi.MaxLogitBias, len(req.LogitBias))
	}
	if len(req.Metadata) > openaiapi.MaxMetadata {
		v.Add("request.metadata", "at most %d entries, got %d", openaiapi.MaxMetadata, len(req.Metadata))
	}
	if k := req.TopK; k != nil && *k < 0 {
		v.Add("request.top_k", "must not be negative, got %d", *k)
	}
	if t := req.GetThinking(); t != nil {
		switch {
		case t.Type != "enabled" && t.Type != "disabled":
			v.Add("request.thinking.type", "want enabled or disabled, got %q", t.Type)
		case t.Type == "enabled" && t.BudgetTokens <= 0:
			v.Add("request.thinking.budget_tokens", "required with type enabled")
		case t.Type == "disabled" && t.BudgetTokens != 0:
			v.Add("request.thinking.budget_tokens", "only with type enabled")
		}
	}
	if req.ExtraBody != "" && !isJSONObject(req.ExtraBody) {
		v.Add("request.extra_body", "must be a JSON object")
	}
	for i, m := range req.Messages {
		// A message's path is made only for an error: every request has messages.
		field := func(member string) string { return fmt.Sprintf("request.messages[%d].%s", i, member) }
		if m.GetContent() != "" && (len(m.GetParts()) > 0 || m.GetContentNull()) {
			// The adapters send one of them; the other would be dropped.
			v.Add(field("content"), "set content, parts or content_null, not several")
		}
		if len(m.GetParts()) > openaiapi.MaxParts {
			v.Add(field("parts"), "at most %d parts, got %d", openaiapi.MaxParts, len(m.GetParts()))
		}
		if len(m.GetToolCalls()) > openaiapi.MaxToolCalls {
			v.Add(field("tool_calls"), "at most %d tool calls, got %d", openaiapi.MaxToolCalls, len(m.GetToolCalls()))
		}
		for j, p := range m.GetParts() {
			if img := p.GetImage(); img != nil && img.GetUrl() == "" && len(img.GetData()) == 0 {
				v.Add(fmt.Sprintf("request.messages[%d].parts[%d].image", i, j), "needs url or data")
			}
			if p.GetPart() == nil {
				v.Add(fmt.Sprintf("request.messages[%d].parts[%d]", i, j), "empty part")
			}
		}
	}
}

func isJSONObject(s string) bool {
	var m map[string]json.RawMessage
	return json.Unmarshal([]byte(s), &m) == nil && m != nil
}

// messageBytes is the size of m the prompt limit counts: its text, parts, tool calls.
func messageBytes(m *mantlev1.ChatMessage) int {
	n := len(m.GetContent()) + len(m.GetName()) + len(m.GetToolCallId()) + len(m.GetRefusal())
	for _, p := range m.GetParts() {
		n += proto.Size(p)
	}
	for _, tc := range m.GetToolCalls() {
		n += proto.Size(tc)
	}
	return n
}

// hasContent reports whether m says anything: text, parts or tool calls.
func hasContent(m *mantlev1.ChatMessage) bool {
	return m.GetContent() != "" || len(m.GetParts()) > 0 || len(m.GetToolCalls()) > 0
}

// chatFields copies req's chat fields beyond the basic ones into p.
func chatFields(p *provider.Request, req *routerv1.Request) {
	p.ToolChoice, p.ToolChoiceFunction = req.ToolChoice, req.ToolChoiceFunction
	if p.ToolChoiceFunction != "" {
		p.ToolChoice = "function"
	}
	p.ParallelToolCalls = req.ParallelToolCalls
	p.Stop = req.Stop
	if req.N != nil {
		n := int(*req.N)
		p.N = &n
	}
	p.Seed = req.Seed
	p.TopP, p.PresencePenalty, p.FrequencyPenalty = req.TopP, req.PresencePenalty, req.FrequencyPenalty
	if len(req.LogitBias) > 0 {
		p.LogitBias = make(map[string]int, len(req.LogitBias))
		for k, b := range req.LogitBias {
			p.LogitBias[k] = int(b)
		}
	}
	p.Logprobs = req.Logprobs
	if req.TopLogprobs != nil {
		n := int(*req.TopLogprobs)
		p.TopLogprobs = &n
	}
	p.MaxTokensIsCompletion = req.MaxTokensIsCompletion
	p.ReasoningEffort, p.ServiceTier = req.ReasoningEffort, req.ServiceTier
	p.Metadata, p.Modalities, p.Store = req.Metadata, req.Modalities, req.Store
	if req.ExtraBody != "" {
		p.ExtraBody = json.RawMessage(req.ExtraBody)
	}
	if req.TopK != nil {
		k := int(*req.TopK)
		p.TopK = &k
	}
	if t := req.GetThinking(); t != nil {
		p.Thinking = &provider.Thinking{Type: t.Type, BudgetTokens: int(t.BudgetTokens)}
	}
	for _, t := range req.Tools {
		pt := provider.Tool{Type: t.Type, Name: t.Name, Description: t.Description, Strict: t.Strict}
		if t.Parameters != "" {
			pt.Parameters = json.RawMessage(t.Parameters)
		}
		p.Tools = append(p.Tools, pt)
	}
	switch rf := req.GetResponseFormat(); rf.GetType() {
	case mantlev1.ResponseFormat_TYPE_TEXT:
		p.TextFormat = true
	case mantlev1.ResponseFormat_TYPE_JSON_SCHEMA:
		p.JSONSchema = &provider.JSONSchema{Name: rf.JsonSchemaName, Description: rf.JsonSchemaDescription, Schema: json.RawMessage(rf.JsonSchema), Strict: rf.JsonSchemaStrict}
	}
}

// chatMessageOut is m for a provider.
func chatMessageOut(m *mantlev1.ChatMessage) provider.Message {
	pm := provider.Message{Role: m.Role, Content: m.Content, Name: m.Name, ToolCallID: m.ToolCallId, Refusal: m.Refusal, ContentNull: m.ContentNull, ToolError: m.ToolError}
	for _, p := range m.Parts {
		pm.Parts = append(pm.Parts, providerPart(p))
	}
	for _, tc := range m.ToolCalls {
		pm.ToolCalls = append(pm.ToolCalls, provider.ToolCall{ID: tc.Id, Type: tc.Type, Name: tc.Name, Arguments: tc.Arguments})
	}
	return pm
}

func providerPart(p *mantlev1.ContentPart) provider.Part {
	switch x := p.Part.(type) {
	case *mantlev1.ContentPart_Text:
		return provider.Part{Type: provider.PartText, Text: x.Text}
	case *mantlev1.ContentPart_Refusal:
		return provider.Part{Type: provider.PartRefusal, Text: x.Refusal}
	case *mantlev1.ContentPart_Image:
		url := x.Image.Url
		if url == "" {
			url = dataURL(x.Image.MediaType, x.Image.Data)
		}
		return provider.Part{Type: provider.PartImage, ImageURL: url, Detail: x.Image.Detail}
	case *mantlev1.ContentPart_InputAudio:
		return provider.Part{Type: provider.PartInputAudio, AudioData: x.InputAudio.Data, AudioFormat: x.InputAudio.Format}
	case *mantlev1.ContentPart_File:
		return provider.Part{Type: provider.PartFile, FileID: x.File.FileId, Filename: x.File.Filename, FileData: x.File.FileData}
	}
	return provider.Part{} // validate refuses an empty part
}

// toolCallsProto is calls for the answer.
func toolCallsProto(calls []provider.ToolCall) []*mantlev1.ToolCall {
	if len(calls) == 0 {
		return nil
	}
	out := make([]*mantlev1.ToolCall, len(calls))
	for i, c := range calls {
		out[i] = &mantlev1.ToolCall{Id: c.ID, Type: c.Type, Name: c.Name, Arguments: c.Arguments}
	}
	return out
}

// toolCallDeltasProto is pieces of tool calls for a streamed delta.
func toolCallDeltasProto(ds []provider.ToolCallDelta) []*mantlev1.ToolCallDelta {
	if len(ds) == 0 {
		return nil
	}
	out := make([]*mantlev1.ToolCallDelta, len(ds))
	for i, d := range ds {
		out[i] = &mantlev1.ToolCallDelta{Index: int32(d.Index), Id: d.ID, Type: d.Type, Name: d.Name, Arguments: d.Arguments}
	}
	return out
}

// need is a capability a request needs, and the field that needs it.
type need struct {
	capability string
	field      string
	lacks      func(*Capabilities) bool
}

// needs lists the capabilities req needs, each once, with the first field needing it.
func needs(req *routerv1.Request) []need {
	var out []need
	add := func(capability, field string, lacks func(*Capabilities) bool) {
		for _, n := range out {
			if n.capability == capability {
				return
			}
		}
		out = append(out, need{capability, field, lacks})
	}
	if len(req.Tools) > 0 {
		add("tools", "tools", func(c *Capabilities) bool { return !c.Tools })
	}
	if p := req.ParallelToolCalls; p != nil && *p {
		add("parallel_tools", "parallel_tool_calls", func(c *Capabilities) bool { return !c.ParallelTools })
	}
	for i, m := range req.Messages {
		if len(m.ToolCalls) > 0 || m.ToolCallId != "" {
			add("tools", fmt.Sprintf("messages[%d].tool_calls", i), func(c *Capabilities) bool { return !c.Tools })
		}
		for _, p := range m.Parts {
			switch p.Part.(type) {
			case *mantlev1.ContentPart_Image:
				add("vision", fmt.Sprintf("messages[%d].content", i), func(c *Capabilities) bool { return !c.Vision })
			case *mantlev1.ContentPart_InputAudio:
				add("audio", fmt.Sprintf("messages[%d].content", i), func(c *Capabilities) bool { return !c.Audio })
			case *mantlev1.ContentPart_File:
				add("files", fmt.Sprintf("messages[%d].content", i), func(c *Capabilities) bool { return !c.Files })
			}
		}
	}
	if req.GetResponseFormat().GetType() == mantlev1.ResponseFormat_TYPE_JSON_SCHEMA {
		add("json_schema", "response_format", func(c *Capabilities) bool { return !c.JSONSchema })
	}
	if p := req.Logprobs; p != nil && *p {
		add("logprobs", "logprobs", func(c *Capabilities) bool { return !c.Logprobs })
	}
	if mt := int(req.MaxTokens); mt > 0 {
		add("max_output", "max_tokens", func(c *Capabilities) bool { return c.MaxOutput > 0 && mt > c.MaxOutput })
	}
	return out
}

// unsupportedBy says why u cannot serve req (preq as its provider gets it): a capability
// its model lacks, or a field its provider would have to drop. field is the request field
// to name; both are "" when u can serve it.
func unsupportedBy(u *upstream, req *routerv1.Request, preq provider.Request) (field, why string) {
	if caps := u.model.Capabilities; caps != nil {
		for _, n := range needs(req) {
			if n.lacks(caps) {
				return n.field, "capability " + n.capability
			}
		}
	}
	if len(u.keys) == 0 {
		return "", ""
	}
	if fr, ok := u.keys[0].client.(provider.FieldRefuser); ok {
		if f := fr.Unsupported(preq); f != "" {
			return f, "its provider cannot carry " + f
		}
	}
	return "", ""
}

// skipUnable marks the candidates whose provider would have to drop a field of preq as
// exhausted, so that none of them is tried: a fallback that ignores the tools or the image
// gives a wrong answer, not a rescue.
func (r *Router) skipUnable(qc *mantlev1.QualityContext, p *plan, req *routerv1.Request, preq provider.Request) {
	for _, c := range p.cands {
		if f, why := unsupportedBy(c.u, req, preq); f != "" {
			c.exhausted = true
			r.audit(qc, "route", fmt.Sprintf("%s skipped: %s (%s)", c.u.model.Name, why, f), 0)
		}
	}
}

// checkCarried refuses req when no candidate of rt can serve it (capabilities, fields its
// provider carries), naming the field and what the first candidate lacks.
func checkCarried(rt *route, req *routerv1.Request) error {
	preq := providerRequest(req, &mantlev1.QualityContext{})
	first, firstWhy, firstModel := "", "", ""
	for _, us := range [][]*upstream{rt.candidates, rt.smaller} {
		for _, u := range us {
			f, why := unsupportedBy(u, req, preq)
			if f == "" {
				return nil
			}
			if first == "" {
				first, firstWhy, firstModel = f, why, u.model.Name
			}
		}
	}
	if first == "" {
		return nil // a route without candidates fails later, as before
	}
	return rpc.Invalid("request."+first, "no model of route %q can serve this request: %s, lacked by %s and every other candidate", rt.name, firstWhy, firstModel)
}

// dataURL is an inline image as a data: URL, the form OpenAI-type APIs take.
func dataURL(mediaType string, data []byte) string {
	return "data:" + mediaType + ";base64," + base64.StdEncoding.EncodeToString(data)
}

// windowMargin discounts the prompt's token count before it is held against a model's
// context window: quota counts with the route's first model's tokenizer, and another
// model's may count up to a tenth fewer. A prompt that still does not fit is skipped
// for sure; one near the edge is left to the provider (a context overflow fails over to
// a larger window).
const windowMargin = 0.9

// skipSmallWindows marks the candidates whose context window cannot hold the prompt and
// max_tokens as exhausted. When that leaves none that could, the request is refused: no
// model of the route can take it, and every one would be a paid context overflow.
func (r *Router) skipSmallWindows(qc *mantlev1.QualityContext, p *plan, rt *route, promptTokens, maxTokens int64) error {
	if promptTokens <= 0 {
		return nil
	}
	need := int64(float64(promptTokens)*windowMargin) + maxTokens
	skipped, largest, left := false, 0, false
	for _, c := range p.cands {
		w := c.u.model.ContextWindow
		largest = max(largest, w)
		if c.exhausted {
			continue
		}
		if w > 0 && int64(w) < need {
			c.exhausted, c.overflow, skipped = true, true, true
			r.audit(qc, "route", fmt.Sprintf("%s skipped: capability context_window (%d tokens, the request needs about %d)", c.u.model.Name, w, need), 0)
			continue
		}
		left = true
	}
	if skipped && !left {
		return rpc.Invalid("request.messages", "no model of route %q can serve this request: capability context_window, the prompt's %d tokens and max_tokens %d exceed every candidate's window (the largest is %d)", rt.name, promptTokens, maxTokens, largest)
	}
	return nil
}
