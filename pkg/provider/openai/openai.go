// Package openai is a provider.Provider for the OpenAI chat completions API and the many
// servers that copy it: OpenAI itself, DeepSeek, Qwen's compatible mode, vLLM, Ollama.
//
// Its job is to turn everything such a server can do wrong into one provider.Error class,
// including the failures a status code hides: an error object inside a 200 body, a 200 body
// that is not JSON or has no choices, a stream that stops without its [DONE] marker. The
// router's retry, breaker and fallback decisions are only as good as that classification.
package openai

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"time"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/pkg/provider/internal/httpcall"
)

// DefaultBaseURL is OpenAI's API root.
const DefaultBaseURL = "https://api.openai.com/v1"

// Config says where a Client sends requests and with which key.
type Config struct {
	// BaseURL is the API root without /chat/completions; DefaultBaseURL when empty.
	BaseURL string
	// APIKey is sent as a bearer token; local servers (Ollama, vLLM) may need none.
	APIKey string
	// HTTPClient makes the calls; http.DefaultClient when nil. Deadlines come from the
	// request context, so it needs no Timeout of its own.
	HTTPClient *http.Client
	// Headers are added to every request (organisation, project, gateway headers); they
	// override the Client's own headers of the same name.
	Headers map[string]string
	// Now is the clock used to turn absolute retry times into durations; time.Now when nil.
	Now func() time.Time
}

// Client calls one OpenAI-compatible server with one key. It is safe for concurrent use.
type Client struct {
	ep     httpcall.Endpoint
	embed  httpcall.Endpoint
	bearer string // the Authorization header's value, "" without a key
}

var _ provider.Provider = (*Client)(nil)

// New returns a Client for cfg.
func New(cfg Config) *Client {
	root := strings.TrimRight(cfg.BaseURL, "/")
	if cfg.BaseURL == "" {
		root = DefaultBaseURL
	}
	return &Client{
		ep:     httpcall.NewEndpoint(root+"/chat/completions", cfg.HTTPClient, cfg.Headers, cfg.Now),
		embed:  httpcall.NewEndpoint(root+"/embeddings", cfg.HTTPClient, cfg.Headers, cfg.Now),
		bearer: bearer(cfg.APIKey),
	}
}

func bearer(key string) string {
	if key == "" {
		return ""
	}
	return "Bearer " + key
}

// chatRequest is the request body: every field of provider.Request, under the name
// OpenAI gives it, omitted when the caller did not set it.
type chatRequest struct {
	Model               string            `json:"model"`
	Messages            []chatMessage     `json:"messages"`
	MaxTokens           int               `json:"max_tokens,omitempty"`
	MaxCompletionTokens int               `json:"max_completion_tokens,omitempty"`
	Temperature         *float64          `json:"temperature,omitempty"`
	TopP                *float64          `json:"top_p,omitempty"`
	N                   *int              `json:"n,omitempty"`
	Stop                []string          `json:"stop,omitempty"`
	Seed                *int64            `json:"seed,omitempty"`
	PresencePenalty     *float64          `json:"presence_penalty,omitempty"`
	FrequencyPenalty    *float64          `json:"frequency_penalty,omitempty"`
	LogitBias           map[string]int    `json:"logit_bias,omitempty"`
	Logprobs            *bool             `json:"logprobs,omitempty"`
	TopLogprobs         *int              `json:"top_logprobs,omitempty"`
	Tools               []tool            `json:"tools,omitempty"`
	ToolChoice          any               `json:"tool_choice,omitempty"`
	ParallelToolCalls   *bool             `json:"parallel_tool_calls,omitempty"`
	ReasoningEffort     string            `json:"reasoning_effort,omitempty"`
	ServiceTier         string            `json:"service_tier,omitempty"`
	Metadata            map[string]string `json:"metadata,omitempty"`
	Modalities          []string          `json:"modalities,omitempty"`
	Store               *bool             `json:"store,omitempty"`
	User                string            `json:"user,omitempty"`
	ResponseFormat      *responseFormat   `json:"response_format,omitempty"`
	Stream              bool              `json:"stream,omitempty"`
	StreamOptions       *streamOptions    `json:"stream_options,omitempty"`
	extra               json.RawMessage   // provider.Request.ExtraBody
}

