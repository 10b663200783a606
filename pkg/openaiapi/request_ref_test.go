package openaiapi

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"unicode/utf8"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/jsonfield"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// refDecodeChatRequest is DecodeChatRequest as it was, on json.Unmarshal throughout: the
// reference the one-pass decoder must match on every body. It decodes an OpenAI chat completions request body. Every documented
// field is decoded; a field that is not documented, or that mantle does not forward
// (Refused), is an error naming it (an *rpc.ValidationError whose field is the JSON path). Size is the caller's to bound; nesting is bounded here by the
// shape: no member is decoded deeper than the API defines, and free-form members (tool
// parameters, json_schema schemas, extra_body) are kept as raw JSON.
func refDecodeChatRequest(body []byte) (*ChatRequest, error) {
	// encoding/json would turn invalid bytes into U+FFFD in strings and keep them in raw
	// values (a JSON schema, extra_body), so a request could reach a provider changed, or
	// not marshal at all.
	if !utf8.Valid(body) {
		return nil, rpc.Invalid("body", "the body is not valid UTF-8")
	}
	top, err := jsonfield.Object(body, "")
	if err != nil {
		return nil, err
	}
	out := &ChatRequest{Request: &routerv1.Request{}}
	req := out.Request
	d := refDecoder{}
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
type refDecoder struct{ refFieldDecoder }

func (d *refDecoder) streamOptions(v json.RawMessage) bool {
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

func (d *refDecoder) stop(v json.RawMessage) []string {
	if jsonfield.IsNull(v) || d.Err != nil {
		return nil
	}
	var one string
	if json.Unmarshal(v, &one) == nil {
		return []string{one}
	}
	var list []string
	d.Strings(v, "stop", &list, MaxStop)
	return list
}

func (d *refDecoder) logitBias(v json.RawMessage) map[string]int32 {
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

func (d *refDecoder) metadata(v json.RawMessage) map[string]string {
	var m map[string]string
	if jsonfield.IsNull(v) || !d.Decode(v, "metadata", &m, "want an object of strings") {
		return nil
	}
	if len(m) > MaxMetadata {
		d.Fail("metadata", "at most %d entries, got %d", MaxMetadata, len(m))
	}
	return m
}

func (d *refDecoder) extraBody(v json.RawMessage) string {
	if jsonfield.IsNull(v) || d.Err != nil {
		return ""
	}
	m, err := jsonfield.Object(v, "extra_body")
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

func (d *refDecoder) tools(v json.RawMessage) []*mantlev1.Tool {
	var list []json.RawMessage
	if jsonfield.IsNull(v) || !d.Decode(v, "tools", &list, "want a list of tools") {
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
			if _, err := jsonfield.Object(p, field+".function.parameters"); err != nil && d.Err == nil {
				d.Err = err
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

func (d *refDecoder) toolChoice(v json.RawMessage, req *routerv1.Request) {
	if jsonfield.IsNull(v) || d.Err != nil {
		return
	}
	var s string
	if json.Unmarshal(v, &s) == nil {
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

func (d *refDecoder) responseFormat(v json.RawMessage) *mantlev1.ResponseFormat {
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

func (d *refDecoder) messages(v json.RawMessage) []*mantlev1.ChatMessage {
	var list []json.RawMessage
	if jsonfield.IsNull(v) || !d.Decode(v, "messages", &list, "want a list of messages") {
		return nil
	}
	out := make([]*mantlev1.ChatMessage, 0, len(list))
	for i, raw := range list {
		field := fmt.Sprintf("messages[%d]", i)
		m := d.Obj(raw, field, "role", "content", "name", "tool_calls", "tool_call_id", "refusal")
		msg := &mantlev1.ChatMessage{}
		// A member's path is made only for a member present: most messages have two.
		for _, s := range []struct {
			key  string
			into *string
		}{{"role", &msg.Role}, {"name", &msg.Name}, {"tool_call_id", &msg.ToolCallId}, {"refusal", &msg.Refusal}} {
			if v, ok := m[s.key]; ok {
				d.Str(v, field+"."+s.key, s.into)
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

func (d *refDecoder) content(v json.RawMessage, field string, msg *mantlev1.ChatMessage) {
	if d.Err != nil {
		return
	}
	if jsonfield.IsNull(v) {
		msg.ContentNull = true
		return
	}
	if text, ok := jsonfield.PlainString(v); ok {
		msg.Content = text
		return
	}
	if json.Unmarshal(v, &msg.Content) == nil {
		return
	}
	var list []json.RawMessage
	if !d.Decode(v, field, &list, "want a string, null or a list of content parts") {
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

func (d *refDecoder) toolCalls(v json.RawMessage, field string) []*mantlev1.ToolCall {
	var list []json.RawMessage
	if jsonfield.IsNull(v) || !d.Decode(v, field, &list, "want a list of tool calls") {
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

// refFieldDecoder is jsonfield.Decoder as it was; it holds the first error; every method is a no-op after it.
type refFieldDecoder struct {
	Err error
	// Refused names keys that Obj refuses with a reason ("not supported: ...") instead of
	// as unknown fields.
	Refused map[string]string
}

// Fail records a field error unless one is recorded already.
func (d *refFieldDecoder) Fail(field, format string, args ...any) {
	if d.Err == nil {
		d.Err = rpc.Invalid(field, format, args...)
	}
}

// Decode unmarshals v into into, failing field with want when it does not fit.
func (d *refFieldDecoder) Decode(v json.RawMessage, field string, into any, want string) bool {
	if d.Err != nil {
		return false
	}
	if err := json.Unmarshal(v, into); err != nil {
		d.Fail(field, "%s, got %s", want, jsonfield.Shorten(v))
		return false
	}
	return true
}

// Str decodes a string; null leaves into as it is.
func (d *refFieldDecoder) Str(v json.RawMessage, field string, into *string) {
	if d.Err != nil {
		return
	}
	if s, ok := jsonfield.PlainString(v); ok {
		*into = s
		return
	}
	if !jsonfield.IsNull(v) {
		d.Decode(v, field, into, "want a string")
	}
}

// Float decodes a number; nil for null or an error.
func (d *refFieldDecoder) Float(v json.RawMessage, field string) *float64 {
	var f float64
	if jsonfield.IsNull(v) || !d.Decode(v, field, &f, "want a number") {
		return nil
	}
	return &f
}

// Int32 decodes an integer; nil for null or an error.
func (d *refFieldDecoder) Int32(v json.RawMessage, field string) *int32 {
	var n int32
	if jsonfield.IsNull(v) || !d.Decode(v, field, &n, "want an integer") {
		return nil
	}
	return &n
}

// Bool decodes true or false; nil for null or an error.
func (d *refFieldDecoder) Bool(v json.RawMessage, field string) *bool {
	var b bool
	if jsonfield.IsNull(v) || !d.Decode(v, field, &b, "want true or false") {
		return nil
	}
	return &b
}

// Strings decodes a list of at most limit strings.
func (d *refFieldDecoder) Strings(v json.RawMessage, field string, into *[]string, limit int) {
	if jsonfield.IsNull(v) || !d.Decode(v, field, into, "want a list of strings") {
		return
	}
	if len(*into) > limit {
		d.Fail(field, "at most %d entries, got %d", limit, len(*into))
	}
}

// List decodes v as a JSON list of at most limit members.
func (d *refFieldDecoder) List(v json.RawMessage, field, what string, limit int) []json.RawMessage {
	var l []json.RawMessage
	if jsonfield.IsNull(v) || !d.Decode(v, field, &l, "want a list of "+what) {
		return nil
	}
	if len(l) > limit {
		d.Fail(field, "at most %d %s, got %d", limit, what, len(l))
		return nil
	}
	return l
}

// Obj decodes v as an object for field, checking that its keys are among allowed; a key of
// Refused is refused with its reason, any other as unknown.
func (d *refFieldDecoder) Obj(v json.RawMessage, field string, allowed ...string) map[string]json.RawMessage {
	if d.Err != nil {
		return nil
	}
	m, err := jsonfield.Object(v, field)
	if err != nil {
		d.Err = err
		return nil
	}
	// Sorting the keys (so that the first error is the same every time) is for an object
	// with a key to refuse; most have none.
	if refAllAllowed(m, allowed) {
		return m
	}
	for _, k := range jsonfield.SortedKeys(m) {
		if slices.Contains(allowed, k) {
			continue
		}
		if why, ok := d.Refused[k]; ok {
			d.Fail(jsonfield.Join(field, k), "not supported: %s", why)
		} else {
			d.Fail(jsonfield.Join(field, k), "unknown field (want one of %s)", strings.Join(allowed, ", "))
		}
		return nil
	}
	return m
}

func refAllAllowed(m map[string]json.RawMessage, allowed []string) bool {
	for k := range m {
		if !slices.Contains(allowed, k) {
			return false
		}
	}
	return true
}
