package review

import (
	"context"
	"github.com/mantle-mesh/mantle/pkg/natsembed"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	"github.com/mantle-mesh/mantle/pkg/events"
)

type queueFixture struct {
	*fixture
	queue  *Queue
	js     jetstream.JetStream
	stream string
	cancel context.CancelFunc
	done   chan struct{}
}

func startQueue(t *testing.T) *queueFixture {
	t.Helper()
	srv, err := natsembed.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, NewLazyJetStreamKV(js, jetstream.KeyValueConfig{Bucket: "reviews_q", History: 1}))
	spool, err := events.OpenSpool(t.TempDir(), events.SpoolLimits{})
	if err != nil {
		t.Fatal(err)
	}
	q := NewQueue(QueueConfig{Stream: "REVIEWS_Q", Consumer: "intake_q", AckWait: time.Hour, PublishTimeout: 5 * time.Second},
		js, spool, f.svc, clockwork.NewFakeClock(), slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	qf := &queueFixture{fixture: f, queue: q, js: js, stream: "REVIEWS_Q", cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(qf.done)
		_ = q.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-qf.done
	})
	return qf
}

func (q *queueFixture) streamMsgs(t *testing.T) uint64 {
	t.Helper()
	s, err := q.js.Stream(context.Background(), q.stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func request(id string, due time.Time) *eventsv1.ReviewRequestEvent {
	return &eventsv1.ReviewRequestEvent{
		At: timestamppb.New(t0), RequestId: id, Tenant: "acme", Scenario: "legal", ReviewId: ID("acme", id),
		RiskScore: 0.9, Reason: "risk", Content: "无需鉴定。", Question: "工伤认定要鉴定吗", DueAt: timestamppb.New(due),
		DefaultAction: "keep",
	}
}

func TestQueueHoldsARequestUntilItsDecisionIsStored(t *testing.T) {
	t.Parallel()
	q := startQueue(t)
	ctx := context.Background()
	flushed := make(chan int, 8)
	q.queue.OnFlush(func(n int, err error) {
		// A flush may also find nothing yet (it raced the append it was woken for).
		if err == nil && n > 0 {
			flushed <- n
		}
	})
	ev := request("req-1", t0.Add(15*time.Minute))
	if err := q.queue.Enqueue(ctx, ev); err != nil {
		t.Fatalf("Enqueue: %v", err)
	}
	// The intake stored it (the opened event is published after the store write).
	opened := q.pub.wait(t, SubjectOpened, 1).(*eventsv1.ReviewRequestEvent)
	if opened.GetReviewId() != ev.GetReviewId() {
		t.Fatalf("opened %s, want %s", opened.GetReviewId(), ev.GetReviewId())
	}
	select {
	case n := <-flushed:
		if n != 1 || q.queue.Spooled() != 0 {
			t.Errorf("flushed %d, spooled %d; want 1 and 0", n, q.queue.Spooled())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no successful flush")
	}
	// Not acknowledged yet: the work queue still holds the request.
	if n := q.streamMsgs(t); n != 1 {
		t.Fatalf("stream holds %d messages before the decision, want 1", n)
	}
	if _, err := q.svc.Claim(ctx, ClaimRequest{ID: ev.GetReviewId(), Reviewer: "alice"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := q.svc.Decide(ctx, DecideRequest{ID: ev.GetReviewId(), Reviewer: "alice", Verdict: VerdictApprove,
		RootCause: CauseNone, CorrectiveAction: ActionNone}); err != nil {
		t.Fatal(err)
	}
	// Decide acknowledged synchronously (double ack), so the work queue is empty now.
	if n := q.streamMsgs(t); n != 0 {
		t.Errorf("stream holds %d messages after the decision, want 0", n)
	}
	if q.queue.Held() != 0 {
		t.Errorf("held = %d, want 0", q.queue.Held())
	}
}

func TestQueueDeduplicatesAndAcknowledgesFinishedReviews(t *testing.T) {
	t.Parallel()
	q := startQueue(t)
	ctx := context.Background()
	ev := request("req-1", t0.Add(15*time.Minute))
	// Enqueued twice (the sync check and the L3 follow-up both asked): one review.
	for range 2 {
		if err := q.queue.Enqueue(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	q.pub.wait(t, SubjectOpened, 1)
	if n := q.streamMsgs(t); n != 1 {
		t.Errorf("stream holds %d messages, want 1 (the duplicate is dropped by its Nats-Msg-Id)", n)
	}
	reviews, _, err := q.svc.List(ctx, Filter{}, Page{})
	if err != nil || len(reviews) != 1 {
		t.Fatalf("reviews = %v, %v; want one", reviews, err)
	}

	// Timing the review out is an outcome too: the request is acknowledged then.
	q.clock.Advance(16 * time.Minute)
	if n, err := q.svc.Sweep(ctx); n != 1 || err != nil {
		t.Fatalf("Sweep = %d, %v", n, err)
	}
	if n := q.streamMsgs(t); n != 0 {
		t.Errorf("stream holds %d messages after the timeout, want 0", n)
	}
}

// TestQueueCarriesAOneMebibytePrompt: a review of a 1 MiB prompt and a 1 MiB answer once
// made a spool record over NATS's max payload, retried forever in front of every other
// review. It is delivered (its texts cut with a marker), and the review behind it too.
func TestQueueCarriesAOneMebibytePrompt(t *testing.T) {
	t.Parallel()
	q := startQueue(t)
	ctx := context.Background()
	big := request("req-big", t0.Add(15*time.Minute))
	big.Question = strings.Repeat("工伤认定要鉴定吗？", (1<<20)/27+1) // 1 MiB of three-byte runes
	big.Content = strings.Repeat("x", 1<<20)
	small := request("req-small", t0.Add(15*time.Minute))
	for _, ev := range []*eventsv1.ReviewRequestEvent{big, small} {
		if err := q.queue.Enqueue(ctx, ev); err != nil {
			t.Fatalf("Enqueue %s: %v", ev.GetRequestId(), err)
		}
	}
	q.pub.wait(t, SubjectOpened, 2)
	for _, ev := range []*eventsv1.ReviewRequestEvent{big, small} {
		r, err := q.svc.Get(ctx, "", ev.GetReviewId())
		if err != nil {
			t.Fatalf("review %s was not delivered: %v", ev.GetRequestId(), err)
		}
		if ev == small {
			if r.Question != small.Question || r.Content != small.Content {
				t.Errorf("small review changed: %q %q", r.Question, r.Content)
			}
			continue
		}
		for name, text := range map[string]string{"question": r.Question, "content": r.Content} {
			if len(text) > 64<<10 || !strings.Contains(text, "truncated by mantle") || !utf8.ValidString(text) {
				t.Errorf("%s: %d bytes, marked %v, UTF-8 %v; want it cut to 64 KiB with a marker", name, len(text), strings.Contains(text, "truncated by mantle"), utf8.ValidString(text))
			}
		}
		if !strings.HasPrefix(r.Question, "工伤认定要鉴定吗？") {
			t.Errorf("question starts %q, want the prompt's start", r.Question[:30])
		}
	}
	if q.queue.Spooled() != 0 {
		t.Errorf("%d requests still spooled", q.queue.Spooled())
	}
}
