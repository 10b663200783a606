package router

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/agent/v1"
	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	"github.com/mantle-mesh/mantle/pkg/httpbody"
	"github.com/mantle-mesh/mantle/pkg/jsonfield"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// This file serves agent sessions on the HTTP door: GET /v1/sessions/{id},
// POST /v1/sessions/{id}/cancel and POST /v1/sessions/{id}/complete, with the tenant keys
// the other endpoints take. The router asks the agent's SessionService on the tenant's
// behalf, so a tenant reaches only its own sessions.

// registerSessions adds the session endpoints to mux.
func (f *frontDoor) registerSessions(mux *http.ServeMux) {
	mux.Handle("GET /v1/sessions/{id}", f.traced("/v1/sessions/{id}", f.getSession))
	mux.Handle("POST /v1/sessions/{id}/cancel", f.traced("/v1/sessions/{id}/cancel", f.cancelSession))
	mux.Handle("POST /v1/sessions/{id}/complete", f.traced("/v1/sessions/{id}/complete", f.completeSession))
}

// errNoSessions answers the session endpoints of a router without an agent.
func errNoSessions() error {
	return rpc.Status(codes.NotFound, errorDomain, ReasonSessionsOff, "agent sessions are not served here: router.agent_address is off")
}

// sessionRequest authenticates a session endpoint's request and reads its id.
func (f *frontDoor) sessionRequest(w http.ResponseWriter, r *http.Request) (context.Context, agentv1.SessionServiceClient, string, bool) {
	ctx, ok := f.authenticate(w, r)
	if !ok {
		return nil, nil, "", false
	}
	id := r.PathValue("id")
	if !validSessionID(id) {
		writeError(w, toStatus(rpc.Invalid("id", "1 to %d printable ASCII characters without spaces", maxSessionIDBytes)))
		return nil, nil, "", false
	}
	sessions := f.router.deps.Sessions
	if sessions == nil {
		writeError(w, errNoSessions())
		return nil, nil, "", false
	}
	return ctx, sessions, id, true
}

func (f *frontDoor) getSession(w http.ResponseWriter, r *http.Request) {
	ctx, sessions, id, ok := f.sessionRequest(w, r)
	if !ok {
		return
	}
	resp, err := sessions.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: id})
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, sessionJSONOf(resp.GetSession()))
}

// maxCancelBody bounds the body of POST /v1/sessions/{id}/cancel: a reason, kept to 512
// bytes by the agent.
const maxCancelBody = 4 << 10

func (f *frontDoor) cancelSession(w http.ResponseWriter, r *http.Request) {
	ctx, sessions, id, ok := f.sessionRequest(w, r)
	if !ok {
		return
	}
	var body struct {
		Reason string `json:"reason"`
	}
	raw, err := httpbody.Request(w, r, maxCancelBody)
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		writeOpenAIError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large", "", "the body is over 4 KiB")
		return
	case err != nil:
		writeError(w, toStatus(rpc.Invalid("body", "unreadable: %v", err)))
		return
	}
	if len(strings.TrimSpace(string(raw))) > 0 {
		dec := json.NewDecoder(strings.NewReader(string(raw)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&body); err != nil {
			writeError(w, toStatus(rpc.Invalid("body", "want {\"reason\": \"...\"} or nothing: %v", err)))
			return
		}
	}
	resp, err := sessions.CancelSession(ctx, &agentv1.CancelSessionRequest{SessionId: id, Reason: body.Reason})
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, sessionJSONOf(resp.GetSession()))
}

func (f *frontDoor) completeSession(w http.ResponseWriter, r *http.Request) {
	ctx, sessions, id, ok := f.sessionRequest(w, r)
	if !ok {
		return
	}
	resp, err := sessions.CompleteSession(ctx, &agentv1.CompleteSessionRequest{SessionId: id})
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, sessionJSONOf(resp.GetSession()))
}

// sessionJSON is a session as the HTTP door shows it.
type sessionJSON struct {
	ID        string `json:"id"`
	Object    string `json:"object"`
	State     string `json:"state"`
	EndReason string `json:"end_reason,omitempty"`
	Budget    struct {
		DeadlineMS int64   `json:"deadline_ms"`
		MaxTokens  int64   `json:"max_tokens"`
		MaxCostUSD float64 `json:"max_cost_usd"`
		MaxSteps   int32   `json:"max_steps"`
	} `json:"budget"`
	Left struct {
		TimeMS  int64   `json:"time_ms"`
		Tokens  int64   `json:"tokens"`
		CostUSD float64 `json:"cost_usd"`
		Steps   int32   `json:"steps"`
	} `json:"left"`
	Degraded                bool       `json:"degraded"`
	DegradedUntil           string     `json:"degraded_until,omitempty"`
	Degradations            int32      `json:"degradations"`
	ActionsNeedConfirmation bool       `json:"actions_need_confirmation"`
	ParallelCap             int32      `json:"parallel_cap"`
	CreatedAt               string     `json:"created_at,omitempty"`
	UpdatedAt               string     `json:"updated_at,omitempty"`
	Steps                   []stepJSON `json:"steps"`
}

