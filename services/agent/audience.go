package agent

import (
	agentv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/agent/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// Audiences says who may call each ToolService and SessionService method. Agents call
// tools and read, cancel and complete their own sessions with a tenant key; the router
// opens and ends model steps on a tenant's behalf (service plane), so a tenant cannot
// forge a recorded step or charge another session's budget. The registry's backends and
// live breaker state are the deployment's (operator plane), as the router's routes are.
var Audiences = rpc.Audiences{
	agentv1.ToolService_CallTool_FullMethodName:           rpc.AudienceTenant,
	agentv1.ToolService_ListTools_FullMethodName:          rpc.AudienceTenant,
	agentv1.ToolService_DescribeTools_FullMethodName:      rpc.AudienceOperator,
	agentv1.SessionService_BeginStep_FullMethodName:       rpc.AudienceService,
	agentv1.SessionService_EndStep_FullMethodName:         rpc.AudienceService,
	agentv1.SessionService_GetSession_FullMethodName:      rpc.AudienceTenant,
	agentv1.SessionService_CancelSession_FullMethodName:   rpc.AudienceTenant,
	agentv1.SessionService_CompleteSession_FullMethodName: rpc.AudienceTenant,
	agentv1.SessionService_WatchSession_FullMethodName:    rpc.AudienceService,
}
