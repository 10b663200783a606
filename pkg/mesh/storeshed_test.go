package mesh_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/services/cache"
	"github.com/mantle-mesh/mantle/services/cache/qdranttest"
)

// TestShedStoreReleasesItsLease: behind a Qdrant that holds every write, the router's
// one store in flight (router.max_async_cache_stores: 1) is busy, so the next request
// that holds its prompt's lease is answered, sheds its store and gives the lease back to
// the cache service. The next identical request then takes a lease of its own and asks
// the model at once: it does not wait, for up to coalesce.max_wait, on a lease whose
// answer will never be stored. In one process and with the cache in a process of its
// own.
func TestShedStoreReleasesItsLease(t *testing.T) {
	for _, mode := range []meshtest.Mode{meshtest.All, meshtest.Split} {
		t.Run(string(mode), func(t *testing.T) {
			q, err := qdranttest.Start()
			if err != nil {
				t.Fatalf("in-process qdrant: %v", err)
			}
			t.Cleanup(q.Close)
			gate := make(chan struct{})
			upserts := make(chan struct{}, 16)
			q.SetFault(func(ctx context.Context, method string) error {
				if !strings.HasSuffix(method, "/Upsert") {
					return nil
				}
				upserts <- struct{}{}
				select {
				case <-gate:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			})

			cfg := testConfig()
			cfg.Cache.Backend = cache.BackendQdrant
			cfg.Cache.Qdrant.Address = q.Addr
			cfg.Router.AsyncCacheStore = true
			cfg.Router.MaxAsyncCacheStores = 1
			m := meshtest.Start(t, cfg, mode)
			t.Cleanup(func() { close(gate) }) // first: the mesh's stop waits for the held store
			cacheProcess := m.Router
			if mode == meshtest.Split {
				cacheProcess = m.Processes["cache"]
			}
			client := routerv1.NewRouterServiceClient(meshtest.Dial(t, m.GRPCAddr))
			complete := func(question string) *routerv1.CompleteResponse {
				t.Helper()
				req := ask("primary", question)
				req.Temperature = proto.Float64(0) // cacheable
				resp, err := client.Complete(authed(acmeKey), &routerv1.CompleteRequest{Request: req})
				if err != nil {
					t.Fatalf("Complete %q: %v", question, err)
				}
				return resp
			}
			leases := func(outcome string) float64 {
				return counterValue(t, cacheProcess, "mantle_cache_coalesce_total", map[string]string{"outcome": outcome})
			}

			complete("Which carriers deliver parcels to Lisbon?")
			select { // its store reached Qdrant and is held there: the one store in flight
			case <-upserts:
			case <-time.After(30 * time.Second):
				t.Fatal("the first answer's store never reached Qdrant")
			}

			const question = "How long does a parcel to Porto take?"
			complete(question)
			if got := counterValue(t, m.Router, "mantle_router_cache_stores_shed_total", nil); got != 1 {
				t.Fatalf("stores shed %v after the second answer, want 1", got)
			}

			again := complete(question)
			if again.Quality.GetCacheHit() {
				t.Fatal("the repeat was a cache hit, though its first answer's store was shed")
			}
			if w := again.Quality.GetWaited().AsDuration(); w != 0 {
				t.Errorf("the repeat waited %s, want 0: it waited on the shed store's lease", w)
			}
			if got := leases("leased"); got != 3 {
				t.Errorf("leases taken %v, want 3 (each of the three requests its own)", got)
			}
			if got := leases("timeout") + leases("retried"); got != 0 {
				t.Errorf("lookups that waited on a lease: %v, want 0", got)
			}
			if len(upserts) != 0 {
				t.Errorf("%d more stores reached Qdrant, want none while the first is held", len(upserts))
			}
		})
	}
}
