package router

import (
	"crypto/sha256"
	"testing"
	"time"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
)

func TestEmbedCacheBoundsAndExpiry(t *testing.T) {
	now := time.Unix(0, 0)
	c := newEmbedCache(EmbeddingsCacheConfig{MaxBytes: 32, TTL: time.Minute})
	k := func(s string) [sha256.Size]byte { return sha256.Sum256([]byte(s)) }
	vec := func() [][]float32 { return [][]float32{{1, 2, 3, 4}} } // 16 bytes
	c.put(k("a"), embedEntry{model: "m", vectors: vec()}, now)
	c.put(k("b"), embedEntry{model: "m", vectors: vec()}, now)
	if _, ok := c.get(k("a"), now); !ok {
		t.Fatal("a missing")
	}
	c.put(k("c"), embedEntry{model: "m", vectors: vec()}, now) // evicts b, the least recently used
	if _, ok := c.get(k("b"), now); ok {
		t.Error("b kept beyond max_bytes")
	}
	if _, ok := c.get(k("a"), now); !ok {
		t.Error("a, used recently, was evicted")
	}
	if _, ok := c.get(k("a"), now.Add(time.Minute)); ok {
		t.Error("a served after its ttl")
	}
	if c.size != 16 {
		t.Errorf("size %d after eviction and expiry, want 16", c.size)
	}
	c.put(k("huge"), embedEntry{vectors: [][]float32{make([]float32, 9)}}, now)
	if _, ok := c.get(k("huge"), now); ok {
		t.Error("an entry larger than the cache was kept")
	}
}

func TestEmbedKeySeparates(t *testing.T) {
	d3, d4 := int32(3), int32(4)
	base := func() *routerv1.EmbedRequest {
		return &routerv1.EmbedRequest{Model: "e", Input: []string{"a", "b"}, Dimensions: &d3}
	}
	want := embedKey("t", "r", "s", base())
	for name, k := range map[string][sha256.Size]byte{
		"tenant":     embedKey("u", "r", "s", base()),
		"route":      embedKey("t", "q", "s", base()),
		"scenario":   embedKey("t", "r", "x", base()),
		"input":      embedKey("t", "r", "s", &routerv1.EmbedRequest{Input: []string{"a", "c"}, Dimensions: &d3}),
		"split":      embedKey("t", "r", "s", &routerv1.EmbedRequest{Input: []string{"ab"}, Dimensions: &d3}),
		"dimensions": embedKey("t", "r", "s", &routerv1.EmbedRequest{Input: []string{"a", "b"}, Dimensions: &d4}),
		"unset dims": embedKey("t", "r", "s", &routerv1.EmbedRequest{Input: []string{"a", "b"}}),
		"encoding":   embedKey("t", "r", "s", &routerv1.EmbedRequest{Input: []string{"a", "b"}, Dimensions: &d3, EncodingFormat: "base64"}),
		"tokens":     embedKey("t", "r", "s", &routerv1.EmbedRequest{InputTokens: []*routerv1.TokenInput{{Tokens: []int64{1}}}, Dimensions: &d3}),
	} {
		if k == want {
			t.Errorf("%s does not change the key", name)
		}
	}
	if embedKey("t", "r", "s", base()) != want {
		t.Error("the key is not stable")
	}
}
