package anthropic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
)

// This file maps a provider.Request (OpenAI's chat completions vocabulary) onto the Messages
// API. Every field is either carried with the same meaning or named as unsupported; the
// router then skips this adapter for the request rather than send it without the field.

type messagesRequest struct {
	Model         string      `json:"model"`
	System        string      `json:"system,omitempty"`
	Messages      []message   `json:"messages"`
	MaxTokens     int         `json:"max_tokens"`
	Temperature   *float64    `json:"temperature,omitempty"`
	TopP          *float64    `json:"top_p,omitempty"`
	TopK          *int        `json:"top_k,omitempty"`
	StopSequences []string    `json:"stop_sequences,omitempty"`
	Tools         []tool      `json:"tools,omitempty"`
	ToolChoice    *toolChoice `json:"tool_choice,omitempty"`
	Thinking      *thinking   `json:"thinking,omitempty"`
	ServiceTier   string      `json:"service_tier,omitempty"`
	Metadata      *metadata   `json:"metadata,omitempty"`
	Stream        bool        `json:"stream,omitempty"`
}

type message struct {
	Role    string  `json:"role"`
	Content content `json:"content"`
}

// content is a message's content: a string when it is one piece of text (the shape a
// text-only conversation has always had), a list of blocks otherwise.
type content struct {
	text   string
	blocks []block
}

func (c content) MarshalJSON() ([]byte, error) {
	if c.blocks != nil {
		return json.Marshal(c.blocks)
	}
	return json.Marshal(c.text)
}

// block is one content block; Type says which fields are set.
type block struct {
	Type string `json:"type"`
	// Text is set (possibly empty) on text blocks only.
	Text *string `json:"text,omitempty"`
	// Source is an image's or a document's bytes or URL; Title a document's name.
	Source *source `json:"source,omitempty"`
	Title  string  `json:"title,omitempty"`
	// ID, Name and Input are a tool_use block.
	ID    string          `json:"id,omitempty"`
	Name  string          `json:"name,omitempty"`
	Input json.RawMessage `json:"input,omitempty"`
	// ToolUseID and Content are a tool_result block; Content is absent for an empty result.
	ToolUseID string   `json:"tool_use_id,omitempty"`
	Content   *content `json:"content,omitempty"`
	IsError   bool     `json:"is_error,omitempty"`
}

type source struct {
	Type      string `json:"type"` // base64 or url
	MediaType string `json:"media_type,omitempty"`
	Data      string `json:"data,omitempty"`
	URL       string `json:"url,omitempty"`
}

type tool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema"`
	Strict      *bool           `json:"strict,omitempty"`
}

type toolChoice struct {
	Type                   string `json:"type"` // auto, any, tool, none
	Name                   string `json:"name,omitempty"`
	DisableParallelToolUse bool   `json:"disable_parallel_tool_use,omitempty"`
}

type thinking struct {
	Type         string `json:"type"`
	BudgetTokens int    `json:"budget_tokens,omitempty"`
}

type metadata struct {
	UserID string `json:"user_id"`
}

// thinkingBudget is the extended-thinking budget (thinking.budget_tokens) each
// reasoning_effort asks for. Anthropic's smallest budget is 1024 tokens; the largest keeps
// budget plus answer within the 32k output limit of the smallest current models. "none"
// asks for no reasoning, which is Anthropic's default, so nothing is sent for it.
var thinkingBudget = map[string]int{
	"none":    0,
	"minimal": 1024,
	"low":     4096,
	"medium":  8192,
	"high":    24576,
}

// minThinkingBudget is the smallest budget_tokens Anthropic accepts.
const minThinkingBudget = 1024

// imageMediaTypes are the inline image types Anthropic accepts.
var imageMediaTypes = map[string]bool{"image/jpeg": true, "image/png": true, "image/gif": true, "image/webp": true}

