package cache

import (
	"testing"

	cachev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/cache/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// TestServerDescribeStats: ordinary lookups count towards the hit rate, per scenario;
// approximate ones (the router's degradation ladder) do not.
func TestServerDescribeStats(t *testing.T) {
	t.Parallel()
	client, _ := startCache(t, NewEmbeddedIndex(10, 0))
	ctx := asTenant("acme")
	if _, err := client.Store(ctx, storeRequest("acme", protoPrompt("How do I reset my password?"))); err != nil {
		t.Fatalf("Store: %v", err)
	}
	lookups := []struct {
		question string
		mode     cachev1.LookupMode
	}{
		{"How do I reset my password?", cachev1.LookupMode_LOOKUP_MODE_UNSPECIFIED},
		{"How do I change my email?", cachev1.LookupMode_LOOKUP_MODE_UNSPECIFIED},
		{"How do I reset my password?", cachev1.LookupMode_LOOKUP_MODE_UNSPECIFIED},
		{"How do I reset my password?", cachev1.LookupMode_LOOKUP_MODE_APPROXIMATE},
	}
	for _, l := range lookups {
		if _, err := client.Lookup(ctx, &cachev1.LookupRequest{Quality: &mantlev1.QualityContext{RequestId: "r", Tenant: "acme"},
			Prompt: protoPrompt(l.question), Mode: l.mode}); err != nil {
			t.Fatalf("Lookup: %v", err)
		}
	}
	resp, err := client.DescribeStats(ctx, &cachev1.DescribeStatsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetLookups() != 3 || resp.GetHits() != 2 || !resp.GetSince().AsTime().Equal(epoch) {
		t.Errorf("stats = %d lookups, %d hits since %v; want 3, 2 since %v", resp.GetLookups(), resp.GetHits(), resp.GetSince().AsTime(), epoch)
	}
	if sc := resp.GetScenarios(); len(sc) != 1 || sc[0].GetScenario() != "support" || sc[0].GetLookups() != 3 || sc[0].GetHits() != 2 {
		t.Errorf("scenarios = %v, want support with 3 lookups and 2 hits", sc)
	}
}
