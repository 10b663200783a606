package router

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/agent/v1"
)

// TestMCPResult: every status a call can end in is visible in the MCP result, in _meta
// for the client and, when the answer is not this call's fresh one, as a note the model
// reads.
func TestMCPResult(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		resp       *agentv1.CallToolResponse
		status     string
		note       string // in the text content; "" for no note
		structured bool
	}{
		{name: "ok", resp: &agentv1.CallToolResponse{Result: `{"a":1}`, Status: agentv1.ToolCallStatus_TOOL_CALL_STATUS_OK}, status: "ok", structured: true},
		{name: "cached", resp: &agentv1.CallToolResponse{Result: `{"a":1}`, Status: agentv1.ToolCallStatus_TOOL_CALL_STATUS_CACHED}, status: "cached", structured: true},
		{name: "array result", resp: &agentv1.CallToolResponse{Result: `[1]`, Status: agentv1.ToolCallStatus_TOOL_CALL_STATUS_OK}, status: "ok"},
		{name: "tool error", resp: &agentv1.CallToolResponse{Result: `{"error":"no such city"}`, IsError: true, Status: agentv1.ToolCallStatus_TOOL_CALL_STATUS_OK}, status: "ok"},
		{
			name: "stale", status: "stale", note: "stale result", structured: true,
			resp: &agentv1.CallToolResponse{Result: `{"a":1}`, Status: agentv1.ToolCallStatus_TOOL_CALL_STATUS_STALE, StaleAge: durationpb.New(12 * time.Minute), Notice: "may be out of date (12 min old)"},
		},
		{
			name: "pending confirmation", status: "pending_confirmation", note: "confirmation rev-7",
			resp: &agentv1.CallToolResponse{Status: agentv1.ToolCallStatus_TOOL_CALL_STATUS_PENDING_CONFIRMATION, ConfirmationId: "rev-7", IdempotencyKey: "k"},
		},
		{
			name: "replayed", status: "replayed", note: "idempotency key k-1", structured: true,
			resp: &agentv1.CallToolResponse{Result: `{"a":1}`, Status: agentv1.ToolCallStatus_TOOL_CALL_STATUS_REPLAYED, IdempotencyKey: "k-1"},
		},
		{
			name: "backup", status: "backup", note: "its backup lookup2 answered", structured: true,
			resp: &agentv1.CallToolResponse{Result: `{"a":1}`, Status: agentv1.ToolCallStatus_TOOL_CALL_STATUS_BACKUP, AnsweredBy: "lookup2"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res := mcpResult(tc.resp)
			if res.Meta[MCPMetaStatus] != tc.status || res.IsError != tc.resp.GetIsError() {
				t.Errorf("meta %v isError %v, want status %s isError %v", res.Meta, res.IsError, tc.status, tc.resp.GetIsError())
			}
			var texts []string
			for _, c := range res.Content {
				texts = append(texts, c.(*mcp.TextContent).Text)
			}
			if r := tc.resp.GetResult(); r != "" && (len(texts) == 0 || texts[0] != r) {
				t.Errorf("content %q, want the result first", texts)
			}
			notes := len(texts) - min(len(tc.resp.GetResult()), 1)
			if tc.note == "" && notes != 0 || tc.note != "" && (notes != 1 || !strings.Contains(texts[len(texts)-1], tc.note)) {
				t.Errorf("content %q, want note %q", texts, tc.note)
			}
			if (res.StructuredContent != nil) != tc.structured {
				t.Errorf("structuredContent %v, want set: %v", res.StructuredContent, tc.structured)
			}
			if tc.resp.GetStaleAge() != nil && res.Meta[MCPMetaStaleAgeSeconds] != 720.0 {
				t.Errorf("stale age %v, want 720", res.Meta[MCPMetaStaleAgeSeconds])
			}
			if _, err := json.Marshal(res); err != nil {
				t.Errorf("result does not marshal: %v", err)
			}
		})
	}
}

