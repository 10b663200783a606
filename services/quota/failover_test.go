package quota

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/mantle-mesh/mantle/services/quota/internal/ledger"
	"github.com/mantle-mesh/mantle/services/quota/internal/redisstore"
)

// A reply the store cannot read is Redis answering wrongly, not Redis missing: it must
// not send the replica to its local limiter.
func TestUnreachable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	expired, cancelExpired := context.WithDeadline(ctx, time.Unix(0, 0))
	defer cancelExpired()
	for _, tt := range []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"no error", ctx, nil, false},
		{"malformed reply", ctx, fmt.Errorf("reserve: %w", redisstore.ErrMalformedReply), false},
		{"an operation's error", ctx, replyError("WRONGTYPE Operation against a key"), false},
		{"loading", ctx, replyError("LOADING Redis is loading the dataset"), true},
		{"connection refused", ctx, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{"connection reset", ctx, fmt.Errorf("redis: %w", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}), true},
		{"i/o timeout", ctx, fmt.Errorf("redis: %w", &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}), true},
		{"closed by the server", ctx, fmt.Errorf("redis: %w", io.EOF), true},
		{"pool timeout", ctx, fmt.Errorf("redis: %w", redis.ErrPoolTimeout), true},
		{"the Redis call's own deadline", ctx, fmt.Errorf("redis: %w", context.DeadlineExceeded), true},
		{"cluster down", ctx, fmt.Errorf("loading the quota functions: %w", replyError("CLUSTERDOWN The cluster is down")), true},
		{"caller gave up", cancelled, &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}, false},
		{"caller's deadline", expired, fmt.Errorf("redis: %w", context.DeadlineExceeded), false},
		// Answers: refusals and other domain errors never mean Redis is away.
		{"a refusal", ctx, &ledger.ExhaustedError{Bucket: "tenant:acme:rpm", Cost: 1, RetryAfter: time.Second}, false},
		{"a wrapped refusal", ctx, fmt.Errorf("reserve: %w", &ledger.ExhaustedError{Bucket: "tenant:acme:tpm"}), false},
		{"too large", ctx, &tooLargeError{Bucket: "tenant:acme:tpm", Cost: 10, Limit: 1}, false},
		{"not found", ctx, fmt.Errorf("settle: %w", ledger.ErrReservationNotFound), false},
		{"budget", ctx, errBudgetUnavailable, false},
		{"redis nil", ctx, redis.Nil, false},
		{"a script's bug", ctx, errors.New("redis: reserve script refused without naming a bucket"), false},
		{"closed store", ctx, redisstore.ErrClosed, false},
		{"closed client", ctx, redis.ErrClosed, false},
		{"shutting down", ctx, errShuttingDown, false},
	} {
		if got := unreachable(tt.ctx, tt.err); got != tt.want {
			t.Errorf("%s: unreachable = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// replyError is an error reply from Redis, as go-redis returns one (a redis.Error).
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}
