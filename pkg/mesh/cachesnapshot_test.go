package mesh_test

import (
	"fmt"
	"io"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/pkg/natsembed"
)

// TestCacheSnapshotKeepsStoresMadeAfterTheAnswer: answers the router stores after they
// have gone to the caller (router.async_cache_store, on by default) are in the snapshot
// the embedded cache writes when the process stops, because the router stops, and waits
// for its stores, before the cache does. A process started from that snapshot answers
// every question from the cache.
func TestCacheSnapshotKeepsStoresMadeAfterTheAnswer(t *testing.T) {
	nats, err := natsembed.Start()
	if err != nil {
		t.Fatalf("embedded nats: %v", err)
	}
	t.Cleanup(nats.Shutdown)
	cfg := testConfig()
	cfg.Target = "all"
	cfg.Events = mesh.EventsConfig{NATSURL: nats.URL()}
	cfg.Server.GRPCListenAddress = "127.0.0.1:0"
	cfg.Server.HTTPListenAddress = "127.0.0.1:0"
	cfg.Log.Level = "error"
	cfg.Cache.Embedded.SnapshotPath = filepath.Join(t.TempDir(), "cache.snapshot")
	if !cfg.Router.AsyncCacheStore {
		t.Fatal("router.async_cache_store is off by default: this test is about stores made after the answer")
	}
	topics := []string{"refund policy", "shipping to Lisbon", "password reset", "invoice copies",
		"gift card balance", "store opening hours", "warranty claims", "loyalty points"}
	ask := func(p *mesh.Process, topic string) bool {
		t.Helper()
		client := routerv1.NewRouterServiceClient(meshtest.Dial(t, p.App.GRPCAddr()))
		q := ask("primary", "Please explain the "+topic+" for online orders.")
		q.Temperature = proto.Float64(0)
		resp, err := client.Complete(authed(acmeKey), &routerv1.CompleteRequest{Request: q})
		if err != nil {
			t.Fatalf("Complete(%s): %v", topic, err)
		}
		return resp.Quality.CacheHit
	}
	first, stop := meshtest.RunStoppable(t, cfg, mesh.Options{LogOutput: io.Discard})
	for _, topic := range topics {
		if ask(first, topic) {
			t.Fatalf("%s: the first question hit the cache", topic)
		}
	}
	stop()
	second := meshtest.Run(t, cfg, mesh.Options{LogOutput: io.Discard})
	var missed []string
	for _, topic := range topics {
		if !ask(second, topic) {
			missed = append(missed, topic)
		}
	}
	if len(missed) > 0 {
		t.Errorf("after a restart from the snapshot, %d of %d questions missed: %s", len(missed), len(topics), fmt.Sprint(missed))
	}
}
