package cache

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/qdrant/go-client/qdrant"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mantle-mesh/mantle/services/cache/internal/embed"
	"github.com/mantle-mesh/mantle/services/cache/internal/vector"
	"github.com/mantle-mesh/mantle/services/cache/qdranttest"
)

func TestQdrantCollectionLayout(t *testing.T) {
	t.Parallel()
	q := startFakeQdrant(t)
	put(t, q.index, testEntry("a", "acme", "support", "p", "how do i reset my password"))
	dense, _ := vector.NewDense([]float32{1, 2, 3})
	old := testEntry("b", "acme", "support", "q", "dense question")
	old.Namespace = "openai-m-3"
	if err := q.index.Put(context.Background(), old, dense, nil); err != nil {
		t.Fatalf("Put(dense): %v", err)
	}

	// One collection per namespace, each with the tenant as an is_tenant keyword index and
	// the expiry fields indexed for the sweep's range filter.
	if got := q.server.Collections(); len(got) != 2 || got[0] != "test_lexical-v1" || got[1] != "test_openai-m-3" {
		t.Fatalf("collections = %v, want [test_lexical-v1 test_openai-m-3]", got)
	}
	for _, c := range q.server.Collections() {
		ix := q.server.FieldIndexes(c)
		if tenant := ix[fieldTenant]; tenant.Type != qdrant.FieldType_FieldTypeKeyword || !tenant.IsTenant {
			t.Errorf("%s: tenant index = %+v, want a keyword index with is_tenant", c, tenant)
		}
		for _, f := range []string{fieldPartition, fieldEntryID, fieldScenario} {
			if ix[f].Type != qdrant.FieldType_FieldTypeKeyword || ix[f].IsTenant {
				t.Errorf("%s: %s index = %+v, want a plain keyword index", c, f, ix[f])
			}
		}
		for _, f := range []string{fieldExpires, fieldStaleUntil} {
			if ix[f].Type != qdrant.FieldType_FieldTypeInteger {
				t.Errorf("%s: %s index = %+v, want an integer index", c, f, ix[f])
			}
		}
	}
	payload := q.server.Payloads("test_lexical-v1")[0]
	if payload[fieldTenant].GetStringValue() != "acme" || payload[fieldQuestion].GetStringValue() != "how do i reset my password" ||
		payload[fieldStaleUntil].GetIntegerValue() != epoch.Add(2*time.Hour).UnixMilli() || payload[fieldModel].GetStringValue() != "m" {
		t.Errorf("payload = %v, want the tenant, question, stale_until_ms and source model", payload)
	}
	// A second Put in a known namespace does not create anything again.
	creates := q.server.Calls("CreateFieldIndex")
	put(t, q.index, testEntry("c", "acme", "support", "p", "another question"))
	if q.server.Calls("CreateFieldIndex") != creates || q.server.Calls("CollectionExists") != 2 {
		t.Errorf("collection set-up repeated for a known namespace")
	}
}

func TestQdrantSweepDeletesExpiredPoints(t *testing.T) {
	t.Parallel()
	q := startFakeQdrant(t)
	short := testEntry("short", "acme", "s", "p", "short lived question")
	short.StaleUntil = epoch.Add(time.Minute)
	long := testEntry("long", "acme", "s", "p", "long lived question")
	put(t, q.index, short, long)

	remaining, err := q.index.Sweep(context.Background(), epoch.Add(time.Minute))
	if err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	if remaining != 1 || len(q.server.Payloads("test_lexical-v1")) != 1 {
		t.Errorf("Sweep left %d points (reported %d), want 1", len(q.server.Payloads("test_lexical-v1")), remaining)
	}
}

func TestQdrantReadsOfAnUnknownNamespaceMiss(t *testing.T) {
	t.Parallel()
	q := startFakeQdrant(t)
	e := testEntry("a", "acme", "s", "p", "question")
	if _, ok, err := q.index.Get(context.Background(), "lexical-v1", e.Key, epoch); err != nil || ok {
		t.Errorf("Get before any collection = (%v, %v), want a plain miss", ok, err)
	}
	c, err := q.index.Search(context.Background(), Query{Tenant: "acme", Partition: e.Partition, Namespace: "lexical-v1", Vector: vec(t, "question"), Limit: 3, Now: epoch})
	if err != nil || len(c) != 0 {
		t.Errorf("Search before any collection = (%v, %v), want a plain miss", c, err)
	}
	if n, err := q.index.Delete(context.Background(), Filter{Tenant: "acme", Namespace: "lexical-v1"}); err != nil || n != 0 {
		t.Errorf("Delete before any collection = (%d, %v), want 0", n, err)
	}
}

