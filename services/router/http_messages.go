package router

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mantle-mesh/mantle/pkg/anthropicapi"
	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	"github.com/mantle-mesh/mantle/pkg/jsonfield"
	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// This file is the Anthropic Messages API front door, POST /v1/messages: the request maps
// onto the same router request the chat completions door builds, and the answer, its
// stream events and its errors are in Anthropic's shapes.

// Headers of the Messages door. The mantle headers (x-mantle-budget-ms, -scenario,
// -priority, Idempotency-Key) work as on the chat completions door.
const (
	HeaderAnthropicVersion = "anthropic-version"
	HeaderAnthropicBeta    = "anthropic-beta"
	HeaderAPIKey           = "x-api-key"
)

// anthropicVersionForm is the form of anthropic-version values: a date. mantle speaks the
// 2023-06-01 shape whatever date is sent; the header is required, as Anthropic requires it.
var anthropicVersionForm = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}$`)

// messagesCredential is the Authorization value to log in with: the caller's Bearer, or
// its x-api-key, the header Anthropic's SDKs send. Both naming different keys is refused.
func messagesCredential(h http.Header) (string, error) {
	auth, key := h.Get("Authorization"), h.Get(HeaderAPIKey)
	switch {
	case key == "":
		return auth, nil
	case auth == "":
		return "Bearer " + key, nil
	}
	if token, ok := rpc.BearerToken(auth); !ok || token != key {
		return "", status.Error(codes.Unauthenticated, "x-api-key and Authorization name different keys: send one")
	}
	return auth, nil
}

// checkAnthropicHeaders refuses a request without a date-form anthropic-version, or with
// anthropic-beta: a beta changes what a request means, and mantle does not model any.
func checkAnthropicHeaders(h http.Header) error {
	if v := h.Get(HeaderAnthropicVersion); !anthropicVersionForm.MatchString(v) {
		if v == "" {
			return rpc.Invalid(HeaderAnthropicVersion, "header required (for example 2023-06-01)")
		}
		return rpc.Invalid(HeaderAnthropicVersion, "want a date such as 2023-06-01, got %q", abbreviateHeader(v))
	}
	if v := h.Get(HeaderAnthropicBeta); v != "" {
		return rpc.Invalid(HeaderAnthropicBeta, "not supported: mantle serves no beta features, got %q", abbreviateHeader(v))
	}
	return nil
}

func (f *frontDoor) messages(w http.ResponseWriter, r *http.Request) {
	arrived := f.router.deps.Clock.Now()
	credential, err := messagesCredential(r.Header)
	if err != nil {
		writeAnthropicError(w, err)
		return
	}
	writeAuthErr := writeAnthropicError
	if credential == "" {
		// The shared refusal names Authorization only; this door's callers send x-api-key.
		writeAuthErr = func(w http.ResponseWriter, _ error) {
			writeAnthropicError(w, status.Error(codes.Unauthenticated, "missing API key: send x-api-key: <key> or Authorization: Bearer <key>"))
		}
	}
	ctx, ok := f.login(w, r, credential, writeAuthErr)
	if !ok {
		return
	}
	if err := checkAnthropicHeaders(r.Header); err != nil {
		writeAnthropicError(w, toStatus(err))
		return
	}
	ctx, door := withDoor(ctx, arrived)
	// As on the chat door: refused before the body is read, priority errors reported below.
	priority, priorityErr := headerPriority(r.Header)
	release, err := f.router.admit(priority)
	if err != nil {
		writeCanned(w, anthropicOverloadedResponse)
		return
	}
	defer release()
	limit := int64(f.router.conf().MaxPromptBytes)*2 + 64<<10
	raw, berr := f.readBody(w, r, limit)
	if berr != nil {
		writeAnthropicJSON(w, berr.shape.statusOnAnthropic(), berr.shape.anthropic, berr.msg)
		return
	}
	mr, err := anthropicapi.DecodeMessagesRequest(raw)
	if err == nil {
		err = priorityErr
	}
	var req *routerv1.Request
	if err == nil {
		req, err = chatToProto(mr.Request, r.Header, priority)
	}
	if err != nil {
		writeAnthropicError(w, toStatus(err))
		return
	}
	budget, err := headerBudget(r.Header)
	if err != nil {
		writeAnthropicError(w, toStatus(err))
		return
	}
	if budget > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, budget)
		defer cancel()
	}
	if mr.Stream {
		f.streamMessages(ctx, w, req)
		return
	}
	door.storesAfter = true
	defer door.makeStores(f.router, w) // after the answer below is written
	resp, err := f.router.Complete(ctx, req)
	if err != nil {
		writeAnthropicError(w, toStatus(err))
		return
	}
	msg, err := messageJSON(resp)
	if err != nil {
		writeAnthropicError(w, err)
		return
	}
	setResponseHeaders(w, resp)
	writeJSONWithQuality(w, http.StatusOK, msg, resp.Quality, func(h http.Header) {
		setServerTiming(h, arrived, f.router.deps.Clock.Now(), resp.Quality)
	})
}

// messageJSON is resp as a Messages API answer.
func messageJSON(resp *routerv1.CompleteResponse) (anthropicapi.Message, error) {
	m := anthropicapi.Message{
		ID:      "msg_" + resp.Id,
		Type:    "message",
		Role:    "assistant",
		Model:   resp.Model,
		Content: []anthropicapi.ContentBlock{},
		Usage:   anthropicapi.Usage{InputTokens: resp.GetUsage().GetInputTokens(), OutputTokens: resp.GetUsage().GetOutputTokens()},
	}
	if c := resp.GetMessage().GetContent(); c != "" {
		m.Content = append(m.Content, anthropicapi.TextBlock(c))
	}
	for _, tc := range resp.GetMessage().GetToolCalls() {
		input, err := toolInput(tc.Arguments)
		if err != nil {
			return m, err
		}
		m.Content = append(m.Content, anthropicapi.ContentBlock{Type: "tool_use", ID: tc.Id, Name: tc.Name, Input: input})
	}
	m.StopReason, m.StopSequence = stopReason(resp.FinishReason, resp.StopSequence)
	return m, nil
}

// toolInput is a tool call's arguments as a tool_use block's input, which must be a JSON
// object: a model that wrote something else is an error, not an answer to reshape.
func toolInput(arguments string) (json.RawMessage, error) {
	if strings.TrimSpace(arguments) == "" {
		return json.RawMessage("{}"), nil
	}
	var m map[string]json.RawMessage
	if json.Unmarshal([]byte(arguments), &m) != nil || m == nil {
		return nil, status.Errorf(codes.Internal, "the model's tool call arguments are not a JSON object: %.80q", arguments)
	}
	return json.RawMessage(arguments), nil
}

// stopReason is a finish reason in Anthropic's words. OpenAI-type providers do not say
// whether a stop sequence ended the answer, so without stopSequence "stop" is end_turn.
func stopReason(finish, stopSequence string) (reason, sequence *string) {
	r := "end_turn"
	switch finish {
	case "stop":
		if stopSequence != "" {
			r = "stop_sequence"
			sequence = &stopSequence
		}
	case "length":
		r = "max_tokens"
	case "tool_calls":
		r = "tool_use"
	case "content_filter":
		r = "refusal"
	}
	return &r, sequence
}

// writeAnthropicError renders a gRPC status as Anthropic's error JSON, with the status
// and type errorShapeOf gives and Retry-After as on the chat door.
func writeAnthropicError(w http.ResponseWriter, err error) {
	st := status.Convert(err)
	shape := errorShapeOf(err)
	setRetryAfter(w, err)
	body := anthropicapi.Error{Type: "error", Error: anthropicapi.ErrorDetail{Type: shape.anthropic, Message: st.Message()}}
	// A request that failed after it was admitted says what it tried, as an answer would.
	if qc := FailedQuality(err); qc != nil {
		w.Header().Set(HeaderRequestID, qc.GetRequestId())
		writeJSONWithQuality(w, shape.statusOnAnthropic(), body, qc, nil)
		return
	}
	writeJSON(w, shape.statusOnAnthropic(), body)
}

func writeAnthropicJSON(w http.ResponseWriter, httpStatus int, typ, msg string) {
	writeJSON(w, httpStatus, anthropicapi.Error{Type: "error", Error: anthropicapi.ErrorDetail{Type: typ, Message: msg}})
}

// anthropicOverloadedResponse is overloadedResponse in Anthropic's shape.
var anthropicOverloadedResponse = func() *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	writeAnthropicError(w, errOverloaded)
	return w
}()

// messagesStream writes a routed stream as Messages API events. Anthropic's streams have
// one content block open at a time, while OpenAI-type providers may interleave the pieces
// of parallel tool calls; so one block is live (its pieces relayed as they come) and the
// others wait, their pieces kept, until it closes. A tool block closes when another block
// has pieces and its arguments are complete JSON, an object as tool arguments are (nothing
// but white space could follow; jsonfield.Completion finds that out reading each piece
// once), or at the end; a text block closes when a tool call begins.
type messagesStream struct {
	send   func(event string, v any) error
	blocks []*streamBlock
	// live is the open block, nil when none; next is the wire index of the next block.
	live *streamBlock
	next int
}

type streamBlock struct {
	tool    bool
	index   int // the provider's tool call index
	id      string
	name    strings.Builder
	wire    int
	closed  bool
	pending strings.Builder      // pieces not yet sent
	args    jsonfield.Completion // the arguments so far, for a tool block
}

// text adds streamed text.
func (s *messagesStream) text(t string) error {
	if t == "" {
		return nil
	}
	if s.live != nil && !s.live.tool {
		return s.delta(s.live, t)
	}
	// A waiting text block takes it; else a new one.
	for _, b := range s.blocks {
		if !b.tool && !b.closed && b != s.live {
			b.pending.WriteString(t)
			return nil
		}
	}
	b := &streamBlock{}
	b.pending.WriteString(t)
	s.blocks = append(s.blocks, b)
	if s.live == nil {
		return s.open(b)
	}
	return nil
}

// tool adds a piece of tool call d.Index.
func (s *messagesStream) tool(d provider.ToolCallDelta) error {
	var b *streamBlock
	for _, x := range s.blocks {
		if x.tool && x.index == d.Index {
			b = x
		}
	}
	if b == nil {
		b = &streamBlock{tool: true, index: d.Index}
		s.blocks = append(s.blocks, b)
	}
	if b.closed {
		if strings.TrimSpace(d.Arguments) == "" && d.ID == "" && d.Name == "" {
			return nil // white space after complete arguments means nothing
		}
		return fmt.Errorf("tool call %d went on after its arguments were complete", d.Index)
	}
	if d.ID != "" {
		b.id = d.ID
	}
	b.name.WriteString(d.Name)
	b.args.Write(d.Arguments)
	if b == s.live {
		return s.delta(b, d.Arguments)
	}
	b.pending.WriteString(d.Arguments)
	if s.live != nil && (!s.live.tool || s.live.args.Complete()) {
		if err := s.closeLive(); err != nil {
			return err
		}
	}
	if s.live == nil {
		return s.openNext()
	}
	return nil
}

func (s *messagesStream) open(b *streamBlock) error {
	b.wire = s.next
	s.next++
	s.live = b
	start := anthropicapi.BlockStart{Type: "content_block_start", Index: b.wire, ContentBlock: anthropicapi.TextBlock("")}
	if b.tool {
		start.ContentBlock = anthropicapi.ContentBlock{Type: "tool_use", ID: b.id, Name: b.name.String(), Input: json.RawMessage("{}")}
	}
	if err := s.send(start.Type, start); err != nil {
		return err
	}
	p := b.pending.String()
	b.pending.Reset()
	return s.delta(b, p)
}

func (s *messagesStream) delta(b *streamBlock, piece string) error {
	if piece == "" {
		return nil
	}
	d := anthropicapi.BlockDelta{Type: "content_block_delta", Index: b.wire, Delta: anthropicapi.Delta{Type: "text_delta", Text: &piece}}
	if b.tool {
		d.Delta = anthropicapi.Delta{Type: "input_json_delta", PartialJSON: &piece}
	}
	return s.send(d.Type, d)
}

func (s *messagesStream) closeLive() error {
	b := s.live
	s.live = nil
	b.closed = true
	return s.send("content_block_stop", anthropicapi.BlockStop{Type: "content_block_stop", Index: b.wire})
}

// openNext opens the first waiting block, if any.
func (s *messagesStream) openNext() error {
	for _, b := range s.blocks {
		if !b.closed && b != s.live {
			return s.open(b)
		}
	}
	return nil
}

// finish closes every block, the waiting ones opened and closed in turn.
func (s *messagesStream) finish() error {
	for {
		if s.live != nil {
			if err := s.closeLive(); err != nil {
				return err
			}
		}
		if err := s.openNext(); err != nil {
			return err
		}
		if s.live == nil {
			return nil
		}
	}
}

func (f *frontDoor) streamMessages(ctx context.Context, w http.ResponseWriter, req *routerv1.Request) {
	rc := http.NewResponseController(w)
	started := false
	id := "msg_" + rpc.RequestID(ctx)
	// One buffer for every event of the stream: a delta per piece of text.
	var out, data []byte
	// hold keeps the events of a delta in the connection's buffer: they go out in one
	// write when the delta ends, or with the next delta's when it follows at once
	// (Delta.More).
	hold := false
	writeEvent := func(event string, b []byte) error {
		out = append(append(append(out[:0], "event: "...), event...), "\ndata: "...)
		out = append(append(out, b...), "\n\n"...)
		if _, err := w.Write(out); err != nil || hold {
			return err
		}
		return rc.Flush()
	}
	send := func(event string, v any) error {
		if d, ok := v.(anthropicapi.BlockDelta); ok {
			data = d.AppendJSON(data[:0])
			return writeEvent(event, data)
		}
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		return writeEvent(event, b)
	}
	s := &messagesStream{send: send}
	begin := func(model string) error {
		started = true
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		start := anthropicapi.MessageStart{Type: "message_start", Message: anthropicapi.Message{
			ID: id, Type: "message", Role: "assistant", Model: model, Content: []anthropicapi.ContentBlock{},
		}}
		return send(start.Type, start)
	}
	final, err := f.router.Stream(ctx, req, func(d Delta) error {
		hold = true
		defer func() { hold = false }()
		if !started {
			// As on the chat door: headers go out with the first delta; the quality
			// context, known only at the end, travels in message_delta's mantle member.
			w.Header().Set(HeaderFallbackLevel, ShortLevel(d.Level))
			w.Header().Set(HeaderCache, cacheHeader(d.Cached, d.Stale))
			if d.Replayed {
				w.Header().Set(HeaderReplayed, "true")
			}
			w.WriteHeader(http.StatusOK)
			if err := begin(d.Model); err != nil {
				return err
			}
		}
		if err := s.text(d.Content); err != nil {
			return err
		}
		for _, tc := range d.ToolCalls {
			if err := s.tool(tc); err != nil {
				return err
			}
		}
		if d.More {
			return nil
		}
		return rc.Flush()
	})
	if err == nil {
		for _, tc := range final.GetMessage().GetToolCalls() {
			if _, ierr := toolInput(tc.Arguments); ierr != nil {
				err = ierr
				break
			}
		}
	}
	if err != nil {
		if !started {
			writeAnthropicError(w, toStatus(err))
			return
		}
		st := status.Convert(toStatus(err))
		_ = send("error", anthropicapi.Error{Type: "error", Error: anthropicapi.ErrorDetail{Type: errorShapeOf(st.Err()).anthropic, Message: st.Message()}})
		return
	}
	if !started {
		// A cached answer with empty content, or a provider that sent nothing: still a
		// well-formed stream.
		setResponseHeaders(w, final)
		w.WriteHeader(http.StatusOK)
		_ = begin(final.Model)
	}
	if s.finish() != nil {
		return
	}
	reason, seq := stopReason(final.FinishReason, final.StopSequence)
	md := anthropicapi.MessageDelta{Type: "message_delta",
		Delta: anthropicapi.MessageDeltaDelta{StopReason: reason, StopSequence: seq},
		Usage: anthropicapi.Usage{InputTokens: final.GetUsage().GetInputTokens(), OutputTokens: final.GetUsage().GetOutputTokens()},
	}
	if b, err := withQuality(md, final.Quality); err == nil {
		_ = writeEvent(md.Type, b)
	} else {
		_ = send(md.Type, md)
	}
	_ = send("message_stop", anthropicapi.MessageStop{Type: "message_stop"})
}
