// Package openaiapi holds the objects of OpenAI's chat completions API that mantle
// writes: the router's OpenAI-compatible front door answers with them, and the simulated
// provider (pkg/sim) serves them. Reading providers' answers, with every variant
// compatible servers send, is pkg/provider/openai's job.
package openaiapi

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
}

// Message is an answer, or a chunk's delta, which leaves out what it does not add: the
// role comes in the first delta, content in the others, and the last is empty.
type Message struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
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
