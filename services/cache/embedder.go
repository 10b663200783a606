package cache

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/mantle-mesh/mantle/services/cache/internal/embed"
	"github.com/mantle-mesh/mantle/services/cache/internal/vector"
)

// Embedder turns a question into a unit vector. Vectors are only compared within one
// Namespace (the embedder, its model and version). Implementations are safe for concurrent
// use; Embed returns vector.ErrZero for text without words.
type Embedder interface {
	Namespace() string
	Embed(ctx context.Context, text string) (vector.Vector, error)
}

// computesInPlace reports whether e says that Embed only computes, in the calling
// goroutine, without waiting on anything (no network, no locks held by others), so that a
// deadline could not cut it short.
func computesInPlace(e Embedder) bool {
	p, ok := e.(interface{ ComputesInPlace() bool })
	return ok && p.ComputesInPlace()
}

// namespaceExact is the namespace of a cache without an embedder: exact matches only.
const namespaceExact = "exact"

// NewEmbedder builds the embedder cfg selects; kind none returns nil. getenv reads the API
// key's environment variable; client sends HTTP requests (nil: one that does not follow
// redirects, provider.RefuseRedirects).
func NewEmbedder(cfg EmbedderConfig, getenv func(string) string, client *http.Client) (Embedder, error) {
	switch cfg.Kind {
	case EmbedderNone:
		return nil, nil
	case EmbedderLexical:
		return embed.NewLexical(), nil
	case EmbedderOpenAI:
		key := ""
		if cfg.APIKeyEnv != "" {
			key = getenv(cfg.APIKeyEnv)
		}
		e, err := embed.NewOpenAI(embed.OpenAIConfig{
			BaseURL: cfg.BaseURL, Model: cfg.Model, Dimensions: cfg.Dimensions,
			APIKey: key, Version: cfg.Version, Client: client,
		})
		if err != nil {
			return nil, err
		}
		return e, nil
	default:
		return nil, fmt.Errorf("embedder.kind: unknown kind %q", cfg.Kind)
	}
}

// cooldown stops calling a dependency for a while after it failed several times in a row,
// so that an outage costs each request nothing instead of a full timeout. It is a minimal
// circuit breaker: the cache only needs "skip it for now", not half-open probing budgets,
// because skipping a cache is always safe.
type cooldown struct {
	clock    clockwork.Clock
	failures int           // consecutive failures that open it
	period   time.Duration // how long it stays open

	mu    sync.Mutex
	count int
	until time.Time
}

func newCooldown(clock clockwork.Clock) *cooldown {
	return &cooldown{clock: clock, failures: 5, period: 5 * time.Second}
}

// allow reports whether the dependency may be called now.
func (c *cooldown) allow() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.clock.Now().Before(c.until)
}

// record counts the outcome of a call. A call the caller cancelled says nothing about the
// dependency and is not counted.
func (c *cooldown) record(ctx context.Context, err error) {
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil {
		c.count = 0
		return
	}
	c.count++
	if c.count >= c.failures {
		c.until = c.clock.Now().Add(c.period)
		c.count = 0
	}
}
