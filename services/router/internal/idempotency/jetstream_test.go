package idempotency

import (
	"context"
	"errors"
	"fmt"
	"github.com/mantle-mesh/mantle/pkg/natsembed"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// startNATS starts an embedded NATS server with JetStream for the test.
func startNATS(t testing.TB) *natsembed.Server {
	t.Helper()
	srv, err := natsembed.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

// connect returns a JetStream context on a connection closed when the test ends.
func connect(t testing.TB, srv *natsembed.Server) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

var bucketSeq atomic.Int64

// newBucketName returns a bucket name no other test uses.
func newBucketName() string { return fmt.Sprintf("idem_%d", bucketSeq.Add(1)) }

func newJetStreamFixture(srv *natsembed.Server) func(t *testing.T) fixture {
	return func(t *testing.T) fixture {
		_, js := connect(t, srv)
		clock := clockwork.NewFakeClockAt(epoch)
		s, err := newJetStream(t.Context(), js, newBucketName(), testTTL, testInflightTTL, clock)
		if err != nil {
			t.Fatal(err)
		}
		return fixture{store: s, now: clock.Now, advance: clock.Advance, awaitWaiters: awaitTimers(clock)}
	}
}

// TestJetStream runs the shared suite against a real JetStream bucket. The store's clock is
// fake, so deadlines and record expiry are exact; the bucket's own TTL (an hour) never
// fires during the test.
func TestJetStream(t *testing.T) {
	testStore(t, newJetStreamFixture(startNATS(t)))
}

func TestNewJetStream(t *testing.T) {
	srv := startNATS(t)
	_, js := connect(t, srv)
	tests := []struct {
		name             string
		bucket           string
		ttl, inflightTTL time.Duration
		wantErr          bool
	}{
		{name: "valid", bucket: "idem_new", ttl: time.Hour, inflightTTL: time.Minute},
		{name: "binds an existing bucket and updates its ttl", bucket: "idem_new", ttl: 2 * time.Hour, inflightTTL: time.Minute},
		{name: "inflight not below ttl", bucket: "idem_bad", ttl: time.Minute, inflightTTL: time.Minute, wantErr: true},
		{name: "zero ttl", bucket: "idem_bad", ttl: 0, inflightTTL: time.Minute, wantErr: true},
		{name: "zero inflight", bucket: "idem_bad", ttl: time.Hour, inflightTTL: 0, wantErr: true},
		{name: "invalid bucket name", bucket: "idem bad", ttl: time.Hour, inflightTTL: time.Minute, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewJetStream(t.Context(), js, tt.bucket, tt.ttl, tt.inflightTTL)
			if (err != nil) != tt.wantErr {
				t.Fatalf("NewJetStream() error = %v, want error %v", err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			kv, err := js.KeyValue(t.Context(), tt.bucket)
			if err != nil {
				t.Fatal(err)
			}
			st, err := kv.Status(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if st.TTL() != tt.ttl || st.History() != 1 {
				t.Errorf("bucket TTL %s history %d, want %s and 1", st.TTL(), st.History(), tt.ttl)
			}
		})
	}
}

// TestJetStreamReplicas checks the guarantees across two router replicas: two stores, two
// connections, one bucket, one clock.
func TestJetStreamReplicas(t *testing.T) {
	srv := startNATS(t)
	type replicas struct {
		a, b  *JetStream
		clock *clockwork.FakeClock
	}
	setup := func(t *testing.T) replicas {
		bucket := newBucketName()
		clock := clockwork.NewFakeClockAt(epoch)
		var r replicas
		r.clock = clock
		for _, s := range []**JetStream{&r.a, &r.b} {
			_, js := connect(t, srv)
			var err error
			if *s, err = newJetStream(t.Context(), js, bucket, testTTL, testInflightTTL, clock); err != nil {
				t.Fatal(err)
			}
		}
		return r
	}

	tests := []struct {
		name string
		run  func(t *testing.T, r replicas)
	}{
		{name: "duplicate on another replica joins", run: func(t *testing.T, r replicas) {
			mustOwn(t, r.a, "k")
			waiter := beginAsync(t.Context(), r.b, "k")
			awaitTimers(r.clock)(t, 1)
			want := Record{Response: []byte("a"), At: r.clock.Now()}
			mustComplete(t, r.a, "k", want)
			if got := receive(t, waiter); got.err != nil || got.owner || string(got.rec.Response) != "a" {
				t.Fatalf("waiter on replica b = %+v, want replica a's record", got)
			}
		}},
		{name: "abandon on one replica hands over to the other", run: func(t *testing.T, r replicas) {
			mustOwn(t, r.a, "k")
			waiter := beginAsync(t.Context(), r.b, "k")
			awaitTimers(r.clock)(t, 1)
			mustAbandon(t, r.a, "k")
			if got := receive(t, waiter); got.err != nil || !got.owner {
				t.Fatalf("waiter on replica b = %+v, want to own the key", got)
			}
			// Replica a's stale Abandon must not release b's claim.
			mustAbandon(t, r.a, "k")
			mustTimeOut(t, r.a, "k")
		}},
		{name: "taken-over owner still records first", run: func(t *testing.T, r replicas) {
			mustOwn(t, r.a, "k")
			r.clock.Advance(testInflightTTL)
			mustOwn(t, r.b, "k")
			first := Record{Response: []byte("a, late"), At: r.clock.Now()}
			mustComplete(t, r.a, "k", first)
			mustComplete(t, r.b, "k", Record{Response: []byte("b")})
			mustReplay(t, r.a, "k", first)
			mustReplay(t, r.b, "k", first)
		}},
		{name: "taken-over owner's abandon keeps the new claim", run: func(t *testing.T, r replicas) {
			mustOwn(t, r.a, "k")
			r.clock.Advance(testInflightTTL)
			mustOwn(t, r.b, "k")
			mustAbandon(t, r.a, "k")
			mustTimeOut(t, r.a, "k")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.run(t, setup(t)) })
	}
}

// TestJetStreamRealClock runs the takeover of a dead owner on the real clock, as in
// production: the waiter's Begin returns once the claim's one-second deadline passes.
func TestJetStreamRealClock(t *testing.T) {
	srv := startNATS(t)
	const inflight = time.Second
	bucket := newBucketName()
	_, jsA := connect(t, srv)
	_, jsB := connect(t, srv)
	dead, err := NewJetStream(t.Context(), jsA, bucket, time.Minute, inflight)
	if err != nil {
		t.Fatal(err)
	}
	live, err := NewJetStream(t.Context(), jsB, bucket, time.Minute, inflight)
	if err != nil {
		t.Fatal(err)
	}
	mustOwn(t, dead, "k") // and never completes
	ctx, cancel := context.WithTimeout(t.Context(), waitBound)
	defer cancel()
	if got := receive(t, beginAsync(ctx, live, "k")); got.err != nil || !got.owner {
		t.Fatalf("waiter = %+v, want to take the dead owner's claim over", got)
	}
	want := Record{Response: []byte("answer")}
	mustComplete(t, live, "k", want)
	rec, owner, err := dead.Begin(t.Context(), "k")
	if err != nil || owner || string(rec.Response) != "answer" {
		t.Fatalf("Begin on the other replica = (%v, %v, %v), want the record", rec, owner, err)
	}
}

// TestJetStreamErrors checks that the store reports trouble instead of hanging or
// pretending: a closed connection, a lost connection while waiting, a value it cannot read.
func TestJetStreamErrors(t *testing.T) {
	srv := startNATS(t)

	t.Run("closed connection", func(t *testing.T) {
		nc, js := connect(t, srv)
		s, err := NewJetStream(t.Context(), js, newBucketName(), time.Hour, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		nc.Close()
		if _, owner, err := s.Begin(t.Context(), "k"); err == nil || owner {
			t.Errorf("Begin on a closed connection = (%v, %v), want an error", owner, err)
		}
		if err := s.Complete(t.Context(), "k", Record{}); err == nil {
			t.Error("Complete on a closed connection succeeded")
		}
	})

	t.Run("connection lost while waiting", func(t *testing.T) {
		bucket := newBucketName()
		_, jsA := connect(t, srv)
		owner, err := NewJetStream(t.Context(), jsA, bucket, time.Hour, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		ncB, jsB := connect(t, srv)
		clock := clockwork.NewFakeClockAt(epoch)
		waiting, err := newJetStream(t.Context(), jsB, bucket, time.Hour, time.Minute, clock)
		if err != nil {
			t.Fatal(err)
		}
		mustOwn(t, owner, "k")
		ctx, cancel := context.WithTimeout(t.Context(), waitBound)
		defer cancel()
		waiter := beginAsync(ctx, waiting, "k")
		awaitTimers(clock)(t, 1)
		ncB.Close()
		got := receive(t, waiter)
		if got.err == nil || got.owner || errors.Is(got.err, context.DeadlineExceeded) {
			t.Fatalf("waiter after its connection closed = %+v, want a prompt error", got)
		}
	})

	t.Run("unreadable value", func(t *testing.T) {
		_, js := connect(t, srv)
		bucket := newBucketName()
		s, err := NewJetStream(t.Context(), js, bucket, time.Hour, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		kv, err := js.KeyValue(t.Context(), bucket)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(t.Context(), bucketKey("k"), []byte("not json")); err != nil {
			t.Fatal(err)
		}
		if _, owner, err := s.Begin(t.Context(), "k"); err == nil || owner {
			t.Errorf("Begin on an unreadable value = (%v, %v), want an error", owner, err)
		}
		// Complete overwrites it: a good answer beats a value nobody can read.
		want := Record{Response: []byte("ok"), At: time.Now()}
		mustComplete(t, s, "k", want)
		mustReplay(t, s, "k", want)
	})
}
