package mesh_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"golang.org/x/net/html"

	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
	"github.com/mantle-mesh/mantle/pkg/sim"
	"github.com/mantle-mesh/mantle/services/router"
	"github.com/mantle-mesh/mantle/services/router/statuspage"
)

// chromiumNames are the browser's names on PATH, tried in order after $CHROME_BIN; as
// root on Debian, `make deps-chromium` (run by `make test`) installs the first.
var chromiumNames = []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}

// statusConfig is one route, "chat", over a primary that answers 503 to everything and a
// healthy backup. The breaker opens after two failures for 30s, without jitter, so the
// next probe time is exact.
func statusConfig() mesh.Config {
	cfg := resilienceConfig()
	r := &cfg.Router
	r.SimProfiles = map[string]sim.Profile{"instant": {}, "down": {Errors: sim.ErrorMix{Overloaded: 1}}}
	r.Models = []router.ModelConfig{
		{Name: "primary", Provider: "sim", SimProfile: "down"},
		{Name: "backup", Provider: "sim"},
	}
	r.Routes = []router.RouteConfig{{Name: "chat", Scenario: "chat", Candidates: []string{"primary", "backup"}}}
	r.Breaker.ConsecutiveFailures = 2
	r.Breaker.OpenDuration = 30 * time.Second
	r.Breaker.OpenJitter = 0
	cfg.Quota.DefaultLimits.RPM = 600
	return cfg
}

