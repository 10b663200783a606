package mesh_test

import (
	"testing"

	"google.golang.org/protobuf/proto"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/services/cache"
	"github.com/mantle-mesh/mantle/services/cache/qdranttest"
)

// TestCacheTenantIsolationThroughTheRouter sends identical prompts for two tenants through
// the whole mesh, with every cache backend, storing before or after the answer
// (router.async_cache_store): each tenant's repeat hits its own entry (found, or waited
// for on the lease of a store still on its way) and the other tenant's first question
// never does.
func TestCacheTenantIsolationThroughTheRouter(t *testing.T) {
	q, err := qdranttest.Start()
	if err != nil {
		t.Fatalf("in-process qdrant: %v", err)
	}
	t.Cleanup(q.Close)
	backends := map[string]func(*mesh.Config){
		"embedded": func(c *mesh.Config) { c.Cache.Backend = cache.BackendEmbedded },
		"qdrant": func(c *mesh.Config) {
			c.Cache.Backend = cache.BackendQdrant
			c.Cache.Qdrant.Address = q.Addr
		},
	}
	for _, async := range []bool{false, true} {
		for name, set := range backends {
			if async {
				name += "/async_cache_store"
			}
			t.Run(name, func(t *testing.T) {
				cfg := testConfig()
				set(&cfg)
				cfg.Router.AsyncCacheStore = async
				m := meshtest.Start(t, cfg, meshtest.Split)
				client := routerv1.NewRouterServiceClient(meshtest.Dial(t, m.GRPCAddr))
				q := ask("primary", "What is the refund policy for "+name+" orders placed online?")
				q.Temperature = proto.Float64(0)
				hit := func(key string) bool {
					t.Helper()
					resp, err := client.Complete(authed(key), &routerv1.CompleteRequest{Request: q})
					if err != nil {
						t.Fatalf("Complete as %s: %v", key, err)
					}
					return resp.Quality.CacheHit
				}
				if hit(acmeKey) {
					t.Fatal("acme's first question hit the cache")
				}
				if !hit(acmeKey) {
					t.Fatal("acme's repeat missed: the backend does not cache at all")
				}
				if hit(tightKey) {
					t.Error("tenant tight got acme's cached answer")
				}
				if !hit(tightKey) {
					t.Error("tight's own repeat missed")
				}
			})
		}
	}
}
