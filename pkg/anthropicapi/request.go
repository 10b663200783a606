// Package anthropicapi reads Anthropic Messages API requests (POST /v1/messages) into the
// router's request, and holds the answer and stream event objects the router's Messages
// front door writes. Calling Anthropic as a provider is pkg/provider/anthropic's job.
package anthropicapi

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"github.com/mantle-mesh/mantle/pkg/jsonfield"
	"slices"
	"strings"
	"unicode/utf8"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/openaiapi"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// MessagesRequest is a decoded Messages API request: the router request, and whether the
// caller wants the answer streamed.
type MessagesRequest struct {
	Request *routerv1.Request
	Stream  bool
}

// Refused lists documented top-level request fields mantle does not forward, with the
// reason the error gives. Every other documented field is decoded into the router request.
var Refused = map[string]string{
	"container":          "code execution containers are not supported by mantle",
	"mcp_servers":        "MCP servers are not supported by mantle",
	"context_management": "context management is not supported by mantle",
	"service_tier":       "Anthropic's service tiers are not modelled by mantle",
}

// Forwarded lists the top-level fields DecodeMessagesRequest decodes into the router
// request (or, for stream, into how the answer is delivered).
var Forwarded = []string{
	"model", "messages", "system", "max_tokens", "stop_sequences", "temperature", "top_p",
	"top_k", "tools", "tool_choice", "metadata", "thinking", "stream",
}

// Bounds beyond the body's size in bytes, which the caller bounds. The router request's
// own bounds (tools, stop sequences, parts) are openaiapi's, which the router enforces.
const (
	MaxMessages = 4096
	MaxBlocks   = openaiapi.MaxParts
)

// refusedKeys are members of content blocks and tools that the API documents and mantle
// cannot carry; each is refused naming its path.
var refusedKeys = map[string]string{
	"cache_control": "prompt caching hints are not carried by mantle",
	"citations":     "citations are not supported by mantle",
	"context":       "document context is not supported by mantle",
}

// DecodeMessagesRequest decodes a Messages API request body. Every documented field is
// decoded or, when mantle cannot carry it, refused; an undocumented one is refused too.
// Errors are *rpc.ValidationError whose field is the JSON path of the offending member.
// Nesting is bounded by the shape: nothing is decoded deeper than the API defines, and
// free-form members (a tool's input_schema, a tool call's input) are kept as raw JSON.
func DecodeMessagesRequest(body []byte) (*MessagesRequest, error) {
	// encoding/json would turn invalid bytes into U+FFFD in strings and keep them in raw
	// values, so a request could reach a provider changed, or not marshal at all.
	if !utf8.Valid(body) {
		return nil, rpc.Invalid("body", "the body is not valid UTF-8")
	}
	top, err := jsonfield.Object(body, "")
	if err != nil {
		return nil, err
	}
	out := &MessagesRequest{Request: &routerv1.Request{}}
	req := out.Request
	d := decoder{jsonfield.Decoder{Refused: refusedKeys}}
	var system []*mantlev1.ChatMessage
	maxTokens := false
	for _, k := range jsonfield.SortedKeys(top) {
		v := top[k]
		switch k {
		case "model":
			d.Str(v, k, &req.Model)
		case "messages":
			req.Messages = d.messages(v)
		case "system":
			system = d.system(v)
		case "max_tokens":
			if n := d.Int32(v, k); n != nil {
				req.MaxTokens, maxTokens = *n, true
				if *n < 1 {
					d.Fail(k, "must be at least 1, got %d", *n)
				}
			}
		case "stop_sequences":
			d.Strings(v, k, &req.Stop, openaiapi.MaxStop)
		case "temperature":
			req.Temperature = d.Float(v, k)
		case "top_p":
			req.TopP = d.Float(v, k)
		case "top_k":
			req.TopK = d.Int32(v, k)
			if req.TopK != nil && *req.TopK < 0 {
				d.Fail(k, "must not be negative, got %d", *req.TopK)
			}
		case "tools":
			req.Tools = d.tools(v)
		case "tool_choice":
			d.toolChoice(v, req)
		case "metadata":
			m := d.Obj(v, k, "user_id")
			d.Str(m["user_id"], "metadata.user_id", &req.User)
		case "thinking":
			req.Thinking = d.thinking(v)
		case "stream":
			if b := d.Bool(v, k); b != nil {
				out.Stream = *b
			}
		default:
			if why, ok := Refused[k]; ok {
				d.Fail(k, "not supported: %s", why)
			} else {
				d.Fail(jsonfield.Join("", k), "unknown field: mantle forwards every documented Messages API field and refuses others")
			}
		}
		if d.Err != nil {
			return nil, d.Err
		}
	}
	if !maxTokens {
		return nil, rpc.Invalid("max_tokens", "required")
	}
	if len(req.Messages) == 0 {
		return nil, rpc.Invalid("messages", "at least one message is required")
	}
	req.Messages = append(system, req.Messages...)
	return out, nil
}

