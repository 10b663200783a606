package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
)

// memoryActions keeps action records in this replica's memory, each for ttl: for a
// single replica and tests. Records older than ttl are swept on every claim, so the map
// holds at most what ttl's worth of actions wrote.
type memoryActions struct {
	ttl   time.Duration
	clock clockwork.Clock

	mu      sync.Mutex
	records map[string]memoryRecord
}

type memoryRecord struct {
	rec      actionRecord
	revision uint64
	written  time.Time
}

func newMemoryActions(ttl time.Duration, clock clockwork.Clock) *memoryActions {
	return &memoryActions{ttl: ttl, clock: clock, records: map[string]memoryRecord{}}
}

func (m *memoryActions) claim(_ context.Context, key string, rec actionRecord) (actionRecord, uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	for k, r := range m.records {
		if now.Sub(r.written) > m.ttl {
			delete(m.records, k)
		}
	}
	if r, ok := m.records[key]; ok {
		return r.rec, r.revision, errClaimed
	}
	m.records[key] = memoryRecord{rec: rec, revision: 1, written: now}
	return rec, 1, nil
}

func (m *memoryActions) update(_ context.Context, key string, rec actionRecord, revision uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.records[key]
	if revision != 0 && (!ok || r.revision != revision) {
		return errClaimed
	}
	m.records[key] = memoryRecord{rec: rec, revision: r.revision + 1, written: m.clock.Now()}
	return nil
}

func (m *memoryActions) release(_ context.Context, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.records, key)
	return nil
}

// jetStreamActions keeps action records in a JetStream KV bucket every replica shares,
// so a repeated key is recognised on any replica. The bucket is created on first use: a
// NATS outage at start does not stop the module, it refuses actions until NATS is back.
type jetStreamActions struct {
	js  jetstream.JetStream
	cfg jetstream.KeyValueConfig

	mu sync.Mutex
	kv jetstream.KeyValue
}

func newJetStreamActions(js jetstream.JetStream, bucket string, ttl time.Duration) *jetStreamActions {
	return &jetStreamActions{js: js, cfg: jetstream.KeyValueConfig{
		Bucket: bucket, Description: "mantle tool action records (idempotency keys)",
		TTL: ttl, History: 1, Storage: jetstream.FileStorage,
	}}
}

func (j *jetStreamActions) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.kv != nil {
		return j.kv, nil
	}
	kv, err := j.js.CreateOrUpdateKeyValue(ctx, j.cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: bucket %s: %w", ErrActionsUnavailable, j.cfg.Bucket, err)
	}
	j.kv = kv
	return kv, nil
}

func (j *jetStreamActions) claim(ctx context.Context, key string, rec actionRecord) (actionRecord, uint64, error) {
	kv, err := j.bucket(ctx)
	if err != nil {
		return actionRecord{}, 0, err
	}
	b, err := marshalRecord(rec)
	if err != nil {
		return actionRecord{}, 0, err
	}
	rev, err := kv.Create(ctx, key, b)
	if err == nil {
		return rec, rev, nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return actionRecord{}, 0, fmt.Errorf("%w: %w", ErrActionsUnavailable, err)
	}
	entry, err := kv.Get(ctx, key)
	if err != nil {
		return actionRecord{}, 0, fmt.Errorf("%w: %w", ErrActionsUnavailable, err)
	}
	existing, err := unmarshalRecord(entry.Value())
	if err != nil {
		return actionRecord{}, 0, fmt.Errorf("record %s: %w", key, err)
	}
	return existing, entry.Revision(), errClaimed
}

func (j *jetStreamActions) update(ctx context.Context, key string, rec actionRecord, revision uint64) error {
	kv, err := j.bucket(ctx)
	if err != nil {
		return err
	}
	b, err := marshalRecord(rec)
	if err != nil {
		return err
	}
	if revision == 0 {
		_, err = kv.Put(ctx, key, b)
	} else {
		_, err = kv.Update(ctx, key, b, revision)
		if errors.Is(err, jetstream.ErrKeyExists) {
			return errClaimed
		}
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrActionsUnavailable, err)
	}
	return nil
}

func (j *jetStreamActions) release(ctx context.Context, key string) error {
	kv, err := j.bucket(ctx)
	if err != nil {
		return err
	}
	if err := kv.Purge(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("%w: %w", ErrActionsUnavailable, err)
	}
	return nil
}

// unavailableActions refuses every action: the jetstream backend is configured and this
// process has no NATS connection. Queries are still served.
type unavailableActions struct{}

func (unavailableActions) claim(context.Context, string, actionRecord) (actionRecord, uint64, error) {
	return actionRecord{}, 0, fmt.Errorf("%w: no NATS connection (set events.nats_url, or agent.idempotency.backend: memory for one replica)", ErrActionsUnavailable)
}

func (unavailableActions) update(context.Context, string, actionRecord, uint64) error {
	return ErrActionsUnavailable
}

func (unavailableActions) release(context.Context, string) error { return ErrActionsUnavailable }
