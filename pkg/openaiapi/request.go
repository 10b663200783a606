package openaiapi

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"unicode/utf8"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/jsonfield"
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
	if !jsonfield.Valid(body) {
		_, err := jsonfield.Object(body, "") // its error says where
		return nil, err
	}
	return DecodeValidChatRequest(body)
}

// DecodeValidChatRequest is DecodeChatRequest for a body already known to be valid UTF-8
// and valid JSON (json.Valid), as the front door checks before it: the body is then read
// in one pass, not validated again at every level of nesting. Given any other body its
// result is undefined (but it does not panic).
func DecodeValidChatRequest(body []byte) (*ChatRequest, error) {
	return decodeChatRequest(body, true)
}

// decodeChatRequest decodes body, which is valid UTF-8; with valid, it is valid JSON too
// and read in one pass (jsonfield.Decoder.Valid). Without, every object, list and literal
// goes through json.Unmarshal, which checks it: the tests hold the one-pass reading to
// that one.
func decodeChatRequest(body []byte, valid bool) (*ChatRequest, error) {
	d := decoder{jsonfield.Decoder{Valid: valid}}
	top, err := d.Object(body, "", Forwarded...)
	if err != nil {
		return nil, err
	}
	out := &ChatRequest{Request: &routerv1.Request{}}
	req := out.Request
	var maxTokens, maxCompletion *int32
	for _, k := range jsonfield.SortedKeys(top) {
		v := top[k]
		switch k {
		case "model":
			d.Str(v, k, &req.Model)
		case "messages":
			req.Messages = d.messages(v)
		case "max_tokens":
			maxTokens = d.Int32(v, k)
		case "max_completion_tokens":
			maxCompletion = d.Int32(v, k)
		case "temperature":
			req.Temperature = d.Float(v, k)
		case "top_p":
			req.TopP = d.Float(v, k)
		case "presence_penalty":
			req.PresencePenalty = d.Float(v, k)
		case "frequency_penalty":
			req.FrequencyPenalty = d.Float(v, k)
		case "n":
			req.N = d.Int32(v, k)
		case "seed":
			if !jsonfield.IsNull(v) {
				var s int64
				if d.Decode(v, k, &s, "want an integer") {
					req.Seed = &s
				}
			}
		case "top_logprobs":
			req.TopLogprobs = d.Int32(v, k)
		case "logprobs":
			req.Logprobs = d.Bool(v, k)
		case "parallel_tool_calls":
			req.ParallelToolCalls = d.Bool(v, k)
		case "store":
			req.Store = d.Bool(v, k)
		case "stream":
			if b := d.Bool(v, k); b != nil {
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
			d.Strings(v, k, &req.Modalities, 8)
		case "reasoning_effort":
			d.Str(v, k, &req.ReasoningEffort)
		case "service_tier":
			d.Str(v, k, &req.ServiceTier)
		case "user":
			d.Str(v, k, &req.User)
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
				d.Fail(k, "not supported: %s", why)
			} else {
				d.Fail(jsonfield.Join("", k), "unknown field: mantle forwards every documented chat completions field and refuses others (provider-specific fields go in extra_body)")
			}
		}
		if d.Err != nil {
			return nil, d.Err
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
type decoder struct{ jsonfield.Decoder }

// invalid is a field error; field is the JSON path in the body, which the front door
// reports as the OpenAI error's param.
func invalid(field, format string, args ...any) error {
	return rpc.Invalid(field, format, args...)
}

func (d *decoder) streamOptions(v json.RawMessage) bool {
	if jsonfield.IsNull(v) {
		return false
	}
	m := d.Obj(v, "stream_options", "include_usage")
	var b bool
	if u, ok := m["include_usage"]; ok && !jsonfield.IsNull(u) {
		d.Decode(u, "stream_options.include_usage", &b, "want true or false")
	}
	return b
}

func (d *decoder) stop(v json.RawMessage) []string {
	if jsonfield.IsNull(v) || d.Err != nil {
		return nil
	}
	if v[0] == '"' { // a string (v is valid JSON)
		var one string
		d.Str(v, "stop", &one)
		return []string{one}
	}
	var list []string
	d.Strings(v, "stop", &list, MaxStop)
	return list
}

func (d *decoder) logitBias(v json.RawMessage) map[string]int32 {
	if jsonfield.IsNull(v) || d.Err != nil {
		return nil
	}
	var raw map[string]float64
	if !d.Decode(v, "logit_bias", &raw, "want an object of token ids to numbers") {
		return nil
	}
	if len(raw) > MaxLogitBias {
		d.Fail("logit_bias", "at most %d entries, got %d", MaxLogitBias, len(raw))
		return nil
	}
	out := make(map[string]int32, len(raw))
	for _, k := range slices.Sorted(maps.Keys(raw)) {
		b := raw[k]
		if b != math.Trunc(b) || b < -100 || b > 100 {
			d.Fail("logit_bias."+k, "want an integer in [-100, 100], got %g", b)
			return nil
		}
		out[k] = int32(b)
	}
	return out
}

func (d *decoder) metadata(v json.RawMessage) map[string]string {
	var m map[string]string
	if jsonfield.IsNull(v) || !d.Decode(v, "metadata", &m, "want an object of strings") {
		return nil
	}
	if len(m) > MaxMetadata {
		d.Fail("metadata", "at most %d entries, got %d", MaxMetadata, len(m))
	}
	return m
}

func (d *decoder) extraBody(v json.RawMessage) string {
	if jsonfield.IsNull(v) || d.Err != nil {
		return ""
	}
	m, err := d.Object(v, "extra_body")
	if err != nil {
		d.Err = err
		return ""
	}
	for _, k := range jsonfield.SortedKeys(m) {
		// A member that names a field mantle models would be sent twice, or override
		// what mantle checked (a model name, the stream flag).
		if slices.Contains(Forwarded, k) {
			d.Fail(jsonfield.Join("extra_body", k), "is a field mantle forwards itself: send it at the top level")
			return ""
		}
	}
	return string(jsonfield.Compact(v))
}

func (d *decoder) tools(v json.RawMessage) []*mantlev1.Tool {
	if jsonfield.IsNull(v) {
		return nil
	}
	list, ok := d.RawList(v, "tools", "want a list of tools")
	if !ok {
		return nil
	}
	if len(list) > MaxTools {
		d.Fail("tools", "at most %d tools, got %d", MaxTools, len(list))
		return nil
	}
	out := make([]*mantlev1.Tool, 0, len(list))
	for i, raw := range list {
		field := fmt.Sprintf("tools[%d]", i)
		m := d.Obj(raw, field, "type", "function")
		t := &mantlev1.Tool{}
		d.Str(m["type"], field+".type", &t.Type)
		if d.Err == nil && t.Type != "function" {
			d.Fail(field+".type", "want function, got %q", t.Type)
		}
		fn := d.Obj(jsonfield.OrNull(m["function"]), field+".function", "name", "description", "parameters", "strict")
		d.Str(fn["name"], field+".function.name", &t.Name)
		if d.Err == nil && t.Name == "" {
			d.Fail(field+".function.name", "required")
		}
		d.Str(fn["description"], field+".function.description", &t.Description)
		if p, ok := fn["parameters"]; ok && !jsonfield.IsNull(p) {
			if _, ok := jsonfield.OpenObject(p); !ok && d.Err == nil {
				_, d.Err = jsonfield.Object(p, field+".function.parameters") // its error
			}
			t.Parameters = string(jsonfield.Compact(p))
		}
		t.Strict = d.Bool(jsonfield.OrNull(fn["strict"]), field+".function.strict")
		if d.Err != nil {
			return nil
		}
		out = append(out, t)
	}
	return out
}

func (d *decoder) toolChoice(v json.RawMessage, req *routerv1.Request) {
	if jsonfield.IsNull(v) || d.Err != nil {
		return
	}
	if v[0] == '"' { // a string (v is valid JSON)
		var s string
		d.Str(v, "tool_choice", &s)
		if d.Err != nil {
			return
		}
		switch s {
		case "auto", "none", "required":
			req.ToolChoice = s
		default:
			d.Fail("tool_choice", "want auto, none, required or {\"type\":\"function\",\"function\":{\"name\":...}}, got %q", s)
		}
		return
	}
	m := d.Obj(v, "tool_choice", "type", "function")
	var typ string
	d.Str(m["type"], "tool_choice.type", &typ)
	if d.Err == nil && typ != "function" {
		d.Fail("tool_choice.type", "want function, got %q", typ)
	}
	fn := d.Obj(jsonfield.OrNull(m["function"]), "tool_choice.function", "name")
	d.Str(fn["name"], "tool_choice.function.name", &req.ToolChoiceFunction)
	if d.Err == nil && req.ToolChoiceFunction == "" {
		d.Fail("tool_choice.function.name", "required")
	}
	req.ToolChoice = "function"
}

func (d *decoder) responseFormat(v json.RawMessage) *mantlev1.ResponseFormat {
	if jsonfield.IsNull(v) || d.Err != nil {
		return nil
	}
	m := d.Obj(v, "response_format", "type", "json_schema")
	var typ string
	d.Str(m["type"], "response_format.type", &typ)
	if d.Err != nil {
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
		js := d.Obj(jsonfield.OrNull(m["json_schema"]), "response_format.json_schema", "name", "description", "schema", "strict")
		d.Str(js["name"], "response_format.json_schema.name", &rf.JsonSchemaName)
		d.Str(js["description"], "response_format.json_schema.description", &rf.JsonSchemaDescription)
		if s, ok := js["schema"]; ok && !jsonfield.IsNull(s) {
			rf.JsonSchema = string(jsonfield.Compact(s))
		}
		rf.JsonSchemaStrict = d.Bool(jsonfield.OrNull(js["strict"]), "response_format.json_schema.strict")
	default:
		d.Fail("response_format.type", "want text, json_object or json_schema, got %q", typ)
		return nil
	}
	if _, ok := m["json_schema"]; ok && rf.Type != mantlev1.ResponseFormat_TYPE_JSON_SCHEMA {
		d.Fail("response_format.json_schema", "only with type json_schema")
	}
	return rf
}

// messagePaths are the paths of the first messages, made once: every message needs its
// path at hand, but only an error uses it.
var messagePaths = func() (p [64]string) {
	for i := range p {
		p[i] = "messages[" + strconv.Itoa(i) + "]"
	}
	return p
}()

func messagePath(i int) string {
	if i < len(messagePaths) {
		return messagePaths[i]
	}
	return "messages[" + strconv.Itoa(i) + "]"
}

func (d *decoder) messages(v json.RawMessage) []*mantlev1.ChatMessage {
	if jsonfield.IsNull(v) {
		return nil
	}
	list, ok := d.RawList(v, "messages", "want a list of messages")
	if !ok {
		return nil
	}
	out := make([]*mantlev1.ChatMessage, 0, len(list))
	for i, raw := range list {
		field := messagePath(i)
		m := d.Obj(raw, field, "role", "content", "name", "tool_calls", "tool_call_id", "refusal")
		msg := &mantlev1.ChatMessage{}
		// A member's path is made only for a member present: most messages have two.
		for _, s := range []struct {
			key  string
			into *string
		}{{"role", &msg.Role}, {"name", &msg.Name}, {"tool_call_id", &msg.ToolCallId}, {"refusal", &msg.Refusal}} {
			if v, ok := m[s.key]; ok {
				if str, ok := jsonfield.PlainString(v); ok {
					*s.into = str // the usual case, without making the path
				} else {
					d.Str(v, field+"."+s.key, s.into)
				}
			}
		}
		if v := m["content"]; jsonfield.IsNull(v) {
			d.content(v, "", msg) // null: no path needed
		} else {
			d.content(v, field+".content", msg)
		}
		if v := m["tool_calls"]; !jsonfield.IsNull(v) {
			msg.ToolCalls = d.toolCalls(v, field+".tool_calls")
		}
		if d.Err != nil {
			return nil
		}
		out = append(out, msg)
	}
	return out
}

func (d *decoder) content(v json.RawMessage, field string, msg *mantlev1.ChatMessage) {
	if d.Err != nil {
		return
	}
	if jsonfield.IsNull(v) {
		msg.ContentNull = true
		return
	}
	if v[0] == '"' { // a string (v is valid JSON)
		d.Str(v, field, &msg.Content)
		return
	}
	list, ok := d.RawList(v, field, "want a string, null or a list of content parts")
	if !ok {
		return
	}
	if len(list) > MaxParts {
		d.Fail(field, "at most %d parts, got %d", MaxParts, len(list))
		return
	}
	msg.Parts = make([]*mantlev1.ContentPart, 0, len(list))
	for i, raw := range list {
		pf := fmt.Sprintf("%s[%d]", field, i)
		var head struct {
			Type string `json:"type"`
		}
		if !d.Decode(raw, pf, &head, "want a content part object") {
			return
		}
		p := &mantlev1.ContentPart{}
		switch head.Type {
		case "text":
			m := d.Obj(raw, pf, "type", "text")
			var s string
			d.Str(m["text"], pf+".text", &s)
			p.Part = &mantlev1.ContentPart_Text{Text: s}
		case "refusal":
			m := d.Obj(raw, pf, "type", "refusal")
			var s string
			d.Str(m["refusal"], pf+".refusal", &s)
			p.Part = &mantlev1.ContentPart_Refusal{Refusal: s}
		case "image_url":
			m := d.Obj(raw, pf, "type", "image_url")
			im := d.Obj(jsonfield.OrNull(m["image_url"]), pf+".image_url", "url", "detail")
			img := &mantlev1.ImagePart{}
			d.Str(im["url"], pf+".image_url.url", &img.Url)
			d.Str(im["detail"], pf+".image_url.detail", &img.Detail)
			if d.Err == nil && img.Url == "" {
				d.Fail(pf+".image_url.url", "required")
			}
			p.Part = &mantlev1.ContentPart_Image{Image: img}
		case "input_audio":
			m := d.Obj(raw, pf, "type", "input_audio")
			am := d.Obj(jsonfield.OrNull(m["input_audio"]), pf+".input_audio", "data", "format")
			a := &mantlev1.AudioPart{}
			d.Str(am["data"], pf+".input_audio.data", &a.Data)
			d.Str(am["format"], pf+".input_audio.format", &a.Format)
			p.Part = &mantlev1.ContentPart_InputAudio{InputAudio: a}
		case "file":
			m := d.Obj(raw, pf, "type", "file")
			fm := d.Obj(jsonfield.OrNull(m["file"]), pf+".file", "file_id", "filename", "file_data")
			f := &mantlev1.FilePart{}
			d.Str(fm["file_id"], pf+".file.file_id", &f.FileId)
			d.Str(fm["filename"], pf+".file.filename", &f.Filename)
			d.Str(fm["file_data"], pf+".file.file_data", &f.FileData)
			p.Part = &mantlev1.ContentPart_File{File: f}
		default:
			d.Fail(pf+".type", "want text, image_url, input_audio, file or refusal, got %q", head.Type)
		}
		if d.Err != nil {
			return
		}
		msg.Parts = append(msg.Parts, p)
	}
}

func (d *decoder) toolCalls(v json.RawMessage, field string) []*mantlev1.ToolCall {
	if jsonfield.IsNull(v) {
		return nil
	}
	list, ok := d.RawList(v, field, "want a list of tool calls")
	if !ok {
		return nil
	}
	if len(list) > MaxToolCalls {
		d.Fail(field, "at most %d tool calls, got %d", MaxToolCalls, len(list))
		return nil
	}
	out := make([]*mantlev1.ToolCall, 0, len(list))
	for i, raw := range list {
		f := fmt.Sprintf("%s[%d]", field, i)
		m := d.Obj(raw, f, "id", "type", "function")
		tc := &mantlev1.ToolCall{}
		d.Str(m["id"], f+".id", &tc.Id)
		d.Str(m["type"], f+".type", &tc.Type)
		fn := d.Obj(jsonfield.OrNull(m["function"]), f+".function", "name", "arguments")
		d.Str(fn["name"], f+".function.name", &tc.Name)
		d.Str(fn["arguments"], f+".function.arguments", &tc.Arguments)
		if d.Err != nil {
			return nil
		}
		out = append(out, tc)
	}
	return out
}