// TestStatusPageInBrowser drives a mesh until the primary's breaker opens, then loads
// /status in headless Chromium, as an operator would, and reads what it rendered: the open
// breaker on the right key with its next probe, the degradation rows, the cache hit rate
// and the tenant's quota line. The mesh runs on a fake clock, so the breaker opens after
// two requests and the quota buckets do not refill while the test reads them.
func TestStatusPageInBrowser(t *testing.T) {
	t.Parallel()
	chromium := requireChromium(t)
	// Near the real time: the router derives context deadlines from the clock.
	clock := clockwork.NewFakeClockAt(time.Now().Truncate(time.Second))
	cfg := statusConfig()
	tools := newToolBackend(t)
	cfg.Agent.Tools = toolsConfig(tools).Agent.Tools
	m := meshtest.StartWith(t, cfg, meshtest.All, mesh.Options{Clock: clock})
	if code, body, _ := doHTTP(t, http.MethodPost, "http://"+m.HTTPAddr+"/v1/tools/lookup/call", resilienceKey, `{"arguments":{"city":"Oslo"}}`, nil); code != http.StatusOK {
		t.Fatalf("call lookup = %d %s", code, body)
	}

	const requests = 3
	for i := range requests {
		res := chat(t, m.HTTPAddr, "chat", fmt.Sprintf("status page question %d", i), false, false)
		if res.status != http.StatusOK || res.model != "backup" {
			t.Fatalf("request %d: status %d from %q (%s %s), want 200 from backup", i, res.status, res.model, res.errCode, res.errMsg)
		}
	}

	// The key goes in as the Basic password, the way a browser sends it after its prompt.
	dom := dumpDOM(t, chromium, "http://tenant:"+resilienceKey+"@"+m.HTTPAddr+statuspage.Path+"?refresh=0")
	doc, err := html.Parse(strings.NewReader(dom))
	if err != nil {
		t.Fatalf("parse the DOM: %v", err)
	}

	t.Run("breaker open on the primary's key, with its next probe", func(t *testing.T) {
		keys := domFindAll(doc, func(n *html.Node) bool { return domHasClass(n, "key") })
		states := map[string]string{}
		for _, k := range keys {
			states[domAttr(k, "data-model")+"/"+domAttr(k, "data-key")] = domAttr(k, "data-breaker")
		}
		if states["primary/sim"] != "open" || states["backup/sim"] != "closed" {
			t.Fatalf("breakers = %v, want primary/sim open and backup/sim closed", states)
		}
		primary := domFindAll(doc, func(n *html.Node) bool { return domHasClass(n, "key") && domAttr(n, "data-model") == "primary" })[0]
		row := domText(primary)
		// The next call that may reach the open key is its next scout (scout_interval after
		// the trip, no jitter here), well before the 30 s open period ends.
		scout := statusConfig().Router.Breaker.ScoutInterval
		probe := clock.Now().Add(scout).UTC().Format("15:04:05")
		for _, want := range []string{"2 consecutive failures (scenario chat)", probe, fmt.Sprintf("(in %s)", scout)} {
			if !strings.Contains(row, want) {
				t.Errorf("primary's row %q lacks %q", row, want)
			}
		}
		route := domFindAll(doc, func(n *html.Node) bool { return n.Data == "tbody" && domAttr(n, "data-route") == "chat" })
		if len(route) != 1 || domAttr(route[0], "data-level") != "L1" {
			t.Errorf("route chat's ladder level is not L1: %v", route)
		}
		if got := domText(domByID(t, doc, "open-breakers")); got != "1" {
			t.Errorf("open breakers = %q, want 1", got)
		}
	})

	t.Run("a degradation row per request answered by the backup", func(t *testing.T) {
		rows := domFindAll(doc, func(n *html.Node) bool { return domHasClass(n, "degradation") })
		if len(rows) != requests {
			t.Fatalf("%d degradation rows, want %d", len(rows), requests)
		}
		for _, r := range rows {
			line := domText(r)
			if domAttr(r, "data-route") != "chat" || domAttr(r, "data-level") != "L1" || !strings.Contains(line, "backup") || !strings.HasPrefix(domAttr(r, "data-request-id"), "req_") {
				t.Errorf("degradation row %q (route %s, level %s, request %s), want chat at L1 answered by backup",
					line, domAttr(r, "data-route"), domAttr(r, "data-level"), domAttr(r, "data-request-id"))
			}
		}
		if first := domText(rows[len(rows)-1]); !strings.Contains(first, "primary failed") {
			t.Errorf("the oldest degradation %q does not say the primary failed", first)
		}
	})

	t.Run("the tenant's quota line", func(t *testing.T) {
		rows := domFindAll(doc, func(n *html.Node) bool { return domHasClass(n, "tenant") })
		if len(rows) != 1 || domAttr(rows[0], "data-tenant") != "acme" {
			t.Fatalf("quota rows %v, want acme's alone (the caller's tenant)", rows)
		}
		if used, limit := domAttr(rows[0], "data-rpm-used"), domAttr(rows[0], "data-rpm-limit"); used != fmt.Sprint(requests) || limit != "600" {
			t.Errorf("acme uses %s of %s requests per minute, want %d of 600", used, limit, requests)
		}
		if !strings.Contains(domText(rows[0]), fmt.Sprintf("%d / 600", requests)) {
			t.Errorf("quota line %q does not show %d / 600", domText(rows[0]), requests)
		}
	})

	t.Run("tools next to the models, with their recent outcomes", func(t *testing.T) {
		rows := domFindAll(doc, func(n *html.Node) bool { return domHasClass(n, "tool") })
		got := map[string]string{}
		for _, r := range rows {
			got[domAttr(r, "data-tool")] = domAttr(r, "data-kind") + " " + domAttr(r, "data-breaker") + " " + domAttr(r, "data-calls") + ": " + strings.Join(strings.Fields(domText(r)), " ")
		}
		if len(rows) != 2 || !strings.HasPrefix(got["lookup"], "query closed 1: ") || !strings.HasSuffix(got["lookup"], " ok") ||
			!strings.HasPrefix(got["order"], "action closed 0: ") || !strings.HasSuffix(got["order"], "no calls yet") {
			t.Errorf("tool rows %q, want lookup (query, closed, 1 call, ok) and order (action, closed, no calls)", got)
		}
	})

	t.Run("the cache hit rate", func(t *testing.T) {
		if got := domText(domByID(t, doc, "cache-hit-rate")); got != "0.0%" {
			t.Errorf("cache hit rate %q, want 0.0%% (three new questions)", got)
		}
	})

	t.Run("no secrets", func(t *testing.T) {
		if strings.Contains(dom, resilienceKey) {
			t.Error("the page shows the tenant's API key")
		}
	})
}

