package openaiapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"unicode/utf8"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// ChatRequest is a decoded chat completions request: the router request, and how the
// caller wants the answer delivered.
type ChatRequest struct {
	Request *routerv1.Request
	Stream  bool
	// IncludeUsage is stream_options.include_usage.
	IncludeUsage bool
}

// Refused lists documented request fields mantle does not forward, with the reason the
// error gives. Every other documented field is decoded into the router request.
var Refused = map[string]string{
	"functions":          "deprecated by OpenAI: send tools",
	"function_call":      "deprecated by OpenAI: send tool_choice",
	"audio":              "audio output is not supported by mantle",
	"prediction":         "predicted outputs are not supported by mantle; send it in extra_body to forward it to OpenAI-type providers",
	"web_search_options": "web search is not supported by mantle; send it in extra_body to forward it to OpenAI-type providers",
	"verbosity":          "not modelled by mantle; send it in extra_body to forward it to OpenAI-type providers",
	"prompt_cache_key":   "not modelled by mantle; send it in extra_body to forward it to OpenAI-type providers",
	"safety_identifier":  "not modelled by mantle; send it in extra_body to forward it to OpenAI-type providers",
}

// Forwarded lists the top-level fields DecodeChatRequest decodes into the router request
// (or, for stream and stream_options, into how the answer is delivered).
var Forwarded = []string{
	"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n",
	"stop", "seed", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs",
	"top_logprobs", "tools", "tool_choice", "parallel_tool_calls", "response_format",
	"reasoning_effort", "service_tier", "metadata", "user", "modalities", "store", "stream",
	"stream_options", "extra_body",
}

// Bounds on what a request may hold, beyond its size in bytes (the caller bounds the body).
const (
	MaxTools     = 128
	MaxStop      = 4
	MaxLogitBias = 1024
	MaxMetadata  = 16
	MaxParts     = 512
	MaxToolCalls = 128
)

// DecodeChatRequest decodes an OpenAI chat completions request body. Every documented
// field is decoded; a field that is not documented, or that mantle does not forward
// (Refused), is an error naming it (an *rpc.ValidationError whose field is the JSON path). Size is the caller's to bound; nesting is bounded here by the
// shape: no member is decoded deeper than the API defines, and free-form members (tool
// parameters, json_schema schemas, extra_body) are kept as raw JSON.
func DecodeChatRequest(body []byte) (*ChatRequest, error) {
	// encoding/json would turn invalid bytes into U+FFFD in strings and keep them in raw
	// values (a JSON schema, extra_body), so a request could reach a provider changed, or
	// not marshal at all.
	if !utf8.Valid(body) {
		return nil, rpc.Invalid("body", "the body is not valid UTF-8")
	}
	top, err := object(body, "")
	if err != nil {
		return nil, err
	}
	out := &ChatRequest{Request: &routerv1.Request{}}
	req := out.Request
	d := decoder{}
	var maxTokens, maxCompletion *int32
	for _, k := range sortedKeys(top) {
		v := top[k]
		switch k {
		case "model":
			d.str(v, k, &req.Model)
		case "messages":
			req.Messages = d.messages(v)
		case "max_tokens":
			maxTokens = d.int32p(v, k)
		case "max_completion_tokens":
			maxCompletion = d.int32p(v, k)
		case "temperature":
			req.Temperature = d.float(v, k)
		case "top_p":
			req.TopP = d.float(v, k)
		case "presence_penalty":
			req.PresencePenalty = d.float(v, k)
		case "frequency_penalty":
			req.FrequencyPenalty = d.float(v, k)
		case "n":
			req.N = d.int32p(v, k)
		case "seed":
			if !isNull(v) {
				var s int64
				if d.decode(v, k, &s, "want an integer") {
					req.Seed = &s
				}
			}
		case "top_logprobs":
			req.TopLogprobs = d.int32p(v, k)
		case "logprobs":
			req.Logprobs = d.boolp(v, k)
		case "parallel_tool_calls":
			req.ParallelToolCalls = d.boolp(v, k)
		case "store":
			req.Store = d.boolp(v, k)
		case "stream":
			if b := d.boolp(v, k); b != nil {
				out.Stream = *b
			}
		case "stream_options":
			out.IncludeUsage = d.streamOptions(v)
		case "stop":
			req.Stop = d.stop(v)
		case "logit_bias":
			req.LogitBias = d.logitBias(v)
		case "metadata":
			req.Metadata = d.metadata(v)
		case "modalities":
			d.strings(v, k, &req.Modalities, 8)
		case "reasoning_effort":
			d.str(v, k, &req.ReasoningEffort)
		case "service_tier":
			d.str(v, k, &req.ServiceTier)
		case "user":
			d.str(v, k, &req.User)
		case "tools":
			req.Tools = d.tools(v)
		case "tool_choice":
			d.toolChoice(v, req)
		case "response_format":
			req.ResponseFormat = d.responseFormat(v)
		case "extra_body":
			req.ExtraBody = d.extraBody(v)
		default:
			if why, ok := Refused[k]; ok {
				d.fail(k, "not supported: %s", why)
			} else {
				d.fail(keyName(k), "unknown field: mantle forwards every documented chat completions field and refuses others (provider-specific fields go in extra_body)")
			}
		}
		if d.err != nil {
			return nil, d.err
		}
	}
	switch {
	case maxCompletion != nil:
		req.MaxTokens, req.MaxTokensIsCompletion = *maxCompletion, true
		if maxTokens != nil && *maxTokens != *maxCompletion {
			return nil, invalid("max_tokens", "max_tokens (%d) and max_completion_tokens (%d) disagree: send one", *maxTokens, *maxCompletion)
		}
	case maxTokens != nil:
		req.MaxTokens = *maxTokens
	}
	return out, nil
}

