package router

import (
	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// Audiences says who may call each RouterService method.
var Audiences = rpc.Audiences{
	routerv1.RouterService_Complete_FullMethodName:       rpc.AudienceTenant,
	routerv1.RouterService_StreamComplete_FullMethodName: rpc.AudienceTenant,
	routerv1.RouterService_Embed_FullMethodName:          rpc.AudienceTenant,
	// Upstream key ids, breaker states and per-key latency are the deployment's; tenants
	// see the summary of the /status page instead.
	routerv1.RouterService_DescribeRoutes_FullMethodName: rpc.AudienceOperator,
}