// TestStatusPageShapes: the page works in both deployment shapes, and a dependency that
// cannot be reached leaves its section unavailable, with the error, instead of failing the
// page. The JSON form is what scripts read.
func TestStatusPageShapes(t *testing.T) {
	t.Parallel()
	for _, mode := range []meshtest.Mode{meshtest.All, meshtest.Split} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			cfg := statusConfig()
			cfg.Agent.Tools = toolsConfig(newToolBackend(t)).Agent.Tools
			m := meshtest.Start(t, cfg, mode)
			chat(t, m.HTTPAddr, "chat", "a question for the status page", false, false)
			if code, body, _ := doHTTP(t, http.MethodPost, "http://"+m.HTTPAddr+"/v1/tools/lookup/call", resilienceKey, `{"arguments":{"city":"Oslo"}}`, nil); code != http.StatusOK {
				t.Fatalf("call lookup = %d %s", code, body)
			}
			snap := getStatus(t, m.HTTPAddr, resilienceKey)
			if !snap.Quota.Available || !snap.Cache.Available || snap.Cache.Lookups == 0 {
				t.Errorf("quota %+v, cache %+v: want both available, with lookups counted", snap.Quota, snap.Cache)
			}
			if len(snap.Quota.Tenants) != 1 || snap.Quota.Tenants[0].Tenant != "acme" || snap.Quota.Tenants[0].Requests.Limit != 600 {
				t.Errorf("quota tenants %+v, want acme's with an RPM limit of 600", snap.Quota.Tenants)
			}
			// Every model is a route of its own, then the chat alias.
			tools := map[string]string{}
			for _, tl := range snap.Tools.Tools {
				tools[tl.Name] = fmt.Sprintf("%s %s %d %v", tl.Kind, tl.Breaker, tl.Calls, tl.Recent)
			}
			if !snap.Tools.Available || snap.Tools.Error != "" || len(tools) != 2 || tools["lookup"] != "query closed 1 [ok]" || tools["order"] != "action closed 0 []" {
				t.Errorf("tools %+v, want lookup (query, closed, 1 call: ok) and order (action, closed, no calls)", snap.Tools)
			}
			if snap.Tenant != "acme" || len(snap.Routes) != 3 || snap.Routes[2].Name != "chat" || len(snap.Degradations) != 1 {
				t.Errorf("tenant %q, routes %+v, %d degradations; want acme, primary, backup and chat, 1", snap.Tenant, snap.Routes, len(snap.Degradations))
			}
		})
	}

	t.Run("quota, cache and agent unreachable", func(t *testing.T) {
		t.Parallel()
		cfg := statusConfig()
		cfg.Target = "router,verifier"
		cfg.Server.GRPCListenAddress, cfg.Server.HTTPListenAddress = "127.0.0.1:0", "127.0.0.1:0"
		cfg.Log.Level = "error"
		cfg.Router.QuotaAddress, cfg.Router.CacheAddress, cfg.Router.AgentAddress = closedAddr(t), closedAddr(t), closedAddr(t)
		p := meshtest.Run(t, cfg, mesh.Options{LogOutput: io.Discard})
		snap := getStatus(t, p.App.HTTPAddr(), resilienceKey)
		if snap.Tools.Available || snap.Tools.Off || !strings.HasPrefix(snap.Tools.Error, "Unavailable: ") {
			t.Errorf("tools section %+v, want unavailable with the error", snap.Tools)
		}
		if snap.Quota.Available || !strings.HasPrefix(snap.Quota.Error, "Unavailable: ") {
			t.Errorf("quota section %+v, want unavailable with the error", snap.Quota)
		}
		if snap.Cache.Available || !strings.HasPrefix(snap.Cache.Error, "Unavailable: ") {
			t.Errorf("cache section %+v, want unavailable with the error", snap.Cache)
		}
		if len(snap.Routes) != 3 {
			t.Errorf("routes %+v, want the router's own state regardless", snap.Routes)
		}
	})

	t.Run("tools off", func(t *testing.T) {
		t.Parallel()
		cfg := statusConfig()
		cfg.Router.AgentAddress = router.Off
		m := meshtest.Start(t, cfg, meshtest.All)
		snap := getStatus(t, m.HTTPAddr, resilienceKey)
		if snap.Tools.Available || !snap.Tools.Off || !strings.Contains(snap.Tools.Error, "router.agent_address is off") || len(snap.Routes) != 3 {
			t.Errorf("tools section %+v with %d routes, want off, saying why, and the routes regardless", snap.Tools, len(snap.Routes))
		}
	})
}

