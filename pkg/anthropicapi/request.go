// Package anthropicapi reads Anthropic Messages API requests (POST /v1/messages) into the
// router's request, and holds the answer and stream event objects the router's Messages
// front door writes. Calling Anthropic as a provider is pkg/provider/anthropic's job.
package anthropicapi

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
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
	top, err := object(body, "")
	if err != nil {
		return nil, err
	}
	out := &MessagesRequest{Request: &routerv1.Request{}}
	req := out.Request
	d := decoder{}
	var system []*mantlev1.ChatMessage
	maxTokens := false
	for _, k := range sortedKeys(top) {
		v := top[k]
		switch k {
		case "model":
			d.str(v, k, &req.Model)
		case "messages":
			req.Messages = d.messages(v)
		case "system":
			system = d.system(v)
		case "max_tokens":
			if n := d.int32p(v, k); n != nil {
				req.MaxTokens, maxTokens = *n, true
				if *n < 1 {
					d.fail(k, "must be at least 1, got %d", *n)
				}
			}
		case "stop_sequences":
			d.strings(v, k, &req.Stop, openaiapi.MaxStop)
		case "temperature":
			req.Temperature = d.float(v, k)
		case "top_p":
			req.TopP = d.float(v, k)
		case "top_k":
			req.TopK = d.int32p(v, k)
			if req.TopK != nil && *req.TopK < 0 {
				d.fail(k, "must not be negative, got %d", *req.TopK)
			}
		case "tools":
			req.Tools = d.tools(v)
		case "tool_choice":
			d.toolChoice(v, req)
		case "metadata":
			m := d.obj(v, k, "user_id")
			d.str(m["user_id"], "metadata.user_id", &req.User)
		case "thinking":
			req.Thinking = d.thinking(v)
		case "stream":
			if b := d.boolp(v, k); b != nil {
				out.Stream = *b
			}
		default:
			if why, ok := Refused[k]; ok {
				d.fail(k, "not supported: %s", why)
			} else {
				d.fail(keyName(k), "unknown field: mantle forwards every documented Messages API field and refuses others")
			}
		}
		if d.err != nil {
			return nil, d.err
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
type decoder struct{ err error }

func (d *decoder) fail(field, format string, args ...any) {
	if d.err == nil {
		d.err = rpc.Invalid(field, format, args...)
	}
}

func (d *decoder) decode(v json.RawMessage, field string, into any, want string) bool {
	if d.err != nil {
		return false
	}
	if err := json.Unmarshal(v, into); err != nil {
		d.fail(field, "%s, got %s", want, shorten(v))
		return false
	}
	return true
}

func (d *decoder) str(v json.RawMessage, field string, into *string) {
	if !isNull(v) {
		d.decode(v, field, into, "want a string")
	}
}

func (d *decoder) float(v json.RawMessage, field string) *float64 {
	var f float64
	if isNull(v) || !d.decode(v, field, &f, "want a number") {
		return nil
	}
	return &f
}

func (d *decoder) int32p(v json.RawMessage, field string) *int32 {
	var n int32
	if isNull(v) || !d.decode(v, field, &n, "want an integer") {
		return nil
	}
	return &n
}

func (d *decoder) boolp(v json.RawMessage, field string) *bool {
	var b bool
	if isNull(v) || !d.decode(v, field, &b, "want true or false") {
		return nil
	}
	return &b
}

func (d *decoder) strings(v json.RawMessage, field string, into *[]string, limit int) {
	if isNull(v) || !d.decode(v, field, into, "want a list of strings") {
		return
	}
	if len(*into) > limit {
		d.fail(field, "at most %d entries, got %d", limit, len(*into))
	}
}

// list decodes v as a JSON list of at most limit members.
func (d *decoder) list(v json.RawMessage, field, what string, limit int) []json.RawMessage {
	var l []json.RawMessage
	if isNull(v) || !d.decode(v, field, &l, "want a list of "+what) {
		return nil
	}
	if len(l) > limit {
		d.fail(field, "at most %d %s, got %d", limit, what, len(l))
		return nil
	}
	return l
}

// obj decodes v as an object for field, checking that its keys are among allowed; a key
// of refusedKeys is refused with its reason.
func (d *decoder) obj(v json.RawMessage, field string, allowed ...string) map[string]json.RawMessage {
	if d.err != nil {
		return nil
	}
	m, err := object(v, field)
	if err != nil {
		d.err = err
		return nil
	}
	for _, k := range sortedKeys(m) {
		if slices.Contains(allowed, k) {
			continue
		}
		if why, ok := refusedKeys[k]; ok {
			d.fail(join(field, k), "not supported: %s", why)
		} else {
			d.fail(join(field, k), "unknown field (want one of %s)", strings.Join(allowed, ", "))
		}
		return nil
	}
	return m
}

// blockType reads the type of a content block.
func (d *decoder) blockType(raw json.RawMessage, field string) string {
	var head struct {
		Type *string `json:"type"`
	}
	if !d.decode(raw, field, &head, "want a content block object") {
		return ""
	}
	if head.Type == nil {
		d.fail(field+".type", "required")
		return ""
	}
	return *head.Type
}

func (d *decoder) system(v json.RawMessage) []*mantlev1.ChatMessage {
	if isNull(v) || d.err != nil {
		return nil
	}
	msg := &mantlev1.ChatMessage{Role: "system"}
	if json.Unmarshal(v, &msg.Content) == nil {
		return []*mantlev1.ChatMessage{msg}
	}
	for i, raw := range d.list(v, "system", "text blocks", MaxBlocks) {
		f := fmt.Sprintf("system[%d]", i)
		if t := d.blockType(raw, f); d.err == nil && t != "text" {
			d.fail(f+".type", "want text, got %q", t)
		}
		msg.Parts = append(msg.Parts, d.text(raw, f))
	}
	if d.err != nil {
		return nil
	}
	return []*mantlev1.ChatMessage{msg}
}

func (d *decoder) text(raw json.RawMessage, field string) *mantlev1.ContentPart {
	m := d.obj(raw, field, "type", "text")
	var s string
	d.str(m["text"], field+".text", &s)
	return &mantlev1.ContentPart{Part: &mantlev1.ContentPart_Text{Text: s}}
}

// messages decodes the turns. A user turn's tool_result blocks become tool messages (with
// tool_call_id), the rest of it user messages around them, in the order given; an
// assistant turn's tool_use blocks become its tool calls.
func (d *decoder) messages(v json.RawMessage) []*mantlev1.ChatMessage {
	var out []*mantlev1.ChatMessage
	for i, raw := range d.list(v, "messages", "messages", MaxMessages) {
		field := fmt.Sprintf("messages[%d]", i)
		m := d.obj(raw, field, "role", "content")
		var role string
		d.str(m["role"], field+".role", &role)
		if d.err == nil && role != "user" && role != "assistant" {
			d.fail(field+".role", "want user or assistant, got %q", role)
		}
		c, ok := m["content"]
		if d.err == nil && (!ok || isNull(c)) {
			d.fail(field+".content", "required")
		}
		if d.err != nil {
			return nil
		}
		var s string
		if json.Unmarshal(c, &s) == nil {
			out = append(out, &mantlev1.ChatMessage{Role: role, Content: s})
			continue
		}
		blocks := d.list(c, field+".content", "content blocks", MaxBlocks)
		if role == "assistant" {
			out = append(out, d.assistant(blocks, field+".content"))
		} else {
			out = append(out, d.user(blocks, field+".content")...)
		}
		if d.err != nil {
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
		if d.err != nil {
			return nil
		}
		if t == "tool_result" {
			cur = nil
			out = append(out, d.toolResult(raw, f))
			continue
		}
		p := d.part(raw, f, t)
		if d.err != nil {
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
		d.fail(f+".type", "%s blocks belong to assistant turns", t)
	default:
		d.fail(f+".type", "not supported: want text, image, document or tool_result, got %q", t)
	}
	return nil
}

func (d *decoder) image(raw json.RawMessage, f string) *mantlev1.ContentPart {
	m := d.obj(raw, f, "type", "source")
	src := d.obj(orNull(m["source"]), f+".source", "type", "media_type", "data", "url", "file_id")
	var typ string
	d.str(src["type"], f+".source.type", &typ)
	img := &mantlev1.ImagePart{}
	switch {
	case d.err != nil:
		return nil
	case typ == "base64":
		d.onlyKeys(src, f+".source", "type", "media_type", "data")
		d.str(src["media_type"], f+".source.media_type", &img.MediaType)
		switch img.MediaType {
		case "image/jpeg", "image/png", "image/gif", "image/webp":
		default:
			d.fail(f+".source.media_type", "want image/jpeg, image/png, image/gif or image/webp, got %q", img.MediaType)
		}
		img.Data = d.base64(src["data"], f+".source.data")
	case typ == "url":
		d.onlyKeys(src, f+".source", "type", "url")
		d.str(src["url"], f+".source.url", &img.Url)
		if d.err == nil && img.Url == "" {
			d.fail(f+".source.url", "required")
		}
	case typ == "file":
		d.fail(f+".source.type", "not supported: files uploaded to Anthropic cannot be carried by mantle; send the image as base64 or url")
	default:
		d.fail(f+".source.type", "want base64 or url, got %q", typ)
	}
	return &mantlev1.ContentPart{Part: &mantlev1.ContentPart_Image{Image: img}}
}

// document carries a base64 PDF as a file part (its title as the file name).
func (d *decoder) document(raw json.RawMessage, f string) *mantlev1.ContentPart {
	m := d.obj(raw, f, "type", "source", "title")
	src := d.obj(orNull(m["source"]), f+".source", "type", "media_type", "data", "url", "content", "file_id")
	var typ, media string
	d.str(src["type"], f+".source.type", &typ)
	file := &mantlev1.FilePart{}
	d.str(m["title"], f+".title", &file.Filename)
	if d.err != nil {
		return nil
	}
	if typ != "base64" {
		d.fail(f+".source.type", "not supported: mantle carries documents as base64 PDF only, got %q", typ)
		return nil
	}
	d.onlyKeys(src, f+".source", "type", "media_type", "data")
	d.str(src["media_type"], f+".source.media_type", &media)
	if d.err == nil && media != "application/pdf" {
		d.fail(f+".source.media_type", "want application/pdf, got %q", media)
	}
	data := d.base64(src["data"], f+".source.data")
	if d.err != nil {
		return nil
	}
	file.FileData = "data:application/pdf;base64," + base64.StdEncoding.EncodeToString(data)
	return &mantlev1.ContentPart{Part: &mantlev1.ContentPart_File{File: file}}
}

// onlyKeys refuses a member of m beyond keys: the members a source of that type has.
func (d *decoder) onlyKeys(m map[string]json.RawMessage, field string, keys ...string) {
	for _, k := range sortedKeys(m) {
		if !slices.Contains(keys, k) {
			d.fail(join(field, k), "unknown field for this source type (want one of %s)", strings.Join(keys, ", "))
			return
		}
	}
}

func (d *decoder) base64(v json.RawMessage, field string) []byte {
	var s string
	d.str(v, field, &s)
	if d.err != nil {
		return nil
	}
	if s == "" {
		d.fail(field, "required")
		return nil
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		d.fail(field, "not base64: %v", err)
		return nil
	}
	return b
}

func (d *decoder) toolResult(raw json.RawMessage, f string) *mantlev1.ChatMessage {
	m := d.obj(raw, f, "type", "tool_use_id", "content", "is_error")
	msg := &mantlev1.ChatMessage{Role: "tool"}
	d.str(m["tool_use_id"], f+".tool_use_id", &msg.ToolCallId)
	if d.err == nil && msg.ToolCallId == "" {
		d.fail(f+".tool_use_id", "required")
	}
	if b := d.boolp(m["is_error"], f+".is_error"); b != nil {
		msg.ToolError = *b
	}
	c := m["content"]
	if d.err != nil || isNull(c) || json.Unmarshal(c, &msg.Content) == nil {
		return msg
	}
	blocks := d.list(c, f+".content", "content blocks", MaxBlocks)
	msg.Parts = make([]*mantlev1.ContentPart, 0, len(blocks))
	for i, b := range blocks {
		bf := fmt.Sprintf("%s.content[%d]", f, i)
		t := d.blockType(b, bf)
		if d.err == nil && t != "text" && t != "image" {
			d.fail(bf+".type", "not supported in a tool result: want text or image, got %q", t)
		}
		if d.err != nil {
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
			m := d.obj(raw, f, "type", "id", "name", "input")
			tc := &mantlev1.ToolCall{Type: "function"}
			d.str(m["id"], f+".id", &tc.Id)
			d.str(m["name"], f+".name", &tc.Name)
			if d.err == nil && (tc.Id == "" || tc.Name == "") {
				d.fail(f, "a tool_use block needs id and name")
			}
			in, ok := m["input"]
			if d.err == nil && !ok {
				d.fail(f+".input", "required")
			}
			if d.err == nil {
				if _, err := object(in, f+".input"); err != nil {
					d.err = err
				}
				tc.Arguments = string(compact(in))
			}
			msg.ToolCalls = append(msg.ToolCalls, tc)
		case "thinking", "redacted_thinking":
			d.fail(f+".type", "not supported: mantle does not carry thinking blocks back to a model")
		default:
			d.fail(f+".type", "not supported in an assistant turn: want text or tool_use, got %q", t)
		}
		if d.err != nil {
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
	list := d.list(v, "tools", "tools", openaiapi.MaxTools)
	out := make([]*mantlev1.Tool, 0, len(list))
	for i, raw := range list {
		f := fmt.Sprintf("tools[%d]", i)
		m := d.obj(raw, f, "type", "name", "description", "input_schema")
		var typ string
		d.str(m["type"], f+".type", &typ)
		if d.err == nil && typ != "" && typ != "custom" {
			d.fail(f+".type", "not supported: mantle carries client tools (type custom) only, got %q", typ)
		}
		t := &mantlev1.Tool{Type: "function"}
		d.str(m["name"], f+".name", &t.Name)
		if d.err == nil && t.Name == "" {
			d.fail(f+".name", "required")
		}
		d.str(m["description"], f+".description", &t.Description)
		s, ok := m["input_schema"]
		if d.err == nil && !ok {
			d.fail(f+".input_schema", "required")
		}
		if d.err == nil {
			if _, err := object(s, f+".input_schema"); err != nil {
				d.err = err
			}
			t.Parameters = string(compact(s))
		}
		if d.err != nil {
			return nil
		}
		out = append(out, t)
	}
	return out
}

// toolChoice maps auto, any, tool and none onto auto, required, a named function and none;
// disable_parallel_tool_use onto parallel_tool_calls, its negation.
func (d *decoder) toolChoice(v json.RawMessage, req *routerv1.Request) {
	if isNull(v) || d.err != nil {
		return
	}
	m := d.obj(v, "tool_choice", "type", "name", "disable_parallel_tool_use")
	var typ string
	d.str(m["type"], "tool_choice.type", &typ)
	if d.err != nil {
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
		d.str(m["name"], "tool_choice.name", &req.ToolChoiceFunction)
		if d.err == nil && req.ToolChoiceFunction == "" {
			d.fail("tool_choice.name", "required with type tool")
		}
	default:
		d.fail("tool_choice.type", "want auto, any, tool or none, got %q", typ)
		return
	}
	if _, ok := m["name"]; ok && typ != "tool" {
		d.fail("tool_choice.name", "only with type tool")
	}
	if p, ok := m["disable_parallel_tool_use"]; ok {
		if typ == "none" {
			d.fail("tool_choice.disable_parallel_tool_use", "not with type none")
		}
		if b := d.boolp(p, "tool_choice.disable_parallel_tool_use"); b != nil {
			parallel := !*b
			req.ParallelToolCalls = &parallel
		}
	}
}

func (d *decoder) thinking(v json.RawMessage) *routerv1.Thinking {
	if isNull(v) || d.err != nil {
		return nil
	}
	m := d.obj(v, "thinking", "type", "budget_tokens")
	t := &routerv1.Thinking{}
	d.str(m["type"], "thinking.type", &t.Type)
	if n := d.int32p(m["budget_tokens"], "thinking.budget_tokens"); n != nil {
		t.BudgetTokens = *n
	}
	switch {
	case d.err != nil:
		return nil
	case t.Type == "enabled" && t.BudgetTokens < 1:
		d.fail("thinking.budget_tokens", "required with type enabled, at least 1")
	case t.Type == "disabled":
		if _, ok := m["budget_tokens"]; ok {
			d.fail("thinking.budget_tokens", "only with type enabled")
		}
	case t.Type != "enabled":
		d.fail("thinking.type", "want enabled or disabled, got %q", t.Type)
	}
	return t
}

// object decodes v as a JSON object; field names it in the error ("" is the body).
func object(v json.RawMessage, field string) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(v, &m); err != nil || m == nil {
		if field == "" {
			msg := "null"
			if err != nil {
				msg = err.Error()
			}
			return nil, rpc.Invalid("body", "the body must be a JSON object: %s", msg)
		}
		return nil, rpc.Invalid(field, "want an object, got %s", shorten(v))
	}
	return m, nil
}

func isNull(v json.RawMessage) bool {
	return len(v) == 0 || string(bytes.TrimSpace(v)) == "null"
}

// orNull is v, or JSON null for an absent member, which obj reports as "want an object".
func orNull(v json.RawMessage) json.RawMessage {
	if v == nil {
		return json.RawMessage("null")
	}
	return v
}

func compact(v json.RawMessage) []byte {
	var b bytes.Buffer
	if json.Compact(&b, v) != nil {
		return v
	}
	return b.Bytes()
}

func shorten(v json.RawMessage) string {
	r := []rune(string(v))
	if len(r) > 40 {
		return string(r[:40]) + "..."
	}
	return string(r)
}

func join(field, k string) string {
	if field == "" {
		return keyName(k)
	}
	return field + "." + keyName(k)
}

// keyName is k as a field name; an empty key is shown quoted, so that the error still
// names it.
func keyName(k string) string {
	if k == "" {
		return `""`
	}
	return k
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}
