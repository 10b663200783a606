package rpc

import (
	"context"
	"log/slog"
)

// LogHandler wraps h so that every record logged with a context carries the request's
// trace_id, request_id and tenant, as the interceptor's call line does. Code deep in a
// request (provider attempts, the ladder, event publishing) logs with the *Context methods
// and gets them without passing them along; fields the record already has are not repeated.
func LogHandler(h slog.Handler) slog.Handler { return contextHandler{h} }

type contextHandler struct{ inner slog.Handler }

func (h contextHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h contextHandler) Handle(ctx context.Context, rec slog.Record) error {
	if ctx == nil {
		return h.inner.Handle(ctx, rec)
	}
	fields := [...]struct{ key, value string }{
		{"trace_id", TraceID(ctx)},
		{"request_id", RequestID(ctx)},
		{"tenant", Tenant(ctx)},
	}
	var has [len(fields)]bool
	rec.Attrs(func(a slog.Attr) bool {
		for i, f := range fields {
			if a.Key == f.key {
				has[i] = true
			}
		}
		return true
	})
	var add []slog.Attr
	for i, f := range fields {
		if f.value != "" && !has[i] {
			add = append(add, slog.String(f.key, f.value))
		}
	}
	if len(add) > 0 {
		rec = rec.Clone()
		rec.AddAttrs(add...)
	}
	return h.inner.Handle(ctx, rec)
}

func (h contextHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return contextHandler{h.inner.WithAttrs(attrs)}
}

// WithGroup nests the request fields in the group too; mantle's loggers do not use groups
// for whole lines, only slog.Group attributes, which this does not affect.
func (h contextHandler) WithGroup(name string) slog.Handler {
	return contextHandler{h.inner.WithGroup(name)}
}