// stepJSON is one step. Result is what the agent can still use: for a model step the
// answer as a chat completion, for a tool step the tool's result; absent when none was
// recorded.
type stepJSON struct {
	ID             string          `json:"id"`
	Kind           string          `json:"kind"`
	Status         string          `json:"status"`
	Target         string          `json:"target,omitempty"`
	AnsweredBy     string          `json:"answered_by,omitempty"`
	Required       bool            `json:"required"`
	Reason         string          `json:"reason,omitempty"`
	ToolKind       string          `json:"tool_kind,omitempty"`
	IdempotencyKey string          `json:"idempotency_key,omitempty"`
	ConfirmationID string          `json:"confirmation_id,omitempty"`
	StaleAgeMS     int64           `json:"stale_age_ms,omitempty"`
	Tokens         int64           `json:"tokens"`
	CostUSD        float64         `json:"cost_usd"`
	RecordTooLarge bool            `json:"record_too_large,omitempty"`
	StartedAt      string          `json:"started_at,omitempty"`
	EndedAt        string          `json:"ended_at,omitempty"`
	Result         json.RawMessage `json:"result,omitempty"`
}

// enumName is an enum value's name without its type prefix, lower case
// (STEP_STATUS_PENDING_CONFIRMATION is pending_confirmation).
func enumName(name, prefix string) string {
	return strings.ToLower(strings.TrimPrefix(name, prefix))
}

func sessionJSONOf(s *agentv1.Session) sessionJSON {
	out := sessionJSON{
		ID: s.GetSessionId(), Object: "agent.session", State: enumName(s.GetState().String(), "SESSION_STATE_"),
		EndReason: s.GetEndReason(), Degraded: s.GetDegraded(), Degradations: s.GetDegradations(),
		ActionsNeedConfirmation: s.GetActionsNeedConfirmation(), ParallelCap: s.GetParallelCap(),
		CreatedAt: rfc3339(s.GetCreatedAt().AsTime(), s.GetCreatedAt() != nil), UpdatedAt: rfc3339(s.GetUpdatedAt().AsTime(), s.GetUpdatedAt() != nil),
		DegradedUntil: rfc3339(s.GetDegradedUntil().AsTime(), s.GetDegradedUntil() != nil),
		Steps:         []stepJSON{},
	}
	b := s.GetBudget()
	out.Budget.DeadlineMS, out.Budget.MaxTokens, out.Budget.MaxCostUSD, out.Budget.MaxSteps = b.GetDeadline().AsDuration().Milliseconds(), b.GetMaxTokens(), b.GetMaxCostUsd(), b.GetMaxSteps()
	l := s.GetLeft()
	out.Left.TimeMS, out.Left.Tokens, out.Left.CostUSD, out.Left.Steps = l.GetTime().AsDuration().Milliseconds(), l.GetTokens(), l.GetCostUsd(), l.GetSteps()
	for _, st := range s.GetSteps() {
		sj := stepJSON{
			ID: st.GetStepId(), Kind: enumName(st.GetKind().String(), "STEP_KIND_"), Status: enumName(st.GetStatus().String(), "STEP_STATUS_"),
			Target: st.GetTarget(), AnsweredBy: st.GetAnsweredBy(), Required: st.GetRequired(), Reason: st.GetReason(),
			IdempotencyKey: st.GetIdempotencyKey(), ConfirmationID: st.GetConfirmationId(),
			StaleAgeMS: st.GetStaleAge().AsDuration().Milliseconds(), Tokens: st.GetTokens(), CostUSD: st.GetCostUsd(),
			RecordTooLarge: st.GetRecordTooLarge(),
			StartedAt:      rfc3339(st.GetStartedAt().AsTime(), st.GetStartedAt() != nil), EndedAt: rfc3339(st.GetEndedAt().AsTime(), st.GetEndedAt() != nil),
			Result: stepResultJSON(st),
		}
		if st.GetToolKind() != agentv1.ToolKind_TOOL_KIND_UNSPECIFIED {
			sj.ToolKind = enumName(st.GetToolKind().String(), "TOOL_KIND_")
		}
		out.Steps = append(out.Steps, sj)
	}
	return out
}

func rfc3339(t time.Time, set bool) string {
	if !set {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// stepResultJSON renders a step's recorded result: a model step's CompleteResponse as the
// chat completion it answered, a tool step's CallToolResponse as its result (JSON text as
// is, other text as a JSON string). What does not decode is given as base64, never
// dropped.
func stepResultJSON(st *agentv1.Step) json.RawMessage {
	raw := st.GetResult()
	if len(raw) == 0 {
		return nil
	}
	switch st.GetKind() {
	case agentv1.StepKind_STEP_KIND_MODEL:
		var resp routerv1.CompleteResponse
		if proto.Unmarshal(raw, &resp) == nil && len(resp.GetQuality().GetAudit()) > 0 {
			if b, err := json.Marshal(completionJSON(&resp)); err == nil {
				return b
			}
		}
	case agentv1.StepKind_STEP_KIND_TOOL:
		var resp agentv1.CallToolResponse
		if proto.Unmarshal(raw, &resp) == nil {
			if r := resp.GetResult(); jsonfield.Valid([]byte(r)) && r != "" {
				return json.RawMessage(r)
			}
			if b, err := json.Marshal(resp.GetResult()); err == nil {
				return b
			}
		}
	}
	b, _ := json.Marshal(map[string]string{"base64": base64.StdEncoding.EncodeToString(raw)})
	return b
}
