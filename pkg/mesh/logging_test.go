package mesh

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"slices"
	"strings"
	"testing"

	"github.com/mantle-mesh/mantle/pkg/logredact"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/router"
)

func TestNewLogger(t *testing.T) {
	t.Parallel()
	const secret = "gateway-key-0123456789"
	tests := []struct {
		name       string
		cfg        LogConfig
		wantPrompt string
	}{
		{"bodies off by default", LogConfig{Level: "info", Format: "json"}, logredact.Omitted},
		{"debug bodies on, redacted", LogConfig{Level: "info", Format: "json", DebugBodies: true}, "use [REDACTED] please"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			log := NewLogger(tt.cfg, &buf, secret)
			ctx := rpc.WithTraceID(rpc.WithRequestID(context.Background(), "req-9"), "0af7651916cd43dd8448eb211c80319c")
			log.WarnContext(ctx, "attempt failed", "err", "upstream rejected "+secret, "prompt", "use "+secret+" please")
			if strings.Contains(buf.String(), secret) {
				t.Fatalf("the configured key leaked: %s", buf.String())
			}
			var m map[string]any
			if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
				t.Fatalf("%q: %v", buf.String(), err)
			}
			want := map[string]any{
				"request_id": "req-9", "trace_id": "0af7651916cd43dd8448eb211c80319c",
				"err": "upstream rejected [REDACTED]", "prompt": tt.wantPrompt,
			}
			for k, v := range want {
				if m[k] != v {
					t.Errorf("%s = %v, want %v", k, m[k], v)
				}
			}
		})
	}
}

func TestSecretValues(t *testing.T) {
	t.Parallel()
	cfg := Default()
	cfg.Router.Providers = []router.ProviderConfig{{Name: "openai", Keys: []router.KeyConfig{{ID: "a", Env: "OPENAI_KEY_A"}, {ID: "b", Env: "UNSET"}}}}
	cfg.Cache.Embedder.APIKeyEnv = "EMBED_KEY"
	env := map[string]string{"OPENAI_KEY_A": "sk-a", "EMBED_KEY": "embed-secret"}
	got := cfg.secretValues(func(k string) string { return env[k] })
	slices.Sort(got)
	if want := []string{"embed-secret", "sk-a"}; !slices.Equal(got, want) {
		t.Errorf("secretValues = %q, want %q", got, want)
	}
}

func TestDebugBodiesFlag(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want bool
	}{
		{nil, false},
		{[]string{"--log.debug-bodies"}, true},
		{[]string{"--log.debug-bodies=false"}, false},
	} {
		fs := flag.NewFlagSet("mantle", flag.ContinueOnError)
		f := RegisterFlags(fs)
		if err := fs.Parse(tt.args); err != nil {
			t.Fatal(err)
		}
		cfg, err := Load(f)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Log.DebugBodies != tt.want {
			t.Errorf("%q: log.debug_bodies = %t, want %t", tt.args, cfg.Log.DebugBodies, tt.want)
		}
	}
}
