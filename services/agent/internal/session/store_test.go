package session

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/mantle-mesh/mantle/pkg/natsembed"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// epoch is where every fake clock starts.
var epoch = time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)

// waitBound bounds every wait on another goroutine: generous, because it only matters when
// the code under test is broken.
const waitBound = 10 * time.Second

// backend makes a fresh, empty store on the clock (the memory store expires keys on it;
// JetStream's expiry is the server's, in real time).
type backend struct {
	name     string
	newStore func(t *testing.T, clock clockwork.Clock) Store
}

// backends are the stores every shared test runs against: memory, and a real JetStream
// bucket on an embedded NATS server started once for the package's tests.
func backends(t *testing.T) []backend {
	t.Helper()
	srv := sharedNATS(t)
	return []backend{
		{name: "memory", newStore: func(_ *testing.T, clock clockwork.Clock) Store { return NewMemory(1000, clock) }},
		{name: "jetstream", newStore: func(t *testing.T, _ clockwork.Clock) Store {
			_, js := connect(t, srv)
			s, err := NewJetStream(t.Context(), js, newBucketName(), 0)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}},
	}
}

// sharedNATS starts an embedded NATS server with JetStream for the calling test.
func sharedNATS(t *testing.T) *natsembed.Server {
	t.Helper()
	srv, err := natsembed.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

// connect returns a JetStream context on a connection closed when the test ends.
func connect(t *testing.T, srv *natsembed.Server) (*nats.Conn, jetstream.JetStream) {
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

func newBucketName() string { return fmt.Sprintf("sessions_%d", bucketSeq.Add(1)) }

func changed(t *testing.T, w Watch) {
	t.Helper()
	select {
	case <-w.Changes():
	case <-time.After(waitBound):
		t.Fatalf("no change reported within %s", waitBound)
	}
}

func unchanged(t *testing.T, w Watch) {
	t.Helper()
	select {
	case <-w.Changes():
		t.Fatal("a change was reported, want none")
	default:
	}
}

// TestStore is the contract of a Store, run against both.
func TestStore(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			tests := []struct {
				name string
				run  func(t *testing.T, s Store)
			}{
				{"get of a missing key", func(t *testing.T, s Store) {
					if _, _, err := s.Get(t.Context(), "s.a.b"); !errors.Is(err, ErrNotFound) {
						t.Fatalf("Get = %v, want ErrNotFound", err)
					}
				}},
				{"create then get", func(t *testing.T, s Store) {
					rev, err := s.Create(t.Context(), "s.a.b", []byte("v1"), time.Hour)
					if err != nil {
						t.Fatal(err)
					}
					v, got, err := s.Get(t.Context(), "s.a.b")
					if err != nil || string(v) != "v1" || got != rev {
						t.Fatalf("Get = (%q, %d, %v), want (v1, %d, nil)", v, got, err, rev)
					}
				}},
				{"create of an existing key conflicts", func(t *testing.T, s Store) {
					if _, err := s.Create(t.Context(), "s.a.b", []byte("v1"), time.Hour); err != nil {
						t.Fatal(err)
					}
					if _, err := s.Create(t.Context(), "s.a.b", []byte("v2"), time.Hour); !errors.Is(err, ErrConflict) {
						t.Fatalf("second Create = %v, want ErrConflict", err)
					}
				}},
				{"update on the revision read", func(t *testing.T, s Store) {
					rev, err := s.Create(t.Context(), "s.a.b", []byte("v1"), time.Hour)
					if err != nil {
						t.Fatal(err)
					}
					rev2, err := s.Update(t.Context(), "s.a.b", []byte("v2"), rev, time.Hour)
					if err != nil || rev2 == rev {
						t.Fatalf("Update = (%d, %v), want a new revision", rev2, err)
					}
					if _, err := s.Update(t.Context(), "s.a.b", []byte("v3"), rev, time.Hour); !errors.Is(err, ErrConflict) {
						t.Fatalf("Update on an old revision = %v, want ErrConflict", err)
					}
					v, _, err := s.Get(t.Context(), "s.a.b")
					if err != nil || string(v) != "v2" {
						t.Fatalf("Get = (%q, %v), want v2", v, err)
					}
				}},
				{"update of a missing key", func(t *testing.T, s Store) {
					_, err := s.Update(t.Context(), "s.a.b", []byte("v"), 1, time.Hour)
					if !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrConflict) {
						t.Fatalf("Update = %v, want ErrNotFound or ErrConflict", err)
					}
				}},
				{"watch reports later changes of its key only", func(t *testing.T, s Store) {
					rev, err := s.Create(t.Context(), "s.a.b", []byte("v1"), time.Hour)
					if err != nil {
						t.Fatal(err)
					}
					w, err := s.Watch(t.Context(), "s.a.b")
					if err != nil {
						t.Fatal(err)
					}
					defer w.Stop()
					if _, err := s.Create(t.Context(), "s.a.c", []byte("other"), time.Hour); err != nil {
						t.Fatal(err)
					}
					if _, err := s.Update(t.Context(), "s.a.b", []byte("v2"), rev, time.Hour); err != nil {
						t.Fatal(err)
					}
					changed(t, w)
					unchanged(t, w)
				}},
				{"watch of a key created later", func(t *testing.T, s Store) {
					w, err := s.Watch(t.Context(), "s.a.b")
					if err != nil {
						t.Fatal(err)
					}
					defer w.Stop()
					if _, err := s.Create(t.Context(), "s.a.b", []byte("v1"), time.Hour); err != nil {
						t.Fatal(err)
					}
					changed(t, w)
				}},
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					tt.run(t, b.newStore(t, clockwork.NewFakeClockAt(epoch)))
				})
			}
		})
	}
}