// emptySchema is the input_schema of a function that takes no arguments: OpenAI allows
// parameters to be omitted, Anthropic requires a schema.
var emptySchema = json.RawMessage(`{"type":"object","properties":{}}`)

// unsupported is a field of a provider.Request this adapter cannot carry.
type unsupported string

// messagesBody is the request body for req, or the first field of req it cannot carry
// (named as in OpenAI's API, as provider.FieldRefuser says).
//
// Carried as the same thing under Anthropic's name: system and developer turns (the
// top-level system prompt, joined in order), text, image and PDF parts, tool calls and tool
// results, tools and tool_choice, parallel_tool_calls false, stop, top_p, temperature,
// max_tokens, user, reasoning_effort (as an extended-thinking budget, see thinkingBudget),
// and service_tier auto and default. Carried because they ask for what Anthropic does
// anyway: n 1, logprobs false, store false, modalities ["text"]. A JSON response format is
// not sent, because the Messages API has no JSON mode; the verifier checks the answer
// against it on every provider. Request.IdempotencyKey is not sent because Anthropic does
// not accept one; the router's own idempotency still applies.
func messagesBody(req provider.Request, stream bool) (messagesRequest, unsupported) {
	body := messagesRequest{
		Model:       req.Model,
		MaxTokens:   req.MaxTokens,
		Temperature: req.Temperature,
		TopP:        req.TopP,
		TopK:        req.TopK,
		Stream:      stream,
	}
	if f := unmappable(req); f != "" {
		return body, f
	}
	var f unsupported
	if body.System, body.Messages, f = messages(req); f != "" {
		return body, f
	}
	if body.Tools, body.ToolChoice, f = tools(req); f != "" {
		return body, f
	}
	for _, s := range req.Stop {
		// Anthropic refuses a stop sequence that is only white space ("\n" is a common one).
		if strings.TrimFunc(s, unicode.IsSpace) == "" {
			return body, "stop (white space only)"
		}
	}
	body.StopSequences = req.Stop
	switch req.ServiceTier {
	case "":
	case "auto":
		body.ServiceTier = "auto"
	case "default":
		// OpenAI's standard processing; Anthropic's name for not using priority capacity.
		body.ServiceTier = "standard_only"
	default:
		return body, "service_tier"
	}
	user, f := userID(req)
	if f != "" {
		return body, f
	}
	if user != "" {
		body.Metadata = &metadata{UserID: user}
	}
	if f := thinkingConfig(req, &body); f != "" {
		return body, f
	}
	if body.MaxTokens <= 0 {
		body.MaxTokens = DefaultMaxTokens
	}
	return body, ""
}

// unmappable names the first top-level field of req the Messages API has nothing for.
func unmappable(req provider.Request) unsupported {
	textOnly := true
	for _, m := range req.Modalities {
		textOnly = textOnly && m == "text"
	}
	fields := []struct {
		name unsupported
		set  bool
	}{
		{"n", req.N != nil && *req.N != 1},
		{"seed", req.Seed != nil},
		{"presence_penalty", req.PresencePenalty != nil},
		{"frequency_penalty", req.FrequencyPenalty != nil},
		{"logit_bias", len(req.LogitBias) > 0},
		{"logprobs", req.Logprobs != nil && *req.Logprobs},
		{"top_logprobs", req.TopLogprobs != nil},
		{"modalities", !textOnly},
		// Anthropic keeps no completions to store; store false asks for exactly that.
		{"store", req.Store != nil && *req.Store},
		// extra_body is for OpenAI-type providers (see router.v1.Request.extra_body).
		{"extra_body", len(req.ExtraBody) > 0},
	}
	for _, f := range fields {
		if f.set {
			return f.name
		}
	}
	return ""
}

