package statuspage

import (
	"fmt"
	"strings"
	"time"

	agentv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/agent/v1"
	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	quotav1 "github.com/mantle-mesh/mantle/pkg/api/mantle/quota/v1"
	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// Snapshot is everything the page shows; ?format=json returns it as is.
type Snapshot struct {
	GeneratedAt time.Time `json:"generated_at"`
	// Tenant is the authenticated caller, whose quota and degradations alone are shown;
	// empty when authentication is off and every tenant's are.
	Tenant string `json:"tenant,omitempty"`
	// RefreshSeconds is how often the HTML page reloads (0: never).
	RefreshSeconds int     `json:"refresh_seconds"`
	Summary        Summary `json:"summary"`
	Routes         []Route `json:"routes"`
	// RoutesError is set when the routing table could not be described.
	RoutesError  string        `json:"routes_error,omitempty"`
	Degradations []Degradation `json:"degradations"`
	Cache        CacheSection  `json:"cache"`
	Quota        QuotaSection  `json:"quota"`
	// Tools are the agent's tools with their health, as the agent replica that answered
	// sees them.
	Tools ToolsSection `json:"tools"`
}

// Summary is the page's headline: what an operator checks first.
type Summary struct {
	Routes int `json:"routes"`
	// DegradedRoutes are the routes whose ladder level is below L0.
	DegradedRoutes int `json:"degraded_routes"`
	// Keys count each (provider, model, key) once, however many routes use it.
	Keys         int `json:"keys"`
	OpenBreakers int `json:"open_breakers"`
	HalfOpen     int `json:"half_open_breakers"`
	CoolingDown  int `json:"cooling_down"`
	// OpenToolBreakers counts the tools whose breaker is open.
	OpenToolBreakers int `json:"open_tool_breakers"`
}

func summarize(routes []Route) Summary {
	s := Summary{Routes: len(routes)}
	// A model serves several routes; each of its keys is counted once.
	seen := map[string]bool{}
	for _, r := range routes {
		if r.Level != "L0" {
			s.DegradedRoutes++
		}
		for _, c := range r.Candidates {
			for _, k := range c.Keys {
				id := c.Provider + "\x00" + c.Model + "\x00" + k.ID
				if seen[id] {
					continue
				}
				seen[id] = true
				s.Keys++
				switch k.Breaker {
				case "open":
					s.OpenBreakers++
				case "half_open":
					s.HalfOpen++
				}
				if k.CooldownUntil != nil {
					s.CoolingDown++
				}
			}
		}
	}
	return s
}

// Route is a route with its ladder level and candidates.
type Route struct {
	Name     string `json:"name"`
	Scenario string `json:"scenario"`
	// Level is the ladder level a request would be answered at now: L0 (primary) to L3
	// (template).
	Level         string      `json:"ladder_level"`
	LevelName     string      `json:"ladder_level_name"`
	DefaultBudget string      `json:"default_budget"`
	Candidates    []Candidate `json:"candidates"`
}

// Candidate is one model of a route.
type Candidate struct {
	Model    string `json:"model"`
	Provider string `json:"provider"`
	Level    string `json:"level"`
	Keys     []Key  `json:"keys"`
}

// Key is the live state of one upstream key of a candidate; the key's id only.
type Key struct {
	ID string `json:"key_id"`
	// Breaker is closed, open or half_open (the worst over the key's scenarios).
	Breaker string `json:"breaker_state"`
	Reason  string `json:"breaker_reason"`
	// NextProbeAt is when an open breaker lets a probe through.
	NextProbeAt *time.Time `json:"next_probe_at,omitempty"`
	// CooldownUntil is set while the key cools down after a 429.
	CooldownUntil *time.Time `json:"cooldown_until,omitempty"`
	P50Ms         float64    `json:"p50_ms"`
	P95Ms         float64    `json:"p95_ms"`
	P99Ms         float64    `json:"p99_ms"`
	Calls         int64      `json:"calls"`
	Failures      int64      `json:"failures"`
	InFlight      int64      `json:"in_flight"`

	// For the HTML page: relative times at the snapshot's time.
	NextProbeIn string `json:"-"`
	CooldownIn  string `json:"-"`
}

// Degradation is one degradation event of this router replica.
type Degradation struct {
	At           time.Time `json:"at"`
	Ago          string    `json:"-"`
	Route        string    `json:"route"`
	Scenario     string    `json:"scenario"`
	Tenant       string    `json:"tenant"`
	Level        string    `json:"level"`
	LevelName    string    `json:"level_name"`
	Reason       string    `json:"reason"`
	RequestID    string    `json:"request_id"`
	AnsweredBy   string    `json:"answered_by"`
	FailedModels []string  `json:"failed_models"`
}

// ToolsSection is every tool of the agent with its health, or why it could not be read.
type ToolsSection struct {
	Available bool `json:"available"`
	// Off is set when the router serves no tools; Error says so.
	Off   bool   `json:"off,omitempty"`
	Error string `json:"error,omitempty"`
	Tools []Tool `json:"tools,omitempty"`
}

// Tool is one tool's kind and health.
type Tool struct {
	Name string `json:"name"`
	// Kind is query, action or external.
	Kind string `json:"kind"`
	// Breaker is closed, open or half_open.
	Breaker string `json:"breaker_state"`
	// NextProbeAt is when an open breaker lets a probe through.
	NextProbeAt  *time.Time `json:"next_probe_at,omitempty"`
	Calls        int64      `json:"calls"`
	Failures     int64      `json:"failures"`
	StaleAnswers int64      `json:"stale_answers"`
	// Recent are the outcomes of the tool's last calls, oldest first.
	Recent []string `json:"recent_outcomes"`

	NextProbeIn string `json:"-"`
}

func toolsOf(resp *agentv1.ListToolsResponse, now time.Time) []Tool {
	out := make([]Tool, 0, len(resp.GetTools()))
	for _, t := range resp.GetTools() {
		h := t.GetHealth()
		tool := Tool{
			Name: t.GetName(), Kind: strings.ToLower(strings.TrimPrefix(t.GetKind().String(), "TOOL_KIND_")),
			Breaker: breakerOf(h.GetBreaker()), Calls: h.GetCalls(), Failures: h.GetFailures(), StaleAnswers: h.GetStaleAnswers(),
			Recent: h.GetRecentOutcomes(),
		}
		if tool.Recent == nil {
			tool.Recent = []string{}
		}
		if h.GetBreakerUntil() != nil {
			at := h.GetBreakerUntil().AsTime()
			tool.NextProbeAt, tool.NextProbeIn = &at, until(at, now)
		}
		out = append(out, tool)
	}
	return out
}

// CacheSection is the cache's hit rate, or why it could not be read.
type CacheSection struct {
	Available bool           `json:"available"`
	Error     string         `json:"error,omitempty"`
	Since     time.Time      `json:"since"`
	Lookups   int64          `json:"lookups"`
	Hits      int64          `json:"hits"`
	HitRate   float64        `json:"hit_rate"`
	Scenarios []ScenarioHits `json:"scenarios,omitempty"`
}

// ScenarioHits is one scenario's cache lookups and hits.
type ScenarioHits struct {
	Scenario string  `json:"scenario"`
	Lookups  int64   `json:"lookups"`
	Hits     int64   `json:"hits"`
	HitRate  float64 `json:"hit_rate"`
}

// QuotaSection is each tenant's quota use, or why it could not be read.
type QuotaSection struct {
	Available bool          `json:"available"`
	Error     string        `json:"error,omitempty"`
	Tenants   []TenantQuota `json:"tenants,omitempty"`
}

// TenantQuota is one tenant's RPM and TPM use.
type TenantQuota struct {
	Tenant   string `json:"tenant"`
	Requests Bucket `json:"rpm"`
	Tokens   Bucket `json:"tpm"`
}

// Bucket is a per-minute bucket: used of limit, and how long until it is full again.
type Bucket struct {
	Used   int64   `json:"used"`
	Limit  int64   `json:"limit"`
	Share  float64 `json:"share"`
	Reset  string  `json:"reset_after"`
	Shadow bool    `json:"shadow,omitempty"`
}

func bucketOf(b *quotav1.BucketLevel) Bucket {
	used := max(b.GetLimit()-b.GetRemaining(), 0)
	return Bucket{Used: used, Limit: b.GetLimit(), Share: rate(used, b.GetLimit()), Reset: b.GetResetAfter().AsDuration().Round(time.Second).String(), Shadow: b.GetShadow()}
}

func routesOf(resp *routerv1.DescribeRoutesResponse, now time.Time) []Route {
	out := make([]Route, 0, len(resp.GetRoutes()))
	for _, rt := range resp.GetRoutes() {
		level, name := levelOf(rt.GetLadderLevel())
		r := Route{Name: rt.GetName(), Scenario: rt.GetScenario(), Level: level, LevelName: name,
			DefaultBudget: rt.GetDefaultBudget().AsDuration().String()}
		for _, c := range rt.GetCandidates() {
			lvl, _ := levelOf(c.GetLevel())
			cand := Candidate{Model: c.GetModel(), Provider: c.GetProvider(), Level: lvl}
			for _, k := range c.GetKeys() {
				key := Key{
					ID:       k.GetKeyId(),
					Breaker:  breakerOf(k.GetBreakerState()),
					Reason:   k.GetBreakerReason(),
					P50Ms:    ms(k.GetLatencyP50().AsDuration()),
					P95Ms:    ms(k.GetLatencyP95().AsDuration()),
					P99Ms:    ms(k.GetLatencyP99().AsDuration()),
					Calls:    k.GetCalls(),
					Failures: k.GetFailures(),
					InFlight: k.GetInFlight(),
				}
				if k.GetNextProbeAt() != nil {
					t := k.GetNextProbeAt().AsTime()
					key.NextProbeAt, key.NextProbeIn = &t, until(t, now)
				}
				if k.GetCooldownUntil() != nil {
					t := k.GetCooldownUntil().AsTime()
					key.CooldownUntil, key.CooldownIn = &t, until(t, now)
				}
				cand.Keys = append(cand.Keys, key)
			}
			r.Candidates = append(r.Candidates, cand)
		}
		out = append(out, r)
	}
	return out
}

// degradationsOf converts the router's events; with a tenant set, only that tenant's.
func degradationsOf(events []*eventsv1.DegradationEvent, tenant string, now time.Time) []Degradation {
	out := []Degradation{}
	for _, ev := range events {
		if tenant != "" && ev.GetTenant() != tenant {
			continue
		}
		level, name := levelOf(ev.GetLevel())
		at := ev.GetAt().AsTime()
		out = append(out, Degradation{
			At: at, Ago: ago(at, now), Route: ev.GetRoute(), Scenario: ev.GetScenario(), Tenant: ev.GetTenant(),
			Level: level, LevelName: name, Reason: ev.GetReason(), RequestID: ev.GetRequestId(),
			AnsweredBy: ev.GetAnsweredBy(), FailedModels: ev.GetFailedModels(),
		})
	}
	return out
}

// levelOf names a ladder level the way the design does (L0 primary ... L3 template).
func levelOf(l mantlev1.FallbackLevel) (string, string) {
	switch l {
	case mantlev1.FallbackLevel_FALLBACK_LEVEL_PRIMARY:
		return "L0", "primary"
	case mantlev1.FallbackLevel_FALLBACK_LEVEL_BACKUP_MODEL:
		return "L1", "backup model"
	case mantlev1.FallbackLevel_FALLBACK_LEVEL_CACHED_APPROXIMATE:
		return "L2", "cached approximate"
	case mantlev1.FallbackLevel_FALLBACK_LEVEL_TEMPLATE:
		return "L3", "template"
	}
	return "-", "none"
}

func breakerOf(s mantlev1.BreakerState) string {
	if s == mantlev1.BreakerState_BREAKER_STATE_UNSPECIFIED {
		return "closed"
	}
	return strings.ToLower(strings.TrimPrefix(s.String(), "BREAKER_STATE_"))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// until is "in 29s", or "now" once t has passed (the probe is due).
func until(t, now time.Time) string {
	if !t.After(now) {
		return "now"
	}
	return "in " + short(t.Sub(now))
}

func ago(t, now time.Time) string {
	if !now.After(t) {
		return "just now"
	}
	return short(now.Sub(t)) + " ago"
}

// short rounds a duration to what a person reads at a glance: 850ms, 29s, 4m05s, 2h10m.
func short(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		d = d.Round(time.Second)
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	d = d.Round(time.Minute)
	return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
}