func TestMemoryExpiryAndBound(t *testing.T) {
	clock := clockwork.NewFakeClockAt(epoch)
	m := NewMemory(2, clock)
	ctx := t.Context()
	if _, err := m.Create(ctx, "a", []byte("1"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(ctx, "b", []byte("2"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(ctx, "c", []byte("3"), time.Hour); !errors.Is(err, ErrFull) {
		t.Fatalf("Create past the bound = %v, want ErrFull", err)
	}
	w, err := m.Watch(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	clock.Advance(time.Minute)
	if _, _, err := m.Get(ctx, "a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of an expired key = %v, want ErrNotFound", err)
	}
	changed(t, w) // its watchers learn that it went
	if _, err := m.Create(ctx, "c", []byte("3"), time.Hour); err != nil {
		t.Fatalf("Create after an expiry made room = %v", err)
	}
	if _, _, err := m.Get(ctx, "b"); err != nil {
		t.Fatalf("Get of a live key = %v", err)
	}
}

// TestJetStreamPerMessageTTL checks that every write carries the key's own time to live
// (the server expires it in real time, which a test does not wait for).
func TestJetStreamPerMessageTTL(t *testing.T) {
	srv := sharedNATS(t)
	_, js := connect(t, srv)
	bucket := newBucketName()
	s, err := NewJetStream(t.Context(), js, bucket, 0)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(t.Context(), "KV_"+bucket)
	if err != nil {
		t.Fatal(err)
	}
	ttlOfRev := func(rev uint64) time.Duration {
		t.Helper()
		msg, err := stream.GetMsg(t.Context(), rev)
		if err != nil {
			t.Fatal(err)
		}
		d, err := time.ParseDuration(msg.Header.Get("Nats-TTL"))
		if err != nil {
			t.Fatalf("Nats-TTL header: %v", err)
		}
		return d
	}
	rev, err := s.Create(t.Context(), "s.a.b", []byte("v1"), 90*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ttlOfRev(rev), 90*time.Minute; got != want {
		t.Errorf("Create's Nats-TTL = %s, want %s", got, want)
	}
	rev, err = s.Update(t.Context(), "s.a.b", []byte("v2"), rev, 30*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ttlOfRev(rev), 30*time.Minute; got != want {
		t.Errorf("Update's Nats-TTL = %s, want %s", got, want)
	}
}

func TestJetStreamFull(t *testing.T) {
	srv := sharedNATS(t)
	_, js := connect(t, srv)
	s, err := NewJetStream(t.Context(), js, newBucketName(), 4096)
	if err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 1500)
	var lastErr error
	for i := range 10 {
		if _, lastErr = s.Create(t.Context(), fmt.Sprintf("r.k%d", i), big, time.Hour); lastErr != nil {
			break
		}
	}
	if !errors.Is(lastErr, ErrFull) {
		t.Fatalf("Create past max_bytes = %v, want ErrFull", lastErr)
	}
}

func TestWatchStopsWithItsContext(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			s := b.newStore(t, clockwork.NewFakeClockAt(epoch))
			ctx, cancel := context.WithCancel(t.Context())
			w, err := s.Watch(ctx, "s.a.b")
			if err != nil {
				t.Fatal(err)
			}
			cancel()
			w.Stop() // returns, and goleak finds nothing left behind
			w.Stop() // twice is harmless
		})
	}
}

// stuckWatcher is a KV watcher whose channel never closes, even after Stop: what a client
// subscription that misses its unsubscribe looks like from outside.
type stuckWatcher struct {
	updates chan jetstream.KeyValueEntry
	stopped atomic.Bool
}

func (s *stuckWatcher) Updates() <-chan jetstream.KeyValueEntry { return s.updates }
func (s *stuckWatcher) Stop() error                             { s.stopped.Store(true); return nil }

// changedEntry is a non-nil entry: the watch reports a change for it.
type changedEntry struct{ jetstream.KeyValueEntry }

// TestJetStreamWatchStopDoesNotWaitForTheClient: Stop returns, and its goroutine ends, even
// when the client never closes the watcher's channel. Before, Stop waited for that close,
// and a request that owned the watch hung with it.
func TestJetStreamWatchStopDoesNotWaitForTheClient(t *testing.T) {
	kw := &stuckWatcher{updates: make(chan jetstream.KeyValueEntry, 1)}
	w := newJSWatch(kw)
	kw.updates <- changedEntry{}
	changed(t, w)

	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		w.Stop()
	}()
	select {
	case <-stopped:
	case <-time.After(waitBound):
		t.Fatalf("Stop did not return within %s while the client's channel stayed open", waitBound)
	}
	if !kw.stopped.Load() {
		t.Error("Stop did not stop the client's watcher")
	}
	w.Stop() // twice is harmless; goleak checks the forwarding goroutine is gone
}
