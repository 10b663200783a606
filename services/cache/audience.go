package cache

import (
	cachev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/cache/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// Audiences says who may call each CacheService method. Only the router looks answers up
// and stores them, after verification: a tenant that could Store would serve its own text
// as a verified answer.
var Audiences = rpc.Audiences{
	cachev1.CacheService_Lookup_FullMethodName:  rpc.AudienceService,
	cachev1.CacheService_Store_FullMethodName:   rpc.AudienceService,
	cachev1.CacheService_Release_FullMethodName: rpc.AudienceService,
	// A tenant removes its own entries only (the tenant comes from the credential).
	cachev1.CacheService_Invalidate_FullMethodName: rpc.AudienceTenant,
	// Totals over every tenant that name no entry; the status page shows them to tenants.
	cachev1.CacheService_DescribeStats_FullMethodName: rpc.AudienceTenant,
}
