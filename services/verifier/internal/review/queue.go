package review

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	"github.com/mantle-mesh/mantle/pkg/events"
)

// QueueConfig names the JetStream objects of the review queue and sets its timings.
type QueueConfig struct {
	// Stream is the work-queue stream (default MANTLE_REVIEWS).
	Stream string
	// Consumer is the durable intake consumer (default verifier-intake).
	Consumer string
	// AckWait is how long the intake may hold a request before JetStream redelivers it:
	// longer than the longest review deadline, so that a live holder is never overtaken.
	AckWait time.Duration
	// PublishTimeout bounds one publish of a spooled request.
	PublishTimeout time.Duration
	// RetryMin and RetryMax bound the flusher's backoff while NATS is unreachable.
	RetryMin, RetryMax time.Duration
	// MaxEventBytes bounds an encoded review request (default 256 KiB): a prompt may be
	// a megabyte, more than NATS carries in one message. Longer texts are truncated with a
	// marker (boundEvent).
	MaxEventBytes int
}

func (c QueueConfig) withDefaults() QueueConfig {
	if c.Stream == "" {
		c.Stream = "MANTLE_REVIEWS"
	}
	if c.Consumer == "" {
		c.Consumer = "verifier-intake"
	}
	if c.AckWait <= 0 {
		c.AckWait = 16 * time.Minute
	}
	if c.PublishTimeout <= 0 {
		c.PublishTimeout = 5 * time.Second
	}
	if c.MaxEventBytes <= 0 {
		c.MaxEventBytes = 256 << 10
	}
	if c.RetryMin <= 0 {
		c.RetryMin = time.Second
	}
	if c.RetryMax < c.RetryMin {
		c.RetryMax = max(30*time.Second, c.RetryMin)
	}
	return c
}

// Queue carries review requests from Verify to the Service through a disk spool and a
// JetStream work-queue stream (see the package documentation).
type Queue struct {
	cfg   QueueConfig
	js    jetstream.JetStream
	spool *events.Spool
	svc   *Service
	clock clockwork.Clock
	log   *slog.Logger

	kick chan struct{}

	mu   sync.Mutex
	held map[string]jetstream.Msg

	// flushed, when set (tests, metrics), observes the outcome of every flush attempt.
	flushed atomic.Pointer[func(n int, err error)]
}

// NewQueue builds a queue; Run starts it.
func NewQueue(cfg QueueConfig, js jetstream.JetStream, spool *events.Spool, svc *Service, clock clockwork.Clock, log *slog.Logger) *Queue {
	q := &Queue{
		cfg: cfg.withDefaults(), js: js, spool: spool, svc: svc, clock: clock, log: log,
		kick: make(chan struct{}, 1), held: map[string]jetstream.Msg{},
	}
	svc.SetAcker(q)
	spool.OnDeadLetter(func(rec events.SpoolRecord, err error) {
		log.Error("review request refused by NATS for good; moved to the spool's dead/ directory", "review_id", rec.MsgID, "seq", rec.Seq, "bytes", len(rec.Data), "err", err)
	})
	return q
}

// OnFlush installs a callback that observes every flush attempt (tests, metrics). It runs
// on the flusher's goroutine after the published records are deleted from the spool.
func (q *Queue) OnFlush(f func(n int, err error)) { q.flushed.Store(&f) }

// Spooled is the number of requests waiting on disk.
func (q *Queue) Spooled() int { return q.spool.Len() }

// Enqueue stores a review request durably (it survives a crash and a NATS outage once
// Enqueue returns nil) and wakes the flusher. It does not wait for NATS.
func (q *Queue) Enqueue(_ context.Context, ev *eventsv1.ReviewRequestEvent) error {
	ev = boundEvent(ev, q.cfg.MaxEventBytes)
	data, err := proto.Marshal(ev)
	if err != nil {
		return fmt.Errorf("encode review request: %w", err)
	}
	if _, err := q.spool.Append(events.SpoolRecord{Subject: SubjectRequests, MsgID: ev.GetReviewId(), Data: data}); err != nil {
		return fmt.Errorf("spool review request: %w", err)
	}
	q.Kick()
	return nil
}

