package logredact

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

const (
	openAIKey    = "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z"
	openAILegacy = "sk-1234567890abcdefghijklmnopqrstuvwxyzABCDEFGH"
	anthropicKey = "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_abcdefAA"
	googleKey    = "AIzaSyA1234567890abcdefghijklmnopqrstu"
	configured   = "corp-gateway-key-77f1c2" // a key that matches no pattern: masked because configured
)

func TestString(t *testing.T) {
	t.Parallel()
	r := New(Options{Secrets: []string{configured, "short", ""}})
	tests := []struct {
		name, in, want string
	}{
		{"openai project key", "upstream said: invalid key " + openAIKey + ".", "upstream said: invalid key [REDACTED]."},
		{"openai legacy key", openAILegacy, "[REDACTED]"},
		{"anthropic key", "x-api-key " + anthropicKey, "x-api-key [REDACTED]"},
		{"bearer header", "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl", "Authorization: [REDACTED]"},
		{"bare bearer token", "retrying with Bearer abc.def-ghi_jkl~mno+pq/rs==", "retrying with Bearer [REDACTED]"},
		{"basic auth", "authorization=Basic dXNlcjpwYXNz", "authorization=[REDACTED]"},
		{"x-api-key header", "x-api-key: abcdef0123456789", "x-api-key: [REDACTED]"},
		{"key in json", `{"model":"gpt-4o","api_key":"` + openAIKey + `","n":1}`, `{"model":"gpt-4o","api_key":"[REDACTED]","n":1}`},
		{"header map in json", `{"X-Api-Key": "plain-value-123", "Content-Type": "application/json"}`, `{"X-Api-Key": "[REDACTED]", "Content-Type": "application/json"}`},
		{"key in url query", "GET https://generativelanguage.example/v1/models?key=" + googleKey + "&alt=sse", "GET https://generativelanguage.example/v1/models?key=[REDACTED]&alt=sse"},
		{"token in url query", "https://h/x?a=1&token=s3cr3t#frag", "https://h/x?a=1&token=[REDACTED]#frag"},
		{"api_key form field", "api_key=zzz&user=bob", "api_key=[REDACTED]&user=bob"},
		{"configured value", "dial gateway with " + configured + " failed", "dial gateway with [REDACTED] failed"},
		{"short configured values are not masked", "a short answer", "a short answer"},
		{"nothing secret", "quota exhausted for tenant acme: retry in 2s (sk- is a prefix)", "quota exhausted for tenant acme: retry in 2s (sk- is a prefix)"},
		{"token counts stay", "tokens=1200 max_tokens=256", "tokens=1200 max_tokens=256"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := r.String(tt.in); got != tt.want {
				t.Errorf("String(%q)\n got %q\nwant %q", tt.in, got, tt.want)
			}
		})
	}
}

type request struct {
	Model  string            `json:"model"`
	Header map[string]string `json:"header"`
}

type upstreamError struct{ url string }

func (e upstreamError) Error() string { return "POST " + e.url + ": 401" }

// logLine logs one record through a Redactor in front of a JSON handler and decodes it.
func logLine(t *testing.T, o Options, log func(*slog.Logger)) (map[string]any, string) {
	t.Helper()
	var buf bytes.Buffer
	log(slog.New(New(o).Handler(slog.NewJSONHandler(&buf, nil))))
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatalf("log line %q: %v", buf.String(), err)
	}
	return m, buf.String()
}