// MarshalJSON adds the members of the extra body to the modelled ones. One that names a
// field mantle sets is an error: it would be sent twice, and which one the server reads is
// not defined.
func (b chatRequest) MarshalJSON() ([]byte, error) { return b.encode() }

// EncodeJSON is MarshalJSON's bytes (compact and HTML-escaped, as json.Marshal leaves
// them) without json.Marshal's second pass over them, and its errors as json.Marshal
// reports them.
func (b chatRequest) EncodeJSON() ([]byte, error) {
	out, err := b.encode()
	if err != nil {
		return nil, &json.MarshalerError{Type: reflect.TypeFor[chatRequest](), Err: err}
	}
	return out, nil
}

func (b chatRequest) encode() ([]byte, error) {
	out, ok := appendBody(nil, b)
	if !ok { // json.Marshal says what is wrong
		type plain chatRequest
		var err error
		if out, err = json.Marshal(plain(b)); err != nil {
			return nil, err
		}
	}
	if len(b.extra) == 0 {
		return out, nil
	}
	var extra map[string]json.RawMessage
	if err := json.Unmarshal(b.extra, &extra); err != nil {
		return nil, fmt.Errorf("extra_body is not a JSON object: %w", err)
	}
	var set map[string]json.RawMessage
	if err := json.Unmarshal(out, &set); err != nil {
		return nil, err
	}
	for k, v := range extra {
		if _, dup := set[k]; dup {
			return nil, fmt.Errorf("extra_body.%s: mantle sets this field itself", k)
		}
		set[k] = v
	}
	return json.Marshal(set)
}

type chatMessage struct {
	Role       string     `json:"role"`
	Content    content    `json:"content"`
	Name       string     `json:"name,omitempty"`
	ToolCalls  []toolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
	Refusal    string     `json:"refusal,omitempty"`
	// Prefix marks a trailing assistant message as a prefill to continue (DeepSeek's
	// "prefix completion"; vLLM continues a final assistant message by itself).
	Prefix bool `json:"prefix,omitempty"`
}

// content is a message's content: a string, null, or a list of typed parts.
type content struct {
	text  string
	null  bool
	parts []provider.Part
}

func (c content) MarshalJSON() ([]byte, error) {
	switch {
	case c.parts != nil:
		out := make([]contentPart, len(c.parts))
		for i, p := range c.parts {
			out[i] = partJSON(p)
		}
		return json.Marshal(out)
	case c.null:
		return []byte("null"), nil
	}
	return json.Marshal(c.text)
}

type contentPart struct {
	Type       string      `json:"type"`
	Text       *string     `json:"text,omitempty"`
	Refusal    *string     `json:"refusal,omitempty"`
	ImageURL   *imageURL   `json:"image_url,omitempty"`
	InputAudio *inputAudio `json:"input_audio,omitempty"`
	File       *file       `json:"file,omitempty"`
}

type imageURL struct {
	URL    string `json:"url"`
	Detail string `json:"detail,omitempty"`
}

type inputAudio struct {
	Data   string `json:"data"`
	Format string `json:"format"`
}

type file struct {
	FileID   string `json:"file_id,omitempty"`
	Filename string `json:"filename,omitempty"`
	FileData string `json:"file_data,omitempty"`
}

func partJSON(p provider.Part) contentPart {
	out := contentPart{Type: p.Type}
	switch p.Type {
	case provider.PartText:
		out.Text = &p.Text
	case provider.PartRefusal:
		out.Refusal = &p.Text
	case provider.PartImage:
		out.ImageURL = &imageURL{URL: p.ImageURL, Detail: p.Detail}
	case provider.PartInputAudio:
		out.InputAudio = &inputAudio{Data: p.AudioData, Format: p.AudioFormat}
	case provider.PartFile:
		out.File = &file{FileID: p.FileID, Filename: p.Filename, FileData: p.FileData}
	}
	return out
}