// userID is Anthropic's metadata.user_id: the request's user, or a metadata entry named
// user_id (what a caller of the Messages API sent). Other metadata has no counterpart.
func userID(req provider.Request) (string, unsupported) {
	user := req.User
	for k, v := range req.Metadata {
		if k != "user_id" || (user != "" && v != user) {
			return "", "metadata"
		}
		user = v
	}
	return user, ""
}

// messages maps the conversation: system and developer turns become the system prompt,
// tool turns become tool_result blocks in a user turn, and the prefill a final assistant
// turn.
func messages(req provider.Request) (string, []message, unsupported) {
	var system []string
	out := make([]message, 0, len(req.Messages)+1)
	for _, m := range req.Messages {
		if m.Name != "" {
			// The Messages API has no participant names.
			return "", nil, "messages[].name"
		}
		switch m.Role {
		case "system", "developer":
			text, f := plainText(m)
			if f != "" {
				return "", nil, f
			}
			system = append(system, text)
		case "user":
			c, f := userContent(m)
			if f != "" {
				return "", nil, f
			}
			// Anthropic wants a tool's results and what the user says next in one turn,
			// results first.
			if n := len(out); n > 0 && out[n-1].Role == "user" && isToolResults(out[n-1].Content) {
				out[n-1].Content.blocks = append(out[n-1].Content.blocks, asBlocks(c)...)
				continue
			}
			out = append(out, message{Role: "user", Content: c})
		case "assistant":
			c, f := assistantContent(m)
			if f != "" {
				return "", nil, f
			}
			out = append(out, message{Role: "assistant", Content: c})
		case "tool":
			b, f := toolResult(m)
			if f != "" {
				return "", nil, f
			}
			// Results of parallel calls share one user turn, as roles must alternate.
			if n := len(out); n > 0 && out[n-1].Role == "user" && isToolResults(out[n-1].Content) {
				out[n-1].Content.blocks = append(out[n-1].Content.blocks, b)
				continue
			}
			out = append(out, message{Role: "user", Content: content{blocks: []block{b}}})
		default:
			return "", nil, "messages[].role"
		}
	}
	if req.Prefill != "" {
		// A final assistant turn is Anthropic's native prefill; it must not end in white space.
		out = append(out, message{Role: "assistant", Content: content{text: strings.TrimRight(req.Prefill, " \t\n")}})
	}
	return strings.Join(system, "\n\n"), out, ""
}

// isToolResults reports whether c is a user turn that holds only tool results so far.
func isToolResults(c content) bool {
	if len(c.blocks) == 0 {
		return false
	}
	for _, b := range c.blocks {
		if b.Type != "tool_result" {
			return false
		}
	}
	return true
}

// asBlocks is c as a list of blocks.
func asBlocks(c content) []block {
	if c.blocks != nil {
		return c.blocks
	}
	if c.text == "" {
		return nil // Anthropic refuses empty text blocks; an empty turn adds nothing here
	}
	return []block{textBlock(c.text)}
}

func textBlock(s string) block { return block{Type: "text", Text: &s} }

// plainText is the text of a turn that may only hold text (a system prompt).
func plainText(m provider.Message) (string, unsupported) {
	if len(m.Parts) == 0 {
		return m.Content, ""
	}
	var b strings.Builder
	for _, p := range m.Parts {
		if p.Type != provider.PartText {
			return "", unsupported("messages[].content (" + p.Type + " part in a " + m.Role + " turn)")
		}
		b.WriteString(p.Text)
	}
	return b.String(), ""
}

// userContent is a user turn's content.
func userContent(m provider.Message) (content, unsupported) {
	if m.ToolCallID != "" || len(m.ToolCalls) > 0 || m.Refusal != "" {
		return content{}, "messages[].role user with tool_calls, tool_call_id or refusal"
	}
	if len(m.Parts) == 0 {
		return content{text: m.Content}, ""
	}
	blocks, f := partBlocks(m.Parts, true)
	return content{blocks: blocks}, f
}