func TestHandler(t *testing.T) {
	t.Parallel()
	prompt := "my password=hunter2 and my key is " + openAIKey
	tests := []struct {
		name  string
		opts  Options
		log   func(*slog.Logger)
		check func(t *testing.T, m map[string]any)
	}{
		{
			name: "message, error and string attributes",
			log: func(l *slog.Logger) {
				l.Warn("provider refused key "+anthropicKey, "err", fmt.Errorf("attempt: %w", upstreamError{"https://api.example/v1?key=" + googleKey}), "model", "primary")
			},
			check: func(t *testing.T, m map[string]any) {
				want := map[string]any{"msg": "provider refused key [REDACTED]", "err": "attempt: POST https://api.example/v1?key=[REDACTED]: 401", "model": "primary"}
				for k, v := range want {
					if m[k] != v {
						t.Errorf("%s = %q, want %q", k, m[k], v)
					}
				}
			},
		},
		{
			name: "secret keys are masked whole",
			log: func(l *slog.Logger) {
				l.Info("dial", "Authorization", "Token abc", "api-key", "anything", "tokens", 12)
			},
			check: func(t *testing.T, m map[string]any) {
				if m["Authorization"] != Redacted || m["api-key"] != Redacted {
					t.Errorf("secret attributes = %q, %q; want %s", m["Authorization"], m["api-key"], Redacted)
				}
				if m["tokens"] != float64(12) {
					t.Errorf("tokens = %v, want 12 (numbers pass)", m["tokens"])
				}
			},
		},
		{
			name: "bodies are omitted by default",
			log: func(l *slog.Logger) {
				l.Debug("x")
				l.Error("answer failed L1", "prompt", prompt, "content", "the answer")
			},
			check: func(t *testing.T, m map[string]any) {
				if m["prompt"] != Omitted || m["content"] != Omitted {
					t.Errorf("prompt = %q, content = %q; want %q", m["prompt"], m["content"], Omitted)
				}
			},
		},
		{
			name: "debug bodies keep them, redacted",
			opts: Options{DebugBodies: true},
			log:  func(l *slog.Logger) { l.Error("answer failed L1", "prompt", prompt) },
			check: func(t *testing.T, m map[string]any) {
				if want := "my password=[REDACTED] and my key is [REDACTED]"; m["prompt"] != want {
					t.Errorf("prompt = %q, want %q", m["prompt"], want)
				}
			},
		},
		{
			name: "groups and With attributes",
			log: func(l *slog.Logger) {
				l.With("upstream", "https://h/v1?token=abc").WithGroup("call").Info("sent", slog.Group("req", "auth", "Bearer zzz.yyy", "api_key", "k"))
			},
			check: func(t *testing.T, m map[string]any) {
				if m["upstream"] != "https://h/v1?token=[REDACTED]" {
					t.Errorf("upstream = %q", m["upstream"])
				}
				req := m["call"].(map[string]any)["req"].(map[string]any)
				if req["auth"] != "Bearer [REDACTED]" || req["api_key"] != Redacted {
					t.Errorf("req group = %v", req)
				}
			},
		},
		{
			name: "structs are checked as JSON",
			log: func(l *slog.Logger) {
				l.Info("request", "req", request{Model: "m", Header: map[string]string{"x-api-key": "abc123def"}}, "plain", request{Model: "m"})
			},
			check: func(t *testing.T, m map[string]any) {
				if s, _ := m["req"].(string); !strings.Contains(s, Redacted) || strings.Contains(s, "abc123def") {
					t.Errorf("req = %v, want the key masked", m["req"])
				}
				if _, ok := m["plain"].(map[string]any); !ok {
					t.Errorf("plain = %v, want it left a JSON object", m["plain"])
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, raw := logLine(t, tt.opts, tt.log)
			tt.check(t, m)
			for _, secret := range []string{openAIKey, anthropicKey, googleKey, "hunter2"} {
				if strings.Contains(raw, secret) {
					t.Errorf("line leaks %q: %s", secret, raw)
				}
			}
		})
	}
}

func TestErrorsKeepTheirText(t *testing.T) {
	t.Parallel()
	m, _ := logLine(t, Options{}, func(l *slog.Logger) { l.Info("x", "err", errors.New("plain failure")) })
	if m["err"] != "plain failure" {
		t.Errorf("err = %q", m["err"])
	}
}
