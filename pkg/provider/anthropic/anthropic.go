// Package anthropic is a provider.Provider for Anthropic's Messages API.
//
// Anthropic differs from OpenAI-compatible servers in shape, not in kind: the system prompt
// is a top-level field, max_tokens is mandatory, overload has a status of its own (529), and
// a stream reports failures as typed "error" events after a 200. This package absorbs those
// differences so the router sees the same provider.Error classes from both.
package anthropic

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

const (
	// DefaultBaseURL is Anthropic's API root.
	DefaultBaseURL = "https://api.anthropic.com/v1"
	// APIVersion is the anthropic-version header value this adapter is written against.
	APIVersion = "2023-06-01"
	// DefaultMaxTokens is sent when the Request leaves MaxTokens at 0, because Anthropic
	// rejects a request without max_tokens.
	DefaultMaxTokens = 1024
)

// Config says where a Client sends requests and with which key.
type Config struct {
	// BaseURL is the API root without /messages; DefaultBaseURL when empty.
	BaseURL string
	// APIKey is sent as x-api-key.
	APIKey string
	// HTTPClient makes the calls; http.DefaultClient when nil. Deadlines come from the
	// request context, so it needs no Timeout of its own.
	HTTPClient *http.Client
	// Headers are added to every request (anthropic-beta, gateway headers); they override
	// the Client's own headers of the same name.
	Headers map[string]string
	// Now is the clock used to turn Anthropic's absolute reset times into durations;
	// time.Now when nil.
	Now func() time.Time
}

// Client calls the Messages API with one key. It is safe for concurrent use.
type Client struct {
	ep     httpcall.Endpoint
	apiKey string
}

var _ provider.Provider = (*Client)(nil)

// New returns a Client for cfg.
func New(cfg Config) *Client {
	base := strings.TrimRight(cfg.BaseURL, "/")
	if base == "" {
		base = DefaultBaseURL
	}
	return &Client{ep: httpcall.NewEndpoint(base+"/messages", cfg.HTTPClient, cfg.Headers, cfg.Now), apiKey: cfg.APIKey}
}

type messagesRequest struct {
	Model       string    `json:"model"`
	System      string    `json:"system,omitempty"`
	Messages    []message `json:"messages"`
	MaxTokens   int       `json:"max_tokens"`
	Temperature *float64  `json:"temperature,omitempty"`
	Metadata    *metadata `json:"metadata,omitempty"`
	Stream      bool      `json:"stream,omitempty"`
	TopK        *int      `json:"top_k,omitempty"`
	Thinking    *thinking `json:"thinking,omitempty"`
}

type thinking struct {
	Type         string `json:"type"`
	BudgetTokens int    `json:"budget_tokens,omitempty"`
}

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type metadata struct {
	UserID string `json:"user_id"`
}

