package redisstore

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/redis/go-redis/v9"
)

// RouteLogs sends the lines go-redis logs itself (a pool that cannot dial, a
// connection it drops) to log, as warnings in the process's format, instead of to stderr
// in go-redis's own. go-redis keeps one logger per process (redis.SetLogger), so the
// binary calls this once, with its process logger; a program running several meshes
// (tests) leaves it alone.
func RouteLogs(log *slog.Logger) {
	redis.SetLogger(redisLogger{log: log})
}

// redisLogger is go-redis's Logging interface on a slog.Logger.
type redisLogger struct {
	log *slog.Logger
}

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	msg := strings.TrimSpace(fmt.Sprintf(format, v...))
	l.log.WarnContext(ctx, strings.TrimPrefix(msg, "redis: "), "component", "go-redis")
}
