package resilience

import (
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// Cooldown tracks an API key that answered 429 until its hint (Retry-After or the
// rate-limit reset header) has passed. A 429 says the key is spent, not that the provider is
// unhealthy, so it rests the key instead of counting as a breaker failure. It is safe for
// concurrent use.
type Cooldown struct {
	clock clockwork.Clock
	mu    sync.Mutex
	until time.Time
}

// NewCooldown returns a cooldown that is not active. clock defaults to the real clock.
func NewCooldown(clock clockwork.Clock) *Cooldown {
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	return &Cooldown{clock: clock}
}

// Until is when the cooldown ends (zero if it was never set).
func (c *Cooldown) Until() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.until
}

// Active reports whether the key is still cooling down.
func (c *Cooldown) Active() bool {
	return c.Remaining() > 0
}

// Remaining is how long the cooldown still lasts (0 when it is not active).
func (c *Cooldown) Remaining() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return max(0, c.until.Sub(c.clock.Now()))
}

// Set cools the key down for d from now. It only ever extends: a shorter hint that arrives
// while a longer one is running (two 429s racing back) does not cut it short.
func (c *Cooldown) Set(d time.Duration) {
	if d <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if t := c.clock.Now().Add(d); t.After(c.until) {
		c.until = t
	}
}
