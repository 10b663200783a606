package verifier

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/services/verifier/internal/review"
)

// startNATS starts a NATS server with JetStream on 127.0.0.1:port (0: a free port) storing
// in dir, so that a test can stop it and start it again with the same address and data.
// (pkg/natsembed.Start always picks a new port and a new directory.)
func startNATS(t *testing.T, port int, dir string) *server.Server {
	t.Helper()
	if port == 0 {
		port = server.RANDOM_PORT
	}
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	if !srv.ReadyForConnections(waitFor) {
		t.Fatal("nats did not become ready")
	}
	return srv
}

func stopNATS(srv *server.Server) {
	srv.Shutdown()
	srv.WaitForShutdown()
}

// TestReviewQueueSurvivesNATSOutage is the end-to-end path of review requests through
// JetStream: a risky answer's request reaches the work-queue stream and the review store;
// with NATS stopped, the next one is spooled to disk and arrives once NATS is back; a
// decision acknowledges the request and is announced.
func TestReviewQueueSurvivesNATSOutage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	srv := startNATS(t, 0, dir)
	port := srv.Addr().(*net.TCPAddr).Port
	t.Cleanup(func() { stopNATS(srv) })

	reconnected := make(chan struct{}, 1)
	nc, err := nats.Connect(srv.ClientURL(),
		nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond), nats.RetryOnFailedConnect(true),
		nats.ReconnectHandler(func(*nats.Conn) {
			select {
			case reconnected <- struct{}{}:
			default:
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}

	cfg := DefaultConfig()
	cfg.Review.SpoolDir = t.TempDir()
	ts := startServer(t, cfg, serverOptions{nats: nc})
	ctx := context.Background()
	streamMsgs := func() uint64 {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, waitFor)
		defer cancel()
		s, err := js.Stream(ctx, cfg.Review.Stream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}

	// 1. NATS is up: the request goes through the work queue into the review store, and
	// stays in the stream (unacknowledged) while nobody has decided.
	first, err := ts.client.Verify(ctx, riskyRequest("req-up"))
	if err != nil || first.GetReviewId() == "" {
		t.Fatalf("Verify = %v, %v; want a review", first, err)
	}
	opened := ts.events.wait(t, review.SubjectOpened, 1).(*eventsv1.ReviewRequestEvent)
	if opened.GetReviewId() != first.GetReviewId() {
		t.Fatalf("opened %s, want %s", opened.GetReviewId(), first.GetReviewId())
	}
	if n := streamMsgs(); n != 1 {
		t.Fatalf("work queue holds %d requests, want 1", n)
	}

	// 2. NATS goes away. Verify still answers at once, and the request is on disk.
	stopNATS(srv)
	second, err := ts.client.Verify(ctx, riskyRequest("req-down"))
	if err != nil || second.GetReviewId() == "" {
		t.Fatalf("Verify while NATS is down = %v, %v; want the answer and a review id", second, err)
	}
	if n := ts.module.queue.Spooled(); n != 1 {
		t.Fatalf("spooled = %d while NATS is down, want 1", n)
	}
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := ts.client.ListReviews(short, &verifierv1.ListReviewsRequest{}); err == nil {
		t.Error("ListReviews succeeded with the review store down; want an error")
	}

	// 3. NATS comes back on the same port with the same data: the spooled request arrives.
	flushed := make(chan int, 8)
	ts.module.queue.OnFlush(func(n int, err error) {
		if err == nil && n > 0 {
			flushed <- n
		}
	})
	srv = startNATS(t, port, dir)
	select {
	case <-reconnected:
	case <-time.After(waitFor):
		t.Fatal("the client did not reconnect")
	}
	ts.module.queue.Kick()
	opened = ts.events.wait(t, review.SubjectOpened, 2).(*eventsv1.ReviewRequestEvent)
	if opened.GetReviewId() != second.GetReviewId() {
		t.Fatalf("second opened %s, want %s", opened.GetReviewId(), second.GetReviewId())
	}
	select {
	case n := <-flushed:
		if n != 1 || ts.module.queue.Spooled() != 0 {
			t.Errorf("flushed %d, spooled %d after NATS returned; want 1 and 0", n, ts.module.queue.Spooled())
		}
	case <-time.After(waitFor):
		t.Fatal("the spool was not flushed")
	}
	if n := streamMsgs(); n != 2 {
		t.Errorf("work queue holds %d requests, want 2", n)
	}

	// 4. A decision is stored, then the request acknowledged, then the decision announced.
	list, err := ts.client.ListReviews(ctx, &verifierv1.ListReviewsRequest{})
	if err != nil || len(list.GetReviews()) != 2 {
		t.Fatalf("ListReviews = %v, %v; want both reviews", list, err)
	}
	if _, err := ts.client.ClaimReview(ctx, &verifierv1.ClaimReviewRequest{ReviewId: second.GetReviewId(), Reviewer: "alice"}); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.client.DecideReview(ctx, &verifierv1.DecideReviewRequest{
		ReviewId: second.GetReviewId(), Reviewer: "alice", Verdict: verifierv1.ReviewVerdict_REVIEW_VERDICT_REJECT,
		RootCause: verifierv1.RootCause_ROOT_CAUSE_TERM_MISREAD, CorrectiveAction: verifierv1.CorrectiveAction_CORRECTIVE_ACTION_ADD_RULE,
	}); err != nil {
		t.Fatal(err)
	}
	decision := ts.events.wait(t, review.SubjectDecision, 1).(*eventsv1.ReviewDecisionEvent)
	if decision.GetReviewId() != second.GetReviewId() || decision.GetRootCause() != "term_misread" {
		t.Errorf("decision event = %v", decision)
	}
	if n := streamMsgs(); n != 1 {
		t.Errorf("work queue holds %d requests after the decision, want 1 (the undecided one)", n)
	}
}
