package router

import (
	"container/list"
	"crypto/sha256"
	"sync"
	"time"
)

// embedCache is the router's exact cache of embeddings answers, per process: bounded by the
// bytes of its vectors, least recently used first out, each entry for ttl.
type embedCache struct {
	mu       sync.Mutex
	maxBytes int64
	ttl      time.Duration
	size     int64
	order    *list.List // of *embedEntry, most recent first
	entries  map[[sha256.Size]byte]*list.Element
}

type embedEntry struct {
	key     [sha256.Size]byte
	model   string
	vectors [][]float32
	expires time.Time
	bytes   int64
}

func newEmbedCache(c EmbeddingsCacheConfig) *embedCache {
	return &embedCache{maxBytes: c.MaxBytes, ttl: c.TTL, order: list.New(), entries: map[[sha256.Size]byte]*list.Element{}}
}

func (c *embedCache) get(key [sha256.Size]byte, now time.Time) (embedEntry, bool) {
	if c == nil {
		return embedEntry{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[key]
	if !ok {
		return embedEntry{}, false
	}
	e := el.Value.(*embedEntry)
	if !now.Before(e.expires) {
		c.remove(el)
		return embedEntry{}, false
	}
	c.order.MoveToFront(el)
	return *e, true
}

func (c *embedCache) put(key [sha256.Size]byte, e embedEntry, now time.Time) {
	if c == nil || c.maxBytes <= 0 || c.ttl <= 0 {
		return
	}
	e.key, e.expires = key, now.Add(c.ttl)
	for _, v := range e.vectors {
		e.bytes += 4 * int64(len(v))
	}
	if e.bytes > c.maxBytes {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[key]; ok {
		c.remove(el)
	}
	for c.size+e.bytes > c.maxBytes {
		c.remove(c.order.Back())
	}
	c.entries[key] = c.order.PushFront(&e)
	c.size += e.bytes
}

func (c *embedCache) remove(el *list.Element) {
	e := c.order.Remove(el).(*embedEntry)
	delete(c.entries, e.key)
	c.size -= e.bytes
}