// decoder holds the first error; every method is a no-op after it.
type decoder struct{ err error }

func (d *decoder) fail(field, format string, args ...any) {
	if d.err == nil {
		d.err = invalid(field, format, args...)
	}
}

// invalid is a field error; field is the JSON path in the body, which the front door
// reports as the OpenAI error's param.
func invalid(field, format string, args ...any) error {
	return rpc.Invalid(field, format, args...)
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

// obj decodes v as an object for field, checking that its keys are among allowed.
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
		if !slices.Contains(allowed, k) {
			d.fail(join(field, k), "unknown field (want one of %s)", strings.Join(allowed, ", "))
			return nil
		}
	}
	return m
}

func (d *decoder) streamOptions(v json.RawMessage) bool {
	if isNull(v) {
		return false
	}
	m := d.obj(v, "stream_options", "include_usage")
	var b bool
	if u, ok := m["include_usage"]; ok && !isNull(u) {
		d.decode(u, "stream_options.include_usage", &b, "want true or false")
	}
	return b
}

func (d *decoder) stop(v json.RawMessage) []string {
	if isNull(v) || d.err != nil {
		return nil
	}
	var one string
	if json.Unmarshal(v, &one) == nil {
		return []string{one}
	}
	var list []string
	d.strings(v, "stop", &list, MaxStop)
	return list
}

func (d *decoder) logitBias(v json.RawMessage) map[string]int32 {
	if isNull(v) || d.err != nil {
		return nil
	}
	var raw map[string]float64
	if !d.decode(v, "logit_bias", &raw, "want an object of token ids to numbers") {
		return nil
	}
	if len(raw) > MaxLogitBias {
		d.fail("logit_bias", "at most %d entries, got %d", MaxLogitBias, len(raw))
		return nil
	}
	out := make(map[string]int32, len(raw))
	for _, k := range slices.Sorted(maps.Keys(raw)) {
		b := raw[k]
		if b != math.Trunc(b) || b < -100 || b > 100 {
			d.fail("logit_bias."+k, "want an integer in [-100, 100], got %g", b)
			return nil
		}
		out[k] = int32(b)
	}
	return out
}

func (d *decoder) metadata(v json.RawMessage) map[string]string {
	var m map[string]string
	if isNull(v) || !d.decode(v, "metadata", &m, "want an object of strings") {
		return nil
	}
	if len(m) > MaxMetadata {
		d.fail("metadata", "at most %d entries, got %d", MaxMetadata, len(m))
	}
	return m
}

func (d *decoder) extraBody(v json.RawMessage) string {
	if isNull(v) || d.err != nil {
		return ""
	}
	m, err := object(v, "extra_body")
	if err != nil {
		d.err = err
		return ""
	}
	for _, k := range sortedKeys(m) {
		// A member that names a field mantle models would be sent twice, or override
		// what mantle checked (a model name, the stream flag).
		if slices.Contains(Forwarded, k) {
			d.fail(join("extra_body", k), "is a field mantle forwards itself: send it at the top level")
			return ""
		}
	}
	return string(compact(v))
}

