package cache

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mantle-mesh/mantle/services/cache/internal/embed"
	"github.com/mantle-mesh/mantle/services/cache/internal/vector"
)

type lookupOutcome struct {
	res LookupResult
	err error
}

// coalesce starts a coalescing lookup of question in the background.
func (f fixture) coalesce(ctx context.Context, tenant, question string, maxWait time.Duration) <-chan lookupOutcome {
	out := make(chan lookupOutcome, 1)
	go func() {
		res, err := f.svc.Lookup(ctx, tenant, LookupRequest{Prompt: basePrompt(question), Coalesce: true, MaxWait: maxWait})
		out <- lookupOutcome{res, err}
	}()
	return out
}

// waiters blocks until n lookups wait on the fake clock.
func (f fixture) waiters(t *testing.T, n int) {
	t.Helper()
	if err := f.clock.BlockUntilContext(t.Context(), n); err != nil {
		t.Fatalf("waiting for %d waiters: %v", n, err)
	}
}

func (f fixture) lease(t *testing.T, tenant, question string) Lease {
	t.Helper()
	res, err := f.svc.Lookup(context.Background(), tenant, LookupRequest{Prompt: basePrompt(question), Coalesce: true})
	if err != nil || res.Hit || res.Lease == nil || res.Waited != 0 {
		t.Fatalf("Lookup = (%+v, %v), want a miss with a lease, at once", res, err)
	}
	return *res.Lease
}

const question = "How do I reset my password?"

func TestCoalescingStoreAnswersEveryWaiter(t *testing.T) {
	t.Parallel()
	f := newFixture(t, DefaultConfig())
	lease := f.lease(t, "acme", question)
	if want := epoch.Add(30 * time.Second); !lease.ExpiresAt.Equal(want) {
		t.Errorf("lease expires %v, want %v (lease_ttl)", lease.ExpiresAt, want)
	}
	// Identical prompts (in another spelling too) wait; another tenant's does not.
	w1 := f.coalesce(context.Background(), "acme", question, 0)
	w2 := f.coalesce(context.Background(), "acme", "HOW DO I RESET MY PASSWORD", 0)
	f.waiters(t, 2)
	other := f.lease(t, "globex", question)

	f.clock.Advance(2 * time.Second) // the first request's model call
	req := answer(basePrompt(question))
	req.LeaseID = lease.ID
	stored := f.mustStore(t, "acme", req)
	for i, w := range []<-chan lookupOutcome{w1, w2} {
		got := <-w
		if got.err != nil || !got.res.Hit || got.res.Match != MatchCoalesced || got.res.Entry.ID != stored.EntryID || got.res.Similarity != 1 {
			t.Errorf("waiter %d = (%+v, %v), want the stored answer, coalesced", i, got.res, got.err)
		}
		if got.res.Waited != 2*time.Second {
			t.Errorf("waiter %d waited %v, want 2s", i, got.res.Waited)
		}
	}
	if got := f.svc.leases.len(); got != 1 {
		t.Errorf("%d live leases, want 1 (globex's %s)", got, other.ID)
	}
	if got := metricValue(t, f.reg, "mantle_cache_coalesce_total", map[string]string{"outcome": "joined"}); got != 2 {
		t.Errorf("coalesce{joined} = %v, want 2", got)
	}
}

func TestCoalescingReleaseHandsTheLeaseOn(t *testing.T) {
	t.Parallel()
	f := newFixture(t, DefaultConfig())
	first := f.lease(t, "acme", question)
	w := f.coalesce(context.Background(), "acme", question, 0)
	f.waiters(t, 1)
	if ok, err := f.svc.Release(context.Background(), "globex", first.ID); err != nil || ok {
		t.Errorf("another tenant's Release = (%v, %v), want not released", ok, err)
	}
	if ok, err := f.svc.Release(context.Background(), "acme", first.ID); err != nil || !ok {
		t.Fatalf("Release = (%v, %v), want released", ok, err)
	}
	got := <-w
	if got.err != nil || got.res.Hit || got.res.Lease == nil || got.res.Lease.ID == first.ID {
		t.Fatalf("waiter after a release = (%+v, %v), want a miss with a lease of its own", got.res, got.err)
	}
	if ok, _ := f.svc.Release(context.Background(), "acme", first.ID); ok {
		t.Errorf("a second Release of the same lease succeeded")
	}
}