// decoder holds the first error; every method is a no-op after it.
type decoder struct{ jsonfield.Decoder }

// blockType reads the type of a content block.
func (d *decoder) blockType(raw json.RawMessage, field string) string {
	var head struct {
		Type *string `json:"type"`
	}
	if !d.Decode(raw, field, &head, "want a content block object") {
		return ""
	}
	if head.Type == nil {
		d.Fail(field+".type", "required")
		return ""
	}
	return *head.Type
}

func (d *decoder) system(v json.RawMessage) []*mantlev1.ChatMessage {
	if jsonfield.IsNull(v) || d.Err != nil {
		return nil
	}
	msg := &mantlev1.ChatMessage{Role: "system"}
	if json.Unmarshal(v, &msg.Content) == nil {
		return []*mantlev1.ChatMessage{msg}
	}
	for i, raw := range d.List(v, "system", "text blocks", MaxBlocks) {
		f := fmt.Sprintf("system[%d]", i)
		if t := d.blockType(raw, f); d.Err == nil && t != "text" {
			d.Fail(f+".type", "want text, got %q", t)
		}
		msg.Parts = append(msg.Parts, d.text(raw, f))
	}
	if d.Err != nil {
		return nil
	}
	return []*mantlev1.ChatMessage{msg}
}

func (d *decoder) text(raw json.RawMessage, field string) *mantlev1.ContentPart {
	m := d.Obj(raw, field, "type", "text")
	var s string
	d.Str(m["text"], field+".text", &s)
	return &mantlev1.ContentPart{Part: &mantlev1.ContentPart_Text{Text: s}}
}

// messages decodes the turns. A user turn's tool_result blocks become tool messages (with
// tool_call_id), the rest of it user messages around them, in the order given; an
// assistant turn's tool_use blocks become its tool calls.
func (d *decoder) messages(v json.RawMessage) []*mantlev1.ChatMessage {
	var out []*mantlev1.ChatMessage
	for i, raw := range d.List(v, "messages", "messages", MaxMessages) {
		field := fmt.Sprintf("messages[%d]", i)
		m := d.Obj(raw, field, "role", "content")
		var role string
		d.Str(m["role"], field+".role", &role)
		if d.Err == nil && role != "user" && role != "assistant" {
			d.Fail(field+".role", "want user or assistant, got %q", role)
		}
		c, ok := m["content"]
		if d.Err == nil && (!ok || jsonfield.IsNull(c)) {
			d.Fail(field+".content", "required")
		}
		if d.Err != nil {
			return nil
		}
		var s string
		if json.Unmarshal(c, &s) == nil {
			out = append(out, &mantlev1.ChatMessage{Role: role, Content: s})
			continue
		}
		blocks := d.List(c, field+".content", "content blocks", MaxBlocks)
		if role == "assistant" {
			out = append(out, d.assistant(blocks, field+".content"))
		} else {
			out = append(out, d.user(blocks, field+".content")...)
		}
		if d.Err != nil {
			return nil
		}
	}
	return out
}