type toolCall struct {
	Index    *int   `json:"index,omitempty"` // streamed pieces only
	ID       string `json:"id,omitempty"`
	Type     string `json:"type,omitempty"`
	Function struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type tool struct {
	Type     string       `json:"type"`
	Function toolFunction `json:"function"`
}

type toolFunction struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

type namedToolChoice struct {
	Type     string `json:"type"`
	Function struct {
		Name string `json:"name"`
	} `json:"function"`
}

type responseFormat struct {
	Type       string          `json:"type"`
	JSONSchema *jsonSchemaSpec `json:"json_schema,omitempty"`
}

type jsonSchemaSpec struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Schema      json.RawMessage `json:"schema,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
}

func (u *usage) toProvider() *provider.Usage {
	if u == nil {
		return nil
	}
	return &provider.Usage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens}
}

// chatResponse is the part of a non-streaming answer the Client reads.
type chatResponse struct {
	Model   string   `json:"model"`
	Choices []choice `json:"choices"`
	Usage   *usage   `json:"usage"`
}

// choice is an alias, not a type of its own, so that json.Unmarshal's errors name the
// type as they did when it was written in place.
type choice = struct {
	Message      messageBody     `json:"message"`
	FinishReason string          `json:"finish_reason"`
	Logprobs     json.RawMessage `json:"logprobs"`
}

// messageBody is an answer's message, and a streamed chunk's delta; an alias, as choice is.
type messageBody = struct {
	Content string `json:"content"`
	// Refusal is set instead of Content when the model declines (structured outputs).
	Refusal   string     `json:"refusal"`
	ToolCalls []toolCall `json:"tool_calls"`
}

// Complete sends req and waits for the whole answer.
func (c *Client) Complete(ctx context.Context, req provider.Request) (provider.Response, error) {
	return c.ep.Complete(ctx, chatBody(req, false), c.ownHeaders(req), parseCompletion)
}

// parseCompletion reads a 2xx body that is neither too large nor an error object, returning
// a classified error when it is still a failure in disguise.
func parseCompletion(body []byte) (provider.Response, *provider.Error) {
	var cr chatResponse
	// decodeCompletion reads the usual answer without reflection; what it does not read
	// exactly as json.Unmarshal would, json.Unmarshal reads, errors included.
	if !decodeCompletion(body, &cr) {
		cr = chatResponse{}
		if err := unmarshalCompletion(body, &cr); err != nil {
			return provider.Response{}, err
		}
	}
	return completionResponse(cr)
}

// unmarshalCompletion is json.Unmarshal of a completion, its error a malformed output.
func unmarshalCompletion(body []byte, cr *chatResponse) *provider.Error {
	if err := json.Unmarshal(body, cr); err != nil {
		return &provider.Error{
			Class:   mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
			Message: "response body is not a chat completion",
			Err:     fmt.Errorf("decode response: %w", err),
		}
	}
	return nil
}

// completionResponse is the answer a decoded completion gives, or the failure it hides.
func completionResponse(cr chatResponse) (provider.Response, *provider.Error) {
	if len(cr.Choices) == 0 {
		return provider.Response{}, &provider.Error{
			Class:   mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR,
			Message: "response has no choices",
		}
	}
	choice := cr.Choices[0]
	if err := finishError(choice.FinishReason, choice.Message.Refusal); err != nil {
		return provider.Response{}, err
	}
	out := provider.Response{
		Content:      choice.Message.Content,
		FinishReason: choice.FinishReason,
		Model:        cr.Model,
		Logprobs:     nonNull(choice.Logprobs),
	}
	for _, tc := range choice.Message.ToolCalls {
		out.ToolCalls = append(out.ToolCalls, provider.ToolCall{ID: tc.ID, Type: tc.Type, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
	}
	if u := cr.Usage.toProvider(); u != nil {
		out.Usage = *u
	}
	return out, nil
}

// finishError turns the ways a model can end without an answer into errors. A "length"
// finish is not one of them: a cut answer may still be usable, and judging that is the
// verifier's job.
func finishError(finishReason, refusal string) *provider.Error {
	switch {
	case finishReason == "content_filter":
		return &provider.Error{
			Class:   mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED,
			Message: "the provider's content filter stopped the answer (finish_reason content_filter)",
		}
	case refusal != "":
		return &provider.Error{Class: mantlev1.ErrorClass_ERROR_CLASS_REFUSAL, Message: refusal}
	}
	return nil
}

// nonNull is raw, or nil when it is absent or JSON null.
func nonNull(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	return raw
}

// chatBody is the request body for req.
func chatBody(req provider.Request, stream bool) chatRequest {
	body := chatRequest{
		Model:             req.Model,
		Messages:          make([]chatMessage, len(req.Messages)),
		Temperature:       req.Temperature,
		TopP:              req.TopP,
		N:                 req.N,
		Stop:              req.Stop,
		Seed:              req.Seed,
		PresencePenalty:   req.PresencePenalty,
		FrequencyPenalty:  req.FrequencyPenalty,
		LogitBias:         req.LogitBias,
		Logprobs:          req.Logprobs,
		TopLogprobs:       req.TopLogprobs,
		ParallelToolCalls: req.ParallelToolCalls,
		ReasoningEffort:   req.ReasoningEffort,
		ServiceTier:       req.ServiceTier,
		Metadata:          req.Metadata,
		Modalities:        req.Modalities,
		Store:             req.Store,
		User:              req.User,
		extra:             req.ExtraBody,
	}
	if req.MaxTokensIsCompletion {
		body.MaxCompletionTokens = req.MaxTokens
	} else {
		body.MaxTokens = req.MaxTokens
	}
	for i, m := range req.Messages {
		cm := chatMessage{
			Role: m.Role, Name: m.Name, ToolCallID: m.ToolCallID, Refusal: m.Refusal,
			Content: content{text: m.Content, null: m.ContentNull, parts: m.Parts},
		}
		for _, tc := range m.ToolCalls {
			var c toolCall
			c.ID, c.Type, c.Function.Name, c.Function.Arguments = tc.ID, tc.Type, tc.Name, tc.Arguments
			cm.ToolCalls = append(cm.ToolCalls, c)
		}
		body.Messages[i] = cm
	}
	if req.Prefill != "" {
		body.Messages = append(body.Messages, chatMessage{Role: "assistant", Content: content{text: req.Prefill}, Prefix: true})
	}
	for _, t := range req.Tools {
		body.Tools = append(body.Tools, tool{Type: t.Type, Function: toolFunction{Name: t.Name, Description: t.Description, Parameters: t.Parameters, Strict: t.Strict}})
	}
	switch {
	case req.ToolChoiceFunction != "":
		var c namedToolChoice
		c.Type, c.Function.Name = "function", req.ToolChoiceFunction
		body.ToolChoice = c
	case req.ToolChoice != "":
		body.ToolChoice = req.ToolChoice
	}
	switch {
	case req.JSONSchema != nil:
		js := req.JSONSchema
		body.ResponseFormat = &responseFormat{Type: "json_schema", JSONSchema: &jsonSchemaSpec{Name: js.Name, Description: js.Description, Schema: js.Schema, Strict: js.Strict}}
	case req.JSON:
		body.ResponseFormat = &responseFormat{Type: "json_object"}
	case req.TextFormat:
		body.ResponseFormat = &responseFormat{Type: "text"}
	}
	if stream {
		body.Stream = true
		// Without this the stream carries no usage, and quota could not settle.
		body.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	return body
}

// ownHeaders are the headers the Client sends for req; Config.Headers override them.
func (c *Client) ownHeaders(req provider.Request) []httpcall.Header {
	h := make([]httpcall.Header, 0, 2)
	if c.bearer != "" {
		h = append(h, httpcall.Header{Name: "Authorization", Value: c.bearer})
	}
	if req.IdempotencyKey != "" {
		h = append(h, httpcall.Header{Name: "Idempotency-Key", Value: req.IdempotencyKey})
	}
	return h
}

var _ provider.FieldRefuser = (*Client)(nil)

// Unsupported names the first field of req that chat completions have no place for: the
// Anthropic Messages API's top_k, thinking and a tool result's is_error reach mantle
// through /v1/messages, and an OpenAI-type provider would have to drop them.
func (c *Client) Unsupported(req provider.Request) string {
	switch {
	case req.TopK != nil:
		return "top_k"
	case req.Thinking != nil:
		return "thinking"
	}
	for _, m := range req.Messages {
		if m.ToolError {
			return "messages[].content[].is_error"
		}
	}
	return ""
}
