package mesh_test

import (
	"io"
	"net"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/services/router"
)

// closedAddr is an address nothing listens on: connections to it are refused at once.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestRouterSurvivesItsDependencies runs the router with one of its own dependencies
// unreachable and checks that requests are still answered, with the skipped step named.
func TestRouterSurvivesItsDependencies(t *testing.T) {
	for _, tc := range []struct {
		name    string
		target  string
		set     func(c *mesh.Config, dead string)
		skipped string // "" when nothing the caller sees is skipped
	}{
		{"quota down: bounded fail-open", "router,cache,verifier,agent", func(c *mesh.Config, dead string) { c.Router.QuotaAddress = dead }, "quota"},
		{"cache down: a miss", "router,quota,verifier,agent", func(c *mesh.Config, dead string) { c.Router.CacheAddress = dead }, "cache"},
		{"verifier down: local L1, unverified", "router,quota,cache,agent", func(c *mesh.Config, dead string) { c.Router.VerifierAddress = dead }, "verify"},
		{"NATS down: events buffered", "all", func(c *mesh.Config, dead string) { c.Events = mesh.EventsConfig{NATSURL: "nats://" + dead} }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.Target = tc.target
			cfg.Server.GRPCListenAddress, cfg.Server.HTTPListenAddress = "127.0.0.1:0", "127.0.0.1:0"
			cfg.Log.Level = "error"
			tc.set(&cfg, closedAddr(t))
			p := meshtest.Run(t, cfg, mesh.Options{LogOutput: io.Discard})
			client := routerv1.NewRouterServiceClient(meshtest.Dial(t, p.App.GRPCAddr()))
			resp, err := client.Complete(authed(acmeKey), &routerv1.CompleteRequest{Request: ask("primary", "Are you still there?")}, grpc.WaitForReady(true))
			if err != nil {
				t.Fatalf("Complete with %s: %v", tc.name, err)
			}
			if resp.GetMessage().GetContent() == "" {
				t.Error("empty answer")
			}
			skipped := resp.GetQuality().GetSkippedSteps()
			if tc.skipped != "" && !slices.Contains(skipped, tc.skipped) {
				t.Errorf("skipped_steps = %v, want %s", skipped, tc.skipped)
			}
			if tc.skipped == "" && len(skipped) != 0 {
				t.Errorf("skipped_steps = %v, want none", skipped)
			}
		})
	}
}

// TestRouterWithServicesOff runs the router with quota, cache and verifier switched off
// (address "off"): alone, and with those modules running in the same process but unused.
// Requests are answered without asking them; only the verifier's absence is visible,
// since the answer goes out checked by the router's L1 alone.
func TestRouterWithServicesOff(t *testing.T) {
	for _, target := range []string{"router", "all"} {
		t.Run(target, func(t *testing.T) {
			cfg := testConfig()
			cfg.Target = target
			cfg.Server.GRPCListenAddress, cfg.Server.HTTPListenAddress = "127.0.0.1:0", "127.0.0.1:0"
			cfg.Log.Level = "error"
			cfg.Router.QuotaAddress, cfg.Router.CacheAddress, cfg.Router.VerifierAddress, cfg.Router.AgentAddress = router.Off, router.Off, router.Off, router.Off
			p := meshtest.Run(t, cfg, mesh.Options{LogOutput: io.Discard})
			client := routerv1.NewRouterServiceClient(meshtest.Dial(t, p.App.GRPCAddr()))
			resp, err := client.Complete(authed(acmeKey), &routerv1.CompleteRequest{Request: ask("primary", "Are you still there?")}, grpc.WaitForReady(true))
			if err != nil {
				t.Fatalf("Complete: %v", err)
			}
			q := resp.GetQuality()
			if resp.GetMessage().GetContent() == "" || q.GetFallbackLevel() != mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY {
				t.Errorf("answer %q at level %v, want the primary's", resp.GetMessage().GetContent(), q.GetFallbackLevel())
			}
			if got := q.GetSkippedSteps(); !slices.Equal(got, []string{"verify"}) {
				t.Errorf("skipped_steps = %v, want [verify]: quota and cache are off, not failing", got)
			}
			var steps []string
			for _, s := range q.GetAudit() {
				if s.GetService() != "router" {
					t.Errorf("audit step %s/%s from a service that is off", s.GetService(), s.GetStep())
				}
				steps = append(steps, s.GetStep()+": "+s.GetDetail())
			}
			if slices.ContainsFunc(steps, func(s string) bool { return strings.HasPrefix(s, "reserve") || strings.HasPrefix(s, "lookup") }) {
				t.Errorf("audit %q reserves or looks up with quota and cache off", steps)
			}
			if !slices.ContainsFunc(steps, func(s string) bool { return s == "verify: verifier off; local L1 passed" }) {
				t.Errorf("audit %q, want the router's own L1 check", steps)
			}
		})
	}
}

// TestAgentWithVerifierOff: router.verifier_address off reaches the agent, alone in its
// process or beside the verifier: it warns at start that action outcomes which become
// unknown stay pending with nobody to confirm them. An agent given a verifier's address
// does not (it dials lazily: the verifier may start later).
func TestAgentWithVerifierOff(t *testing.T) {
	for _, tt := range []struct {
		name, target string
		verifier     func(t *testing.T) string
		wantWarning  bool
	}{
		{"agent alone, verifier off", "agent", func(*testing.T) string { return router.Off }, true},
		{"every module, verifier off", "all", func(*testing.T) string { return router.Off }, true},
		{"agent alone, a verifier address", "agent", closedAddr, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.Target = tt.target
			cfg.Server.GRPCListenAddress, cfg.Server.HTTPListenAddress = "127.0.0.1:0", "127.0.0.1:0"
			cfg.Log.Level = "warn"
			cfg.Router.VerifierAddress = tt.verifier(t)
			logs := &syncBuffer{}
			meshtest.Run(t, cfg, mesh.Options{LogOutput: logs})
			var warned []map[string]any
			for _, l := range logs.all(t) {
				if msg, _ := l["msg"].(string); strings.HasPrefix(msg, "no verifier to confirm action outcomes") && l["level"] == "WARN" {
					warned = append(warned, l)
				}
			}
			if got := len(warned) > 0; got != tt.wantWarning {
				t.Errorf("warned %v, want %v: %v", got, tt.wantWarning, warned)
			}
			for _, l := range warned {
				if msg, _ := l["msg"].(string); !strings.Contains(msg, "never retried and never marked done") {
					t.Errorf("the warning %q does not say what happens to unknown outcomes", msg)
				}
			}
		})
	}
}
