package rpc

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestCallLog(t *testing.T) {
	t.Parallel()
	info := &grpc.UnaryServerInfo{FullMethod: "/mantle.quota.v1.QuotaService/Reserve"}
	tests := []struct {
		name   string
		level  slog.Level
		err    error
		want   []string // substrings of the one line; nil: no line at all
		absent []string
	}{
		{name: "OK at info", level: slog.LevelInfo, want: []string{
			"level=INFO", `msg="finished call"`, "grpc.service=mantle.quota.v1.QuotaService", "grpc.method=Reserve",
			"grpc.method_type=unary", "grpc.component=server", "grpc.code=OK", "grpc.time_ms=", "request_id=req_7", "trace_id=",
		}, absent: []string{"grpc.error"}},
		{name: "OK below the level is not built", level: slog.LevelWarn},
		{name: "unavailable at warn", level: slog.LevelWarn, err: status.Error(codes.Unavailable, "redis down"),
			want: []string{"level=WARN", "grpc.code=Unavailable", `grpc.error="rpc error: code = Unavailable desc = redis down"`}},
		{name: "a plain error is logged as the Internal the caller sees, with its cause", level: slog.LevelError, err: errors.New("disk full"),
			want: []string{"level=ERROR", "grpc.code=Internal", `grpc.error="disk full"`}},
		{name: "unavailable below the level", level: slog.LevelError, err: status.Error(codes.Unavailable, "x")},
		{name: "an overloaded refusal is not a warning", level: slog.LevelInfo, err: Status(codes.Unavailable, "router.mantle", ReasonOverloaded, "shedding")},
		{name: "an overloaded refusal at debug", level: slog.LevelDebug, err: Status(codes.Unavailable, "router.mantle", ReasonOverloaded, "shedding"),
			want: []string{"level=DEBUG", "grpc.code=Unavailable"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			c := callLog{log: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: tt.level}))}
			ctx := WithRequestID(context.Background(), "req_7")
			resp, err := c.unary(ctx, "req", info, func(context.Context, any) (any, error) { return "resp", tt.err })
			if resp != "resp" || !errors.Is(err, tt.err) {
				t.Errorf("unary = %v, %v; want the handler's resp, %v", resp, err, tt.err)
			}
			line := buf.String()
			if tt.want == nil {
				if line != "" {
					t.Errorf("logged %q, want nothing", line)
				}
				return
			}
			if strings.Count(line, "\n") != 1 {
				t.Fatalf("logged %q, want one line", line)
			}
			for _, w := range tt.want {
				if !strings.Contains(line, w) {
					t.Errorf("line %q does not contain %q", line, w)
				}
			}
			for _, a := range tt.absent {
				if strings.Contains(line, a) {
					t.Errorf("line %q contains %q", line, a)
				}
			}
		})
	}
}

func TestSplitMethod(t *testing.T) {
	t.Parallel()
	for in, want := range map[string][2]string{
		"/mantle.quota.v1.QuotaService/Reserve": {"mantle.quota.v1.QuotaService", "Reserve"},
		"/svc":                                  {"svc", "unknown"},
		"abc/de":                                {"abc", "de"},
		"":                                      {"", "unknown"},
	} {
		if s, m := splitMethod(in); s != want[0] || m != want[1] {
			t.Errorf("splitMethod(%q) = %q, %q; want %q, %q", in, s, m, want[0], want[1])
		}
	}
}

// ctxStream is a grpc.ServerStream of which the call log uses only the context.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s ctxStream) Context() context.Context { return s.ctx }

func TestCallLogStream(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		info grpc.StreamServerInfo
		err  error
		want []string
	}{
		{"a stream that ended with io.EOF is OK", grpc.StreamServerInfo{FullMethod: "/mantle.router.v1.RouterService/StreamComplete", IsServerStream: true},
			io.EOF, []string{"grpc.method_type=server_stream", "grpc.code=OK", "grpc.method=StreamComplete"}},
		{"a failed bidi stream", grpc.StreamServerInfo{FullMethod: "/s.S/M", IsServerStream: true, IsClientStream: true},
			status.Error(codes.Aborted, "x"), []string{"grpc.method_type=bidi_stream", "grpc.code=Aborted", "level=WARN"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			c := callLog{log: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))}
			err := c.stream(nil, ctxStream{ctx: context.Background()}, &tt.info, func(any, grpc.ServerStream) error { return tt.err })
			if !errors.Is(err, tt.err) {
				t.Errorf("stream = %v, want the handler's %v", err, tt.err)
			}
			for _, w := range tt.want {
				if !strings.Contains(buf.String(), w) {
					t.Errorf("line %q does not contain %q", buf.String(), w)
				}
			}
		})
	}
}
