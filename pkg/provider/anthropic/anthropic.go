// Package anthropic is a provider.Provider for Anthropic's Messages API.
//
// Anthropic differs from OpenAI-compatible servers in shape, not in kind: the system prompt
// is a top-level field, max_tokens is mandatory, overload has a status of its own (529), and
// a stream reports failures as typed "error" events after a 200. This package absorbs those
// differences so the router sees the same provider.Error classes from both. It also maps
// OpenAI's chat vocabulary (content parts, tools, tool calls and results, sampling fields,
// reasoning effort) onto Anthropic's content blocks and parameters, and names what has no
// counterpart so that the router sends such a request elsewhere (request.go).
package anthropic

import (
	"bytes"
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
	ep  httpcall.Endpoint
	own []httpcall.Header // the same for every request
}

var _ provider.Provider = (*Client)(nil)

// New returns a Client for cfg.
func New(cfg Config) *Client {
	base := strings.TrimRight(cfg.BaseURL, "/")
	if base == "" {
		base = DefaultBaseURL
	}
	return &Client{
		ep:  httpcall.NewEndpoint(base+"/messages", cfg.HTTPClient, cfg.Headers, cfg.Now),
		own: []httpcall.Header{{Name: "X-Api-Key", Value: cfg.APIKey}, {Name: "Anthropic-Version", Value: APIVersion}},
	}
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
		Type  string          `json:"type"`
		Text  string          `json:"text"`
		ID    string          `json:"id"`
		Name  string          `json:"name"`
		Input json.RawMessage `json:"input"`
	} `json:"content"`
	StopReason   string `json:"stop_reason"`
	StopSequence string `json:"stop_sequence"`
	Usage        usage  `json:"usage"`
}

// Complete sends req and waits for the whole answer.
func (c *Client) Complete(ctx context.Context, req provider.Request) (provider.Response, error) {
	body, f := messagesBody(req, false)
	if f != "" {
		return provider.Response{}, refusedError(f)
	}
	return c.ep.Complete(ctx, body, c.ownHeaders(), parseMessage)
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
	// Text blocks are the answer and tool_use blocks its tool calls. Thinking and
	// redacted_thinking blocks are the model's reasoning, which OpenAI's answer shape has no
	// place for: they are not passed on.
	var text strings.Builder
	var calls []provider.ToolCall
	for _, block := range msg.Content {
		switch block.Type {
		case "text":
			text.WriteString(block.Text)
		case "tool_use":
			calls = append(calls, provider.ToolCall{ID: block.ID, Type: "function", Name: block.Name, Arguments: toolArguments(block.Input)})
		}
	}
	return provider.Response{
		Content:      text.String(),
		ToolCalls:    calls,
		FinishReason: finish,
		StopSequence: msg.StopSequence,
		Model:        msg.Model,
		Usage: provider.Usage{
			InputTokens:  msg.Usage.inputTokens(),
			OutputTokens: msg.Usage.OutputTokens,
		},
	}, nil
}

// toolArguments is a tool_use block's input as the arguments string of an OpenAI tool
// call: compact JSON, "{}" when absent.
func toolArguments(input json.RawMessage) string {
	var b bytes.Buffer
	if len(input) == 0 || json.Compact(&b, input) != nil || b.String() == "null" {
		return "{}"
	}
	return b.String()
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

// ownHeaders are the headers the Client sends; Config.Headers override them.
func (c *Client) ownHeaders() []httpcall.Header { return c.own }

var _ provider.FieldRefuser = (*Client)(nil)

// Unsupported names the first field of req that has no counterpart in the Messages API (see
// messagesBody), or "" when the adapter carries the whole request.
func (c *Client) Unsupported(req provider.Request) string {
	_, f := messagesBody(req, false)
	return string(f)
}
