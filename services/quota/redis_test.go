package quota

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	"github.com/mantle-mesh/mantle/services/quota/internal/ledger"
	"github.com/mantle-mesh/mantle/services/quota/internal/memstore"
	"github.com/mantle-mesh/mantle/services/quota/internal/redisstore"
)

// Tests of what only the Redis backend has: Redis's clock, key layout, the over-limit
// cache, falling back when Redis is away, and several replicas sharing one tenant.

// A tenant's buckets, budget and reservations share one hash tag, hence one cluster
// slot (the reservations are fields of the tenant's hash); an upstream key's live
// under its own.
func TestRedisKeysShareTheirGroupsSlot(t *testing.T) {
	t.Parallel()
	c := newTestRedisClient(t)
	prefix := testPrefix(t, c)
	clock := clockwork.NewFakeClockAt(t0)
	store := redisstore.New(c, redisstore.Options{Prefix: prefix, Clock: clock})
	t.Cleanup(func() { _ = store.Close() })
	cfg := testConfig()
	cfg.ModelLimits = map[string]map[string]RateLimits{"*": {"gpt-4o": {TPM: 3000}}}
	cfg.Budgets = BudgetsConfig{Tenants: map[string]Budget{"a{c}me": {DailyUSD: 10}}, Prices: map[string]Price{"gpt-4o": {InputPerMillion: 1}}}
	cfg.UpstreamKeys = map[string]RateLimits{"k1": {TPM: 6000}}
	f := newFixtureWith(t, store, clock, cfg)
	for _, tenant := range []string{"acme", "a{c}me"} {
		if _, err := f.svc.Reserve(context.Background(), reserveRequest{Tenant: tenant, Model: "gpt-4o", InputTokens: 10, UpstreamKey: "k1"}); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := c.Keys(context.Background(), prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	tags := map[string]int{}
	for _, k := range keys {
		rest := strings.TrimPrefix(k, prefix)
		open, end := strings.IndexByte(rest, '{'), strings.IndexByte(rest, '}')
		if open != 0 || end < 0 {
			t.Fatalf("key %q does not start with a hash tag", k)
		}
		tags[rest[1:end]]++
	}
	// Per tenant: one hash of buckets, budget and the reservation's record. The key: its
	// bucket hash.
	want := map[string]int{"tenant:acme": 1, "tenant:a%7Bc%7Dme": 1, "key:k1": 1}
	if len(tags) != len(want) {
		t.Fatalf("hash tags %v, want %v", tags, want)
	}
	for tag, n := range want {
		if tags[tag] != n {
			t.Errorf("hash tag %q has %d keys, want %d (all: %v)", tag, tags[tag], n, tags)
		}
	}
}

func TestRedisOverLimitCache(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClockAt(t0)
	store := newTestRedisStore(t, clock, redisstore.Options{OverLimitCache: 2 * time.Second})
	f := newFixtureWith(t, store, clock, testConfig())
	f.reserve(t, "acme", 5999, 1) // empty; 100 tokens a second

	reserve := func(tokens int64) error {
		_, err := f.svc.Reserve(context.Background(), reserveRequest{Tenant: "acme", Model: "m", InputTokens: tokens - 1, MaxOutputTokens: 1})
		return err
	}
	if err := reserve(500); !errors.Is(err, ledger.ErrExhausted) {
		t.Fatalf("err = %v, want exhausted", err)
	}
	calls := store.RoundTrips()
	steps := []struct {
		name      string
		advance   time.Duration
		tokens    int64
		wantErr   bool
		wantCalls int64 // round trips this step
		wantRetry time.Duration
	}{
		{"the same request is refused locally", 0, 500, true, 0, 5 * time.Second},
		{"the refill is estimated locally", time.Second, 500, true, 0, 4 * time.Second},
		{"a request the estimate covers asks Redis", 0, 100, false, 1, 0},
		{"an entry lives at most the cache time", 2 * time.Second, 500, true, 1, 3 * time.Second},
	}
	for _, s := range steps {
		clock.Advance(s.advance)
		err := reserve(s.tokens)
		if got := store.RoundTrips() - calls; got != s.wantCalls {
			t.Errorf("%s: %d round trips, want %d", s.name, got, s.wantCalls)
		}
		calls = store.RoundTrips()
		if (err != nil) != s.wantErr {
			t.Fatalf("%s: err = %v, want error %v", s.name, err, s.wantErr)
		}
		if e, ok := errors.AsType[*ledger.ExhaustedError](err); ok && e.RetryAfter != s.wantRetry {
			t.Errorf("%s: retry after %v, want %v", s.name, e.RetryAfter, s.wantRetry)
		}
	}
}

// flakyProxy forwards TCP to Redis until cut; while cut it drops every connection.
type flakyProxy struct {
	lis    net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

func startFlakyProxy(t *testing.T, target string) *flakyProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &flakyProxy{lis: lis, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.serve)
	t.Cleanup(func() {
		_ = lis.Close()
		p.setCut(true)
		p.wg.Wait()
	})
	return p
}

func (p *flakyProxy) addr() string { return p.lis.Addr().String() }

func (p *flakyProxy) serve() {
	for {
		in, err := p.lis.Accept()
		if err != nil {
			return // listener closed
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			_ = in.Close()
			continue
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			_ = in.Close()
			continue
		}
		p.conns[in], p.conns[out] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Go(func() { _, _ = io.Copy(out, in); _ = out.Close() })
		p.wg.Go(func() { _, _ = io.Copy(in, out); _ = in.Close() })
	}
}

func (p *flakyProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			_ = c.Close()
		}
		clear(p.conns)
	}
}

