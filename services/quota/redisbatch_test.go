package quota

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
)

// A script no Redis has seen, so that its first EVALSHA answers NOSCRIPT.
func freshScript(t *testing.T, body string) *redis.Script {
	t.Helper()
	var b [8]byte
	_, _ = rand.Read(b[:])
	return redis.NewScript("-- " + hex.EncodeToString(b[:]) + "\n" + body)
}

func TestBatcherKeepsEachCallersReplyAndError(t *testing.T) {
	c := newTestRedisClient(t)
	b := newScriptBatcher(c)
	t.Cleanup(b.Close)
	echo := freshScript(t, "return {ARGV[1], KEYS[1]}")
	fail := freshScript(t, "return redis.error_reply('NOPE ' .. ARGV[1])")
	ctx := context.Background()

	const callers = 200
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for i := range callers {
		wg.Go(func() {
			arg := fmt.Sprint(i)
			if i%7 == 0 {
				_, err := b.run(ctx, fail, []string{"k"}, []any{arg})
				if err == nil || err.Error() != "NOPE "+arg {
					errs <- fmt.Errorf("caller %d: error %v, want NOPE %s", i, err, arg)
				}
				return
			}
			v, err := b.run(ctx, echo, []string{"key" + arg}, []any{arg})
			if err != nil {
				errs <- fmt.Errorf("caller %d: %w", i, err)
				return
			}
			if len(v) != 2 || v[0] != arg || v[1] != "key"+arg {
				errs <- fmt.Errorf("caller %d: reply %v", i, v)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestBatcherSkipsCallersThatLeft(t *testing.T) {
	c := newTestRedisClient(t)
	prefix := testPrefix(t, c)
	b := newScriptBatcher(c)
	incr := freshScript(t, "return {redis.call('INCR', KEYS[1])}")

	left := make(chan struct{})
	close(left)
	gone := &scriptCall{script: incr, keys: []string{prefix + "gone"}, gone: left, reply: make(chan scriptReply, 1)}
	live := &scriptCall{script: incr, keys: []string{prefix + "live"}, reply: make(chan scriptReply, 1)}
	// One batch, run the way a worker runs it.
	b.exec(context.Background(), []*scriptCall{gone, live}, nil)

	if r := <-live.reply; r.err != nil {
		t.Fatalf("live caller: %v, %v", r.v, r.err)
	}
	select {
	case r := <-gone.reply:
		t.Fatalf("a caller that left got a reply: %v", r)
	default:
	}
	if n, err := c.Exists(context.Background(), prefix+"gone").Result(); err != nil || n != 0 {
		t.Fatalf("the script of a caller that left ran (exists=%d, %v)", n, err)
	}
}

func TestBatcherCancelledCallerDoesNotFailOthers(t *testing.T) {
	c := newTestRedisClient(t)
	b := newScriptBatcher(c)
	t.Cleanup(b.Close)
	echo := freshScript(t, "return {ARGV[1]}")

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			if i%2 == 0 {
				// Either it left before its reply or the reply won the race; both are fine,
				// as long as nobody else notices.
				if _, err := b.run(cancelled, echo, []string{"k"}, []any{"x"}); err != nil && !errors.Is(err, context.Canceled) {
					t.Errorf("cancelled caller: %v", err)
				}
				return
			}
			v, err := b.run(context.Background(), echo, []string{"k"}, []any{fmt.Sprint(i)})
			if err != nil || len(v) != 1 || v[0] != fmt.Sprint(i) {
				t.Errorf("caller %d: %v, %v", i, v, err)
			}
		})
	}
	wg.Wait()
}

func TestBatcherClose(t *testing.T) {
	c := newTestRedisClient(t)
	b := newScriptBatcher(c)
	echo := freshScript(t, "return {ARGV[1]}")
	ctx := context.Background()
	if _, err := b.run(ctx, echo, []string{"k"}, []any{"a"}); err != nil {
		t.Fatal(err)
	}
	b.Close()
	b.Close() // twice is harmless
	if _, err := b.run(ctx, echo, []string{"k"}, []any{"a"}); !errors.Is(err, errBatcherClosed) {
		t.Fatalf("after Close: %v, want errBatcherClosed", err)
	}

	// Closed before first use: no worker starts, calls fail.
	b2 := newScriptBatcher(c)
	b2.Close()
	if _, err := b2.run(ctx, echo, []string{"k"}, []any{"a"}); !errors.Is(err, errBatcherClosed) {
		t.Fatalf("after Close: %v, want errBatcherClosed", err)
	}
}