// partBlocks maps content parts: text, images, and (when files is set) PDF files.
func partBlocks(parts []provider.Part, files bool) ([]block, unsupported) {
	out := make([]block, 0, len(parts))
	for _, p := range parts {
		switch {
		case p.Type == provider.PartText:
			out = append(out, textBlock(p.Text))
		case p.Type == provider.PartImage:
			b, f := imageBlock(p)
			if f != "" {
				return nil, f
			}
			out = append(out, b)
		case p.Type == provider.PartFile && files:
			b, f := documentBlock(p)
			if f != "" {
				return nil, f
			}
			out = append(out, b)
		case p.Type == provider.PartInputAudio:
			// Claude takes no audio input.
			return nil, "messages[].content (input_audio part)"
		default:
			return nil, unsupported("messages[].content (" + p.Type + " part)")
		}
	}
	return out, ""
}

// imageBlock is an image part: a URL as a url source, a data: URL as base64 bytes.
// Anthropic looks at every image at its full resolution, which is what detail high asks
// for (and auto allows); detail low, a cheaper low-resolution look, has no counterpart.
func imageBlock(p provider.Part) (block, unsupported) {
	if p.Detail != "" && p.Detail != "auto" && p.Detail != "high" {
		return block{}, "messages[].content (image_url detail " + unsupported(p.Detail) + ")"
	}
	if !strings.HasPrefix(p.ImageURL, "data:") {
		return block{Type: "image", Source: &source{Type: "url", URL: p.ImageURL}}, ""
	}
	mediaType, data, ok := parseDataURL(p.ImageURL)
	if !ok || !imageMediaTypes[mediaType] {
		return block{}, "messages[].content (image_url data that is not base64 JPEG, PNG, GIF or WebP)"
	}
	return block{Type: "image", Source: &source{Type: "base64", MediaType: mediaType, Data: data}}, ""
}

// documentBlock is a file part as a PDF document block. Only inline PDFs have a
// counterpart: a file_id names a file in OpenAI's storage, and Anthropic reads no other
// inline file types as documents.
func documentBlock(p provider.Part) (block, unsupported) {
	if p.FileID != "" || p.FileData == "" {
		return block{}, "messages[].content (file part with file_id)"
	}
	data, mediaType := p.FileData, ""
	if strings.HasPrefix(data, "data:") {
		var ok bool
		if mediaType, data, ok = parseDataURL(data); !ok {
			return block{}, "messages[].content (file part that is not base64)"
		}
	} else if strings.HasSuffix(strings.ToLower(p.Filename), ".pdf") || strings.HasPrefix(data, "JVBERi") {
		// Raw base64: a .pdf name, or the bytes "%PDF-" that open every PDF.
		mediaType = "application/pdf"
	}
	if mediaType != "application/pdf" {
		return block{}, "messages[].content (file part that is not a PDF)"
	}
	return block{Type: "document", Source: &source{Type: "base64", MediaType: mediaType, Data: data}, Title: p.Filename}, ""
}

// parseDataURL splits data:<media type>;base64,<data>. Parameters other than base64
// (charset) are dropped from the media type, which Anthropic takes bare.
func parseDataURL(u string) (mediaType, data string, ok bool) {
	rest, found := strings.CutPrefix(u, "data:")
	if !found {
		return "", "", false
	}
	head, data, found := strings.Cut(rest, ",")
	if !found || data == "" {
		return "", "", false
	}
	params := strings.Split(head, ";")
	if params[len(params)-1] != "base64" {
		return "", "", false
	}
	return strings.ToLower(strings.TrimSpace(params[0])), data, true
}

