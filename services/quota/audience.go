package quota

import (
	quotav1 "github.com/mantle-mesh/mantle/pkg/api/mantle/quota/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// audiences says who may call each QuotaService method. Admission, charges and the
// shared upstream and retry budgets are the router's business alone: a tenant that could
// call them could lock every tenant out (ObserveUpstream) or drain the retries of all.
var audiences = rpc.Audiences{
	quotav1.QuotaService_Reserve_FullMethodName:         rpc.AudienceService,
	quotav1.QuotaService_Settle_FullMethodName:          rpc.AudienceService,
	quotav1.QuotaService_ObserveUpstream_FullMethodName: rpc.AudienceService,
	quotav1.QuotaService_AcquireRetry_FullMethodName:    rpc.AudienceService,
	// Counting tokens touches no state.
	quotav1.QuotaService_CountTokens_FullMethodName: rpc.AudienceTenant,
	// A tenant sees its own buckets only (DescribeUsage scopes it).
	quotav1.QuotaService_DescribeUsage_FullMethodName: rpc.AudienceTenant,
}