// TestMCPCallIDs: the idempotency key, session and step come from _meta or the headers;
// both given must agree, and an unknown mantle key is refused by name.
func TestMCPCallIDs(t *testing.T) {
	t.Parallel()
	h := http.Header{}
	h.Set(HeaderSession, "s-1")
	h.Set("Idempotency-Key", "k-h")
	for _, tc := range []struct {
		name               string
		meta               mcp.Meta
		header             http.Header
		key, session, step string
		err                string
	}{
		{name: "none", header: http.Header{}},
		{name: "headers", header: h, key: "k-h", session: "s-1"},
		{name: "meta", header: http.Header{}, meta: mcp.Meta{MCPMetaStepID: "st", MCPMetaSessionID: "s", "progressToken": 3}, session: "s", step: "st"},
		{name: "meta agrees with header", header: h, meta: mcp.Meta{MCPMetaSessionID: "s-1", MCPMetaStepID: "st"}, key: "k-h", session: "s-1", step: "st"},
		{name: "meta differs from header", header: h, meta: mcp.Meta{MCPMetaIdempotencyKey: "k-m"}, err: "differs from the Idempotency-Key header"},
		{name: "unknown mantle key", header: h, meta: mcp.Meta{"mantle/sesion_id": "x"}, err: "mantle/sesion_id: unknown key"},
		{name: "not a string", header: h, meta: mcp.Meta{MCPMetaStepID: 7}, err: "mantle/step_id: must be a string"},
		{name: "header not UTF-8", header: http.Header{"X-Mantle-Step": {"\xff"}}, err: "x-mantle-step: must be UTF-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			key, session, step, err := mcpCallIDs(tc.meta, tc.header)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Errorf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || key != tc.key || session != tc.session || step != tc.step {
				t.Errorf("got %q %q %q %v, want %q %q %q", key, session, step, err, tc.key, tc.session, tc.step)
			}
		})
	}
}

// TestBudgetSpent: a call the caller's budget ended is a tool error naming the budget and
// its source; a caller that went away, or a failure before the budget ran out, is not.
func TestBudgetSpent(t *testing.T) {
	t.Parallel()
	live := context.Background()
	gone, cancelGone := context.WithCancel(context.Background())
	cancelGone()
	unavailable := status.Error(codes.Unavailable, "tool lookup is unavailable")
	deadline := status.Error(codes.DeadlineExceeded, "context deadline exceeded")
	for _, tc := range []struct {
		name    string
		call    *mcpCall // nil: the context carries none
		expired bool     // the budget's deadline has passed
		err     error
		want    string // "" for not a budget error
	}{
		{name: "budget from the header ran out", call: &mcpCall{done: live, budget: 250 * time.Millisecond, budgetFrom: "the " + HeaderBudget + " header"},
			expired: true, err: deadline, want: "tool lookup did not answer within the call's budget of 250ms (the x-mantle-budget-ms header)"},
		{name: "default budget ran out, agent answered first", call: &mcpCall{done: live, budget: 30 * time.Second, budgetFrom: "router.default_budget"},
			expired: true, err: unavailable, want: "budget of 30s (router.default_budget)"},
		{name: "agent's deadline error within the budget", call: &mcpCall{done: live, budget: time.Second, budgetFrom: "router.default_budget"},
			err: deadline, want: "budget of 1s"},
		{name: "caller went away", call: &mcpCall{done: gone, budget: time.Second}, expired: true, err: deadline},
		{name: "failure within the budget", call: &mcpCall{done: live, budget: time.Second}, err: unavailable},
		{name: "no MCP call", expired: true, err: deadline},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			if tc.call != nil {
				ctx = context.WithValue(ctx, mcpCallKey{}, tc.call)
			}
			if tc.expired {
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, time.Unix(0, 0))
				defer cancel()
			}
			got := budgetSpent(ctx, "lookup", tc.err)
			switch {
			case tc.want == "" && got != nil:
				t.Errorf("budgetSpent = %v, want nil", got)
			case tc.want != "" && (got == nil || !strings.Contains(status.Convert(got).Message(), tc.want) || reasonOf(got) != "deadline_exceeded"):
				t.Errorf("budgetSpent = %v, want deadline_exceeded naming %q", got, tc.want)
			}
		})
	}
}
