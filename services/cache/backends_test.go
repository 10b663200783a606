package cache

import (
	"context"
	"crypto/rand"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/qdrant/go-client/qdrant"

	"github.com/mantle-mesh/mantle/pkg/tlsconfig"
	"github.com/mantle-mesh/mantle/services/cache/qdranttest"
)

var epoch = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// backend opens an empty Index for a test.
type backend struct {
	name string
	open func(t testing.TB) Index
}

// testBackends are the backends every service-level test runs against: the embedded index,
// the Qdrant backend with the real client against the in-process server, and, when
// QDRANT_ADDR names a Qdrant (host:port of its gRPC API, as in the compose stack), against
// that real server too.
func testBackends() []backend {
	bs := []backend{
		{"embedded", func(testing.TB) Index { return NewEmbeddedIndex(1000, 0) }},
		{"qdrant", func(t testing.TB) Index { return startFakeQdrant(t).index }},
	}
	if addr := os.Getenv("QDRANT_ADDR"); addr != "" {
		bs = append(bs, backend{"qdrant-real", func(t testing.TB) Index { return openRealQdrant(t, addr) }})
	}
	return bs
}

type fakeQdrant struct {
	server *qdranttest.Server
	client *qdrant.Client
	index  *QdrantIndex
}

// startFakeQdrant serves an in-process Qdrant and returns a QdrantIndex on it, with a
// generous call timeout (tests that need a short one make their own index).
func startFakeQdrant(t testing.TB) fakeQdrant {
	t.Helper()
	srv, err := qdranttest.Start()
	if err != nil {
		t.Fatalf("qdranttest.Start: %v", err)
	}
	t.Cleanup(srv.Close)
	client, err := newQdrantClient(QdrantConfig{Address: srv.Addr}, os.Getenv, nil, tlsconfig.Options{})
	if err != nil {
		t.Fatalf("newQdrantClient: %v", err)
	}
	t.Cleanup(func() { _ = client.Close() }) // the server is going away too
	return fakeQdrant{server: srv, client: client, index: NewQdrantIndex(client, "test_", 5*time.Second)}
}

// openRealQdrant returns a QdrantIndex on the Qdrant at addr, with a collection prefix of
// its own; the test's collections are deleted when it ends.
func openRealQdrant(t testing.TB, addr string) *QdrantIndex {
	t.Helper()
	client, err := newQdrantClient(QdrantConfig{Address: addr, APIKeyEnv: "QDRANT_API_KEY"}, os.Getenv, nil, tlsconfig.Options{})
	if err != nil {
		t.Fatalf("newQdrantClient: %v", err)
	}
	prefix := "mantle_test_" + strings.ToLower(rand.Text()[:10]) + "_"
	index := NewQdrantIndex(client, prefix, 5*time.Second)
	t.Cleanup(func() {
		ctx := context.Background()
		names, err := index.collections(ctx)
		if err != nil {
			t.Errorf("list collections for cleanup: %v", err)
		}
		for _, name := range names {
			if err := client.DeleteCollection(ctx, name); err != nil {
				t.Errorf("delete collection %s: %v", name, err)
			}
		}
		_ = client.Close() // nothing left to flush
	})
	if v, err := index.ServerVersion(context.Background()); err != nil {
		t.Fatalf("Qdrant at QDRANT_ADDR=%s: %v", addr, err)
	} else if !strings.HasPrefix(v, QdrantServerVersion+".") {
		t.Logf("Qdrant server %s; this backend is tested with %s.x", v, QdrantServerVersion)
	}
	return index
}
