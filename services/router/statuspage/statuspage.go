// Package statuspage serves the router's built-in status page, GET /status on the HTTP
// port: every route and upstream key with its breaker state, reason and next probe time,
// the degradation ladder level of each route, the router's recent degradations, the
// cache's hit rate and each tenant's quota use. It is server-rendered HTML (html/template,
// embedded, inline CSS, no scripts) that reloads itself, and the same data as JSON with
// ?format=json for scripts.
//
// The page never fails because a dependency does: the cache and quota sections are read
// over gRPC with a short timeout each and shown as unavailable, with the error, when the
// call fails. It shows no secrets: upstream keys by id, tenants by id.
//
// Access follows the OpenAI-compatible front door: when tenant keys are configured a
// caller needs one, as "Authorization: Bearer <key>" (scripts) or as the password of HTTP
// Basic authentication (browsers, which then re-send it on every refresh). A tenant then
// sees the mesh-wide route, breaker and cache state but only its own quota and
// degradations. Keys in the query string are not accepted: URLs end up in logs.
package statuspage

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	agentv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/agent/v1"
	cachev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/cache/v1"
	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	quotav1 "github.com/mantle-mesh/mantle/pkg/api/mantle/quota/v1"
	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// Path is where the page is served.
const Path = "/status"

// defaultCallTimeout bounds each dependency call: a page that hangs on a dead dependency
// tells the operator less than one that says it is unreachable.
const defaultCallTimeout = 2 * time.Second

//go:embed status.html.tmpl
var templates embed.FS

var page = template.Must(template.New("status.html.tmpl").Funcs(template.FuncMap{
	"pct": func(f float64) string { return strconv.FormatFloat(100*f, 'f', 1, 64) + "%" },
	"barWidth": func(f float64) string {
		return strconv.FormatFloat(100*min(max(f, 0), 1), 'f', 0, 64) + "%"
	},
}).ParseFS(templates, "status.html.tmpl"))

// Routes is the router's own state: its routing table with live key state (what the
// DescribeRoutes RPC returns) and its recent degradation events, newest first.
type Routes interface {
	Describe(only string) (*routerv1.DescribeRoutesResponse, error)
	RecentDegradations() []*eventsv1.DegradationEvent
}

// Quota is the part of the quota service's client the page reads.
type Quota interface {
	DescribeUsage(ctx context.Context, in *quotav1.DescribeUsageRequest, opts ...grpc.CallOption) (*quotav1.DescribeUsageResponse, error)
}

// Cache is the part of the cache service's client the page reads.
type Cache interface {
	DescribeStats(ctx context.Context, in *cachev1.DescribeStatsRequest, opts ...grpc.CallOption) (*cachev1.DescribeStatsResponse, error)
}

// Tools is the part of the agent's tool client the page reads.
type Tools interface {
	ListTools(ctx context.Context, in *agentv1.ListToolsRequest, opts ...grpc.CallOption) (*agentv1.ListToolsResponse, error)
}

// Deps are where the page's data comes from.
type Deps struct {
	Routes Routes
	Quota  Quota
	Cache  Cache
	// Tools is nil when the router serves no tools (router.agent_address off).
	Tools Tools
	// Auth checks tenant keys; nil when authentication is disabled (the page is open).
	Auth  *rpc.Authenticator
	Clock clockwork.Clock
	Log   *slog.Logger
	// Refresh is how often the HTML page reloads itself (0: never). It is read for every
	// request, so a configuration reload applies at once.
	Refresh func() time.Duration
	// CallTimeout bounds each call to quota and cache; 0 means 2s.
	CallTimeout time.Duration
}

// Handler serves the status page.
type Handler struct {
	deps Deps
}

// New returns the page's handler.
func New(deps Deps) *Handler {
	if deps.CallTimeout <= 0 {
		deps.CallTimeout = defaultCallTimeout
	}
	if deps.Refresh == nil {
		deps.Refresh = func() time.Duration { return 0 }
	}
	return &Handler{deps: deps}
}

