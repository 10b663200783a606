package sim

import (
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// This file holds the OpenAI wire format (only the fields the simulator reads or writes)
// and the deterministic answers.

type chatRequest struct {
	Model          string          `json:"model"`
	Messages       []chatMessage   `json:"messages"`
	Stream         bool            `json:"stream"`
	StreamOptions  *streamOptions  `json:"stream_options"`
	ResponseFormat *responseFormat `json:"response_format"`
	// MaxTokens is the legacy name; MaxCompletionTokens replaced it. Either caps the answer.
	MaxTokens           int `json:"max_tokens"`
	MaxCompletionTokens int `json:"max_completion_tokens"`

	// opening starts every answer instead of "sim answer to: " (the profile's Opening).
	opening string
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type responseFormat struct {
	Type string `json:"type"`
}

type chatMessage struct {
	Role string `json:"role"`
	// Content is a string or an array of typed parts; only text parts matter here.
	Content json.RawMessage `json:"content"`
}

func (m chatMessage) text() string {
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(m.Content, &parts) != nil {
		return ""
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type == "text" {
			b.WriteString(p.Text)
		}
	}
	return b.String()
}

func (r *chatRequest) jsonMode() bool {
	return r.ResponseFormat != nil && r.ResponseFormat.Type == "json_object"
}

func (r *chatRequest) includeUsage() bool {
	return r.StreamOptions != nil && r.StreamOptions.IncludeUsage
}

func (r *chatRequest) maxTokens() int {
	if r.MaxCompletionTokens > 0 {
		return r.MaxCompletionTokens
	}
	return r.MaxTokens
}

// promptTokens estimates the prompt's size the way mantle's quota does before it has a
// tokenizer: about four bytes per token, plus a few tokens of framing per message.
func (r *chatRequest) promptTokens() int {
	n := 0
	for _, m := range r.Messages {
		n += estimateTokens(m.text()) + 4
	}
	return n
}

func estimateTokens(s string) int {
	return (len(s) + 3) / 4
}

// promptEcho is how much of the user's message the answer repeats: enough to tell answers
// apart in logs and caches, short enough to keep streams brief.
const promptEcho = 120

const refusalText = "I'm sorry, but I can't help with that."

// answer is the deterministic reply to r: the same request always gets the same text, which
// lets cache and idempotency tests compare answers byte for byte.
func (r *chatRequest) answer() string {
	var last string
	for _, m := range r.Messages {
		if m.Role == "user" {
			last = m.text()
		}
	}
	last = strings.Join(strings.Fields(last), " ")
	if utf8.RuneCountInString(last) > promptEcho {
		last = string([]rune(last)[:promptEcho]) + "..."
	}
	opening := "sim answer to: "
	if r.opening != "" {
		opening = r.opening
	}
	text := opening + last
	if n := len(r.Messages); n > 0 && r.Messages[n-1].Role == "assistant" {
		// A prefill: continue the answer it starts, as prefill-capable models do.
		if rest, ok := strings.CutPrefix(text, r.Messages[n-1].text()); ok {
			return rest
		}
	}
	if !r.jsonMode() {
		return text
	}
	b, _ := json.Marshal(struct {
		Answer     string  `json:"answer"`
		Confidence float64 `json:"confidence"`
	}{text, 0.9})
	return string(b)
}

// content returns the answer text and finish reason for outcome o.
func (r *chatRequest) content(o Outcome) (text, finish string) {
	text, finish = r.answer(), "stop"
	switch o {
	case OutcomeRefusal:
		return refusalText, "stop"
	case OutcomeContentFilterFinish:
		return "", "content_filter"
	case OutcomeTruncated:
		return cutAt(text, len(text)/2), "length"
	case OutcomeMalformedJSON:
		if r.jsonMode() {
			// What models really do: chatter around the object and lose the closing brace.
			return "Here is the JSON you asked for:\n" + strings.TrimSuffix(text, "}"), "stop"
		}
	}
	if limit := r.maxTokens(); limit > 0 && estimateTokens(text) > limit {
		return cutAt(text, limit*4), "length"
	}
	return text, finish
}

// cutAt returns the first n bytes of s, backing off to a rune boundary.
func cutAt(s string, n int) string {
	if n >= len(s) {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// pieces splits an answer into stream chunks of about one word each.
func pieces(text string) []string {
	parts := strings.SplitAfter(text, " ")
	out := parts[:0]
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return out
}

// text is an answer's content: left out when empty, as the simulator always sent it.
func text(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

type errorBody struct {
	Error apiError `json:"error"`
}

type apiError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func newError(msg, typ, code string) errorBody {
	e := apiError{Message: msg, Type: typ}
	if code != "" {
		e.Code = &code
	}
	return errorBody{Error: e}
}

type modelList struct {
	Object string      `json:"object"`
	Data   []modelInfo `json:"data"`
}

type modelInfo struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}
