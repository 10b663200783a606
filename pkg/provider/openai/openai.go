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
	apiKey string
}

var _ provider.Provider = (*Client)(nil)

// New returns a Client for cfg.
func New(cfg Config) *Client {
	url := strings.TrimRight(cfg.BaseURL, "/") + "/chat/completions"
	if cfg.BaseURL == "" {
		url = DefaultBaseURL + "/chat/completions"
	}
	return &Client{ep: httpcall.NewEndpoint(url, cfg.HTTPClient, cfg.Headers, cfg.Now), apiKey: cfg.APIKey}
}

// chatRequest is the request body. max_tokens rather than max_completion_tokens because
// every compatible server accepts it.
type chatRequest struct {
	Model          string          `json:"model"`
	Messages       []chatMessage   `json:"messages"`
	MaxTokens      int             `json:"max_tokens,omitempty"`
	Temperature    *float64        `json:"temperature,omitempty"`
	User           string          `json:"user,omitempty"`
	ResponseFormat *responseFormat `json:"response_format,omitempty"`
	Stream         bool            `json:"stream,omitempty"`
	StreamOptions  *streamOptions  `json:"stream_options,omitempty"`
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
	Name    string `json:"name,omitempty"`
	// Prefix marks a trailing assistant message as a prefill to continue (DeepSeek's
	// "prefix completion"; vLLM continues a final assistant message by itself).
	Prefix bool `json:"prefix,omitempty"`
}

type responseFormat struct {
	Type string `json:"type"`
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
	Model   string `json:"model"`
	Choices []struct {
		Message struct {
			Content string `json:"content"`
			// Refusal is set instead of Content when the model declines (structured outputs).
			Refusal string `json:"refusal"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

// Complete sends req and waits for the whole answer.
func (c *Client) Complete(ctx context.Context, req provider.Request) (provider.Response, error) {
	return c.ep.Complete(ctx, chatBody(req, false), c.ownHeaders(req), parseCompletion)
}

// parseCompletion reads a 2xx body that is neither too large nor an error object, returning
// a classified error when it is still a failure in disguise.
func parseCompletion(body []byte) (provider.Response, *provider.Error) {
	var cr chatResponse
	if err := json.Unmarshal(body, &cr); err != nil {
		return provider.Response{}, &provider.Error{
			Class:   mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
			Message: "response body is not a chat completion",
			Err:     fmt.Errorf("decode response: %w", err),
		}
	}
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

// chatBody is the request body for req.
func chatBody(req provider.Request, stream bool) chatRequest {
	body := chatRequest{
		Model:       req.Model,
		Messages:    make([]chatMessage, len(req.Messages)),
		MaxTokens:   req.MaxTokens,
		Temperature: req.Temperature,
		User:        req.User,
	}
	for i, m := range req.Messages {
		body.Messages[i] = chatMessage{Role: m.Role, Content: m.Content, Name: m.Name}
	}
	if req.Prefill != "" {
		body.Messages = append(body.Messages, chatMessage{Role: "assistant", Content: req.Prefill, Prefix: true})
	}
	if req.JSON {
		body.ResponseFormat = &responseFormat{Type: "json_object"}
	}
	if stream {
		body.Stream = true
		// Without this the stream carries no usage, and quota could not settle.
		body.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	return body
}

// ownHeaders are the headers the Client sends for req; Config.Headers override them.
func (c *Client) ownHeaders(req provider.Request) map[string]string {
	h := make(map[string]string, 2)
	if c.apiKey != "" {
		h["Authorization"] = "Bearer " + c.apiKey
	}
	if req.IdempotencyKey != "" {
		h["Idempotency-Key"] = req.IdempotencyKey
	}
	return h
}
