package session

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// JetStream is a Store in a NATS JetStream KV bucket, shared by every agent replica, so
// that any replica serves a session's next step. Each key carries its own time to live
// (per-message TTL, which the bucket allows through its limit-marker TTL): every write sets
// it again, so a session lives until its deadline plus the retention period after its
// last change.
type JetStream struct {
	js     jetstream.JetStream
	kv     jetstream.KeyValue
	bucket string
}

var _ Store = (*JetStream)(nil)

// markerTTL is how long the bucket keeps the marker a key's expiry leaves: watchers see the
// key go, and then the marker goes too.
const markerTTL = time.Minute

// NewJetStream creates the KV bucket (or binds it and updates its limits) and returns a
// store over it. maxBytes bounds the bucket's size (0: no bound but the server's).
func NewJetStream(ctx context.Context, js jetstream.JetStream, bucket string, maxBytes int64) (*JetStream, error) {
	if maxBytes <= 0 {
		maxBytes = -1
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      bucket,
		Description: "mantle agent sessions: budgets, steps and recorded results",
		// One value per key: the session's current record, or one step's result.
		History:        1,
		MaxBytes:       maxBytes,
		LimitMarkerTTL: markerTTL,
	})
	if err != nil {
		return nil, fmt.Errorf("session bucket %q: %w", bucket, err)
	}
	return &JetStream{js: js, kv: kv, bucket: bucket}, nil
}

// Get implements Store.
func (s *JetStream) Get(ctx context.Context, key string) ([]byte, uint64, error) {
	e, err := s.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, 0, ErrNotFound
	}
	if err != nil {
		return nil, 0, fmt.Errorf("session store get: %w", err)
	}
	return e.Value(), e.Revision(), nil
}

// Create implements Store.
func (s *JetStream) Create(ctx context.Context, key string, value []byte, ttl time.Duration) (uint64, error) {
	rev, err := s.kv.Create(ctx, key, value, jetstream.KeyTTL(ttlOf(ttl)))
	if err != nil {
		return 0, s.mapErr("create", err)
	}
	return rev, nil
}

// Update implements Store. KeyValue.Update takes no time to live, so this is the same
// compare-and-set publish with the per-message TTL header added.
func (s *JetStream) Update(ctx context.Context, key string, value []byte, revision uint64, ttl time.Duration) (uint64, error) {
	msg := &nats.Msg{Subject: "$KV." + s.bucket + "." + key, Header: nats.Header{}, Data: value}
	ack, err := s.js.PublishMsg(ctx, msg,
		jetstream.WithExpectLastSequencePerSubject(revision),
		jetstream.WithMsgTTL(ttlOf(ttl)))
	if err != nil {
		return 0, s.mapErr("update", err)
	}
	return ack.Sequence, nil
}

// ttlOf rounds a time to live up to the server's unit, a second.
func ttlOf(ttl time.Duration) time.Duration {
	return max(ttl.Round(time.Second), time.Second)
}

// jsErrStoreFailed is the server's error code for a write the stream's limits refuse
// (max_bytes reached, under the discard-new policy of KV buckets); nats.go names no
// constant for it.
const jsErrStoreFailed jetstream.ErrorCode = 10077

func (s *JetStream) mapErr(op string, err error) error {
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return ErrConflict
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case jetstream.JSErrCodeStreamWrongLastSequence, jetstream.JSErrCodeStreamWrongLastSequenceConstant:
			return ErrConflict
		case jsErrStoreFailed, jetstream.JSErrCodeStreamMessageExceedsMaximum:
			return fmt.Errorf("session store %s: %w: %w", op, ErrFull, err)
		}
	}
	return fmt.Errorf("session store %s: %w", op, err)
}

// Watch implements Store: a KV watch of the key's new values. One goroutine per watch
// forwards them; Stop ends it and waits for it.
func (s *JetStream) Watch(ctx context.Context, key string) (Watch, error) {
	kw, err := s.kv.Watch(ctx, key, jetstream.UpdatesOnly())
	if err != nil {
		return nil, fmt.Errorf("session store watch: %w", err)
	}
	return newJSWatch(kw), nil
}

type jsWatch struct {
	kw   jetstream.KeyWatcher
	ch   chan struct{}
	stop chan struct{} // closed by Stop: forward returns at once
	done chan struct{} // closed when forward has returned
	once sync.Once
}

func newJSWatch(kw jetstream.KeyWatcher) *jsWatch {
	w := &jsWatch{kw: kw, ch: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go w.forward()
	return w
}

// forward turns the watcher's entries into change signals until Stop, or until the
// watcher's channel closes (its context ended). Stop does not wait for that channel to
// close: the client closes it from the subscription's closed handler, after the
// subscription's delivery goroutine has seen the unsubscribe, and once, in the mesh's
// tests after a router restart, it never did, which held Stop, and the request that owned
// the watch, for good.
func (w *jsWatch) forward() {
	defer close(w.done)
	updates := w.kw.Updates()
	for {
		select {
		case <-w.stop:
			return
		case e, ok := <-updates:
			if !ok {
				return
			}
			if e == nil {
				continue // the end of the initial values: there are none with UpdatesOnly
			}
			select {
			case w.ch <- struct{}{}:
			default:
			}
		}
	}
}

func (w *jsWatch) Changes() <-chan struct{} { return w.ch }

func (w *jsWatch) Stop() {
	w.once.Do(func() {
		close(w.stop)
		_ = w.kw.Stop() // an error means it was stopped already (its context ended)
		<-w.done
	})
}