// Kick wakes the flusher now instead of at its next retry.
func (q *Queue) Kick() {
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// Run sets up the stream and consumer (retrying while NATS is unreachable), flushes the
// spool and runs the intake until ctx is done.
func (q *Queue) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { q.flushLoop(ctx) })
	wg.Go(func() { q.intakeLoop(ctx) })
	wg.Wait()
	return nil
}

// wait blocks for d on the injected clock, or until kicked (when kick is non-nil) or ctx is
// done; it reports false when ctx is done.
func (q *Queue) wait(ctx context.Context, d time.Duration, kick <-chan struct{}) bool {
	t := q.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-kick:
		return true
	case <-t.Chan():
		return true
	}
}

func (q *Queue) flushLoop(ctx context.Context) {
	publish := events.PublishToJetStream(q.js)
	withTimeout := func(ctx context.Context, rec events.SpoolRecord) error {
		ctx, cancel := context.WithTimeout(ctx, q.cfg.PublishTimeout)
		defer cancel()
		return publish(ctx, rec)
	}
	backoff := q.cfg.RetryMin
	for {
		next := q.cfg.RetryMax // idle: look again now and then even without a kick
		if q.spool.Len() > 0 {
			n, err := q.spool.Flush(ctx, withTimeout)
			if f := q.flushed.Load(); f != nil {
				(*f)(n, err)
			}
			if err != nil && ctx.Err() == nil {
				q.log.WarnContext(ctx, "review requests stay spooled: publishing failed", "published", n, "spooled", q.spool.Len(), "retry_in", backoff, "err", err)
				next, backoff = backoff, min(2*backoff, q.cfg.RetryMax)
			} else {
				backoff = q.cfg.RetryMin
			}
		}
		if !q.wait(ctx, next, q.kick) {
			return
		}
	}
}

// setup creates the work-queue stream and the intake consumer.
func (q *Queue) setup(ctx context.Context) (jetstream.Consumer, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := q.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        q.cfg.Stream,
		Description: "mantle review requests waiting for a verifier to store them (work queue)",
		Subjects:    []string{SubjectRequests},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Duplicates:  2 * time.Minute,
	})
	if err != nil {
		return nil, fmt.Errorf("create stream %s: %w", q.cfg.Stream, err)
	}
	cons, err := q.js.CreateOrUpdateConsumer(ctx, q.cfg.Stream, jetstream.ConsumerConfig{
		Durable:       q.cfg.Consumer,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       q.cfg.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: 100_000,
	})
	if err != nil {
		return nil, fmt.Errorf("create consumer %s: %w", q.cfg.Consumer, err)
	}
	return cons, nil
}

func (q *Queue) intakeLoop(ctx context.Context) {
	backoff := q.cfg.RetryMin
	var cons jetstream.Consumer
	for {
		var err error
		if cons, err = q.setup(ctx); err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		q.log.WarnContext(ctx, "review queue not set up yet", "retry_in", backoff, "err", err)
		if !q.wait(ctx, backoff, nil) {
			return
		}
		backoff = min(2*backoff, q.cfg.RetryMax)
	}
	q.Kick() // the stream exists now: whatever is spooled can go
	cc, err := cons.Consume(func(msg jetstream.Msg) { q.intake(ctx, msg) },
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			q.log.DebugContext(ctx, "review intake", "err", err)
		}))
	if err != nil {
		q.log.ErrorContext(ctx, "review intake did not start", "err", err)
		<-ctx.Done()
		return
	}
	<-ctx.Done()
	cc.Stop()
	<-cc.Closed()
}

// intake stores one request and holds its message until the review's outcome is stored.
func (q *Queue) intake(ctx context.Context, msg jetstream.Msg) {
	ev := &eventsv1.ReviewRequestEvent{}
	if err := proto.Unmarshal(msg.Data(), ev); err != nil {
		q.log.ErrorContext(ctx, "review request dropped: not a ReviewRequestEvent", "err", err)
		_ = msg.Term()
		return
	}
	stored, _, err := q.svc.Open(ctx, FromEvent(ev))
	if err != nil {
		q.log.WarnContext(ctx, "review request not stored; will be redelivered", "review_id", ev.GetReviewId(), "err", err)
		_ = msg.NakWithDelay(q.cfg.RetryMin)
		return
	}
	if stored.State.Final() {
		q.ackMsg(ctx, stored.ID, msg)
		return
	}
	q.mu.Lock()
	q.held[stored.ID] = msg
	q.mu.Unlock()
}