func (d *decoder) user(blocks []json.RawMessage, field string) []*mantlev1.ChatMessage {
	var out []*mantlev1.ChatMessage
	var cur *mantlev1.ChatMessage
	for i, raw := range blocks {
		f := fmt.Sprintf("%s[%d]", field, i)
		t := d.blockType(raw, f)
		if d.Err != nil {
			return nil
		}
		if t == "tool_result" {
			cur = nil
			out = append(out, d.toolResult(raw, f))
			continue
		}
		p := d.part(raw, f, t)
		if d.Err != nil {
			return nil
		}
		if cur == nil {
			cur = &mantlev1.ChatMessage{Role: "user"}
			out = append(out, cur)
		}
		cur.Parts = append(cur.Parts, p)
	}
	if len(blocks) == 0 {
		out = append(out, &mantlev1.ChatMessage{Role: "user", Parts: []*mantlev1.ContentPart{}})
	}
	return out
}

// part decodes a block of a user turn or a tool result that is not a tool result: text,
// image, document.
func (d *decoder) part(raw json.RawMessage, f, t string) *mantlev1.ContentPart {
	switch t {
	case "text":
		return d.text(raw, f)
	case "image":
		return d.image(raw, f)
	case "document":
		return d.document(raw, f)
	case "tool_use", "thinking", "redacted_thinking":
		d.Fail(f+".type", "%s blocks belong to assistant turns", t)
	default:
		d.Fail(f+".type", "not supported: want text, image, document or tool_result, got %q", t)
	}
	return nil
}

func (d *decoder) image(raw json.RawMessage, f string) *mantlev1.ContentPart {
	m := d.Obj(raw, f, "type", "source")
	src := d.Obj(jsonfield.OrNull(m["source"]), f+".source", "type", "media_type", "data", "url", "file_id")
	var typ string
	d.Str(src["type"], f+".source.type", &typ)
	img := &mantlev1.ImagePart{}
	switch {
	case d.Err != nil:
		return nil
	case typ == "base64":
		d.onlyKeys(src, f+".source", "type", "media_type", "data")
		d.Str(src["media_type"], f+".source.media_type", &img.MediaType)
		switch img.MediaType {
		case "image/jpeg", "image/png", "image/gif", "image/webp":
		default:
			d.Fail(f+".source.media_type", "want image/jpeg, image/png, image/gif or image/webp, got %q", img.MediaType)
		}
		img.Data = d.base64(src["data"], f+".source.data")
	case typ == "url":
		d.onlyKeys(src, f+".source", "type", "url")
		d.Str(src["url"], f+".source.url", &img.Url)
		if d.Err == nil && img.Url == "" {
			d.Fail(f+".source.url", "required")
		}
	case typ == "file":
		d.Fail(f+".source.type", "not supported: files uploaded to Anthropic cannot be carried by mantle; send the image as base64 or url")
	default:
		d.Fail(f+".source.type", "want base64 or url, got %q", typ)
	}
	return &mantlev1.ContentPart{Part: &mantlev1.ContentPart_Image{Image: img}}
}

// document carries a base64 PDF as a file part (its title as the file name).
func (d *decoder) document(raw json.RawMessage, f string) *mantlev1.ContentPart {
	m := d.Obj(raw, f, "type", "source", "title")
	src := d.Obj(jsonfield.OrNull(m["source"]), f+".source", "type", "media_type", "data", "url", "content", "file_id")
	var typ, media string
	d.Str(src["type"], f+".source.type", &typ)
	file := &mantlev1.FilePart{}
	d.Str(m["title"], f+".title", &file.Filename)
	if d.Err != nil {
		return nil
	}
	if typ != "base64" {
		d.Fail(f+".source.type", "not supported: mantle carries documents as base64 PDF only, got %q", typ)
		return nil
	}
	d.onlyKeys(src, f+".source", "type", "media_type", "data")
	d.Str(src["media_type"], f+".source.media_type", &media)
	if d.Err == nil && media != "application/pdf" {
		d.Fail(f+".source.media_type", "want application/pdf, got %q", media)
	}
	data := d.base64(src["data"], f+".source.data")
	if d.Err != nil {
		return nil
	}
	file.FileData = "data:application/pdf;base64," + base64.StdEncoding.EncodeToString(data)
	return &mantlev1.ContentPart{Part: &mantlev1.ContentPart_File{File: file}}
}

