package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"

	"google.golang.org/grpc/codes"

	agentv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/agent/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/jsonfield"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// maxToolCallBytes bounds the body of POST /v1/tools/{name}/call; the agent bounds the
// arguments within it (agent.max_argument_bytes).
const maxToolCallBytes = 1 << 20

// HeaderToolStatus says where a tool call's result came from: ok, backup, stale, cached,
// replayed or pending_confirmation.
const HeaderToolStatus = "x-mantle-tool-status"

// registerTools serves the agent's tool gateway on the HTTP door: GET /v1/tools,
// POST /v1/tools/{name}/call and MCP's POST /mcp, with tenant keys as the other endpoints
// take them.
func (f *frontDoor) registerTools(mux *http.ServeMux) {
	mux.Handle("GET /v1/tools", f.traced("/v1/tools", f.listTools))
	mux.Handle("POST /v1/tools/{name}/call", f.traced("/v1/tools/{name}/call", f.callTool))
	f.registerMCP(mux)
}

// errNoTools answers the tool endpoints of a router without an agent.
func errNoTools() error {
	return rpc.Status(codes.NotFound, errorDomain, "TOOLS_OFF", "tools are not served here: router.agent_address is off")
}

// toolJSON is a tool as GET /v1/tools lists it.
type toolJSON struct {
	Name         string          `json:"name"`
	Description  string          `json:"description,omitempty"`
	Kind         string          `json:"kind"`
	InputSchema  json.RawMessage `json:"input_schema"`
	OutputSchema json.RawMessage `json:"output_schema,omitempty"`
}

func (f *frontDoor) listTools(w http.ResponseWriter, r *http.Request) {
	ctx, ok := f.authenticate(w, r)
	if !ok {
		return
	}
	tools := f.router.deps.Tools
	if tools == nil {
		writeError(w, errNoTools())
		return
	}
	resp, err := tools.ListTools(ctx, &agentv1.ListToolsRequest{})
	if err != nil {
		writeError(w, err)
		return
	}
	out := struct {
		Object   string     `json:"object"`
		Data     []toolJSON `json:"data"`
		Revision string     `json:"revision"`
	}{Object: "list", Data: []toolJSON{}, Revision: resp.GetRevision()}
	for _, t := range resp.GetTools() {
		tj := toolJSON{Name: t.GetName(), Description: t.GetDescription(), Kind: ToolKindName(t.GetKind()), InputSchema: json.RawMessage(t.GetInputSchema())}
		if t.GetOutputSchema() != "" {
			tj.OutputSchema = json.RawMessage(t.GetOutputSchema())
		}
		out.Data = append(out.Data, tj)
	}
	writeJSON(w, http.StatusOK, out)
}

// toolCallBody is the body of POST /v1/tools/{name}/call.
type toolCallBody struct {
	// Arguments is a JSON object (or a string holding one, as models write tool calls).
	Arguments      json.RawMessage `json:"arguments"`
	IdempotencyKey string          `json:"idempotency_key"`
	SessionID      string          `json:"session_id"`
	StepID         string          `json:"step_id"`
}

// toolCallAnswer is a tool call's result on the HTTP door.
type toolCallAnswer struct {
	Object          string          `json:"object"`
	Tool            string          `json:"tool"`
	Result          json.RawMessage `json:"result"`
	Status          string          `json:"status"`
	IsError         bool            `json:"is_error,omitempty"`
	StaleAgeSeconds float64         `json:"stale_age_seconds,omitempty"`
	Notice          string          `json:"notice,omitempty"`
	IdempotencyKey  string          `json:"idempotency_key,omitempty"`
	ConfirmationID  string          `json:"confirmation_id,omitempty"`
	Kind            string          `json:"kind"`
	AnsweredBy      string          `json:"answered_by,omitempty"`
	Attempts        []toolAttempt   `json:"attempts,omitempty"`
}

type toolAttempt struct {
	Tool           string  `json:"tool"`
	Outcome        string  `json:"outcome"`
	LatencySeconds float64 `json:"latency_seconds"`
	HTTPStatus     int32   `json:"http_status,omitempty"`
}

