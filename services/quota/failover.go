package quota

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	"github.com/mantle-mesh/mantle/pkg/app"
	"github.com/mantle-mesh/mantle/pkg/events"
	"github.com/mantle-mesh/mantle/services/quota/internal/ledger"
	"github.com/mantle-mesh/mantle/services/quota/internal/memstore"
	"github.com/mantle-mesh/mantle/services/quota/internal/redisstore"
)

// failoverStore is a redisstore.Store that keeps working when Redis does not answer: each
// replica then enforces limit/replicas with a local memstore.Store, so that the replicas
// together stay near the limit (assuming the load balancer spreads requests evenly),
// and refuses requests of tenants with an enforced money budget (ErrBudgetUnavailable):
// money fails closed. It says so in mantle_quota_backend_fallback, in the log, in
// Degradation (which /readyz shows) and with a DegradationEvent (route "quota") on each
// switch; Run probes Redis every ProbeInterval and switches back when it answers.
//
// Only an outage switches (unreachable): a refusal, or any other answer Redis gives, is
// returned as it is.
//
// Switches hand over what the replica knows, so that neither side starts from a full
// bucket (docs/quota.md, "Redis outage and recovery"):
//   - to the local limiter: each bucket this replica used in the last window starts at
//     its share of the level Redis last reported (plus the refill since), not full;
//   - back to Redis that kept its data: each bucket the local limiter charged is lowered
//     to the local level times the replica count (what the replicas hold together when
//     the load balancer spreads evenly; Observe never raises, so the emptiest replica's
//     view wins, which errs towards refusing);
//   - back to Redis that lost its data (its epoch marker changed or went missing, seen
//     on the way back and by a check every ProbeInterval while healthy): each bucket this
//     replica used in the last window is recreated holding only what it refilled since
//     the marker was rewritten, as if it had been emptied then.
//
// Reservations follow the store that made them: one granted locally is settled locally,
// one held in Redis cannot be settled while Redis is away (ErrStoreUnavailable), and its
// charge stands, as for any reservation that is never settled.
type failoverStore struct {
	redis    *redisstore.Store
	local    *memstore.Store
	replicas int64
	clock    clockwork.Clock
	probe    time.Duration
	log      *slog.Logger
	events   app.Publisher
	recent   recentBuckets

	// mu guards the state below; a switch back to Redis holds it while it hands over,
	// so that no request is decided halfway.
	mu      sync.Mutex
	metrics *metrics
	down    bool
	reason  string // why, while down
	// epoch is Redis's epoch marker as last seen; "" before the first contact.
	epoch string
}

// failoverOptions configure a FailoverStore.
type failoverOptions struct {
	// Replicas is how many quota replicas share Redis.
	Replicas      int
	ProbeInterval time.Duration
	Log           *slog.Logger
	Events        app.Publisher
}

// newFailoverStore wraps primary. The Service built on it exports its state in the
// Service's metrics.
func newFailoverStore(primary *redisstore.Store, clock clockwork.Clock, opts failoverOptions) *failoverStore {
	publisher := opts.Events
	if publisher == nil {
		publisher = discardEvents{}
	}
	probe := opts.ProbeInterval
	if probe <= 0 {
		probe = time.Second
	}
	return &failoverStore{
		redis:    primary,
		local:    memstore.New(clock),
		replicas: int64(max(opts.Replicas, 1)),
		clock:    clock,
		probe:    probe,
		log:      opts.Log,
		events:   publisher,
		recent:   recentBuckets{m: make(map[string]*recentBucket)},
	}
}

var _ stateStore = (*failoverStore)(nil)

// attach hands the store the Service's metrics.
func (f *failoverStore) attach(m *metrics) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.metrics = m
	if f.down {
		m.backendFallback.Set(1)
	}
}

// Degraded reports whether the store runs on its local limiter.
func (f *failoverStore) Degraded() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.down
}

// Degradation says why the store runs on its local limiter; "" while it uses Redis.
func (f *failoverStore) Degradation() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.down {
		return ""
	}
	return f.reason
}