// onlyKeys refuses a member of m beyond keys: the members a source of that type has.
func (d *decoder) onlyKeys(m map[string]json.RawMessage, field string, keys ...string) {
	for _, k := range jsonfield.SortedKeys(m) {
		if !slices.Contains(keys, k) {
			d.Fail(jsonfield.Join(field, k), "unknown field for this source type (want one of %s)", strings.Join(keys, ", "))
			return
		}
	}
}

func (d *decoder) base64(v json.RawMessage, field string) []byte {
	var s string
	d.Str(v, field, &s)
	if d.Err != nil {
		return nil
	}
	if s == "" {
		d.Fail(field, "required")
		return nil
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		d.Fail(field, "not base64: %v", err)
		return nil
	}
	return b
}

func (d *decoder) toolResult(raw json.RawMessage, f string) *mantlev1.ChatMessage {
	m := d.Obj(raw, f, "type", "tool_use_id", "content", "is_error")
	msg := &mantlev1.ChatMessage{Role: "tool"}
	d.Str(m["tool_use_id"], f+".tool_use_id", &msg.ToolCallId)
	if d.Err == nil && msg.ToolCallId == "" {
		d.Fail(f+".tool_use_id", "required")
	}
	if b := d.Bool(m["is_error"], f+".is_error"); b != nil {
		msg.ToolError = *b
	}
	c := m["content"]
	if d.Err != nil || jsonfield.IsNull(c) || json.Unmarshal(c, &msg.Content) == nil {
		return msg
	}
	blocks := d.List(c, f+".content", "content blocks", MaxBlocks)
	msg.Parts = make([]*mantlev1.ContentPart, 0, len(blocks))
	for i, b := range blocks {
		bf := fmt.Sprintf("%s.content[%d]", f, i)
		t := d.blockType(b, bf)
		if d.Err == nil && t != "text" && t != "image" {
			d.Fail(bf+".type", "not supported in a tool result: want text or image, got %q", t)
		}
		if d.Err != nil {
			return nil
		}
		msg.Parts = append(msg.Parts, d.part(b, bf, t))
	}
	return msg
}

func (d *decoder) assistant(blocks []json.RawMessage, field string) *mantlev1.ChatMessage {
	msg := &mantlev1.ChatMessage{Role: "assistant"}
	for i, raw := range blocks {
		f := fmt.Sprintf("%s[%d]", field, i)
		switch t := d.blockType(raw, f); t {
		case "":
		case "text":
			msg.Parts = append(msg.Parts, d.text(raw, f))
		case "tool_use":
			m := d.Obj(raw, f, "type", "id", "name", "input")
			tc := &mantlev1.ToolCall{Type: "function"}
			d.Str(m["id"], f+".id", &tc.Id)
			d.Str(m["name"], f+".name", &tc.Name)
			if d.Err == nil && (tc.Id == "" || tc.Name == "") {
				d.Fail(f, "a tool_use block needs id and name")
			}
			in, ok := m["input"]
			if d.Err == nil && !ok {
				d.Fail(f+".input", "required")
			}
			if d.Err == nil {
				if _, err := jsonfield.Object(in, f+".input"); err != nil {
					d.Err = err
				}
				tc.Arguments = string(jsonfield.Compact(in))
			}
			msg.ToolCalls = append(msg.ToolCalls, tc)
		case "thinking", "redacted_thinking":
			d.Fail(f+".type", "not supported: mantle does not carry thinking blocks back to a model")
		default:
			d.Fail(f+".type", "not supported in an assistant turn: want text or tool_use, got %q", t)
		}
		if d.Err != nil {
			return nil
		}
	}
	switch {
	case len(msg.Parts) == 0 && len(msg.ToolCalls) > 0:
		// Only tool calls: no content, as OpenAI-type APIs want it.
		msg.ContentNull = true
	case len(blocks) == 0:
		msg.Parts = []*mantlev1.ContentPart{}
	}
	return msg
}

