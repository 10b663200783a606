// Package provider defines what mantle needs from an LLM provider and the single error
// taxonomy every adapter maps its failures to. Adapters live in subpackages (openai,
// anthropic); the router depends only on this package.
package provider

import (
	"context"
	"errors"
	"fmt"
	"time"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// Message is one chat turn.
type Message struct {
	Role    string
	Content string
	Name    string
}

// Request is one chat completion call to one model with one key.
type Request struct {
	Model       string
	Messages    []Message
	MaxTokens   int
	Temperature *float64
	// JSON asks the provider for a JSON object answer when it supports that.
	JSON bool
	// User is the end-user id, forwarded where the provider accepts one.
	User string
	// IdempotencyKey is forwarded as the Idempotency-Key header where accepted.
	IdempotencyKey string
	// Prefill is the start of the assistant's answer, which the model continues: the router
	// uses it to finish a stream that broke mid-answer on another model. Only models that
	// accept a prefill (Anthropic; DeepSeek and vLLM through OpenAI-compatible APIs) get it.
	Prefill string
}

// Usage is the token usage a provider reported.
type Usage struct {
	InputTokens  int64
	OutputTokens int64
}

// Response is a complete answer.
type Response struct {
	Content      string
	FinishReason string
	Usage        Usage
	// Model is the model name the provider reported.
	Model string
	// RequestID is the provider's own request id, when it sent one.
	RequestID string
	// RateLimit is what the provider's rate-limit headers said, when present.
	RateLimit RateLimit
}

// RateLimit is a provider's view of the key's remaining capacity.
type RateLimit struct {
	// RemainingRequests and RemainingTokens are -1 when the provider reported other limits
	// but not this one, so that "unknown" is never mistaken for "exhausted".
	RemainingRequests int64
	RemainingTokens   int64
	// ResetRequests and ResetTokens are how long until the matching limit refills.
	ResetRequests time.Duration
	ResetTokens   time.Duration
	// Known is false when the provider sent no rate-limit headers.
	Known bool
}

// Chunk is one piece of a streamed answer. The last chunk of a well-formed stream carries
// a FinishReason and, when the provider reports it, Usage.
type Chunk struct {
	Content      string
	FinishReason string
	Usage        *Usage
}

// Stream yields chunks until Recv returns io.EOF (a clean end) or an *Error.
// Close releases the connection and may be called at any time, more than once.
type Stream interface {
	Recv() (Chunk, error)
	Close() error
	// RequestID is the provider's request id, known once the stream has started.
	RequestID() string
}

// Provider is a chat completion backend reached with one API key.
type Provider interface {
	Complete(ctx context.Context, req Request) (Response, error)
	Stream(ctx context.Context, req Request) (Stream, error)
}

// Class is the taxonomy of provider failures; it is the wire enum so that attempts can be
// recorded in the QualityContext without translation.
type Class = mantlev1.ErrorClass

// Error is a classified provider failure.
type Error struct {
	Class Class
	// StatusCode is the HTTP status, 0 when the failure happened before a response.
	StatusCode int
	// Message is the provider's explanation (for content filters: its reason).
	Message string
	// RetryAfter is the provider's retry hint (Retry-After or reset headers), 0 when absent.
	RetryAfter time.Duration
	// RequestID is the provider's own request id, when known.
	RequestID string
	// Err is the underlying cause, when there is one.
	Err error
}

func (e *Error) Error() string {
	s := fmt.Sprintf("provider: %s", classNames[e.Class])
	if e.StatusCode != 0 {
		s += fmt.Sprintf(" (HTTP %d)", e.StatusCode)
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

var classNames = map[Class]string{
	mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED:            "rate limited",
	mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED:              "overloaded",
	mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT:               "transient failure",
	mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT:                 "timeout",
	mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST:             "bad request",
	mantlev1.ErrorClass_ERROR_CLASS_AUTH:                    "authentication failed",
	mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED:        "content filtered",
	mantlev1.ErrorClass_ERROR_CLASS_CONTEXT_LENGTH_EXCEEDED: "context length exceeded",
	mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR:            "error inside a 200 response",
	mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT:        "malformed response",
	mantlev1.ErrorClass_ERROR_CLASS_REFUSAL:                 "refusal",
	mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED:               "truncated",
	mantlev1.ErrorClass_ERROR_CLASS_CANCELED:                "canceled",
	mantlev1.ErrorClass_ERROR_CLASS_UNKNOWN:                 "unknown failure",
}

// ClassOf returns the class of err: the class of an *Error in its chain, CANCELED or
// TIMEOUT for context errors, UNKNOWN otherwise, and NONE for nil.
func ClassOf(err error) Class {
	if err == nil {
		return mantlev1.ErrorClass_ERROR_CLASS_NONE
	}
	var pe *Error
	if errors.As(err, &pe) {
		return pe.Class
	}
	switch {
	case errors.Is(err, context.Canceled):
		return mantlev1.ErrorClass_ERROR_CLASS_CANCELED
	case errors.Is(err, context.DeadlineExceeded):
		return mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT
	}
	return mantlev1.ErrorClass_ERROR_CLASS_UNKNOWN
}

// Retryable reports whether the same request may succeed if sent again (to this or another
// candidate). Bad requests, auth failures and content filters never are.
func Retryable(c Class) bool {
	switch c {
	case mantlev1.ErrorClass_ERROR_CLASS_RATE_LIMITED,
		mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED,
		mantlev1.ErrorClass_ERROR_CLASS_TRANSIENT,
		mantlev1.ErrorClass_ERROR_CLASS_TIMEOUT,
		mantlev1.ErrorClass_ERROR_CLASS_HIDDEN_ERROR,
		mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
		mantlev1.ErrorClass_ERROR_CLASS_TRUNCATED,
		mantlev1.ErrorClass_ERROR_CLASS_REFUSAL,
		mantlev1.ErrorClass_ERROR_CLASS_UNKNOWN:
		return true
	}
	return false
}

// FailsOver reports whether another candidate may succeed where this one failed. It is wider
// than Retryable: an auth failure is specific to a key and a context overflow to a model.
func FailsOver(c Class) bool {
	switch c {
	case mantlev1.ErrorClass_ERROR_CLASS_AUTH,
		mantlev1.ErrorClass_ERROR_CLASS_CONTEXT_LENGTH_EXCEEDED:
		return true
	}
	return Retryable(c)
}
