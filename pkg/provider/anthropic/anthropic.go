// Package anthropic is a provider.Provider for Anthropic's Messages API.
//
// Anthropic differs from OpenAI-compatible servers in shape, not in kind: the system prompt
// is a top-level field, max_tokens is mandatory, overload has a status of its own (529), and
// a stream reports failures as typed "error" events after a 200. This package absorbs those
// differences so the router sees the same provider.Error classes from both.
package anthropic

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
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

// maxBody bounds how much of a response body is read, so a runaway server cannot exhaust
// memory; no real answer comes near it.
const maxBody = 16 << 20

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
	url     string
	apiKey  string
	http    *http.Client
	headers map[string]string
	now     func() time.Time
}

var _ provider.Provider = (*Client)(nil)

// New returns a Client for cfg.
func New(cfg Config) *Client {
	base := strings.TrimRight(cfg.BaseURL, "/")
	if base == "" {
		base = DefaultBaseURL
	}
	c := &Client{
		url:     base + "/messages",
		apiKey:  cfg.APIKey,
		http:    cfg.HTTPClient,
		headers: cfg.Headers,
		now:     cfg.Now,
	}
	if c.http == nil {
		c.http = http.DefaultClient
	}
	if c.now == nil {
		c.now = time.Now
	}
	return c
}

type messagesRequest struct {
	Model       string    `json:"model"`
	System      string    `json:"system,omitempty"`
	Messages    []message `json:"messages"`
	MaxTokens   int       `json:"max_tokens"`
	Temperature *float64  `json:"temperature,omitempty"`
	Metadata    *metadata `json:"metadata,omitempty"`
	Stream      bool      `json:"stream,omitempty"`
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
	resp, err := c.post(ctx, req, false)
	if err != nil {
		return provider.Response{}, err
	}
	defer resp.Body.Close()
	requestID := provider.RequestID(resp.Header)

	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		e := provider.ClassifyTransport(ctx, fmt.Errorf("read response: %w", err))
		e.RequestID = requestID
		return provider.Response{}, e
	}
	out, perr := parseMessage(body)
	if perr != nil {
		perr.StatusCode, perr.RequestID = resp.StatusCode, requestID
		return provider.Response{}, perr
	}
	out.RequestID = requestID
	out.RateLimit = provider.ParseRateLimit(resp.Header, c.now)
	return out, nil
}

// parseMessage reads a 2xx body, returning a classified error when the body is a failure in
// disguise.
func parseMessage(body []byte) (provider.Response, *provider.Error) {
	if len(body) > maxBody {
		return provider.Response{}, &provider.Error{
			Class:   mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
			Message: fmt.Sprintf("response body larger than %d bytes", maxBody),
		}
	}
	if apiErr, ok := provider.ParseAPIError(body); ok {
		return provider.Response{}, provider.ClassifyEmbedded(apiErr)
	}
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

// post sends req and returns the response when its status is 2xx; any other outcome is a
// classified *provider.Error. The caller closes the body.
//
// Request.JSON is not forwarded because the Messages API has no JSON mode, and
// Request.IdempotencyKey is not because Anthropic does not accept one; the router's own
// idempotency still applies.
func (c *Client) post(ctx context.Context, req provider.Request, stream bool) (*http.Response, error) {
	body := messagesRequest{
		Model:       req.Model,
		Messages:    make([]message, 0, len(req.Messages)),
		MaxTokens:   req.MaxTokens,
		Temperature: req.Temperature,
		Stream:      stream,
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
	if req.User != "" {
		body.Metadata = &metadata{UserID: req.User}
	}
	payload, err := json.Marshal(body)
	if err != nil {
		return nil, &provider.Error{
			Class: mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST,
			Err:   fmt.Errorf("encode request: %w", err),
		}
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(payload))
	if err != nil {
		return nil, &provider.Error{
			Class: mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST,
			Err:   fmt.Errorf("build request: %w", err),
		}
	}
	// net/http silently resends a request that carries an Idempotency-Key when a reused
	// connection fails before the response. Every upstream call must be the router's own
	// decision (retry budgets, billing), so the body is made non-rewindable.
	hreq.GetBody = nil
	hreq.Header.Set("Content-Type", "application/json")
	if stream {
		hreq.Header.Set("Accept", "text/event-stream")
	} else {
		hreq.Header.Set("Accept", "application/json")
	}
	hreq.Header.Set("X-Api-Key", c.apiKey)
	hreq.Header.Set("Anthropic-Version", APIVersion)
	for k, v := range c.headers {
		hreq.Header.Set(k, v)
	}

	resp, err := c.http.Do(hreq)
	if err != nil {
		return nil, provider.ClassifyTransport(ctx, err)
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp, nil
	}
	defer resp.Body.Close()
	// The error body only feeds classification and the message; 64 KiB is plenty.
	errBody, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return nil, provider.ClassifyHTTP(resp.StatusCode, resp.Header, errBody, c.now)
}