// TestQdrantFailuresAreMisses makes the in-process Qdrant fail or hang: every lookup is
// then a miss within the call timeout, and after repeated failures Qdrant is not called at
// all for a while.
func TestQdrantFailuresAreMisses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		fault func(ctx context.Context, method string) error
	}{
		{"unavailable", func(context.Context, string) error { return status.Error(codes.Unavailable, "qdrant restarting") }},
		{"hangs past the deadline", func(ctx context.Context, _ string) error { <-ctx.Done(); return ctx.Err() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			q := startFakeQdrant(t)
			setup := newFixtureWith(t, DefaultConfig(), q.index, embed.NewLexical())
			setup.mustStore(t, "acme", answer(basePrompt(question)))
			// The cache under test calls the same Qdrant with a short deadline.
			f := newFixtureWith(t, DefaultConfig(), NewQdrantIndex(q.client, "test_", 200*time.Millisecond), embed.NewLexical())
			q.server.SetFault(tt.fault)

			for range 3 {
				res := f.lookupMode(t, "acme", basePrompt(question), ModeNormal)
				if res.Hit || res.MissReason != MissBackendError {
					t.Fatalf("Lookup with a failing Qdrant = %+v, want a miss with reason %s", res, MissBackendError)
				}
			}
			if _, err := f.svc.Store(context.Background(), "acme", answer(basePrompt("What is your refund policy?"))); err == nil {
				t.Errorf("Store with a failing Qdrant succeeded; want an error")
			}
			for range 5 {
				f.lookupMode(t, "acme", basePrompt(question), ModeNormal)
			}
			calls := q.server.Calls("Get")
			res := f.lookupMode(t, "acme", basePrompt(question), ModeNormal)
			if res.MissReason != MissBackendError || q.server.Calls("Get") != calls {
				t.Errorf("during the cooldown: %+v with %d new calls; want a miss without calling Qdrant", res, q.server.Calls("Get")-calls)
			}
			// Qdrant recovers; after the cooldown the cache uses it again.
			q.server.SetFault(nil)
			f.clock.Advance(5 * time.Second)
			if res := f.lookupMode(t, "acme", basePrompt(question), ModeNormal); !res.Hit {
				t.Errorf("after recovery: %+v, want a hit", res)
			}
		})
	}
}

func TestQdrantStoreWithoutVector(t *testing.T) {
	t.Parallel()
	q := startFakeQdrant(t)
	f := newFixtureWith(t, DefaultConfig(), q.index, &failingEmbedder{})
	res, err := f.svc.Store(context.Background(), "acme", answer(basePrompt(question)))
	if err != nil || res.Stored || res.SkippedReason != SkipNoVector {
		t.Errorf("Store with a failing embedder on Qdrant = (%+v, %v), want skipped for %s", res, err, SkipNoVector)
	}
}

func TestQdrantModule(t *testing.T) {
	t.Parallel()
	srv, err := qdranttest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	cfg := DefaultConfig()
	cfg.Backend = BackendQdrant
	cfg.Qdrant.Address = srv.Addr
	cfg.Qdrant.APIKeyEnv = "TEST_QDRANT_KEY"
	env, reg, clock := moduleEnv(t)
	r, err := build(context.Background(), cfg, env, func(k string) string {
		if k == "TEST_QDRANT_KEY" {
			return "secret"
		}
		return ""
	})
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	if r.qdrant == nil || r.embedded != nil {
		t.Fatalf("backend qdrant built %+v", r)
	}
	f := fixture{svc: r.svc, clock: clock, reg: reg, index: r.qdrant}
	f.mustStore(t, "acme", answer(basePrompt(question)))
	if _, hit := f.lookup(t, "acme", basePrompt(question)); !hit {
		t.Errorf("lookup through the module's Qdrant backend missed")
	}
	if got := srv.APIKey(); got != "secret" {
		t.Errorf("Qdrant received api-key %q, want the one from the environment", got)
	}

	tasks := make(chan string, 10)
	r.done = func(task string) { tasks <- task }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	// Run waits on two tickers (leases, sweep); the sweep counts the points.
	if err := clock.BlockUntilContext(t.Context(), 2); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute)
	for task := <-tasks; task != "sweep"; task = <-tasks {
		// the lease sweep (every 30s) runs too
	}
	if got := metricValue(t, reg, "mantle_cache_qdrant_points", nil); got != 1 {
		t.Errorf("mantle_cache_qdrant_points = %v after the sweep, want 1", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// TestRealQdrant runs the index conformance checks against the Qdrant at QDRANT_ADDR (for
// example the compose stack's, localhost:6334); without it the test is skipped. The other
// tests already include that server in their backends when the variable is set.
func TestRealQdrant(t *testing.T) {
	addr := os.Getenv("QDRANT_ADDR")
	if addr == "" {
		t.Skip("QDRANT_ADDR not set; run with QDRANT_ADDR=localhost:6334 against a Qdrant v1.17")
	}
	index := openRealQdrant(t, addr)
	f := newFixtureWith(t, DefaultConfig(), index, embed.NewLexical())
	f.mustStore(t, "acme", answer(basePrompt(question)))
	if res := f.lookupMode(t, "acme", basePrompt("how can I reset my password"), ModeNormal); !res.Hit || res.Match != MatchSemantic {
		t.Errorf("semantic lookup on a real Qdrant = %+v, want a hit", res)
	}
	if res := f.lookupMode(t, "globex", basePrompt(question), ModeNormal); res.Hit {
		t.Errorf("another tenant hit on a real Qdrant")
	}
	f.clock.Advance(26 * time.Hour)
	if _, err := index.Sweep(context.Background(), f.clock.Now()); err != nil {
		t.Errorf("Sweep: %v", err)
	}
}