// Ack acknowledges the held message of a review whose outcome is stored. A review held by
// another replica is acknowledged there, by Reconcile or on redelivery.
func (q *Queue) Ack(ctx context.Context, reviewID string) {
	q.mu.Lock()
	msg, ok := q.held[reviewID]
	delete(q.held, reviewID)
	q.mu.Unlock()
	if ok {
		q.ackMsg(ctx, reviewID, msg)
	}
}

func (q *Queue) ackMsg(ctx context.Context, reviewID string, msg jetstream.Msg) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), q.cfg.PublishTimeout)
	defer cancel()
	// Wait for the server's confirmation: if it is lost, redelivery finds the stored outcome
	// and acknowledges again, so nothing is lost either way.
	if err := msg.DoubleAck(ctx); err != nil {
		q.log.WarnContext(ctx, "review request not acknowledged; it will be redelivered and acknowledged then",
			"review_id", reviewID, "err", err)
	}
}

// Held is the number of requests this replica holds un-acknowledged.
func (q *Queue) Held() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.held)
}

// Reconcile acknowledges held requests whose reviews another replica decided or timed out.
func (q *Queue) Reconcile(ctx context.Context) {
	q.mu.Lock()
	ids := make([]string, 0, len(q.held))
	for id := range q.held {
		ids = append(ids, id)
	}
	q.mu.Unlock()
	for _, id := range ids {
		r, _, err := q.svc.store.getReview(ctx, id)
		if err != nil {
			if !errors.Is(err, ErrNotFound) {
				return // the store is unreachable; try at the next sweep
			}
			continue
		}
		if r.State.Final() {
			q.Ack(ctx, id)
		}
	}
}

// LazyJetStreamKV is a JetStreamKV whose bucket is created on first use, so that a verifier
// can start while NATS is unreachable (review calls fail with ErrUnavailable until it is).
type LazyJetStreamKV struct {
	js  jetstream.JetStream
	cfg jetstream.KeyValueConfig

	mu sync.Mutex
	kv jetstream.KeyValue
}

// NewLazyJetStreamKV returns a KV over the bucket cfg describes.
func NewLazyJetStreamKV(js jetstream.JetStream, cfg jetstream.KeyValueConfig) *LazyJetStreamKV {
	return &LazyJetStreamKV{js: js, cfg: cfg}
}

func (l *LazyJetStreamKV) bucket(ctx context.Context) (JetStreamKV, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.kv == nil {
		kv, err := l.js.CreateOrUpdateKeyValue(ctx, l.cfg)
		if err != nil {
			return JetStreamKV{}, unavailable(fmt.Errorf("key-value bucket %s: %w", l.cfg.Bucket, err))
		}
		l.kv = kv
	}
	return JetStreamKV{KV: l.kv}, nil
}

// Create implements KV.
func (l *LazyJetStreamKV) Create(ctx context.Context, key string, value []byte) (uint64, error) {
	b, err := l.bucket(ctx)
	if err != nil {
		return 0, err
	}
	return b.Create(ctx, key, value)
}

// Get implements KV.
func (l *LazyJetStreamKV) Get(ctx context.Context, key string) ([]byte, uint64, error) {
	b, err := l.bucket(ctx)
	if err != nil {
		return nil, 0, err
	}
	return b.Get(ctx, key)
}

// Update implements KV.
func (l *LazyJetStreamKV) Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	b, err := l.bucket(ctx)
	if err != nil {
		return 0, err
	}
	return b.Update(ctx, key, value, revision)
}

// Keys implements KV.
func (l *LazyJetStreamKV) Keys(ctx context.Context, prefix string) ([]string, error) {
	b, err := l.bucket(ctx)
	if err != nil {
		return nil, err
	}
	return b.Keys(ctx, prefix)
}
