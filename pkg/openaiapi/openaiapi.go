// Package openaiapi holds the objects of OpenAI's chat completions API that mantle
// writes: the router's OpenAI-compatible front door answers with them, and the simulated
// provider (pkg/sim) serves them. Reading providers' answers, with every variant
// compatible servers send, is pkg/provider/openai's job.
package openaiapi

import "encoding/json"

// ChatCompletion is a chat completion, or, with Object "chat.completion.chunk", one
// chunk of a streamed one.
type ChatCompletion struct {
	ID      string   `json:"id"`
	Object  string   `json:"object"`
	Created int64    `json:"created"`
	Model   string   `json:"model"`
	Choices []Choice `json:"choices"`
	Usage   *Usage   `json:"usage,omitempty"`
}

// Choice is a completion's answer (Message) or a chunk's part of it (Delta).
type Choice struct {
	Index        int      `json:"index"`
	Message      *Message `json:"message,omitempty"`
	Delta        *Message `json:"delta,omitempty"`
	FinishReason *string  `json:"finish_reason"`
	// Logprobs is the provider's logprobs object, passed through when the caller asked.
	Logprobs json.RawMessage `json:"logprobs,omitempty"`
}

// Message is an answer, or a chunk's delta, which leaves out what it does not add: the
// role comes in the first delta, content in the others, and the last is empty.
type Message struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
	// ToolCalls are the calls of an answer, or in a chunk pieces of them (with Index).
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
}

// ToolCall is a call of a function, or in a chunk a piece of one.
type ToolCall struct {
	Index    *int         `json:"index,omitempty"`
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"`
	Function FunctionCall `json:"function"`
}

// FunctionCall is a tool call's function and its arguments (JSON text).
type FunctionCall struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// Usage counts a completion's tokens.
type Usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

// NewUsage returns the usage of prompt and completion tokens.
func NewUsage(prompt, completion int64) *Usage {
	return &Usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
}