// assistantContent is an assistant turn's content: its text, refusal and tool calls.
func assistantContent(m provider.Message) (content, unsupported) {
	if m.ToolCallID != "" {
		return content{}, "messages[].tool_call_id"
	}
	if len(m.Parts) == 0 && len(m.ToolCalls) == 0 && m.Refusal == "" {
		return content{text: m.Content}, ""
	}
	var out []block
	switch {
	case len(m.Parts) > 0:
		for _, p := range m.Parts {
			switch p.Type {
			case provider.PartText, provider.PartRefusal:
				// A refusal the assistant gave is what it said in that turn.
				out = append(out, textBlock(p.Text))
			default:
				return content{}, unsupported("messages[].content (" + p.Type + " part in an assistant turn)")
			}
		}
	case m.Content != "":
		out = append(out, textBlock(m.Content))
	}
	if m.Refusal != "" {
		out = append(out, textBlock(m.Refusal))
	}
	for _, tc := range m.ToolCalls {
		input, f := toolInput(tc.Arguments)
		if f != "" {
			return content{}, f
		}
		out = append(out, block{Type: "tool_use", ID: tc.ID, Name: tc.Name, Input: input})
	}
	return content{blocks: out}, ""
}

// toolInput is a tool call's arguments as the JSON object Anthropic's input is. Arguments
// the model wrote as something else cannot be sent back as they were.
func toolInput(arguments string) (json.RawMessage, unsupported) {
	if strings.TrimSpace(arguments) == "" {
		// No arguments: the call of a function that takes none.
		return json.RawMessage(`{}`), ""
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(arguments), &obj); err != nil || obj == nil {
		return nil, "messages[].tool_calls[].function.arguments (not a JSON object)"
	}
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(arguments)); err != nil {
		return nil, "messages[].tool_calls[].function.arguments (not a JSON object)"
	}
	return b.Bytes(), ""
}

// toolResult is a tool turn as a tool_result block; its content may hold text and images.
func toolResult(m provider.Message) (block, unsupported) {
	if m.ToolCallID == "" {
		return block{}, "messages[].role tool without tool_call_id"
	}
	if len(m.ToolCalls) > 0 || m.Refusal != "" {
		return block{}, "messages[].role tool with tool_calls or refusal"
	}
	b := block{Type: "tool_result", ToolUseID: m.ToolCallID, IsError: m.ToolError}
	switch {
	case len(m.Parts) > 0:
		blocks, f := partBlocks(m.Parts, false)
		if f != "" {
			return block{}, f
		}
		b.Content = &content{blocks: blocks}
	case m.Content != "":
		b.Content = &content{text: m.Content}
	}
	return b, ""
}

// tools maps the tools and the choice among them.
func tools(req provider.Request) ([]tool, *toolChoice, unsupported) {
	var out []tool
	for _, t := range req.Tools {
		if t.Type != "" && t.Type != "function" {
			return nil, nil, "tools[].type"
		}
		schema := t.Parameters
		if len(schema) == 0 {
			schema = emptySchema
		}
		out = append(out, tool{Name: t.Name, Description: t.Description, InputSchema: schema, Strict: t.Strict})
	}
	var choice *toolChoice
	switch req.ToolChoice {
	case "":
	case "auto":
		choice = &toolChoice{Type: "auto"}
	case "required":
		choice = &toolChoice{Type: "any"}
	case "none":
		choice = &toolChoice{Type: "none"}
	case "function":
		choice = &toolChoice{Type: "tool", Name: req.ToolChoiceFunction}
	default:
		return nil, nil, "tool_choice"
	}
	if p := req.ParallelToolCalls; p != nil && !*p && len(req.Tools) > 0 {
		switch {
		case choice == nil:
			choice = &toolChoice{Type: "auto", DisableParallelToolUse: true}
		case choice.Type != "none":
			choice.DisableParallelToolUse = true
		}
	}
	if len(req.Tools) == 0 {
		if hasToolTurns(req) {
			// Anthropic refuses tool_use and tool_result blocks unless tools are defined.
			return nil, nil, "messages[].tool_calls (without tools)"
		}
		if choice != nil && (choice.Type == "auto" || choice.Type == "none") {
			// Without tools there is nothing to choose from: auto and none mean the same
			// as no choice, and Anthropic refuses a tool_choice without tools.
			choice = nil
		}
	}
	return out, choice, ""
}

