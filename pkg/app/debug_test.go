package app_test

import (
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/mantle-mesh/mantle/pkg/app"
)

// TestDebugListener: configured without a host, the debug listener binds loopback and
// serves pprof and expvar; the public HTTP listener serves neither; unconfigured, there is
// no debug listener at all.
func TestDebugListener(t *testing.T) {
	t.Parallel()
	t.Run("on", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig("blocker")
		cfg.DebugListenAddress = ":0"
		r := start(t, cfg, []app.Module{newBlocker().module("blocker", nil, nil)})
		host, _, err := net.SplitHostPort(r.app.DebugAddr())
		if err != nil || host != "127.0.0.1" {
			t.Fatalf("DebugAddr() = %q, want a 127.0.0.1 address", r.app.DebugAddr())
		}
		for _, tt := range []struct{ path, want string }{
			{"/debug/pprof/", "goroutine"},
			{"/debug/pprof/heap?debug=1", "heap profile"},
			{"/debug/vars", `"memstats"`},
		} {
			code, body := httpGet(t, "http://"+r.app.DebugAddr()+tt.path)
			if code != http.StatusOK || !strings.Contains(body, tt.want) {
				t.Errorf("GET %s on the debug listener = %d, body without %q", tt.path, code, tt.want)
			}
			if code, _ := httpGet(t, "http://"+r.app.HTTPAddr()+tt.path); code != http.StatusNotFound {
				t.Errorf("GET %s on the public listener = %d, want 404", tt.path, code)
			}
		}
	})
	t.Run("metrics moved to the debug listener", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig("blocker")
		cfg.DebugListenAddress, cfg.MetricsOnDebug = ":0", true
		r := start(t, cfg, []app.Module{newBlocker().module("blocker", nil, nil)})
		if code, body := httpGet(t, "http://"+r.app.DebugAddr()+"/metrics"); code != http.StatusOK || !strings.Contains(body, "# TYPE") {
			t.Errorf("GET /metrics on the debug listener = %d, want the metrics", code)
		}
		if code, _ := httpGet(t, "http://"+r.app.HTTPAddr()+"/metrics"); code != http.StatusNotFound {
			t.Errorf("GET /metrics on the public listener = %d, want 404", code)
		}
	})
	t.Run("metrics stay public by default", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig("blocker")
		cfg.DebugListenAddress = ":0"
		r := start(t, cfg, []app.Module{newBlocker().module("blocker", nil, nil)})
		if code, _ := httpGet(t, "http://"+r.app.HTTPAddr()+"/metrics"); code != http.StatusOK {
			t.Errorf("GET /metrics on the public listener = %d, want 200", code)
		}
		if code, _ := httpGet(t, "http://"+r.app.DebugAddr()+"/metrics"); code != http.StatusNotFound {
			t.Errorf("GET /metrics on the debug listener = %d, want 404", code)
		}
	})
	t.Run("off", func(t *testing.T) {
		t.Parallel()
		r := start(t, testConfig("blocker"), []app.Module{newBlocker().module("blocker", nil, nil)})
		if addr := r.app.DebugAddr(); addr != "" {
			t.Errorf("DebugAddr() = %q without debug_listen_address", addr)
		}
		if code, _ := httpGet(t, "http://"+r.app.HTTPAddr()+"/debug/pprof/"); code != http.StatusNotFound {
			t.Errorf("GET /debug/pprof/ on the public listener = %d, want 404", code)
		}
	})
}