// unreachable reports whether err means Redis could not answer: the connection failed
// (dial, reset, EOF, an I/O timeout), no connection was free in time, the Redis call's
// own deadline passed, or Redis replied "not now" (LOADING, READONLY, CLUSTERDOWN,
// MASTERDOWN, TRYAGAIN, BUSY, max clients). Only these send the replica to its local
// limiter. Everything else is an answer and is returned as it is: a refusal
// (*ExhaustedError) or any other domain error, a script's error, a malformed reply, the
// store or client being closed; and so is the caller giving up (its context is done).
func unreachable(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	if rerr, ok := errors.AsType[redis.Error](err); ok {
		msg := rerr.Error()
		for _, p := range []string{"LOADING", "READONLY", "CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN", "BUSY", "ERR max number of clients"} {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
		return false
	}
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrPoolExhausted),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return true
	case errors.Is(err, context.DeadlineExceeded):
		// The caller's context is live (checked above), so the deadline was the Redis
		// call's own: a dial or command timeout.
		return true
	}
	// Dial errors, I/O timeouts and closed connections not matched above.
	_, isNet := errors.AsType[net.Error](err)
	return isNet
}

// fail records that Redis is unreachable, once per outage, and seeds the local limiter
// from what Redis last said.
func (f *failoverStore) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return
	}
	f.goLocal(err, "redis unreachable; quota falls back to the local limiter")
}

// goLocal switches to the local limiter. Callers hold f.mu.
func (f *failoverStore) goLocal(err error, msg string) {
	now := f.clock.Now()
	f.seedLocal(now)
	f.down = true
	f.reason = fmt.Sprintf("redis unreachable since %s: %v; enforcing limit/%d locally, money budgets fail closed", now.UTC().Format(time.RFC3339), err, f.replicas)
	if f.metrics != nil {
		f.metrics.backendFallback.Set(1)
		f.metrics.backendFallbacks.Inc()
	}
	f.log.Warn(msg, "err", err, "replicas", f.replicas)
	f.events.Publish(context.Background(), events.SubjectDegradation, &eventsv1.DegradationEvent{
		At: timestamppb.New(now), Route: "quota", Reason: "quota backend unreachable: " + err.Error() + fmt.Sprintf("; enforcing limit/%d locally, money budgets fail closed", f.replicas),
	})
}

// seedLocal lowers each recently used local bucket to this replica's share of the level
// Redis last reported for it, plus the refill since: a tenant that had spent its bucket
// does not get a full one from every replica when Redis goes away. Callers hold f.mu.
func (f *failoverStore) seedLocal(now time.Time) {
	var obs []ledger.Observation
	for _, e := range f.recent.snapshot(now) {
		if e.remaining < 0 || now.Sub(e.seen) >= ledger.Window {
			continue
		}
		level := min(e.spec.Limit, addSaturating(e.remaining, ledger.TokensIn(now.Sub(e.seen), e.spec.Limit)))
		b := e.spec
		b.Limit = f.share(b.Limit)
		obs = append(obs, ledger.Observation{Bucket: b, Remaining: min(level/f.replicas, b.Limit)})
	}
	if len(obs) > 0 {
		// A memstore.Store's Observe fails only on a done context.
		_, _ = f.local.Observe(context.Background(), obs)
	}
}

// reconnect reads Redis's epoch marker and, when Redis lost its data or the store comes
// back from the local limiter, hands over (see FailoverStore) and uses Redis again. An
// error leaves the store as it was.
func (f *failoverStore) reconnect(ctx context.Context) error {
	now, err := f.redis.Now(ctx)
	if err != nil {
		return err
	}
	marker, created, err := f.redis.Epoch(ctx, newEpoch(now))
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	// A marker this replica never saw: Redis lost its data. At the first contact a
	// marker that exists is trusted, and one this replica had to write is not (Redis
	// may have lost it while the replica was starting).
	lost := marker != f.epoch && (f.epoch != "" || created)
	if !lost && !f.down {
		f.epoch = marker
		return nil
	}
	local := f.clock.Now()
	if lost {
		if err := f.restore(ctx, now, epochTime(marker, now)); err != nil {
			return err
		}
		if f.epoch != "" || f.down {
			f.log.Warn("redis lost the quota state; buckets used in the last window restart empty and refill at their rate", "epoch", marker)
		} else {
			// The first contact with a Redis that never held quota state: a new deployment.
			f.log.Info("quota epoch marker written", "epoch", marker)
		}
	} else if err := f.handBack(ctx, local); err != nil {
		return err
	}
	f.recent.handedOver()
	f.local.ForgetBuckets()
	f.epoch = marker
	if f.down {
		f.down, f.reason = false, ""
		if f.metrics != nil {
			f.metrics.backendFallback.Set(0)
		}
		f.log.Info("redis reachable again; quota uses the shared state", "restored", lost)
		f.events.Publish(context.Background(), events.SubjectDegradation, &eventsv1.DegradationEvent{
			At: timestamppb.New(local), Route: "quota", Reason: "quota backend recovered: shared limits enforced again",
		})
	}
	return nil
}