func hasToolTurns(req provider.Request) bool {
	for _, m := range req.Messages {
		if len(m.ToolCalls) > 0 || m.ToolCallID != "" {
			return true
		}
	}
	return false
}

// thinkingConfig sets extended thinking from the caller's explicit thinking block (the
// Messages front door's, sent as it is) or from reasoning_effort (thinking.budget_tokens
// from thinkingBudget), never both. An effort's budget counts against max_tokens, as
// OpenAI's reasoning tokens count against max_completion_tokens: without max_tokens the
// request gets DefaultMaxTokens on top of the budget; with it the budget is at most half of
// max_tokens, so that the answer keeps room. The combinations Anthropic refuses with
// thinking are unsupported: temperature other than 1, top_p below 0.95, a forced tool
// choice, a prefill, and continuing a tool call (Anthropic wants the turn's thinking blocks
// back, which a chat completions conversation does not carry).
func thinkingConfig(req provider.Request, body *messagesRequest) unsupported {
	field := unsupported("reasoning_effort")
	var budget int
	switch t := req.Thinking; {
	case t != nil && req.ReasoningEffort != "":
		return "thinking (with reasoning_effort)"
	case t != nil && t.Type == "disabled":
		body.Thinking = &thinking{Type: "disabled"}
		return ""
	case t != nil && t.Type == "enabled":
		field, budget = "thinking", t.BudgetTokens
		if budget < minThinkingBudget || (body.MaxTokens > 0 && budget >= body.MaxTokens) {
			return "thinking.budget_tokens"
		}
	case t != nil:
		return "thinking.type"
	case req.ReasoningEffort == "":
		return ""
	default:
		var known bool
		if budget, known = thinkingBudget[req.ReasoningEffort]; !known {
			return "reasoning_effort"
		}
		if budget == 0 {
			return ""
		}
	}
	switch {
	case req.Temperature != nil && *req.Temperature != 1:
		return field + " (with temperature)"
	case req.TopP != nil && *req.TopP < 0.95:
		return field + " (with top_p below 0.95)"
	case req.TopK != nil:
		return field + " (with top_k)"
	case body.ToolChoice != nil && (body.ToolChoice.Type == "any" || body.ToolChoice.Type == "tool"):
		return field + " (with a forced tool_choice)"
	case req.Prefill != "":
		return field + " (with a prefill)"
	case continuesToolCall(req.Messages):
		return field + " (continuing a tool call)"
	}
	if field == "reasoning_effort" {
		if body.MaxTokens <= 0 {
			body.MaxTokens = DefaultMaxTokens + budget
		} else {
			budget = min(budget, body.MaxTokens/2)
			if budget < minThinkingBudget {
				return "reasoning_effort (max_tokens below 2048)"
			}
		}
	} else if body.MaxTokens <= 0 {
		body.MaxTokens = DefaultMaxTokens + budget
	}
	body.Thinking = &thinking{Type: "enabled", BudgetTokens: budget}
	return ""
}

// continuesToolCall reports whether the conversation is inside a tool loop: an assistant
// turn with tool calls after the last turn of the user.
func continuesToolCall(msgs []provider.Message) bool {
	for i := len(msgs) - 1; i >= 0; i-- {
		switch m := msgs[i]; {
		case m.Role == "user":
			return false
		case m.Role == "assistant" && len(m.ToolCalls) > 0:
			return true
		}
	}
	return false
}

// refusedError is the failure of a Complete or Stream call for a request this adapter
// cannot carry; the router does not make one (it asks Unsupported first).
func refusedError(f unsupported) *provider.Error {
	return &provider.Error{
		Class:   mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST,
		Message: fmt.Sprintf("the Anthropic Messages API cannot carry %s", f),
	}
}
