package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/agent/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/jsonfield"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// This file serves the agent's tool gateway to MCP clients: POST /mcp speaks MCP's
// streamable HTTP transport in stateless mode (every request stands alone, so any router
// replica answers any request and no session is held between requests), with JSON
// answers rather than event streams. tools/list is the tenant's ListTools and tools/call
// the tenant's CallTool, under the same tenant keys as /v1/tools.

// MCPPath is where the MCP endpoint is served.
const MCPPath = "/mcp"

// maxMCPBodyBytes bounds an MCP request's body: a JSON-RPC message holding one tool call,
// whose arguments the agent bounds further (agent.max_argument_bytes).
const maxMCPBodyBytes = maxToolCallBytes + 64<<10

// maxMCPInFlight bounds the MCP requests one router serves at once; beyond it a request
// is answered 503 overloaded at once rather than queued.
const maxMCPInFlight = 256

// Keys of _meta that tools/call reads (the call's idempotency key, session and step) and
// that its result carries (where the result came from). Keys under "mantle/" other than
// these are refused by name.
const (
	MCPMetaIdempotencyKey  = "mantle/idempotency_key"
	MCPMetaSessionID       = "mantle/session_id"
	MCPMetaStepID          = "mantle/step_id"
	MCPMetaStatus          = "mantle/status"
	MCPMetaKind            = "mantle/kind"
	MCPMetaAnsweredBy      = "mantle/answered_by"
	MCPMetaNotice          = "mantle/notice"
	MCPMetaStaleAgeSeconds = "mantle/stale_age_seconds"
	MCPMetaConfirmationID  = "mantle/confirmation_id"
	MCPMetaErrorReason     = "mantle/error_reason"
	mcpMetaPrefix          = "mantle/"
)

// mcpCall is what the HTTP request gives the MCP handlers beyond the tenant: the SDK runs
// them under a context that keeps the request's values but not its cancellation, so the
// request's context travels as a value and ends the call when the caller goes away.
type mcpCall struct {
	done   context.Context
	budget time.Duration
	// budgetFrom says where the budget came from, for the error that says it ran out.
	budgetFrom string
}

type mcpCallKey struct{}

// registerMCP adds POST /mcp to mux.
func (f *frontDoor) registerMCP(mux *http.ServeMux) {
	server := mcp.NewServer(&mcp.Implementation{Name: "mantle", Title: "mantle tool gateway", Version: "1"}, &mcp.ServerOptions{
		Instructions: "Tools of the mantle tool gateway. Action tools run at most once per idempotency key " +
			"(_meta mantle/idempotency_key, or mantle/session_id with mantle/step_id); a result's _meta " +
			"mantle/status says where it came from (ok, backup, stale, cached, replayed, pending_confirmation).",
		// Tools come from the agent at each request, never registered here: declare them.
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}},
	})
	server.AddReceivingMiddleware(f.mcpTools)
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{
		Stateless:           true,
		JSONResponse:        true,
		MaxRequestBodyBytes: maxMCPBodyBytes,
		// DNS rebinding protection is for servers that trust whoever reaches them on
		// loopback; with tenant keys every request carries its credential, and a proxy on
		// loopback (a sidecar) forwards other Host headers.
		DisableLocalhostProtection: f.auth.Enabled(),
	})
	slots := make(chan struct{}, maxMCPInFlight)
	mux.Handle("POST "+MCPPath, f.traced(MCPPath, func(w http.ResponseWriter, r *http.Request) {
		ctx, ok := f.authenticate(w, r)
		if !ok {
			return
		}
		if f.router.deps.Tools == nil {
			writeError(w, errNoTools())
			return
		}
		budget, err := headerBudget(r.Header)
		if err != nil {
			writeError(w, toStatus(err))
			return
		}
		budgetFrom := "the " + HeaderBudget + " header"
		if budget == 0 {
			budget, budgetFrom = f.router.conf().DefaultBudget, "router.default_budget"
		}
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
		default:
			writeOverloaded(w)
			return
		}
		ctx = context.WithValue(ctx, mcpCallKey{}, &mcpCall{done: r.Context(), budget: budget, budgetFrom: budgetFrom})
		handler.ServeHTTP(w, r.WithContext(ctx))
	}))
}

// mcpTools answers tools/list and tools/call from the agent; every other method is the
// SDK's (initialize, ping...).
func (f *frontDoor) mcpTools(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch method {
		case "tools/list":
			ctx, done, err := mcpContext(ctx)
			if err != nil {
				return nil, err
			}
			defer done()
			return f.mcpListTools(ctx)
		case "tools/call":
			call, ok := req.(*mcp.CallToolRequest)
			if !ok {
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("tools/call: unexpected request %T", req)}
			}
			ctx, done, err := mcpContext(ctx)
			if err != nil {
				return nil, err
			}
			defer done()
			return f.mcpCallTool(ctx, call)
		}
		return next(ctx, method, req)
	}
}