// restore lowers every bucket this replica used in the last window to what it refilled
// since restoredAt, on Redis's clock (now). Observe never raises a bucket, so replicas
// restoring one bucket in any order agree. Callers hold f.mu.
func (f *failoverStore) restore(ctx context.Context, now, restoredAt time.Time) error {
	var obs []ledger.Observation
	for _, e := range f.recent.snapshot(f.clock.Now()) {
		obs = append(obs, ledger.Observation{Bucket: e.spec, Remaining: min(e.spec.Limit, ledger.TokensIn(now.Sub(restoredAt), e.spec.Limit))})
	}
	slices.SortFunc(obs, func(a, b ledger.Observation) int { return strings.Compare(a.Bucket.Group, b.Bucket.Group) })
	_, err := f.redis.Observe(ctx, obs)
	return err
}

// handBack lowers each bucket the local limiter charged to the local level times the
// replica count. The local buckets started from Redis's level (seedLocal) and refilled
// at their share of the rate, so together they are the bucket as it would be had Redis
// answered all along. Callers hold f.mu.
func (f *failoverStore) handBack(ctx context.Context, now time.Time) error {
	var obs []ledger.Observation
	for _, e := range f.recent.snapshot(now) {
		if !e.local {
			continue
		}
		level := f.local.Level(e.spec.Name(), f.share(e.spec.Limit))
		obs = append(obs, ledger.Observation{Bucket: e.spec, Remaining: min(e.spec.Limit, level*f.replicas)})
	}
	slices.SortFunc(obs, func(a, b ledger.Observation) int { return strings.Compare(a.Bucket.Group, b.Bucket.Group) })
	_, err := f.redis.Observe(ctx, obs)
	return err
}

// newEpoch is a fresh epoch marker: when it was written (the decision clock, ns) and a
// random part, so that two replicas writing at one instant still differ.
func newEpoch(now time.Time) string {
	return fmt.Sprintf("%d:%s", now.UnixNano(), uuid.NewString()[:8])
}

// epochTime is when marker was written; fallback when it cannot be read.
func epochTime(marker string, fallback time.Time) time.Time {
	ns, _, _ := strings.Cut(marker, ":")
	n, err := strconv.ParseInt(ns, 10, 64)
	if err != nil {
		return fallback
	}
	return time.Unix(0, n)
}

// Reserve implements Store.
func (f *failoverStore) Reserve(ctx context.Context, c ledger.Charge) (ledger.Grant, error) {
	if !f.Degraded() {
		g, err := f.redis.Reserve(ctx, c)
		if !unreachable(ctx, err) {
			f.recent.sawRedis(f.clock.Now(), c, g, err)
			return g, err
		}
		f.fail(err)
	}
	if bc := c.Budget; bc != nil {
		if !bc.Shadow {
			return ledger.Grant{}, errBudgetUnavailable
		}
		c.Budget = nil // a shadow budget counts nothing while its state is away
	}
	local := c
	local.Buckets = make([]ledger.BucketSpec, len(c.Buckets))
	for i, b := range c.Buckets {
		b.Limit = f.share(b.Limit)
		// A request larger than this replica's share could never be covered here; it
		// takes the whole share instead.
		b.Cost = min(b.Cost, b.Limit)
		local.Buckets[i] = b
	}
	g, err := f.local.Reserve(ctx, local)
	if err == nil {
		f.recent.spentLocally(f.clock.Now(), c)
	}
	return g, err
}

// share is this replica's part of a limit: limit/replicas, rounded up so that no limit
// becomes 0.
func (f *failoverStore) share(limit int64) int64 {
	return max((limit+f.replicas-1)/f.replicas, 1)
}

