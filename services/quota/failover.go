package quota

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	"github.com/mantle-mesh/mantle/pkg/app"
	"github.com/mantle-mesh/mantle/pkg/events"
)

// FailoverStore is a RedisStore that keeps working when Redis does not answer: each
// replica then enforces limit/replicas with a local MemoryStore, so that the replicas
// together stay near the limit (assuming the load balancer spreads requests evenly),
// and refuses requests of tenants with an enforced money budget (ErrBudgetUnavailable):
// money fails closed. It says so in mantle_quota_backend_fallback, in the log, and with
// a DegradationEvent (route "quota") on each switch; Run probes Redis every
// ProbeInterval and switches back when it answers.
//
// Reservations follow the store that made them: one granted locally is settled locally,
// one held in Redis cannot be settled while Redis is away (ErrStoreUnavailable), and its
// charge stands, as for any reservation that is never settled.
type FailoverStore struct {
	redis    *RedisStore
	local    *MemoryStore
	replicas int64
	clock    clockwork.Clock
	probe    time.Duration
	log      *slog.Logger
	events   app.Publisher
	metrics  *metrics

	mu   sync.Mutex
	down bool
}

// FailoverOptions configure a FailoverStore.
type FailoverOptions struct {
	// Replicas is how many quota replicas share Redis.
	Replicas      int
	ProbeInterval time.Duration
	Log           *slog.Logger
	Events        app.Publisher
}

// NewFailoverStore wraps primary. The Service built on it exports its state in the
// Service's metrics.
func NewFailoverStore(primary *RedisStore, clock clockwork.Clock, opts FailoverOptions) *FailoverStore {
	publisher := opts.Events
	if publisher == nil {
		publisher = discardEvents{}
	}
	return &FailoverStore{
		redis:    primary,
		local:    NewMemoryStore(clock),
		replicas: int64(max(opts.Replicas, 1)),
		clock:    clock,
		probe:    opts.ProbeInterval,
		log:      opts.Log,
		events:   publisher,
	}
}

var _ Store = (*FailoverStore)(nil)

// attach hands the store the Service's metrics.
func (f *FailoverStore) attach(m *metrics) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.metrics = m
	if f.down {
		m.backendFallback.Set(1)
	}
}

// Degraded reports whether the store runs on its local limiter.
func (f *FailoverStore) Degraded() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.down
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

// fail records that Redis is unreachable, once per outage.
func (f *FailoverStore) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return
	}
	f.down = true
	if f.metrics != nil {
		f.metrics.backendFallback.Set(1)
		f.metrics.backendFallbacks.Inc()
	}
	reason := fmt.Sprintf("quota backend unreachable: %v; enforcing limit/%d locally, money budgets fail closed", err, f.replicas)
	f.log.Warn("redis unreachable; quota falls back to the local limiter", "err", err, "replicas", f.replicas)
	f.events.Publish(context.Background(), events.SubjectDegradation, &eventsv1.DegradationEvent{
		At: timestamppb.New(f.clock.Now()), Route: "quota", Reason: reason,
	})
}

func (f *FailoverStore) recover() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.down {
		return
	}
	f.down = false
	if f.metrics != nil {
		f.metrics.backendFallback.Set(0)
	}
	f.log.Info("redis reachable again; quota uses the shared state")
	f.events.Publish(context.Background(), events.SubjectDegradation, &eventsv1.DegradationEvent{
		At: timestamppb.New(f.clock.Now()), Route: "quota", Reason: "quota backend recovered: shared limits enforced again",
	})
}

// Reserve implements Store.
func (f *FailoverStore) Reserve(ctx context.Context, c Charge) (Grant, error) {
	if !f.Degraded() {
		g, err := f.redis.Reserve(ctx, c)
		if !unreachable(ctx, err) {
			return g, err
		}
		f.fail(err)
	}
	if bc := c.Budget; bc != nil {
		if !bc.Shadow {
			return Grant{}, ErrBudgetUnavailable
		}
		c.Budget = nil // a shadow budget counts nothing while its state is away
	}
	local := c
	local.Buckets = make([]BucketSpec, len(c.Buckets))
	for i, b := range c.Buckets {
		b.Limit = f.share(b.Limit)
		// A request larger than this replica's share could never be covered here; it
		// takes the whole share instead.
		b.Cost = min(b.Cost, b.Limit)
		local.Buckets[i] = b
	}
	return f.local.Reserve(ctx, local)
}

// share is this replica's part of a limit: limit/replicas, rounded up so that no limit
// becomes 0.
func (f *FailoverStore) share(limit int64) int64 {
	return max((limit+f.replicas-1)/f.replicas, 1)
}

// Settle implements Store.
func (f *FailoverStore) Settle(ctx context.Context, tenant, id string, actual Actual, release bool) (Settlement, error) {
	st, err := f.local.Settle(ctx, tenant, id, actual, release)
	if !errors.Is(err, ErrReservationNotFound) {
		return st, err
	}
	if f.Degraded() {
		return Settlement{}, fmt.Errorf("reservation %s is held in Redis: %w", id, ErrStoreUnavailable)
	}
	st, err = f.redis.Settle(ctx, tenant, id, actual, release)
	if unreachable(ctx, err) {
		f.fail(err)
		return Settlement{}, fmt.Errorf("reservation %s is held in Redis: %w", id, ErrStoreUnavailable)
	}
	return st, err
}

// Observe implements Store.
func (f *FailoverStore) Observe(ctx context.Context, obs []Observation) ([]BucketLevel, error) {
	if !f.Degraded() {
		levels, err := f.redis.Observe(ctx, obs)
		if !unreachable(ctx, err) {
			return levels, err
		}
		f.fail(err)
	}
	local := make([]Observation, len(obs))
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
func (f *FailoverStore) CountRequest(ctx context.Context, key string, overall bool, window time.Duration) {
	if f.Degraded() {
		f.local.CountRequest(ctx, key, overall, window)
		return
	}
	f.redis.CountRequest(ctx, key, overall, window)
}

// AcquireRetry implements Store.
func (f *FailoverStore) AcquireRetry(ctx context.Context, ask RetryAsk) (RetryDecision, error) {
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
func (f *FailoverStore) Sweep(ctx context.Context) (int, error) {
	n, err := f.local.Sweep(ctx)
	_, rerr := f.redis.Sweep(ctx)
	return n, errors.Join(err, rerr)
}

// Close stops the Redis store's batcher.
func (f *FailoverStore) Close() error { return f.redis.Close() }

// Run flushes request counts to Redis and, while Redis is unreachable, probes it every
// ProbeInterval on the injected clock. It returns nil when ctx is done.
func (f *FailoverStore) Run(ctx context.Context) error {
	done := make(chan error, 1)
	go func() { done <- f.redis.Run(ctx) }()
	ticker := f.clock.NewTicker(f.probe)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return <-done
		case <-ticker.Chan():
			if !f.Degraded() {
				continue
			}
			pctx, cancel := context.WithTimeout(ctx, f.probe)
			err := f.redis.Ping(pctx)
			cancel()
			if err == nil {
				f.recover()
			}
		}
	}
}