func getStatus(t *testing.T, addr, key string) statuspage.Snapshot {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+statuspage.Path+"?format=json", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET /status: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET /status: %d %s", resp.StatusCode, b)
	}
	var snap statuspage.Snapshot
	if err := json.NewDecoder(resp.Body).Decode(&snap); err != nil {
		t.Fatal(err)
	}
	return snap
}

// requireChromium returns the browser's path: $CHROME_BIN, else the first of
// chromiumNames on PATH. Without one the test skips, except in CI (CI=true), where a
// browser test that silently skips would prove nothing.
func requireChromium(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("CHROME_BIN"); bin != "" {
		path, err := exec.LookPath(bin)
		if err != nil {
			t.Fatalf("CHROME_BIN=%s: %v", bin, err)
		}
		return path
	}
	for _, name := range chromiumNames {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	msg := "no Chromium on PATH (" + strings.Join(chromiumNames, ", ") + ") and CHROME_BIN is unset: " +
		"install it (Debian: apt-get install chromium, or `make deps-chromium` as root) or set CHROME_BIN"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + "; CI=true, so this is a failure, not a skip")
	}
	t.Skip(msg)
	return ""
}

// dumpDOM loads url in headless Chromium and returns the DOM it rendered. --dump-dom
// prints it once the page has loaded, which for a page without scripts is all there is
// to wait for, so a driver such as chromedp would add nothing.
func dumpDOM(t *testing.T, chromium, url string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, chromium, append(chromiumFlags(t.TempDir()), "--dump-dom", url)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium --dump-dom: %v\n%s", err, stderr.String())
	}
	return string(out)
}

// chromiumFlags run Chromium headless as root in a container, with nothing that reaches
// the network on its own.
func chromiumFlags(profile string) []string {
	return []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--user-data-dir=" + profile}
}

func domFindAll(n *html.Node, match func(*html.Node) bool) []*html.Node {
	var out []*html.Node
	for d := range n.Descendants() {
		if d.Type == html.ElementNode && match(d) {
			out = append(out, d)
		}
	}
	return out
}

func domByID(t *testing.T, doc *html.Node, id string) *html.Node {
	t.Helper()
	found := domFindAll(doc, func(n *html.Node) bool { return domAttr(n, "id") == id })
	if len(found) != 1 {
		t.Fatalf("%d elements with id %q, want 1", len(found), id)
	}
	return found[0]
}

func domAttr(n *html.Node, name string) string {
	for _, a := range n.Attr {
		if a.Key == name {
			return a.Val
		}
	}
	return ""
}

func domHasClass(n *html.Node, class string) bool {
	return n.Type == html.ElementNode && strings.Contains(" "+domAttr(n, "class")+" ", " "+class+" ")
}

// text is the visible text of n with whitespace collapsed.
func domText(n *html.Node) string {
	var b strings.Builder
	for d := range n.Descendants() {
		if d.Type == html.TextNode {
			b.WriteString(d.Data)
			b.WriteByte(' ')
		}
	}
	return strings.Join(strings.Fields(b.String()), " ")
}