type usage struct {
	InputTokens              int64 `json:"input_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
}

// inputTokens counts cache writes and reads as input: they are prompt tokens the key's
// token limits and the tenant's quota pay for, only at a different price.
func (u usage) inputTokens() int64 {
	return u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens
}

type messageResponse struct {
	Type    string `json:"type"`
	Model   string `json:"model"`
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	StopReason string `json:"stop_reason"`
	Usage      usage  `json:"usage"`
}

// Complete sends req and waits for the whole answer.
func (c *Client) Complete(ctx context.Context, req provider.Request) (provider.Response, error) {
	return c.ep.Complete(ctx, messagesBody(req, false), c.ownHeaders(), parseMessage)
}

// parseMessage reads a 2xx body that is neither too large nor an error object, returning a
// classified error when it is still a failure in disguise.
func parseMessage(body []byte) (provider.Response, *provider.Error) {
	var msg messageResponse
	if err := json.Unmarshal(body, &msg); err != nil {
		return provider.Response{}, &provider.Error{
			Class:   mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
			Message: "response body is not a message",
			Err:     fmt.Errorf("decode response: %w", err),
		}
	}
	// Gateways in front of Anthropic sometimes omit "type"; only a different one is wrong.
	if (msg.Type != "" && msg.Type != "message") || msg.Content == nil {
		return provider.Response{}, &provider.Error{
			Class:   mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR,
			Message: fmt.Sprintf("response is not a message with content (type %q)", msg.Type),
		}
	}
	finish, perr := finishReason(msg.StopReason)
	if perr != nil {
		return provider.Response{}, perr
	}
	var text strings.Builder
	for _, block := range msg.Content {
		if block.Type == "text" {
			text.WriteString(block.Text)
		}
	}
	return provider.Response{
		Content:      text.String(),
		FinishReason: finish,
		Model:        msg.Model,
		Usage: provider.Usage{
			InputTokens:  msg.Usage.inputTokens(),
			OutputTokens: msg.Usage.OutputTokens,
		},
	}, nil
}

// finishReason translates Anthropic's stop_reason into the OpenAI vocabulary the rest of
// mantle speaks. A refusal is Anthropic's safety classifiers stopping the answer, so it is
// the same failure as OpenAI's content filter. Running out of tokens or context is "length"
// and left to the verifier, which decides whether a cut answer is still usable. Reasons
// this adapter does not know are passed through unchanged rather than guessed at.
func finishReason(stopReason string) (string, *provider.Error) {
	switch stopReason {
	case "end_turn", "stop_sequence":
		return "stop", nil
	case "max_tokens", "model_context_window_exceeded":
		return "length", nil
	case "tool_use":
		return "tool_calls", nil
	case "refusal":
		return "", &provider.Error{
			Class:   mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED,
			Message: "the model's safety system declined to answer (stop_reason refusal)",
		}
	}
	return stopReason, nil
}

// messagesBody is the request body for req.
//
// Request.JSON is not forwarded because the Messages API has no JSON mode, and
// Request.IdempotencyKey is not because Anthropic does not accept one; the router's own
// idempotency still applies.
func messagesBody(req provider.Request, stream bool) messagesRequest {
	body := messagesRequest{
		Model:       req.Model,
		Messages:    make([]message, 0, len(req.Messages)),
		MaxTokens:   req.MaxTokens,
		Temperature: req.Temperature,
		Stream:      stream,
		TopK:        req.TopK,
	}
	if t := req.Thinking; t != nil {
		body.Thinking = &thinking{Type: t.Type, BudgetTokens: t.BudgetTokens}
	}
	if body.MaxTokens <= 0 {
		body.MaxTokens = DefaultMaxTokens
	}
	var system []string
	for _, m := range req.Messages {
		switch m.Role {
		case "system", "developer":
			system = append(system, m.Content)
		default:
			body.Messages = append(body.Messages, message{Role: m.Role, Content: m.Content})
		}
	}
	body.System = strings.Join(system, "\n\n")
	if req.Prefill != "" {
		// A final assistant turn is Anthropic's native prefill; it must not end in white space.
		body.Messages = append(body.Messages, message{Role: "assistant", Content: strings.TrimRight(req.Prefill, " \t\n")})
	}
	if req.User != "" {
		body.Metadata = &metadata{UserID: req.User}
	}
	return body
}

// ownHeaders are the headers the Client sends; Config.Headers override them.
func (c *Client) ownHeaders() map[string]string {
	return map[string]string{"X-Api-Key": c.apiKey, "Anthropic-Version": APIVersion}
}

var _ provider.FieldRefuser = (*Client)(nil)

// Unsupported names the first field of req that messagesBody would drop. The Messages API
// has counterparts for several of them (tools, images, stop sequences); until this adapter
// maps them, a request that carries one is not sent here. A JSON response format is not
// among them: the verifier checks the answer against it on every provider.
func (c *Client) Unsupported(req provider.Request) string {
	for _, m := range req.Messages {
		switch {
		case len(m.Parts) > 0:
			return "messages[].content (content parts)"
		case len(m.ToolCalls) > 0:
			return "messages[].tool_calls"
		case m.ToolCallID != "":
			return "messages[].tool_call_id"
		case m.Refusal != "":
			return "messages[].refusal"
		case m.Name != "":
			return "messages[].name"
		case m.Role == "tool":
			return "messages[].role tool"
		}
	}
	fields := []struct {
		name string
		set  bool
	}{
		{"tools", len(req.Tools) > 0},
		{"tool_choice", req.ToolChoice != "" || req.ToolChoiceFunction != ""},
		{"parallel_tool_calls", req.ParallelToolCalls != nil},
		{"stop", len(req.Stop) > 0},
		{"n", req.N != nil && *req.N != 1},
		{"seed", req.Seed != nil},
		{"top_p", req.TopP != nil},
		{"presence_penalty", req.PresencePenalty != nil},
		{"frequency_penalty", req.FrequencyPenalty != nil},
		{"logit_bias", len(req.LogitBias) > 0},
		{"logprobs", req.Logprobs != nil && *req.Logprobs},
		{"top_logprobs", req.TopLogprobs != nil},
		{"reasoning_effort", req.ReasoningEffort != ""},
		{"service_tier", req.ServiceTier != ""},
		{"metadata", len(req.Metadata) > 0},
		{"modalities", len(req.Modalities) > 0},
		{"store", req.Store != nil},
		{"extra_body", len(req.ExtraBody) > 0},
	}
	for _, f := range fields {
		if f.set {
			return f.name
		}
	}
	return ""
}