func (d *decoder) tools(v json.RawMessage) []*mantlev1.Tool {
	list := d.List(v, "tools", "tools", openaiapi.MaxTools)
	out := make([]*mantlev1.Tool, 0, len(list))
	for i, raw := range list {
		f := fmt.Sprintf("tools[%d]", i)
		m := d.Obj(raw, f, "type", "name", "description", "input_schema")
		var typ string
		d.Str(m["type"], f+".type", &typ)
		if d.Err == nil && typ != "" && typ != "custom" {
			d.Fail(f+".type", "not supported: mantle carries client tools (type custom) only, got %q", typ)
		}
		t := &mantlev1.Tool{Type: "function"}
		d.Str(m["name"], f+".name", &t.Name)
		if d.Err == nil && t.Name == "" {
			d.Fail(f+".name", "required")
		}
		d.Str(m["description"], f+".description", &t.Description)
		s, ok := m["input_schema"]
		if d.Err == nil && !ok {
			d.Fail(f+".input_schema", "required")
		}
		if d.Err == nil {
			if _, err := jsonfield.Object(s, f+".input_schema"); err != nil {
				d.Err = err
			}
			t.Parameters = string(jsonfield.Compact(s))
		}
		if d.Err != nil {
			return nil
		}
		out = append(out, t)
	}
	return out
}

// toolChoice maps auto, any, tool and none onto auto, required, a named function and none;
// disable_parallel_tool_use onto parallel_tool_calls, its negation.
func (d *decoder) toolChoice(v json.RawMessage, req *routerv1.Request) {
	if jsonfield.IsNull(v) || d.Err != nil {
		return
	}
	m := d.Obj(v, "tool_choice", "type", "name", "disable_parallel_tool_use")
	var typ string
	d.Str(m["type"], "tool_choice.type", &typ)
	if d.Err != nil {
		return
	}
	switch typ {
	case "auto":
		req.ToolChoice = "auto"
	case "any":
		req.ToolChoice = "required"
	case "none":
		req.ToolChoice = "none"
	case "tool":
		req.ToolChoice = "function"
		d.Str(m["name"], "tool_choice.name", &req.ToolChoiceFunction)
		if d.Err == nil && req.ToolChoiceFunction == "" {
			d.Fail("tool_choice.name", "required with type tool")
		}
	default:
		d.Fail("tool_choice.type", "want auto, any, tool or none, got %q", typ)
		return
	}
	if _, ok := m["name"]; ok && typ != "tool" {
		d.Fail("tool_choice.name", "only with type tool")
	}
	if p, ok := m["disable_parallel_tool_use"]; ok {
		if typ == "none" {
			d.Fail("tool_choice.disable_parallel_tool_use", "not with type none")
		}
		if b := d.Bool(p, "tool_choice.disable_parallel_tool_use"); b != nil {
			parallel := !*b
			req.ParallelToolCalls = &parallel
		}
	}
}

func (d *decoder) thinking(v json.RawMessage) *routerv1.Thinking {
	if jsonfield.IsNull(v) || d.Err != nil {
		return nil
	}
	m := d.Obj(v, "thinking", "type", "budget_tokens")
	t := &routerv1.Thinking{}
	d.Str(m["type"], "thinking.type", &t.Type)
	if n := d.Int32(m["budget_tokens"], "thinking.budget_tokens"); n != nil {
		t.BudgetTokens = *n
	}
	switch {
	case d.Err != nil:
		return nil
	case t.Type == "enabled" && t.BudgetTokens < 1:
		d.Fail("thinking.budget_tokens", "required with type enabled, at least 1")
	case t.Type == "disabled":
		if _, ok := m["budget_tokens"]; ok {
			d.Fail("thinking.budget_tokens", "only with type enabled")
		}
	case t.Type != "enabled":
		d.Fail("thinking.type", "want enabled or disabled, got %q", t.Type)
	}
	return t
}