func (d *decoder) tools(v json.RawMessage) []*mantlev1.Tool {
	var list []json.RawMessage
	if isNull(v) || !d.decode(v, "tools", &list, "want a list of tools") {
		return nil
	}
	if len(list) > MaxTools {
		d.fail("tools", "at most %d tools, got %d", MaxTools, len(list))
		return nil
	}
	out := make([]*mantlev1.Tool, 0, len(list))
	for i, raw := range list {
		field := fmt.Sprintf("tools[%d]", i)
		m := d.obj(raw, field, "type", "function")
		t := &mantlev1.Tool{}
		d.str(m["type"], field+".type", &t.Type)
		if d.err == nil && t.Type != "function" {
			d.fail(field+".type", "want function, got %q", t.Type)
		}
		fn := d.obj(orNull(m["function"]), field+".function", "name", "description", "parameters", "strict")
		d.str(fn["name"], field+".function.name", &t.Name)
		if d.err == nil && t.Name == "" {
			d.fail(field+".function.name", "required")
		}
		d.str(fn["description"], field+".function.description", &t.Description)
		if p, ok := fn["parameters"]; ok && !isNull(p) {
			if _, err := object(p, field+".function.parameters"); err != nil && d.err == nil {
				d.err = err
			}
			t.Parameters = string(compact(p))
		}
		t.Strict = d.boolp(orNull(fn["strict"]), field+".function.strict")
		if d.err != nil {
			return nil
		}
		out = append(out, t)
	}
	return out
}

func (d *decoder) toolChoice(v json.RawMessage, req *routerv1.Request) {
	if isNull(v) || d.err != nil {
		return
	}
	var s string
	if json.Unmarshal(v, &s) == nil {
		switch s {
		case "auto", "none", "required":
			req.ToolChoice = s
		default:
			d.fail("tool_choice", "want auto, none, required or {\"type\":\"function\",\"function\":{\"name\":...}}, got %q", s)
		}
		return
	}
	m := d.obj(v, "tool_choice", "type", "function")
	var typ string
	d.str(m["type"], "tool_choice.type", &typ)
	if d.err == nil && typ != "function" {
		d.fail("tool_choice.type", "want function, got %q", typ)
	}
	fn := d.obj(orNull(m["function"]), "tool_choice.function", "name")
	d.str(fn["name"], "tool_choice.function.name", &req.ToolChoiceFunction)
	if d.err == nil && req.ToolChoiceFunction == "" {
		d.fail("tool_choice.function.name", "required")
	}
	req.ToolChoice = "function"
}

func (d *decoder) responseFormat(v json.RawMessage) *mantlev1.ResponseFormat {
	if isNull(v) || d.err != nil {
		return nil
	}
	m := d.obj(v, "response_format", "type", "json_schema")
	var typ string
	d.str(m["type"], "response_format.type", &typ)
	if d.err != nil {
		return nil
	}
	rf := &mantlev1.ResponseFormat{}
	switch typ {
	case "text":
		rf.Type = mantlev1.ResponseFormat_TYPE_TEXT
	case "json_object":
		rf.Type = mantlev1.ResponseFormat_TYPE_JSON_OBJECT
	case "json_schema":
		rf.Type = mantlev1.ResponseFormat_TYPE_JSON_SCHEMA
		js := d.obj(orNull(m["json_schema"]), "response_format.json_schema", "name", "description", "schema", "strict")
		d.str(js["name"], "response_format.json_schema.name", &rf.JsonSchemaName)
		d.str(js["description"], "response_format.json_schema.description", &rf.JsonSchemaDescription)
		if s, ok := js["schema"]; ok && !isNull(s) {
			rf.JsonSchema = string(compact(s))
		}
		rf.JsonSchemaStrict = d.boolp(orNull(js["strict"]), "response_format.json_schema.strict")
	default:
		d.fail("response_format.type", "want text, json_object or json_schema, got %q", typ)
		return nil
	}
	if _, ok := m["json_schema"]; ok && rf.Type != mantlev1.ResponseFormat_TYPE_JSON_SCHEMA {
		d.fail("response_format.json_schema", "only with type json_schema")
	}
	return rf
}

func (d *decoder) messages(v json.RawMessage) []*mantlev1.ChatMessage {
	var list []json.RawMessage
	if isNull(v) || !d.decode(v, "messages", &list, "want a list of messages") {
		return nil
	}
	out := make([]*mantlev1.ChatMessage, 0, len(list))
	for i, raw := range list {
		field := fmt.Sprintf("messages[%d]", i)
		m := d.obj(raw, field, "role", "content", "name", "tool_calls", "tool_call_id", "refusal")
		msg := &mantlev1.ChatMessage{}
		d.str(m["role"], field+".role", &msg.Role)
		d.str(m["name"], field+".name", &msg.Name)
		d.str(m["tool_call_id"], field+".tool_call_id", &msg.ToolCallId)
		d.str(m["refusal"], field+".refusal", &msg.Refusal)
		d.content(m["content"], field+".content", msg)
		msg.ToolCalls = d.toolCalls(m["tool_calls"], field+".tool_calls")
		if d.err != nil {
			return nil
		}
		out = append(out, msg)
	}
	return out
}

