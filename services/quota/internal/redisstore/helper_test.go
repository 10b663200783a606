package redisstore

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/mantle-mesh/mantle/services/quota/internal/redistest"
)

// TestMain stops the Redis the tests may have started (redistest) and then fails the
// package's tests when a goroutine they started still runs: every goroutine has an owner
// that ends it.
func TestMain(m *testing.M) {
	code := m.Run()
	redistest.Stop()
	if err := goleak.Find(); code == 0 && err != nil {
		fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
		code = 1
	}
	os.Exit(code)
}

// newTestRedisClient returns a client of the test Redis, closed when the test ends.
func newTestRedisClient(t testing.TB) *redis.Client {
	t.Helper()
	return redistest.Client(t, os.Getenv)
}

// testPrefix returns a key prefix no other test uses, deleting its keys when the test ends.
func testPrefix(t testing.TB, c *redis.Client) string { t.Helper(); return redistest.Prefix(t, c) }

// newTestRedisStore returns a Store on the test Redis under a fresh prefix,
// deciding at clock (fake in tests) unless opts.ServerTime is set.
func newTestRedisStore(t testing.TB, clock clockwork.Clock, opts Options) *Store {
	t.Helper()
	c := newTestRedisClient(t)
	if opts.Prefix == "" {
		opts.Prefix = testPrefix(t, c)
	}
	opts.Clock = clock
	s := New(c, opts)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// t0 is the fake clock's start in the tests.
var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