// Settle implements Store.
func (f *failoverStore) Settle(ctx context.Context, tenant, id string, actual ledger.Actual, release bool) (ledger.Settlement, error) {
	st, err := f.local.Settle(ctx, tenant, id, actual, release)
	if !errors.Is(err, ledger.ErrReservationNotFound) {
		return st, err
	}
	if f.Degraded() {
		return ledger.Settlement{}, fmt.Errorf("reservation %s is held in Redis: %w", id, errStoreUnavailable)
	}
	st, err = f.redis.Settle(ctx, tenant, id, actual, release)
	if unreachable(ctx, err) {
		f.fail(err)
		return ledger.Settlement{}, fmt.Errorf("reservation %s is held in Redis: %w", id, errStoreUnavailable)
	}
	return st, err
}

// Observe implements Store.
func (f *failoverStore) Observe(ctx context.Context, obs []ledger.Observation) ([]ledger.BucketLevel, error) {
	if !f.Degraded() {
		levels, err := f.redis.Observe(ctx, obs)
		if !unreachable(ctx, err) {
			return levels, err
		}
		f.fail(err)
	}
	local := make([]ledger.Observation, len(obs))
	for i, o := range obs {
		o.Bucket.Limit = f.share(o.Bucket.Limit)
		if o.Remaining > 0 {
			o.Remaining = max(o.Remaining/f.replicas, 1)
		}
		local[i] = o
	}
	return f.local.Observe(ctx, local)
}

// CountRequest implements Store.
func (f *failoverStore) CountRequest(ctx context.Context, key string, overall bool, window time.Duration) {
	if f.Degraded() {
		f.local.CountRequest(ctx, key, overall, window)
		return
	}
	f.redis.CountRequest(ctx, key, overall, window)
}

// AcquireRetry implements Store.
func (f *failoverStore) AcquireRetry(ctx context.Context, ask ledger.RetryAsk) (ledger.RetryDecision, error) {
	if !f.Degraded() {
		d, err := f.redis.AcquireRetry(ctx, ask)
		if !unreachable(ctx, err) {
			return d, err
		}
		f.fail(err)
	}
	// The ratio holds per replica as it holds overall; the floor is shared.
	ask.Budget.Floor = int(f.share(int64(ask.Budget.Floor)))
	return f.local.AcquireRetry(ctx, ask)
}

// Sweep implements Store.
func (f *failoverStore) Sweep(ctx context.Context) (int, error) {
	n, err := f.local.Sweep(ctx)
	_, rerr := f.redis.Sweep(ctx)
	return n, errors.Join(err, rerr)
}

// Close stops the Redis store's batcher.
func (f *failoverStore) Close() error { return f.redis.Close() }

// Run flushes request counts to Redis and contacts Redis: once at the start (a Redis
// unreachable then is logged and the store starts on its local limiter), then every
// ProbeInterval on the injected clock: to switch back while Redis is away, and to check
// its epoch marker while it answers. It returns nil when ctx is done.
func (f *failoverStore) Run(ctx context.Context) error {
	done := make(chan error, 1)
	go func() { done <- f.redis.Run(ctx) }()
	f.start(ctx)
	ticker := f.clock.NewTicker(f.probe)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return <-done
		case <-ticker.Chan():
			f.recent.prune(f.clock.Now())
			f.check(ctx)
		}
	}
}

// start is the first contact with Redis.
func (f *failoverStore) start(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, f.probe)
	defer cancel()
	err := f.redis.Ping(pctx)
	if err == nil {
		err = f.reconnect(pctx)
	}
	if err == nil || ctx.Err() != nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.down {
		f.goLocal(err, "redis unreachable at start; quota starts on the local limiter and switches when redis answers")
	}
}

// check probes Redis while it is away, and reads its epoch marker while it answers.
func (f *failoverStore) check(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, f.probe)
	defer cancel()
	if f.Degraded() {
		if err := f.redis.Ping(pctx); err == nil {
			if err := f.reconnect(pctx); err != nil {
				f.log.Debug("redis answers but the switch back failed; trying again", "err", err)
			}
		}
		return
	}
	if err := f.reconnect(pctx); unreachable(pctx, err) {
		f.fail(err)
	} else if err != nil {
		f.log.Warn("reading the quota epoch marker", "err", err)
	}
}