func (d *decoder) content(v json.RawMessage, field string, msg *mantlev1.ChatMessage) {
	if d.err != nil {
		return
	}
	if isNull(v) {
		msg.ContentNull = true
		return
	}
	if json.Unmarshal(v, &msg.Content) == nil {
		return
	}
	var list []json.RawMessage
	if !d.decode(v, field, &list, "want a string, null or a list of content parts") {
		return
	}
	if len(list) > MaxParts {
		d.fail(field, "at most %d parts, got %d", MaxParts, len(list))
		return
	}
	msg.Parts = make([]*mantlev1.ContentPart, 0, len(list))
	for i, raw := range list {
		pf := fmt.Sprintf("%s[%d]", field, i)
		var head struct {
			Type string `json:"type"`
		}
		if !d.decode(raw, pf, &head, "want a content part object") {
			return
		}
		p := &mantlev1.ContentPart{}
		switch head.Type {
		case "text":
			m := d.obj(raw, pf, "type", "text")
			var s string
			d.str(m["text"], pf+".text", &s)
			p.Part = &mantlev1.ContentPart_Text{Text: s}
		case "refusal":
			m := d.obj(raw, pf, "type", "refusal")
			var s string
			d.str(m["refusal"], pf+".refusal", &s)
			p.Part = &mantlev1.ContentPart_Refusal{Refusal: s}
		case "image_url":
			m := d.obj(raw, pf, "type", "image_url")
			im := d.obj(orNull(m["image_url"]), pf+".image_url", "url", "detail")
			img := &mantlev1.ImagePart{}
			d.str(im["url"], pf+".image_url.url", &img.Url)
			d.str(im["detail"], pf+".image_url.detail", &img.Detail)
			if d.err == nil && img.Url == "" {
				d.fail(pf+".image_url.url", "required")
			}
			p.Part = &mantlev1.ContentPart_Image{Image: img}
		case "input_audio":
			m := d.obj(raw, pf, "type", "input_audio")
			am := d.obj(orNull(m["input_audio"]), pf+".input_audio", "data", "format")
			a := &mantlev1.AudioPart{}
			d.str(am["data"], pf+".input_audio.data", &a.Data)
			d.str(am["format"], pf+".input_audio.format", &a.Format)
			p.Part = &mantlev1.ContentPart_InputAudio{InputAudio: a}
		case "file":
			m := d.obj(raw, pf, "type", "file")
			fm := d.obj(orNull(m["file"]), pf+".file", "file_id", "filename", "file_data")
			f := &mantlev1.FilePart{}
			d.str(fm["file_id"], pf+".file.file_id", &f.FileId)
			d.str(fm["filename"], pf+".file.filename", &f.Filename)
			d.str(fm["file_data"], pf+".file.file_data", &f.FileData)
			p.Part = &mantlev1.ContentPart_File{File: f}
		default:
			d.fail(pf+".type", "want text, image_url, input_audio, file or refusal, got %q", head.Type)
		}
		if d.err != nil {
			return
		}
		msg.Parts = append(msg.Parts, p)
	}
}

func (d *decoder) toolCalls(v json.RawMessage, field string) []*mantlev1.ToolCall {
	var list []json.RawMessage
	if isNull(v) || !d.decode(v, field, &list, "want a list of tool calls") {
		return nil
	}
	if len(list) > MaxToolCalls {
		d.fail(field, "at most %d tool calls, got %d", MaxToolCalls, len(list))
		return nil
	}
	out := make([]*mantlev1.ToolCall, 0, len(list))
	for i, raw := range list {
		f := fmt.Sprintf("%s[%d]", field, i)
		m := d.obj(raw, f, "id", "type", "function")
		tc := &mantlev1.ToolCall{}
		d.str(m["id"], f+".id", &tc.Id)
		d.str(m["type"], f+".type", &tc.Type)
		fn := d.obj(orNull(m["function"]), f+".function", "name", "arguments")
		d.str(fn["name"], f+".function.name", &tc.Name)
		d.str(fn["arguments"], f+".function.arguments", &tc.Arguments)
		if d.err != nil {
			return nil
		}
		out = append(out, tc)
	}
	return out
}

// object decodes v as a JSON object; field names it in the error ("" is the body).
func object(v json.RawMessage, field string) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(v, &m); err != nil || m == nil {
		name := field
		if name == "" {
			return nil, rpc.Invalid("body", "the body must be a JSON object: %v", errOr(err, "null"))
		}
		return nil, invalid(name, "want an object, got %s", shorten(v))
	}
	return m, nil
}

func errOr(err error, s string) string {
	if err != nil {
		return err.Error()
	}
	return s
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
	r := []rune(string(v)) // invalid UTF-8 becomes U+FFFD: the message must be UTF-8
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
