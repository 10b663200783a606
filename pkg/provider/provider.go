// Package provider defines what mantle needs from an LLM provider and the single error
// taxonomy every adapter maps its failures to. Adapters live in subpackages (openai,
// anthropic); the router depends only on this package.
package provider

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// Message is one chat turn.
type Message struct {
	Role    string
	Content string
	Name    string
	// Parts is the content as typed parts, when the caller sent a list; Content is empty then.
	Parts []Part
	// ContentNull: the turn has no content at all (an assistant turn that only calls tools).
	ContentNull bool
	// ToolCalls are the calls an assistant turn made.
	ToolCalls []ToolCall
	// ToolCallID is, for role tool, the call this message answers.
	ToolCallID string
	// Refusal is an assistant turn's refusal.
	Refusal string
	// ToolError is, for role tool, that the tool failed (Anthropic's tool_result is_error).
	ToolError bool
}

// Part kinds.
const (
	PartText       = "text"
	PartImage      = "image_url"
	PartInputAudio = "input_audio"
	PartFile       = "file"
	PartRefusal    = "refusal"
)

// Part is one typed part of a message's content; Type says which fields are set.
type Part struct {
	Type string
	// Text is the text of a text part, or the refusal of a refusal part.
	Text string
	// ImageURL is an image's URL (a data: URL for an inline image) and Detail its detail.
	ImageURL string
	Detail   string
	// AudioData (base64) and AudioFormat are an input_audio part.
	AudioData   string
	AudioFormat string
	// FileID, Filename and FileData (base64) are a file part.
	FileID   string
	Filename string
	FileData string
}

// ToolCall is one call of a function by the model.
type ToolCall struct {
	ID   string
	Type string
	Name string
	// Arguments is the JSON text the model wrote, unparsed.
	Arguments string
}

// ToolCallDelta is a piece of a streamed tool call (see Chunk.ToolCalls).
type ToolCallDelta struct {
	Index     int
	ID        string
	Type      string
	Name      string
	Arguments string
}

// Tool is a function the model may call.
type Tool struct {
	Type        string
	Name        string
	Description string
	// Parameters is the JSON Schema of the arguments as the caller wrote it; nil when absent.
	Parameters json.RawMessage
	Strict     *bool
}

// JSONSchema is a json_schema response format.
type JSONSchema struct {
	Name        string
	Description string
	Schema      json.RawMessage
	Strict      *bool
}

// Request is one chat completion call to one model with one key.
type Request struct {
	Model       string
	Messages    []Message
	MaxTokens   int
	Temperature *float64
	// JSON asks the provider for a JSON answer: a JSON object, or JSONSchema when set.
	JSON bool
	// JSONSchema is the schema of a json_schema response format.
	JSONSchema *JSONSchema
	// TextFormat: the caller asked for response_format text explicitly.
	TextFormat bool
	// User is the end-user id, forwarded where the provider accepts one.
	User string
	// IdempotencyKey is forwarded as the Idempotency-Key header where accepted.
	IdempotencyKey string
	// Prefill is the start of the assistant's answer, which the model continues: the router
	// uses it to finish a stream that broke mid-answer on another model. Only models that
	// accept a prefill (Anthropic; DeepSeek and vLLM through OpenAI-compatible APIs) get it.
	Prefill string

	// The sampling and tool fields of OpenAI's chat completions API, forwarded as given:
	// nil and empty mean "not sent".
	Tools              []Tool
	ToolChoice         string // auto, none, required, or function (with ToolChoiceFunction)
	ToolChoiceFunction string
	ParallelToolCalls  *bool
	Stop               []string
	N                  *int
	Seed               *int64
	TopP               *float64
	PresencePenalty    *float64
	FrequencyPenalty   *float64
	LogitBias          map[string]int
	Logprobs           *bool
	TopLogprobs        *int
	// MaxTokensIsCompletion sends MaxTokens as max_completion_tokens, which reasoning
	// models require.
	MaxTokensIsCompletion bool
	ReasoningEffort       string
	ServiceTier           string
	Metadata              map[string]string
	Modalities            []string
	Store                 *bool
	// ExtraBody is a JSON object whose members are added to the request body as they are;
	// only adapters whose API it is meant for accept it.
	ExtraBody json.RawMessage
	// TopK and Thinking are Anthropic's top_k and thinking; nil when not sent.
	TopK     *int
	Thinking *Thinking
}

