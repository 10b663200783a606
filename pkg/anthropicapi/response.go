package anthropicapi

import "encoding/json"

// Message is an answer of the Messages API.
type Message struct {
	ID           string         `json:"id"`
	Type         string         `json:"type"` // message
	Role         string         `json:"role"` // assistant
	Model        string         `json:"model"`
	Content      []ContentBlock `json:"content"`
	StopReason   *string        `json:"stop_reason"`
	StopSequence *string        `json:"stop_sequence"`
	Usage        Usage          `json:"usage"`
}

// ContentBlock is a text or tool_use block of an answer. In a content_block_start event a
// tool_use block's Input is {} and its arguments follow as input_json_delta pieces.
type ContentBlock struct {
	Type  string          `json:"type"`
	Text  *string         `json:"text,omitempty"`
	ID    string          `json:"id,omitempty"`
	Name  string          `json:"name,omitempty"`
	Input json.RawMessage `json:"input,omitempty"`
}

// TextBlock is a text block holding s.
func TextBlock(s string) ContentBlock {
	return ContentBlock{Type: "text", Text: &s}
}

// Usage counts a message's tokens.
type Usage struct {
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
}

// Error is the body of an error answer, and the data of a stream's error event.
type Error struct {
	Type  string      `json:"type"` // error
	Error ErrorDetail `json:"error"`
}

// ErrorDetail says what failed: Type is invalid_request_error, authentication_error,
// permission_error, not_found_error, request_too_large, rate_limit_error, api_error or
// overloaded_error.
type ErrorDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// Stream events, in the order a stream sends them: message_start, then for each content
// block content_block_start, content_block_delta..., content_block_stop, then
// message_delta and message_stop. An error event may end a stream at any point.

// MessageStart opens a stream with the message, its content still empty.
type MessageStart struct {
	Type    string  `json:"type"` // message_start
	Message Message `json:"message"`
}

// BlockStart opens content block Index.
type BlockStart struct {
	Type         string       `json:"type"` // content_block_start
	Index        int          `json:"index"`
	ContentBlock ContentBlock `json:"content_block"`
}

// BlockDelta adds to content block Index.
type BlockDelta struct {
	Type  string `json:"type"` // content_block_delta
	Index int    `json:"index"`
	Delta Delta  `json:"delta"`
}

// Delta is a text_delta (Text) or an input_json_delta (PartialJSON).
type Delta struct {
	Type        string  `json:"type"`
	Text        *string `json:"text,omitempty"`
	PartialJSON *string `json:"partial_json,omitempty"`
}

// BlockStop closes content block Index.
type BlockStop struct {
	Type  string `json:"type"` // content_block_stop
	Index int    `json:"index"`
}

// MessageDelta ends the message: why it stopped and its usage.
type MessageDelta struct {
	Type  string            `json:"type"` // message_delta
	Delta MessageDeltaDelta `json:"delta"`
	Usage Usage             `json:"usage"`
}

// MessageDeltaDelta is a message_delta's change to the message.
type MessageDeltaDelta struct {
	StopReason   *string `json:"stop_reason"`
	StopSequence *string `json:"stop_sequence"`
}

// MessageStop ends the stream.
type MessageStop struct {
	Type string `json:"type"` // message_stop
}