// eventChan is an app.Publisher that hands events to the test as they come.
type eventChan chan proto.Message

func (e eventChan) Publish(_ context.Context, _ string, msg proto.Message) { e <- msg }

func TestRedisFailover(t *testing.T) {
	t.Parallel()
	addr := redisAddrForTest(t)
	proxy := startFlakyProxy(t, addr)
	client := redis.NewClient(&redis.Options{Addr: proxy.addr(), MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
	t.Cleanup(func() { _ = client.Close() })
	clean := newTestRedisClient(t)
	clock := clockwork.NewFakeClockAt(t0)
	events := make(eventChan, 100)
	store := newFailoverStore(redisstore.New(client, redisstore.Options{Prefix: testPrefix(t, clean), Clock: clock}), clock,
		failoverOptions{Replicas: 3, ProbeInterval: time.Second, Log: slog.New(slog.DiscardHandler), Events: events})
	t.Cleanup(func() { _ = store.Close() })
	cfg := testConfig()
	cfg.DefaultLimits = RateLimits{RPM: 600, TPM: 6000}
	cfg.Budgets = BudgetsConfig{Tenants: map[string]Budget{"payg": {DailyUSD: 10}}, Prices: map[string]Price{"m": {InputPerMillion: 1}}}
	reg := prometheus.NewRegistry()
	svc, err := newService(cfg, serviceDeps{Store: store, Clock: clock, Metrics: reg, Log: slog.New(slog.DiscardHandler), Events: events})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{svc: svc, store: store, clock: clock, reg: reg}
	ctx := context.Background()
	reserve := func(tenant string, tokens int64) (reserveOutcome, error) {
		return svc.Reserve(ctx, reserveRequest{Tenant: tenant, Model: "m", InputTokens: tokens - 1, MaxOutputTokens: 1})
	}
	// Run first, as the module does: its first contact reads Redis's epoch marker.
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- store.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	if err := clock.BlockUntilContext(ctx, 2); err != nil { // the probe and flush tickers
		t.Fatal(err)
	}

	held, err := reserve("acme", 1000)
	if err != nil {
		t.Fatal(err)
	}
	if store.Degraded() || f.counter(t, "mantle_quota_backend_fallback") != 0 {
		t.Fatal("degraded while Redis answers")
	}

	proxy.setCut(true)
	local, err := reserve("acme", 1000)
	if err != nil {
		t.Fatalf("with Redis cut: %v, want admitted by the local limiter", err)
	}
	if !store.Degraded() || f.counter(t, "mantle_quota_backend_fallback") != 1 || f.counter(t, "mantle_quota_backend_fallbacks_total") != 1 {
		t.Error("the fallback is not visible in Degraded and the metrics")
	}
	if ev := nextDegradation(t, events); ev.GetRoute() != "quota" || !strings.Contains(ev.GetReason(), "limit/3") {
		t.Errorf("event = %v, want a quota degradation naming limit/3", ev)
	}
	// This replica's share of 6000 is 2000, and it starts at its share of what Redis
	// last said (5000 / 3 = 1666): 666 more fit, then no more.
	if local.Levels.Tokens.Limit != 2000 || local.Levels.Tokens.Remaining != 666 {
		t.Errorf("local level = %+v, want 666 of 2000 left", local.Levels.Tokens)
	}
	if _, err := reserve("acme", 1001); !errors.Is(err, ledger.ErrExhausted) {
		t.Errorf("beyond the local share: err = %v, want exhausted", err)
	}
	// Money fails closed.
	if _, err := reserve("payg", 10); !errors.Is(err, errBudgetUnavailable) {
		t.Errorf("budgeted tenant: err = %v, want ErrBudgetUnavailable", err)
	}
	// A reservation held in Redis cannot be settled now; a local one can.
	if _, err := svc.Settle(ctx, settleRequest{Tenant: "acme", ReservationID: held.ReservationID, Usage: &tokenUsage{}}); !errors.Is(err, errStoreUnavailable) {
		t.Errorf("settling a Redis reservation: err = %v, want ErrStoreUnavailable", err)
	}
	if st, err := svc.Settle(ctx, settleRequest{Tenant: "acme", ReservationID: local.ReservationID, Usage: &tokenUsage{TotalTokens: 400}}); err != nil || st.Refunded != 600 {
		t.Errorf("settling a local reservation: %+v, %v; want 600 refunded", st, err)
	}

	// Redis comes back; the next probe notices.
	proxy.setCut(false)
	clock.Advance(time.Second)
	if ev := nextDegradation(t, events); !strings.Contains(ev.GetReason(), "recovered") {
		t.Errorf("event = %v, want recovered", ev)
	}
	if store.Degraded() || f.counter(t, "mantle_quota_backend_fallback") != 0 {
		t.Error("still degraded after recovery")
	}
	// Shared state again, lowered to what the local limiter held times three: it
	// started at 1666, took 1000, got 600 back and refilled a second of its share
	// (33): 1299, so 3897 in Redis (which alone would hold 5100), 3797 after this 100.
	r, err := reserve("acme", 100)
	if err != nil || r.Levels.Tokens.Limit != 6000 || r.Levels.Tokens.Remaining != 3797 {
		t.Errorf("after recovery: levels %+v, err %v; want Redis's 3797 of 6000", r.Levels.Tokens, err)
	}
	if _, err := svc.Settle(ctx, settleRequest{Tenant: "acme", ReservationID: held.ReservationID, Usage: &tokenUsage{}}); err != nil {
		t.Errorf("settling the Redis reservation after recovery: %v", err)
	}
}

func nextDegradation(t *testing.T, events eventChan) *eventsv1.DegradationEvent {
	t.Helper()
	for {
		select {
		case msg := <-events:
			if ev, ok := msg.(*eventsv1.DegradationEvent); ok {
				return ev
			}
		case <-time.After(10 * time.Second): // a failure timeout, not a wait
			t.Fatal("no degradation event")
			return nil
		}
	}
}

// Three replicas on one Redis hold one tenant's TPM together: over five simulated
// minutes of demand far above the limit they admit what one bucket allows (capacity
// plus five minutes of refill) within 5%, and never more. Three replicas with memory
// stores, for contrast, admit about three times as much: the limit would multiply with
// the replica count.
func TestMultiReplicaTPMWithinFivePercent(t *testing.T) {
	t.Parallel()
	const (
		limit    = 60_000 // tokens per minute
		replicas = 3
		duration = 5 * time.Minute
		step     = 200 * time.Millisecond
	)
	want := int64(limit + limit*int64(duration/time.Minute))
	run := func(t *testing.T, stores func(clock clockwork.Clock) []stateStore) int64 {
		clock := clockwork.NewFakeClockAt(t0)
		cfg := testConfig()
		cfg.DefaultLimits = RateLimits{RPM: 1_000_000, TPM: limit}
		var svcs []*service
		for _, s := range stores(clock) {
			svcs = append(svcs, newFixtureWith(t, s, clock, cfg).svc)
		}
		var (
			mu       sync.Mutex
			admitted int64
		)
		rng := rand.New(rand.NewPCG(1, 2))
		for range duration / step {
			var wg sync.WaitGroup
			for i, svc := range svcs {
				sizes := []int64{100 + rng.Int64N(1900), 100 + rng.Int64N(1900), 100 + rng.Int64N(1900)}
				wg.Go(func() {
					for _, n := range sizes {
						r, err := svc.Reserve(context.Background(), reserveRequest{Tenant: "acme", RequestID: fmt.Sprint(i), Model: "m", InputTokens: n - 1, MaxOutputTokens: 1})
						if err == nil {
							mu.Lock()
							admitted += r.ReservedTokens
							mu.Unlock()
						} else if !errors.Is(err, ledger.ErrExhausted) {
							t.Errorf("replica %d: %v", i, err)
						}
					}
				})
			}
			wg.Wait()
			clock.Advance(step)
		}
		return admitted
	}

	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		c := newTestRedisClient(t)
		prefix := testPrefix(t, c)
		got := run(t, func(clock clockwork.Clock) []stateStore {
			var out []stateStore
			for range replicas {
				s := redisstore.New(c, redisstore.Options{Prefix: prefix, Clock: clock})
				t.Cleanup(func() { _ = s.Close() })
				out = append(out, s)
			}
			return out
		})
		if got > want || got < want*95/100 {
			t.Errorf("three replicas admitted %d tokens in %v, want within 5%% below %d", got, duration, want)
		}
		t.Logf("admitted %d of %d tokens (%.2f%%)", got, want, 100*float64(got)/float64(want))
	})
	t.Run("memory, for contrast", func(t *testing.T) {
		t.Parallel()
		got := run(t, func(clock clockwork.Clock) []stateStore {
			var out []stateStore
			for range replicas {
				out = append(out, memstore.New(clock))
			}
			return out
		})
		if got < want*replicas*95/100 {
			t.Errorf("three unshared replicas admitted %d, want about %d: the test would not notice a limit that multiplies", got, want*replicas)
		}
	})
}

// retarget sends new connections to addr (a Redis that replaced the old one).
func (p *flakyProxy) retarget(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = addr
}