// Thinking is extended thinking: Type enabled (with BudgetTokens) or disabled.
type Thinking struct {
	Type         string
	BudgetTokens int
}

// FieldRefuser is implemented by adapters that cannot carry every field of a Request. The
// router does not send a request to such an adapter when Unsupported names a field.
type FieldRefuser interface {
	// Unsupported returns the OpenAI name of the first field of req the adapter would have
	// to drop, or "" when it carries them all.
	Unsupported(req Request) string
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
	// ToolCalls are the calls the model made (finish reason tool_calls).
	ToolCalls []ToolCall
	// Logprobs is the choice's logprobs object as the provider sent it, when asked for.
	Logprobs json.RawMessage
	Usage    Usage
	// Model is the model name the provider reported.
	Model string
	// RequestID is the provider's own request id, when it sent one.
	RequestID string
	// RateLimit is what the provider's rate-limit headers said, when present.
	RateLimit RateLimit
	// StopSequence is the stop sequence that ended the answer, when the provider says.
	StopSequence string
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
	// ToolCalls are pieces of tool calls, by index (ToolCallAssembler joins them).
	ToolCalls []ToolCallDelta
	// Logprobs is the chunk's logprobs object as the provider sent it.
	Logprobs json.RawMessage
	// More says the stream's next Recv returns another piece of the answer (text, tool
	// calls, logprobs) without waiting for the network: it arrived with this chunk. A
	// caller writing the pieces on may then hold its flush for the next one, as a proxy
	// writes out once per read. The end of the answer is never More. It says nothing of
	// the answer itself (Empty ignores it).
	More bool
}

// Empty reports whether c carries nothing for the caller (content, tool calls, logprobs).
func (c Chunk) Empty() bool {
	return c.Content == "" && len(c.ToolCalls) == 0 && len(c.Logprobs) == 0
}

// MaxStreamedToolCalls bounds the tool calls of one streamed answer: past it, a stream
// is malformed (the assembler's, and every decoder's, state grows with the calls).
const MaxStreamedToolCalls = 1024

// MaxAnswerBytes bounds one answer: a response body is read up to it, and a streamed
// answer's text and tool calls together may not pass it, so that a runaway server cannot
// exhaust memory. No real answer comes near it.
const MaxAnswerBytes = 16 << 20

// ToolCallAssembler joins streamed tool call pieces into calls, in index order: the first
// piece of an index gives its id, type and name, every piece adds to its arguments. Each
// piece is copied once, so a long argument in many small pieces costs its length, not the
// square of it. The zero value is ready for use.
type ToolCallAssembler struct {
	calls []*assembling // pointers: a strings.Builder must not be copied once written
	size  int           // bytes of every call's id, type, name and arguments
}

type assembling struct {
	id, typ    string
	name, args strings.Builder
}

// Add folds deltas into the calls; it refuses a piece that would start more than
// MaxStreamedToolCalls calls, as malformed output.
func (a *ToolCallAssembler) Add(deltas []ToolCallDelta) *Error {
	for _, d := range deltas {
		if d.Index < 0 || d.Index > len(a.calls) {
			// Out of order indexes are appended rather than dropped.
			d.Index = len(a.calls)
		}
		if d.Index == len(a.calls) {
			if len(a.calls) == MaxStreamedToolCalls {
				return &Error{
					Class:   mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
					Message: fmt.Sprintf("more than %d tool calls in one answer", MaxStreamedToolCalls),
				}
			}
			a.calls = append(a.calls, new(assembling))
		}
		c := a.calls[d.Index]
		if d.ID != "" {
			c.id = d.ID
		}
		if d.Type != "" {
			c.typ = d.Type
		}
		c.name.WriteString(d.Name)
		c.args.WriteString(d.Arguments)
		a.size += len(d.ID) + len(d.Type) + len(d.Name) + len(d.Arguments)
	}
	return nil
}

// Bytes is the size of the calls' pieces taken so far (ids, types, names, arguments).
func (a *ToolCallAssembler) Bytes() int { return a.size }

// Calls returns the calls as assembled so far; nil when none.
func (a *ToolCallAssembler) Calls() []ToolCall {
	if len(a.calls) == 0 {
		return nil
	}
	calls := make([]ToolCall, len(a.calls))
	for i, c := range a.calls {
		calls[i] = ToolCall{ID: c.id, Type: c.typ, Name: c.name.String(), Arguments: c.args.String()}
	}
	return calls
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
