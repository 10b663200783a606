package main

import (
	"strings"
	"testing"
	"time"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// TestSummaryNamesTheCache: the summary line says whether the answer came from the cache,
// and whether that answer was past its time to live.
func TestSummaryNamesTheCache(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		qc   *mantlev1.QualityContext
		want string
	}{
		{&mantlev1.QualityContext{}, " cache=miss "},
		{&mantlev1.QualityContext{CacheHit: true, CacheSimilarity: 1}, " cache=hit(1.00) "},
		{&mantlev1.QualityContext{CacheHit: true, CacheStale: true, CacheSimilarity: 0.98}, " cache=stale(0.98) "},
	} {
		if got := summary(&routerv1.CompleteResponse{Quality: tt.qc}, time.Second); !strings.Contains(got, tt.want) {
			t.Errorf("summary = %q, want it to contain %q", got, tt.want)
		}
	}
}