// mcpContext is the context of a call to the agent: the request's values, its budget,
// and the HTTP request's cancellation.
func mcpContext(ctx context.Context) (context.Context, func(), error) {
	call, ok := ctx.Value(mcpCallKey{}).(*mcpCall)
	if !ok {
		return nil, nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the MCP request lost its HTTP context"}
	}
	ctx, cancel := context.WithTimeout(ctx, call.budget)
	stop := context.AfterFunc(call.done, cancel)
	return ctx, func() { stop(); cancel() }, nil
}

func (f *frontDoor) mcpListTools(ctx context.Context) (*mcp.ListToolsResult, error) {
	resp, err := f.router.deps.Tools.ListTools(ctx, &agentv1.ListToolsRequest{})
	if err != nil {
		st := status.Convert(err)
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "tools/list: " + reasonOf(err) + ": " + st.Message()}
	}
	out := &mcp.ListToolsResult{Tools: []*mcp.Tool{}}
	for _, t := range resp.GetTools() {
		kind := ToolKindName(t.GetKind())
		tool := &mcp.Tool{
			Name: t.GetName(), Description: t.GetDescription(), InputSchema: json.RawMessage(t.GetInputSchema()),
			Annotations: mcpAnnotations(t.GetKind()), Meta: mcp.Meta{MCPMetaKind: kind},
		}
		// MCP's output schemas describe structuredContent, which is an object.
		if s := t.GetOutputSchema(); s != "" && objectSchema(s) {
			tool.OutputSchema = json.RawMessage(s)
		}
		out.Tools = append(out.Tools, tool)
	}
	return out, nil
}

// objectSchema reports whether a JSON Schema describes objects only.
func objectSchema(s string) bool {
	var v struct {
		Type any `json:"type"`
	}
	return json.Unmarshal([]byte(s), &v) == nil && v.Type == "object"
}

// mcpAnnotations are the hints MCP clients show for a tool's kind: queries only read,
// actions change the world and are made idempotent by their key, external tools reach a
// third party.
func mcpAnnotations(k agentv1.ToolKind) *mcp.ToolAnnotations {
	yes, no := true, false
	switch k {
	case agentv1.ToolKind_TOOL_KIND_QUERY:
		return &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: &no}
	case agentv1.ToolKind_TOOL_KIND_EXTERNAL:
		return &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: &yes}
	case agentv1.ToolKind_TOOL_KIND_ACTION:
		return &mcp.ToolAnnotations{DestructiveHint: &yes, IdempotentHint: true}
	}
	return nil
}

// mcpCallIDs are the idempotency key, session and step of a call: from _meta or the HTTP
// headers (x-mantle-session, x-mantle-step, Idempotency-Key); both given must agree.
func mcpCallIDs(meta mcp.Meta, h http.Header) (key, session, step string, err error) {
	fromMeta := map[string]string{}
	for k, v := range meta {
		if !strings.HasPrefix(k, mcpMetaPrefix) {
			continue // the protocol's own keys (progressToken...)
		}
		switch k {
		case MCPMetaIdempotencyKey, MCPMetaSessionID, MCPMetaStepID:
		default:
			return "", "", "", fmt.Errorf("_meta %s: unknown key: tools/call takes %s, %s and %s", k, MCPMetaIdempotencyKey, MCPMetaSessionID, MCPMetaStepID)
		}
		s, ok := v.(string)
		if !ok {
			return "", "", "", fmt.Errorf("_meta %s: must be a string", k)
		}
		fromMeta[k] = s
	}
	pick := func(metaKey, header string) (string, error) {
		hv := h.Get(header)
		if !utf8.ValidString(hv) {
			return "", fmt.Errorf("header %s: must be UTF-8 text", header)
		}
		mv, ok := fromMeta[metaKey]
		if ok && hv != "" && hv != mv {
			return "", fmt.Errorf("_meta %s differs from the %s header", metaKey, header)
		}
		if ok {
			return mv, nil
		}
		return hv, nil
	}
	if key, err = pick(MCPMetaIdempotencyKey, "Idempotency-Key"); err != nil {
		return "", "", "", err
	}
	if session, err = pick(MCPMetaSessionID, HeaderSession); err != nil {
		return "", "", "", err
	}
	if step, err = pick(MCPMetaStepID, HeaderStep); err != nil {
		return "", "", "", err
	}
	return key, session, step, nil
}

func (f *frontDoor) mcpCallTool(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	p := req.Params
	if p == nil || p.Name == "" {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "tools/call: name is required"}
	}
	var h http.Header
	if req.Extra != nil {
		h = req.Extra.Header
	}
	key, session, step, err := mcpCallIDs(p.Meta, h)
	if err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "tools/call: " + err.Error()}
	}
	args, err := argumentsText(p.Arguments)
	if err != nil {
		return mcpErrorResult(toStatus(err)), nil
	}
	resp, err := f.router.deps.Tools.CallTool(ctx, &agentv1.CallToolRequest{
		Name: p.Name, Arguments: args, IdempotencyKey: key, SessionId: session, StepId: step,
		Quality: &mantlev1.QualityContext{RequestId: rpc.RequestID(ctx), TraceId: rpc.TraceID(ctx), Tenant: rpc.Tenant(ctx)},
	})
	if err != nil {
		if spent := budgetSpent(ctx, p.Name, err); spent != nil {
			return mcpErrorResult(spent), nil
		}
		if status.Code(err) == codes.NotFound {
			// An unknown tool is the client's mistake, not the tool's: a protocol error.
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: status.Convert(err).Message()}
		}
		return mcpErrorResult(err), nil
	}
	return mcpResult(resp), nil
}

