package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
)

func TestLogHandler(t *testing.T) {
	t.Parallel()
	full := WithTenant(WithTraceID(WithRequestID(context.Background(), "req-1"), "4bf92f3577b34da6a3ce929d0e0e4736"), "acme")
	tests := []struct {
		name string
		ctx  context.Context
		log  func(context.Context, *slog.Logger)
		want map[string]any // fields that must be there; "" means absent
	}{
		{"every field from the context", full,
			func(ctx context.Context, l *slog.Logger) { l.WarnContext(ctx, "attempt failed", "model", "primary") },
			map[string]any{"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "request_id": "req-1", "tenant": "acme", "model": "primary"}},
		{"the record's own fields win and are not repeated", full,
			func(ctx context.Context, l *slog.Logger) {
				l.InfoContext(ctx, "finished call", "request_id", "explicit")
			},
			map[string]any{"request_id": "explicit", "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"}},
		{"only what the context has", WithRequestID(context.Background(), "req-2"),
			func(ctx context.Context, l *slog.Logger) { l.InfoContext(ctx, "x") },
			map[string]any{"request_id": "req-2", "trace_id": "", "tenant": ""}},
		{"no context fields without a context", full,
			func(_ context.Context, l *slog.Logger) { l.Info("background") },
			map[string]any{"request_id": "", "trace_id": ""}},
		{"attributes from With stay", full,
			func(ctx context.Context, l *slog.Logger) { l.With("service", "router").ErrorContext(ctx, "x") },
			map[string]any{"service": "router", "request_id": "req-1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			tt.log(tt.ctx, slog.New(LogHandler(slog.NewJSONHandler(&buf, nil))))
			if n := strings.Count(buf.String(), `"request_id"`); n > 1 {
				t.Errorf("request_id appears %d times: %s", n, buf.String())
			}
			var m map[string]any
			if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
				t.Fatalf("%q: %v", buf.String(), err)
			}
			for k, v := range tt.want {
				got, ok := m[k]
				if v == "" && ok {
					t.Errorf("%s = %v, want it absent", k, got)
				}
				if v != "" && got != v {
					t.Errorf("%s = %v, want %v", k, got, v)
				}
			}
		})
	}
}
