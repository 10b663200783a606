package session

import (
	"context"
	"errors"
	"time"
)

// Store is the key-value store sessions live in: a JetStream KV bucket shared by every
// replica (JetStream), or process memory (Memory). Every write that changes a session is a
// compare-and-set on the key's revision, so two replicas changing one session never lose
// each other's change; every key carries its own time to live.
type Store interface {
	// Get returns the value of key and its revision, or ErrNotFound.
	Get(ctx context.Context, key string) (value []byte, revision uint64, err error)
	// Create writes key if it does not exist, and returns the new revision; ErrConflict if
	// it does. The key expires ttl after this write.
	Create(ctx context.Context, key string, value []byte, ttl time.Duration) (uint64, error)
	// Update writes key if its revision is still revision, and returns the new one;
	// ErrConflict otherwise (ErrNotFound when the key is gone). The key expires ttl after
	// this write.
	Update(ctx context.Context, key string, value []byte, revision uint64, ttl time.Duration) (uint64, error)
	// Watch reports changes of key made after it returns: the channel receives (at least)
	// one value after each change, until Stop. Changes may be coalesced; a receiver reads
	// the key again to learn what changed.
	Watch(ctx context.Context, key string) (Watch, error)
}

// Watch follows one key (Store.Watch).
type Watch interface {
	// Changes receives after every change of the key.
	Changes() <-chan struct{}
	// Stop ends the watch and releases what it holds.
	Stop()
}

// Store errors.
var (
	// ErrNotFound: the key does not exist (or has expired).
	ErrNotFound = errors.New("session store: key not found")
	// ErrConflict: a compare-and-set lost to another writer.
	ErrConflict = errors.New("session store: key changed concurrently")
	// ErrFull: the store holds as many keys as it may.
	ErrFull = errors.New("session store: full")
)