// budgetSpent is the error of a call that the caller's budget ended, naming the budget
// and where it came from, so that a model (or its framework) tells a tool slower than the
// budget from a broken one; nil when the call failed otherwise. The budget's deadline
// cancels the call to the agent, and with it the agent's call to the backend.
func budgetSpent(ctx context.Context, tool string, err error) error {
	call, ok := ctx.Value(mcpCallKey{}).(*mcpCall)
	if !ok || call.done.Err() != nil {
		return nil // the caller went away: nobody reads the answer
	}
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) && status.Code(err) != codes.DeadlineExceeded {
		return nil
	}
	return rpc.Status(codes.DeadlineExceeded, errorDomain, ReasonDeadlineExceeded,
		fmt.Sprintf("tool %s did not answer within the call's budget of %s (%s); the call was cancelled", tool, call.budget, call.budgetFrom))
}

// mcpErrorResult is a failed call as a tool result with isError, so that the model reads
// why (the field that failed, when to retry) and can correct itself.
func mcpErrorResult(err error) *mcp.CallToolResult {
	st := status.Convert(err)
	reason := reasonOf(err)
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", reason, st.Message())
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				fmt.Fprintf(&b, "\nfield %s: %s", v.GetField(), v.GetDescription())
			}
		case *errdetails.RetryInfo:
			fmt.Fprintf(&b, "\nretry after %s", d.GetRetryDelay().AsDuration())
		}
	}
	return &mcp.CallToolResult{
		IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: b.String()}},
		Meta: mcp.Meta{MCPMetaErrorReason: reason},
	}
}

// mcpResult is a tool's answer as MCP's CallToolResult: the result as text (and as
// structuredContent when it is an object), where it came from in _meta, and a note for
// the model whenever it is not a fresh answer of this call.
func mcpResult(resp *agentv1.CallToolResponse) *mcp.CallToolResult {
	st := ToolStatusName(resp.GetStatus())
	meta := mcp.Meta{MCPMetaStatus: st, MCPMetaKind: ToolKindName(resp.GetKind())}
	if v := resp.GetAnsweredBy(); v != "" {
		meta[MCPMetaAnsweredBy] = v
	}
	if v := resp.GetIdempotencyKey(); v != "" {
		meta[MCPMetaIdempotencyKey] = v
	}
	if v := resp.GetConfirmationId(); v != "" {
		meta[MCPMetaConfirmationID] = v
	}
	if v := resp.GetNotice(); v != "" {
		meta[MCPMetaNotice] = v
	}
	if resp.GetStaleAge() != nil {
		meta[MCPMetaStaleAgeSeconds] = resp.GetStaleAge().AsDuration().Seconds()
	}
	out := &mcp.CallToolResult{IsError: resp.GetIsError(), Meta: meta, Content: []mcp.Content{}}
	if r := resp.GetResult(); r != "" {
		out.Content = append(out.Content, &mcp.TextContent{Text: r})
		if !resp.GetIsError() && strings.HasPrefix(strings.TrimSpace(r), "{") && jsonfield.Valid([]byte(r)) {
			out.StructuredContent = json.RawMessage(r)
		}
	}
	if note := statusNote(resp); note != "" {
		out.Content = append(out.Content, &mcp.TextContent{Text: note})
	}
	return out
}

// statusNote is the sentence that tells the model a result is not this call's fresh
// answer; "" when it is.
func statusNote(resp *agentv1.CallToolResponse) string {
	var note string
	switch resp.GetStatus() {
	case agentv1.ToolCallStatus_TOOL_CALL_STATUS_STALE:
		note = "mantle: stale result: every backend failed; this is the last good result of the same call"
	case agentv1.ToolCallStatus_TOOL_CALL_STATUS_PENDING_CONFIRMATION:
		note = "mantle: pending_confirmation: the action's outcome is unknown and a person confirms whether it happened (confirmation " +
			resp.GetConfirmationId() + "); do not call it again under another idempotency key"
	case agentv1.ToolCallStatus_TOOL_CALL_STATUS_REPLAYED:
		note = "mantle: replayed: the recorded result of an earlier call with idempotency key " + resp.GetIdempotencyKey() + "; the tool did not run again"
	case agentv1.ToolCallStatus_TOOL_CALL_STATUS_BACKUP:
		note = "mantle: backup: the tool failed and its backup " + resp.GetAnsweredBy() + " answered"
	}
	if n := resp.GetNotice(); n != "" {
		if note == "" {
			return "mantle: " + n
		}
		note += "; " + n
	}
	return note
}