func TestCoalescingSkippedStoreReleases(t *testing.T) {
	t.Parallel()
	f := newFixture(t, DefaultConfig())
	lease := f.lease(t, "acme", question)
	w := f.coalesce(context.Background(), "acme", question, 0)
	f.waiters(t, 1)
	req := answer(basePrompt(question))
	req.LeaseID, req.FinishReason = lease.ID, "length" // a truncated answer is not for sharing
	if res, err := f.svc.Store(context.Background(), "acme", req); err != nil || res.Stored {
		t.Fatalf("Store = (%+v, %v), want skipped", res, err)
	}
	if got := <-w; got.err != nil || got.res.Hit || got.res.Lease == nil {
		t.Errorf("waiter = (%+v, %v), want a miss with its own lease", got.res, got.err)
	}
}

func TestCoalescingStoreOfAnotherPromptDoesNotAnswer(t *testing.T) {
	t.Parallel()
	f := newFixture(t, DefaultConfig())
	lease := f.lease(t, "acme", question)
	w := f.coalesce(context.Background(), "acme", question, 0)
	f.waiters(t, 1)
	req := answer(basePrompt("What is your refund policy?"))
	req.LeaseID = lease.ID
	f.mustStore(t, "acme", req)
	if got := <-w; got.err != nil || got.res.Hit || got.res.Lease == nil {
		t.Errorf("waiter = (%+v, %v), want a miss with its own lease, not another prompt's answer", got.res, got.err)
	}
}

func TestCoalescingLeaseExpires(t *testing.T) {
	t.Parallel()
	f := newFixture(t, DefaultConfig()) // lease_ttl 30s, max_wait 10s
	first := f.lease(t, "acme", question)
	// The waiter gives up after max_wait, before the lease expires.
	w := f.coalesce(context.Background(), "acme", question, 0)
	f.waiters(t, 1)
	f.clock.Advance(10 * time.Second) // the default max_wait
	got := <-w
	if got.err != nil || got.res.Hit || got.res.Lease != nil || got.res.MissReason != MissCoalesceTimeout || got.res.Waited != 10*time.Second {
		t.Fatalf("waiter after max_wait = (%+v, %v), want a miss with reason %s after 10s", got.res, got.err, MissCoalesceTimeout)
	}
	// A waiter allowed to wait longer than the lease lives (30s) takes over when it expires.
	cfg := DefaultConfig()
	cfg.Coalesce.MaxWait = time.Minute
	g := newFixture(t, cfg)
	first = g.lease(t, "acme", question)
	w = g.coalesce(context.Background(), "acme", question, 0)
	g.waiters(t, 1)
	g.clock.Advance(30 * time.Second)
	got = <-w
	if got.err != nil || got.res.Lease == nil || got.res.Lease.ID == first.ID {
		t.Fatalf("waiter after the lease expired = (%+v, %v), want a new lease", got.res, got.err)
	}
	// The expired holder's late answer neither answers nor fails.
	req := answer(basePrompt(question))
	req.LeaseID = first.ID
	if res, err := g.svc.Store(context.Background(), "acme", req); err != nil || !res.Stored {
		t.Errorf("late Store = (%+v, %v), want stored", res, err)
	}
}

func TestCoalescingLeaseEndsByTheRequestDeadline(t *testing.T) {
	t.Parallel()
	f := newFixture(t, DefaultConfig())
	deadline := epoch.Add(5 * time.Second)
	res, err := f.svc.Lookup(context.Background(), "acme", LookupRequest{Prompt: basePrompt(question), Coalesce: true, Deadline: deadline})
	if err != nil || res.Lease == nil || !res.Lease.ExpiresAt.Equal(deadline) {
		t.Fatalf("Lookup = (%+v, %v), want a lease ending at the request's deadline", res, err)
	}
}

func TestCoalescingWaiterCancelled(t *testing.T) {
	t.Parallel()
	f := newFixture(t, DefaultConfig())
	f.lease(t, "acme", question)
	ctx, cancel := context.WithCancel(context.Background())
	w := f.coalesce(ctx, "acme", question, 0)
	f.waiters(t, 1)
	cancel()
	if got := <-w; !errors.Is(got.err, context.Canceled) {
		t.Errorf("cancelled waiter = (%+v, %v), want context.Canceled", got.res, got.err)
	}
}

func TestCoalescingNeedsACacheablePrompt(t *testing.T) {
	t.Parallel()
	f := newFixture(t, DefaultConfig())
	for _, q := range []string{"What is the weather today?", "我的积分怎么还没到账"} {
		res, err := f.svc.Lookup(context.Background(), "acme", LookupRequest{Prompt: basePrompt(q), Coalesce: true})
		if err != nil || res.Lease != nil || res.MissReason == "" {
			t.Errorf("Lookup(%q) = (%+v, %v), want a miss without a lease: its answer could never be shared", q, res, err)
		}
	}
}