// Register adds GET /status to mux.
func (h *Handler) Register(mux *http.ServeMux) {
	mux.Handle("GET "+Path, h)
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	asJSON := r.URL.Query().Get("format") == "json"
	ctx, tenant, err := h.authenticate(r)
	if err != nil {
		// Browsers show their login prompt on a Basic challenge; scripts send Bearer.
		w.Header().Set("WWW-Authenticate", `Basic realm="mantle status", charset="UTF-8"`)
		h.writeError(w, asJSON, http.StatusUnauthorized, err.Error())
		return
	}
	refresh := h.deps.Refresh()
	if v := r.URL.Query().Get("refresh"); v != "" {
		secs, err := strconv.Atoi(v)
		if err != nil || secs < 0 {
			h.writeError(w, asJSON, http.StatusBadRequest, fmt.Sprintf("refresh: want a number of seconds (0 turns it off), got %q", v))
			return
		}
		refresh = time.Duration(max(secs, 1)) * time.Second
		if secs == 0 {
			refresh = 0
		}
	}
	snap := h.collect(ctx, tenant)
	snap.RefreshSeconds = int(refresh / time.Second)
	w.Header().Set("Cache-Control", "no-store")
	if asJSON {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(snap)
		return
	}
	// Rendered to a buffer first, so a template error is a 500 rather than half a page.
	var buf bytes.Buffer
	if err := page.Execute(&buf, snap); err != nil {
		h.deps.Log.ErrorContext(ctx, "status page did not render", "err", err)
		h.writeError(w, false, http.StatusInternalServerError, "the status page did not render; see the router's log")
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(buf.Bytes())
}

// authenticate returns the context to call dependencies with (carrying the tenant's
// credential, so quota scopes its answer) and the tenant ("" when authentication is off).
func (h *Handler) authenticate(r *http.Request) (context.Context, string, error) {
	ctx := rpc.WithRequestID(r.Context(), rpc.NewRequestID())
	if !h.deps.Auth.Enabled() {
		return ctx, "", nil
	}
	token, ok := rpc.BearerToken(r.Header.Get("Authorization"))
	if !ok {
		if _, password, basic := r.BasicAuth(); basic && password != "" {
			token, ok = password, true
		}
	}
	if !ok {
		return nil, "", fmt.Errorf("missing API key: send Authorization: Bearer <key>, or the key as the Basic auth password")
	}
	ctx, err := h.deps.Auth.Login(ctx, token)
	if err != nil {
		return nil, "", fmt.Errorf("%s", status.Convert(err).Message())
	}
	return ctx, rpc.Tenant(ctx), nil
}

func (h *Handler) writeError(w http.ResponseWriter, asJSON bool, code int, msg string) {
	w.Header().Set("Cache-Control", "no-store")
	if asJSON {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
		return
	}
	http.Error(w, msg, code)
}

// collect reads every section. The router's own state is local; quota and cache are
// called concurrently, each within the call timeout, and a failure marks only its section.
func (h *Handler) collect(ctx context.Context, tenant string) Snapshot {
	now := h.deps.Clock.Now()
	snap := Snapshot{GeneratedAt: now, Tenant: tenant}

	var wg sync.WaitGroup
	wg.Go(func() {
		cctx, cancel := context.WithTimeout(ctx, h.deps.CallTimeout)
		defer cancel()
		snap.Quota = quotaSection(cctx, h.deps.Quota)
	})
	wg.Go(func() {
		cctx, cancel := context.WithTimeout(ctx, h.deps.CallTimeout)
		defer cancel()
		snap.Cache = cacheSection(cctx, h.deps.Cache)
	})
	wg.Go(func() {
		cctx, cancel := context.WithTimeout(ctx, h.deps.CallTimeout)
		defer cancel()
		snap.Tools = toolsSection(cctx, h.deps.Tools, now)
	})

	if resp, err := h.deps.Routes.Describe(""); err != nil {
		snap.RoutesError = err.Error()
	} else {
		snap.Routes = routesOf(resp, now)
	}
	snap.Degradations = degradationsOf(h.deps.Routes.RecentDegradations(), tenant, now)
	wg.Wait()
	snap.Summary = summarize(snap.Routes)
	for _, t := range snap.Tools.Tools {
		if t.Breaker == "open" {
			snap.Summary.OpenToolBreakers++
		}
	}
	return snap
}

func toolsSection(ctx context.Context, t Tools, now time.Time) ToolsSection {
	if t == nil {
		return ToolsSection{Off: true, Error: "tools are off here: router.agent_address is off"}
	}
	resp, err := t.ListTools(ctx, &agentv1.ListToolsRequest{IncludeHealth: true})
	if err != nil {
		return ToolsSection{Error: callError(err)}
	}
	return ToolsSection{Available: true, Tools: toolsOf(resp, now)}
}

func quotaSection(ctx context.Context, q Quota) QuotaSection {
	if q == nil {
		return QuotaSection{Error: "no quota service configured"}
	}
	resp, err := q.DescribeUsage(ctx, &quotav1.DescribeUsageRequest{})
	if err != nil {
		return QuotaSection{Error: callError(err)}
	}
	out := QuotaSection{Available: true, Tenants: []TenantQuota{}}
	for _, u := range resp.GetTenants() {
		out.Tenants = append(out.Tenants, TenantQuota{
			Tenant:   u.GetTenant(),
			Requests: bucketOf(u.GetRequests()),
			Tokens:   bucketOf(u.GetTokens()),
		})
	}
	return out
}

func cacheSection(ctx context.Context, c Cache) CacheSection {
	if c == nil {
		return CacheSection{Error: "no cache service configured"}
	}
	resp, err := c.DescribeStats(ctx, &cachev1.DescribeStatsRequest{})
	if err != nil {
		return CacheSection{Error: callError(err)}
	}
	out := CacheSection{
		Available: true,
		Since:     resp.GetSince().AsTime(),
		Lookups:   resp.GetLookups(),
		Hits:      resp.GetHits(),
		HitRate:   rate(resp.GetHits(), resp.GetLookups()),
		Scenarios: []ScenarioHits{},
	}
	for _, s := range resp.GetScenarios() {
		out.Scenarios = append(out.Scenarios, ScenarioHits{Scenario: s.GetScenario(), Lookups: s.GetLookups(), Hits: s.GetHits(), HitRate: rate(s.GetHits(), s.GetLookups())})
	}
	return out
}

// callError is what an operator needs of a failed call: its code and message, as in
// "Unavailable: connection refused".
func callError(err error) string {
	st := status.Convert(err)
	msg := st.Message()
	// gRPC's connection errors repeat the dial target at length; the first line is enough.
	if i := strings.IndexByte(msg, '\n'); i >= 0 {
		msg = msg[:i]
	}
	return st.Code().String() + ": " + msg
}

func rate(hits, lookups int64) float64 {
	if lookups == 0 {
		return 0
	}
	return float64(hits) / float64(lookups)
}