func (f *frontDoor) callTool(w http.ResponseWriter, r *http.Request) {
	ctx, ok := f.authenticate(w, r)
	if !ok {
		return
	}
	tools := f.router.deps.Tools
	if tools == nil {
		writeError(w, errNoTools())
		return
	}
	raw, berr := f.readBody(w, r, maxToolCallBytes)
	if berr != nil {
		writeJSON(w, berr.shape.status, errorBody{Error: openAIError{Message: berr.msg, Type: berr.shape.openAI, Code: berr.code}})
		return
	}
	body, err := decodeToolCall(raw)
	if err != nil {
		writeError(w, toStatus(err))
		return
	}
	key := body.IdempotencyKey
	if h := r.Header.Get("Idempotency-Key"); h != "" {
		if key != "" && key != h {
			writeError(w, toStatus(rpc.Invalid("idempotency_key", "differs from the Idempotency-Key header")))
			return
		}
		key = h
	}
	args, err := argumentsText(body.Arguments)
	if err != nil {
		writeError(w, toStatus(err))
		return
	}
	resp, err := tools.CallTool(ctx, &agentv1.CallToolRequest{
		Name: r.PathValue("name"), Arguments: args, IdempotencyKey: key,
		SessionId: body.SessionID, StepId: body.StepID,
		Quality: &mantlev1.QualityContext{RequestId: rpc.RequestID(ctx), TraceId: rpc.TraceID(ctx), Tenant: rpc.Tenant(ctx)},
	})
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set(HeaderToolStatus, ToolStatusName(resp.GetStatus()))
	writeJSON(w, http.StatusOK, toolAnswer(r.PathValue("name"), resp))
}

// decodeToolCall decodes a call's body strictly: an unknown field is refused by name.
func decodeToolCall(raw []byte) (toolCallBody, error) {
	var body toolCallBody
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		if field, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return body, rpc.Invalid(strings.Trim(field, `"`), "unknown field: the body takes arguments, idempotency_key, session_id and step_id")
		}
		return body, rpc.Invalid("", "the body is not a tool call: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return body, rpc.Invalid("", "more than one JSON value")
	}
	return body, nil
}

// argumentsText is the arguments as the agent takes them: a JSON object as text. A JSON
// string is taken as the text of the object (the form models write tool calls in).
func argumentsText(raw json.RawMessage) (string, error) {
	trimmed := bytes.TrimSpace(raw)
	switch {
	case len(trimmed) == 0 || string(trimmed) == "null":
		return "{}", nil
	case trimmed[0] == '"':
		var s string
		if err := json.Unmarshal(trimmed, &s); err != nil {
			return "", rpc.Invalid("arguments", "not a JSON string: %v", err)
		}
		return s, nil
	case trimmed[0] == '{':
		return string(trimmed), nil
	}
	return "", rpc.Invalid("arguments", "must be a JSON object (or a string holding one)")
}

// toolAnswer is the HTTP form of a tool call's result.
func toolAnswer(name string, resp *agentv1.CallToolResponse) toolCallAnswer {
	a := toolCallAnswer{
		Object: "tool.result", Tool: name, Status: ToolStatusName(resp.GetStatus()), IsError: resp.GetIsError(),
		Notice: resp.GetNotice(), IdempotencyKey: resp.GetIdempotencyKey(), ConfirmationID: resp.GetConfirmationId(),
		Kind: ToolKindName(resp.GetKind()), AnsweredBy: resp.GetAnsweredBy(), Result: json.RawMessage("null"),
	}
	if resp.GetResult() != "" {
		if jsonfield.Valid([]byte(resp.GetResult())) {
			a.Result = json.RawMessage(resp.GetResult())
		} else {
			quoted, _ := json.Marshal(resp.GetResult()) // a string always marshals
			a.Result = quoted
		}
	}
	if resp.GetStaleAge() != nil {
		a.StaleAgeSeconds = resp.GetStaleAge().AsDuration().Seconds()
	}
	for _, at := range resp.GetAttempts() {
		a.Attempts = append(a.Attempts, toolAttempt{Tool: at.GetTool(), Outcome: at.GetOutcome(), LatencySeconds: at.GetLatency().AsDuration().Seconds(), HTTPStatus: at.GetHttpStatus()})
	}
	return a
}

// ToolStatusName is a tool call status as the HTTP door and MCP write it.
func ToolStatusName(s agentv1.ToolCallStatus) string {
	name, ok := strings.CutPrefix(s.String(), "TOOL_CALL_STATUS_")
	if !ok {
		return "unspecified"
	}
	return strings.ToLower(name)
}

// ToolKindName is a tool kind as the HTTP door and MCP write it.
func ToolKindName(k agentv1.ToolKind) string {
	name, ok := strings.CutPrefix(k.String(), "TOOL_KIND_")
	if !ok {
		return "unspecified"
	}
	return strings.ToLower(name)
}