func TestCoalescingHitsNeedNoLease(t *testing.T) {
	t.Parallel()
	f := newFixture(t, DefaultConfig())
	f.mustStore(t, "acme", answer(basePrompt(question)))
	res, err := f.svc.Lookup(context.Background(), "acme", LookupRequest{Prompt: basePrompt(question), Coalesce: true})
	if err != nil || !res.Hit || res.Lease != nil {
		t.Errorf("Lookup = (%+v, %v), want a hit without a lease", res, err)
	}
}

func TestSweepLeases(t *testing.T) {
	t.Parallel()
	f := newFixture(t, DefaultConfig())
	f.lease(t, "acme", question)
	f.lease(t, "acme", "What is your refund policy?")
	if n := f.svc.SweepLeases(); n != 0 {
		t.Errorf("SweepLeases before expiry ended %d, want 0", n)
	}
	f.clock.Advance(30 * time.Second)
	if n := f.svc.SweepLeases(); n != 2 || f.svc.leases.len() != 0 {
		t.Errorf("SweepLeases after expiry ended %d (left %d), want 2 (0)", n, f.svc.leases.len())
	}
}

// slowPutIndex holds each Put until release is closed, as a remote backend's write takes
// its time; it tells entered when a Put starts.
type slowPutIndex struct {
	*EmbeddedIndex
	entered chan struct{}
	release chan struct{}
}

func (x slowPutIndex) Put(ctx context.Context, e Entry, v vector.Vector, near *vector.Near) error {
	x.entered <- struct{}{}
	<-x.release
	return x.EmbeddedIndex.Put(ctx, e, v, near)
}

// TestCoalescingLookupDuringTheWriteJoins: once the holder stores its answer, an identical
// lookup that arrives while the entry is being written joins the lease (the answer is on
// its way in) instead of missing and calling the model again; after the write, the lease
// is gone and the entry answers by its key.
func TestCoalescingLookupDuringTheWriteJoins(t *testing.T) {
	t.Parallel()
	idx := slowPutIndex{EmbeddedIndex: NewEmbeddedIndex(100, 0), entered: make(chan struct{}), release: make(chan struct{})}
	release := sync.OnceFunc(func() { close(idx.release) })
	t.Cleanup(release) // a failing test must not leave the Store blocked
	f := newFixtureWith(t, DefaultConfig(), idx, embed.NewLexical())
	lease := f.lease(t, "acme", question)
	req := answer(basePrompt(question))
	req.LeaseID = lease.ID
	stored := make(chan StoreResult, 1)
	go func() {
		res, err := f.svc.Store(context.Background(), "acme", req)
		if err != nil {
			t.Errorf("Store: %v", err)
		}
		stored <- res
	}()
	<-idx.entered // the answer is out to waiters; the entry is not in the index yet
	got := <-f.coalesce(context.Background(), "acme", question, time.Second)
	if got.err != nil || !got.res.Hit || got.res.Match != MatchCoalesced {
		t.Fatalf("lookup during the write = (%+v, %v), want the answer, coalesced", got.res, got.err)
	}
	release()
	res := <-stored
	if got.res.Entry.ID != res.EntryID {
		t.Errorf("joined entry %s, stored %s", got.res.Entry.ID, res.EntryID)
	}
	if n := f.svc.leases.len(); n != 0 {
		t.Errorf("%d live leases after the write, want 0", n)
	}
	after, err := f.svc.Lookup(context.Background(), "acme", LookupRequest{Prompt: basePrompt(question), Coalesce: true})
	if err != nil || !after.Hit || after.Match != MatchExact {
		t.Errorf("lookup after the write = (%+v, %v), want an exact hit", after, err)
	}
}

// countingEmbedder counts its calls.
type countingEmbedder struct {
	Embedder
	mu    sync.Mutex
	calls int
}

func (e *countingEmbedder) Embed(ctx context.Context, text string) (vector.Vector, error) {
	e.mu.Lock()
	e.calls++
	e.mu.Unlock()
	return e.Embedder.Embed(ctx, text)
}

func (e *countingEmbedder) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls
}

