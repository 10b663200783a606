package redisstore

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"
)

// go-redis's own lines come out as the process's JSON, at warn level.
func TestRedisLoggerWritesThroughSlog(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	l := redisLogger{log: slog.New(slog.NewJSONHandler(&buf, nil))}
	l.Printf(context.Background(), "redis: connection pool: failed to dial after %d attempts: %v\n", 5, "connection refused")
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("not one JSON line: %q: %v", buf.String(), err)
	}
	if line["level"] != "WARN" || line["msg"] != "connection pool: failed to dial after 5 attempts: connection refused" || line["component"] != "go-redis" {
		t.Errorf("line = %v", line)
	}
}
