package mesh_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/agent/v1"
	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/services/agent"
)

// scriptedPayments is a payment backend that answers each call with the next scripted
// status (200 once the script is used up) and counts its calls.
type scriptedPayments struct {
	srv   *httptest.Server
	calls atomic.Int64
	mu    sync.Mutex
	codes []int
}

func newScriptedPayments(t *testing.T) *scriptedPayments {
	t.Helper()
	p := &scriptedPayments{}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		n := p.calls.Add(1)
		p.mu.Lock()
		code := http.StatusOK
		if len(p.codes) > 0 {
			code, p.codes = p.codes[0], p.codes[1:]
		}
		p.mu.Unlock()
		w.WriteHeader(code)
		_, _ = io.WriteString(w, `{"payment":"p-`+string(rune('0'+n))+`"}`)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *scriptedPayments) then(codes ...int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.codes = append(p.codes, codes...)
}

// TestActionConfirmationFlow: an action whose outcome is unknown (the backend answered
// 504: it may have run) goes to the verifier's review queue as "confirm outcome"; the
// call answers pending_confirmation until an operator decides. After "happened" the
// repeat answers with the recorded result and never calls the backend; after "not
// happened" the next call runs the action once. A tenant key cannot open, read, list or
// decide confirmations. The agent and the verifier meet over real gRPC (split: separate
// processes, the agent with its service identity), on a fake clock.
func TestActionConfirmationFlow(t *testing.T) {
	t.Parallel()
	for _, mode := range []meshtest.Mode{meshtest.All, meshtest.Split} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			pay := newScriptedPayments(t)
			cfg := testConfig()
			cfg.Agent.Tools = []agent.ToolConfig{{
				Name: "pay", Description: "Pays an invoice.", Kind: agent.KindAction,
				Backend: agent.BackendConfig{Type: agent.BackendHTTP, URL: pay.srv.URL + "/pay"},
			}}
			clock := clockwork.NewFakeClockAt(time.Now())
			m := meshtest.StartWith(t, cfg, mode, mesh.Options{Clock: clock})
			verifierAddr, agentAddr := m.GRPCAddr, m.GRPCAddr
			if mode == meshtest.Split {
				verifierAddr, agentAddr = m.Processes["verifier"].App.GRPCAddr(), m.Processes["agent"].App.GRPCAddr()
			}
			tools := agentv1.NewToolServiceClient(meshtest.Dial(t, agentAddr))
			reviews := verifierv1.NewVerifierServiceClient(meshtest.Dial(t, verifierAddr))
			call := func(key string) *agentv1.CallToolResponse {
				t.Helper()
				res, err := tools.CallTool(authed(acmeKey), &agentv1.CallToolRequest{Name: "pay", Arguments: `{"invoice":"i-1"}`, IdempotencyKey: key})
				if err != nil {
					t.Fatalf("CallTool %s: %v", key, err)
				}
				return res
			}
			pending := func() []*verifierv1.Confirmation {
				t.Helper()
				resp, err := reviews.ListConfirmations(authed(meshtest.OperatorKey), &verifierv1.ListConfirmationsRequest{State: verifierv1.ConfirmationState_CONFIRMATION_STATE_PENDING})
				if err != nil {
					t.Fatalf("ListConfirmations: %v", err)
				}
				return resp.GetConfirmations()
			}
			decide := func(id string, d verifierv1.ConfirmationState, result string) {
				t.Helper()
				if _, err := reviews.DecideConfirmation(authed(meshtest.OperatorKey), &verifierv1.DecideConfirmationRequest{
					ConfirmationId: id, Reviewer: "ops-anna", Decision: d, Result: result,
				}); err != nil {
					t.Fatalf("DecideConfirmation %s: %v", id, err)
				}
			}

			// happened: the recorded result, and the backend is never called again.
			pay.then(http.StatusGatewayTimeout)
			first := call("pay-1")
			if first.GetStatus() != agentv1.ToolCallStatus_TOOL_CALL_STATUS_PENDING_CONFIRMATION || first.GetConfirmationId() == "" {
				t.Fatalf("timed-out action = %v, want pending_confirmation with a confirmation id", first)
			}
			if again := call("pay-1"); again.GetStatus() != agentv1.ToolCallStatus_TOOL_CALL_STATUS_PENDING_CONFIRMATION || again.GetConfirmationId() != first.GetConfirmationId() {
				t.Fatalf("repeat before a decision = %v, want the same pending confirmation", again)
			}
			list := pending()
			if len(list) != 1 || list[0].GetId() != first.GetConfirmationId() || list[0].GetTenant() != "acme" || list[0].GetTool() != "pay" ||
				list[0].GetIdempotencyKey() != "pay-1" || !strings.Contains(list[0].GetArguments(), "i-1") || list[0].GetReason() == "" {
				t.Fatalf("pending confirmations = %v, want the one of pay-1", list)
			}
			decide(first.GetConfirmationId(), verifierv1.ConfirmationState_CONFIRMATION_STATE_HAPPENED, `{"payment":"p-manual"}`)
			for i := range 2 {
				res := call("pay-1")
				if res.GetStatus() != agentv1.ToolCallStatus_TOOL_CALL_STATUS_REPLAYED || res.GetResult() != `{"payment":"p-manual"}` {
					t.Fatalf("repeat %d after happened = %v, want the recorded result", i, res)
				}
			}
			if n := pay.calls.Load(); n != 1 {
				t.Fatalf("backend called %d times for pay-1, want 1", n)
			}
			if _, err := reviews.DecideConfirmation(authed(meshtest.OperatorKey), &verifierv1.DecideConfirmationRequest{
				ConfirmationId: first.GetConfirmationId(), Reviewer: "ops-anna", Decision: verifierv1.ConfirmationState_CONFIRMATION_STATE_NOT_HAPPENED,
			}); status.Code(err) != codes.FailedPrecondition {
				t.Errorf("second decision = %v, want FAILED_PRECONDITION (a decision is final)", err)
			}

			// not happened: the next call runs the action, once.
			pay.then(http.StatusGatewayTimeout)
			second := call("pay-2")
			if second.GetStatus() != agentv1.ToolCallStatus_TOOL_CALL_STATUS_PENDING_CONFIRMATION {
				t.Fatalf("timed-out action = %v, want pending_confirmation", second)
			}
			decide(second.GetConfirmationId(), verifierv1.ConfirmationState_CONFIRMATION_STATE_NOT_HAPPENED, "")
			if res := call("pay-2"); res.GetStatus() != agentv1.ToolCallStatus_TOOL_CALL_STATUS_OK || res.GetResult() != `{"payment":"p-3"}` {
				t.Fatalf("call after not happened = %v, want the action run now", res)
			}
			if res := call("pay-2"); res.GetStatus() != agentv1.ToolCallStatus_TOOL_CALL_STATUS_REPLAYED || res.GetResult() != `{"payment":"p-3"}` {
				t.Fatalf("repeat after the run = %v, want its result replayed", res)
			}
			if n := pay.calls.Load(); n != 3 {
				t.Fatalf("backend called %d times in all, want 3 (pay-1 once, pay-2 twice)", n)
			}
			if list := pending(); len(list) != 0 {
				t.Errorf("pending confirmations after both decisions = %v", list)
			}

			audit, err := reviews.ListReviewAudit(authed(meshtest.OperatorKey), &verifierv1.ListReviewAuditRequest{ReviewId: first.GetConfirmationId()})
			if err != nil || len(audit.GetEntries()) != 2 || audit.GetEntries()[1].GetAction() != "decided" || audit.GetEntries()[1].GetActor() != "ops-anna" {
				t.Errorf("audit of the confirmation = %v, %v; want created and decided by ops-anna", audit, err)
			}

			// A tenant key reaches none of it.
			tenant := authed(acmeKey)
			for name, err := range map[string]error{
				"open": func() error {
					_, err := reviews.OpenConfirmation(tenant, &verifierv1.OpenConfirmationRequest{Tenant: "acme", Tool: "pay", IdempotencyKey: "k", Attempt: "1"})
					return err
				}(),
				"get": func() error {
					_, err := reviews.GetConfirmation(tenant, &verifierv1.GetConfirmationRequest{ConfirmationId: first.GetConfirmationId(), Tenant: "acme"})
					return err
				}(),
				"list": func() error {
					_, err := reviews.ListConfirmations(tenant, &verifierv1.ListConfirmationsRequest{})
					return err
				}(),
				"decide": func() error {
					_, err := reviews.DecideConfirmation(tenant, &verifierv1.DecideConfirmationRequest{ConfirmationId: second.GetConfirmationId(), Reviewer: "mallory", Decision: verifierv1.ConfirmationState_CONFIRMATION_STATE_HAPPENED})
					return err
				}(),
			} {
				if status.Code(err) != codes.PermissionDenied {
					t.Errorf("%s with a tenant key = %v, want PERMISSION_DENIED", name, err)
				}
			}
			if _, err := reviews.ListReviewAudit(tenant, &verifierv1.ListReviewAuditRequest{ReviewId: first.GetConfirmationId()}); status.Code(err) != codes.NotFound {
				t.Errorf("a confirmation's audit trail with a tenant key = %v, want NOT_FOUND", err)
			}
		})
	}
}