// A miss embeds its question once: the store that answers the lease reuses the lookup's
// vector (with a remote embedder, the second call is paid and on the request's path),
// and the stored entry is found by similarity as if it had been embedded again.
func TestCoalescingStoreReusesTheLookupsVector(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		lookup    string // the question the lease is taken for
		store     string // the question stored with the lease
		wantCalls int    // embeddings by lookup and store together
	}{
		{"the same question", question, question, 1},
		// The same exact key, other text: the lease's vector is not this question's.
		{"another spelling", question, "how do i reset my password", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			emb := &countingEmbedder{Embedder: embed.NewLexical()}
			f := newFixtureWith(t, DefaultConfig(), NewEmbeddedIndex(100, 0), emb)
			l := f.lease(t, "acme", tt.lookup)
			req := answer(basePrompt(tt.store))
			req.LeaseID = l.ID
			f.mustStore(t, "acme", req)
			if got := emb.count(); got != tt.wantCalls {
				t.Errorf("lookup %q and store %q embedded %d times, want %d", tt.lookup, tt.store, got, tt.wantCalls)
			}
			res := f.lookupMode(t, "acme", basePrompt("How can I reset my password?"), ModeNormal)
			if !res.Hit || res.Match != MatchSemantic {
				t.Errorf("a rewording after the store = %+v (rejected: %+v), want a semantic hit (the stored vector is the question's)", res, res.Rejected)
			}
		})
	}
	// A store without a lease embeds its question itself.
	emb := &countingEmbedder{Embedder: embed.NewLexical()}
	f := newFixtureWith(t, DefaultConfig(), NewEmbeddedIndex(100, 0), emb)
	f.mustStore(t, "acme", answer(basePrompt(question)))
	if got := emb.count(); got != 1 {
		t.Errorf("a store without a lease embedded %d times, want 1", got)
	}
}

// A store that answers the lease its own lookup took skips the prompt scans (the lease
// says they found nothing in that prompt); a lease does not carry that past its prompt:
// a store of another prompt with it is scanned, and one its scans forbid is skipped.
func TestCoalescingLeaseCarriesThePromptScans(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		stored string
		want   SkipReason
	}{
		{"the lease's own prompt", question, ""},
		{"another, personal prompt", "My e-mail is ada@example.com, what is my balance?", SkipPersonalPrompt},
		{"another, volatile prompt", "What time is it now?", SkipVolatilePrompt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, DefaultConfig())
			l := f.lease(t, "acme", question)
			req := answer(basePrompt(tt.stored))
			req.LeaseID = l.ID
			res, err := f.svc.Store(context.Background(), "acme", req)
			if err != nil {
				t.Fatalf("Store: %v", err)
			}
			if res.SkippedReason != tt.want || res.Stored != (tt.want == "") {
				t.Errorf("Store(%q) with the lease of %q = %+v, want skipped %q", tt.stored, question, res, tt.want)
			}
		})
	}
}

// storeDuringSearchIndex runs during, once it is armed, after its next Search has read the
// index and before that search returns: the lease holder's store completes, lease ended and
// all, between an identical lookup's reads of the index and its attempt at the lease.
type storeDuringSearchIndex struct {
	Index
	during atomic.Pointer[func()]
}

func (x *storeDuringSearchIndex) Search(ctx context.Context, q Query) ([]Candidate, error) {
	c, err := x.Index.Search(ctx, q)
	if f := x.during.Swap(nil); f != nil {
		(*f)()
	}
	return c, err
}

// TestCoalescingLookupOvertakenByTheStoreHits: a lookup that read the index just before
// the lease holder's entry was written, and reaches the lease table just after the lease
// ended, finds the entry instead of taking a new lease: the caller's next identical
// request (sent once the first one's answer came back) must not miss while the first
// answer is being stored after it was sent (router.async_cache_store). On every backend:
// the second read of the key goes to the index.
func TestCoalescingLookupOvertakenByTheStoreHits(t *testing.T) {
	t.Parallel()
	for _, b := range testBackends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			idx := &storeDuringSearchIndex{Index: b.open(t)}
			f := newFixtureWith(t, DefaultConfig(), idx, embed.NewLexical())
			lease := f.lease(t, "acme", question)
			var stored StoreResult
			store := func() {
				req := answer(basePrompt(question))
				req.LeaseID = lease.ID
				stored = f.mustStore(t, "acme", req)
			}
			idx.during.Store(&store)
			res, err := f.svc.Lookup(context.Background(), "acme", LookupRequest{Prompt: basePrompt(question), Coalesce: true})
			if stored.EntryID == "" {
				t.Fatal("the store did not run during the lookup's search")
			}
			if err != nil || !res.Hit || res.Entry.ID != stored.EntryID || res.Lease != nil {
				t.Errorf("Lookup = (hit %v, entry %q, lease %+v, miss reason %q, %v), want the stored entry %q without a lease",
					res.Hit, res.Entry.ID, res.Lease, res.MissReason, err, stored.EntryID)
			}
			if n := f.svc.leases.len(); n != 0 {
				t.Errorf("%d live leases, want none", n)
			}
			if got := metricValue(t, f.reg, "mantle_cache_coalesce_total", map[string]string{"outcome": "overtaken"}); got != 1 {
				t.Errorf("coalesce{overtaken} = %v, want 1", got)
			}
		})
	}
}
