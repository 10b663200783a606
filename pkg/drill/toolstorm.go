package drill

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	"github.com/mantle-mesh/mantle/pkg/drill/load"
	"github.com/mantle-mesh/mantle/pkg/events"
	"github.com/mantle-mesh/mantle/pkg/httpbody"
	"github.com/mantle-mesh/mantle/pkg/mesh"
	"github.com/mantle-mesh/mantle/pkg/resilience"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/agent"
)

// This file is the tool-storm drill: agents run five-step sessions (a model call, a query
// tool, an action tool, the query tool again, a model call) while the third-party query
// tool fails for the scenario's incident and the action tool sometimes times out after it
// performed the action, so that its caller cannot know whether it happened. Mantle's side
// runs the sessions through the router's HTTP door (/v1/chat/completions with the session
// headers, /v1/tools/{name}/call with session_id and step_id, /v1/sessions/{id}/complete);
// the naive side calls the model and the tool backends directly, retrying every failure
// blindly. The tool backends count what they received: executions per action and calls
// per logical query.

// ToolStorm is the tools block of a scenario: the tool backends' behaviour, in scenario
// time. A scenario with it runs agent sessions instead of single chat requests; load.rate
// is then sessions per second.
type ToolStorm struct {
	// QueryLatency and ActionLatency are how long a healthy backend call takes.
	QueryLatency  time.Duration `yaml:"query_latency"`
	ActionLatency time.Duration `yaml:"action_latency"`
	// QueryTimeout and ActionTimeout are mantle's per-call timeouts of the two tools.
	QueryTimeout  time.Duration `yaml:"query_timeout"`
	ActionTimeout time.Duration `yaml:"action_timeout"`
	// QueryFailRate is the share of query calls that fail during the incident; of those,
	// QueryHangShare hang until their caller gives up and the rest answer 503 at once.
	QueryFailRate  float64 `yaml:"query_fail_rate"`
	QueryHangShare float64 `yaml:"query_hang_share"`
	// ActionLostRate is the share of action calls that perform the action and then hang
	// until their caller gives up: the caller cannot know the action happened.
	ActionLostRate float64 `yaml:"action_lost_rate"`
	// Queries is the number of distinct queries agents ask (one per city), so that a query
	// asked before the incident has a last good result during it.
	Queries int `yaml:"queries"`
}

func (t *ToolStorm) validate(s *Scenario, add func(string, ...any)) {
	if s.Incident == nil {
		add("incident: required with tools (the query tool fails during it)")
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"tools.query_timeout", t.QueryTimeout}, {"tools.action_timeout", t.ActionTimeout}} {
		if d.v <= 0 {
			add("%s: must be positive, got %s", d.key, d.v)
		}
	}
	if t.QueryLatency < 0 || t.ActionLatency < 0 {
		add("tools: latencies must not be negative")
	}
	for _, r := range []struct {
		key string
		v   float64
	}{{"tools.query_fail_rate", t.QueryFailRate}, {"tools.query_hang_share", t.QueryHangShare}, {"tools.action_lost_rate", t.ActionLostRate}} {
		if r.v < 0 || r.v > 1 {
			add("%s: must be in [0, 1], got %g", r.key, r.v)
		}
	}
	if t.Queries < 1 || t.Queries > 1000 {
		add("tools.queries: must be in [1, 1000], got %d", t.Queries)
	}
}

// toolStormKey is the API key of the drill's tenant in a tool storm's mesh.
const toolStormKey = "sk-drill-agents"

// Tool names in the drill's registry.
const (
	toolQuery  = "lookup"
	toolAction = "order"
)

// ToolReport is a tool-storm run's figures, one ToolSide per side.
type ToolReport struct {
	Sides []ToolSide `json:"sides"`
}

// ToolSide is what one side's sessions came to, counted by the agents (sessions) and at
// the tool backends (executions and calls).
type ToolSide struct {
	Name     string `json:"name"`
	Sessions int    `json:"sessions"`
	// Done sessions ran every step with fresh results; Stale ones ran every step, at least
	// one query answered from a last good result; Partial ones lost a step (a query or the
	// action failed); Pending ones have an action whose outcome a person must confirm.
	// Hung ones did not end within the drill's guard: mantle must have none.
	Done    int `json:"done"`
	Stale   int `json:"stale"`
	Partial int `json:"partial"`
	Pending int `json:"pending_confirmation"`
	Hung    int `json:"hung"`
	// Actions is how many distinct actions the backend performed; ActionsTwice how many
	// of them it performed more than once, and DuplicateExecutions the extra executions.
	Actions             int `json:"actions"`
	ActionsTwice        int `json:"actions_twice"`
	DuplicateExecutions int `json:"duplicate_executions"`
	// LogicalQueries is how many query steps the agents asked; QueryCalls how many calls
	// reached the query backend; QueryAmplification their ratio.
	LogicalQueries     int     `json:"logical_queries"`
	QueryCalls         int     `json:"query_calls"`
	QueryAmplification float64 `json:"query_amplification"`
	// ModelSteps and ModelAnswered count the model calls.
	ModelSteps    int `json:"model_steps"`
	ModelAnswered int `json:"model_answered"`
	// WallS is how long the side ran, in wall-clock seconds.
	WallS float64 `json:"wall_s"`
	// SessionEvents counts the agent's session events on NATS by kind (degraded,
	// pending_confirmation, ended); mantle only.
	SessionEvents map[string]int `json:"session_events,omitempty"`
	// ToolBreakers are the tool breaker transitions the agent published; mantle only.
	ToolBreakers []ToolBreakerTransition `json:"tool_breakers,omitempty"`
}

// ToolBreakerTransition is one ToolBreakerEvent, at scenario time since the side started.
type ToolBreakerTransition struct {
	AtS    float64 `json:"at_s"`
	Tool   string  `json:"tool"`
	From   string  `json:"from"`
	To     string  `json:"to"`
	Reason string  `json:"reason"`
}

// Session outcomes.
const (
	outcomeDone    = "done"
	outcomeStale   = "stale"
	outcomePartial = "partial"
	outcomePending = "pending"
	outcomeHung    = "hung"
)

// sessionTally counts a side's sessions from its agents.
type sessionTally struct {
	mu                                       sync.Mutex
	outcomes                                 map[string]int
	logicalQueries, modelSteps, modelAnswers int
}

func (t *sessionTally) add(outcome string, queries, modelSteps, modelAnswers int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.outcomes == nil {
		t.outcomes = map[string]int{}
	}
	t.outcomes[outcome]++
	t.logicalQueries += queries
	t.modelSteps += modelSteps
	t.modelAnswers += modelAnswers
}

// toolSession is one session's record, kept by its agent.
type toolSession struct {
	stale, failed, pending, hung bool
	queries, modelSteps, answers int
}

func (s *toolSession) outcome() string {
	switch {
	case s.hung:
		return outcomeHung
	case s.pending:
		return outcomePending
	case s.failed:
		return outcomePartial
	case s.stale:
		return outcomeStale
	}
	return outcomeDone
}

// toolArgs are the arguments of session i's steps: two queries and one action.
func (p *plan) toolArgs(i int, sessionID string) (q1, action, q2 string) {
	n := p.s.Tools.Queries
	rng := rand.New(rand.NewPCG(uint64(p.s.Seed), uint64(i)^0x7001))
	q1 = fmt.Sprintf(`{"city":"city-%d"}`, rng.IntN(n))
	q2 = fmt.Sprintf(`{"city":"city-%d"}`, rng.IntN(n))
	action = fmt.Sprintf(`{"order":%q}`, sessionID)
	return q1, action, q2
}

// runToolStorm runs a tool-storm scenario on each side and fills rep.
func (p *plan) runToolStorm(ctx context.Context, opts Options, sides []string, rep *Report) (*Report, error) {
	rep.Tools = &ToolReport{}
	if opts.Requests != nil {
		if _, err := io.WriteString(opts.Requests, requestsCSVHeader); err != nil {
			return nil, err
		}
	}
	for _, side := range sides {
		ts, rows, err := p.runToolSide(ctx, side, opts)
		if err != nil {
			return nil, err
		}
		if opts.Requests != nil {
			if err := p.writeSessionsCSV(opts.Requests, side, rows); err != nil {
				return nil, err
			}
		}
		rep.Tools.Sides = append(rep.Tools.Sides, ts)
		rep.Sides = append(rep.Sides, Side{Name: side, Requests: ts.Sessions, Answered: ts.Sessions - ts.Hung, Failed: ts.Hung,
			SuccessRate: ratio(ts.Done, ts.Sessions), CorrectRate: ratio(ts.Done, ts.Sessions)})
	}
	if m := rep.Tools.side(SideMantle); m != nil {
		rep.Checks = p.toolChecks(m)
	}
	rep.Machine.LoadAverage[1] = loadAverage()
	return rep, nil
}

func (r *ToolReport) side(name string) *ToolSide {
	for i := range r.Sides {
		if r.Sides[i].Name == name {
			return &r.Sides[i]
		}
	}
	return nil
}

// toolGuard bounds one call of an agent on the client side, well past every timeout and
// backoff mantle's gears and the naive client's retries can add up to, so that a call
// that never ends is counted as hung instead of hanging the drill. Half a minute of wall
// time on top keeps a busy machine's own delays (which do not scale) from reading as hung.
func (p *plan) toolGuard() time.Duration {
	t := p.s.Tools
	n := p.s.Naive
	longest := max(t.QueryTimeout, t.ActionTimeout, n.Timeout)*time.Duration(n.Retries+3) + time.Duration(n.Retries)*n.RetryDelay + 10*time.Second + p.s.Budget
	return 2*p.sc.d(longest) + 30*time.Second
}

// sessionRow is one session of a side, for the requests CSV.
type sessionRow struct {
	due, latency time.Duration
	outcome      string
}

// writeSessionsCSV writes one line per session in the requests CSV's columns: answered is
// ended, correct is done with fresh results, failure is the outcome otherwise.
func (p *plan) writeSessionsCSV(w io.Writer, side string, rows []sessionRow) error {
	var b strings.Builder
	for i, r := range rows {
		failure := r.outcome
		if failure == outcomeDone {
			failure = ""
		}
		fmt.Fprintf(&b, "%s,%s,%d,%.3f,%.1f,%t,%t,-1,false,%s,,\n", p.s.Name, side, i,
			r.due.Seconds()/p.scale, float64(r.latency)/float64(time.Millisecond)/p.scale,
			r.outcome != outcomeHung, r.outcome == outcomeDone, failure)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func (p *plan) runToolSide(ctx context.Context, side string, opts Options) (ts ToolSide, rows []sessionRow, err error) {
	if side == SideMantle && opts.MeshURL != "" {
		return ts, nil, errors.New("drill: tool-storm runs the in-process mesh only: its tool backends are the drill's own")
	}
	backends, err := startToolBackends(ctx, p)
	if err != nil {
		return ts, nil, err
	}
	defer func() { err = errors.Join(err, backends.close()) }()
	up, err := startUpstream(ctx, "127.0.0.1:0", p.log)
	if err != nil {
		return ts, nil, err
	}
	defer func() { err = errors.Join(err, up.close()) }()

	var agentRun func(ctx context.Context, i int) toolSession
	var watch *subjectWatch
	switch side {
	case SideMantle:
		logOut := opts.Log
		if logOut == nil {
			logOut = io.Discard
		}
		cfg := p.toolMeshConfig(up.baseURL, backends.url)
		if opts.HTTPAddr != "" {
			cfg.Server.HTTPListenAddress = opts.HTTPAddr
		}
		var m *inProcessMesh
		if m, err = startMesh(ctx, cfg, logOut); err != nil {
			return ts, nil, err
		}
		defer func() { err = errors.Join(err, m.stop()) }()
		if watch, err = watchSubjects(m.proc.Events.Conn(), events.SubjectSession, events.SubjectToolBreaker); err != nil {
			return ts, nil, err
		}
		// Registered after the mesh's stop, so it runs before it, while NATS is up.
		defer watch.stop(context.WithoutCancel(ctx))
		base := "http://" + m.proc.App.HTTPAddr()
		a := &mantleAgent{p: p, base: base, http: &http.Client{Transport: newTransport()}, guard: p.toolGuard(),
			model: &mantleClient{url: base + "/v1/chat/completions", route: RouteName, runID: p.runID, apiKey: toolStormKey,
				http: &http.Client{Transport: newTransport()}, timeout: p.toolGuard()}}
		agentRun = a.run
	case SideNaive:
		n := p.s.Naive
		a := &naiveAgent{p: p, url: backends.url, http: &http.Client{Transport: newTransport()},
			timeout: p.sc.d(n.Timeout), retries: n.Retries, delay: p.sc.d(n.RetryDelay),
			model: newNaiveClient(up.baseURL, n.Model, p.runID, p.sc.d(n.Timeout), n.Retries, p.sc.d(n.RetryDelay))}
		agentRun = a.run
	default:
		return ts, nil, fmt.Errorf("drill: unknown side %q", side)
	}

	var tally sessionTally
	var prog progress
	stopProgress := p.showProgress(side, opts, &prog)
	up.arm(p.simConfig())
	backends.arm()
	rows = make([]sessionRow, p.requests)
	start := time.Now()
	_, err = load.Run(ctx, p.loadConfig(opts.MaxInFlight), func(ctx context.Context, i int, due time.Time) {
		prog.inFlight.Add(1)
		s := agentRun(ctx, i)
		prog.inFlight.Add(-1)
		rows[i] = sessionRow{due: due.Sub(start), latency: time.Since(due), outcome: s.outcome()}
		if s.hung {
			prog.failed.Add(1)
		} else {
			prog.answered.Add(1)
		}
		tally.add(s.outcome(), s.queries, s.modelSteps, s.answers)
	}, func(i int, due time.Time) {
		rows[i] = sessionRow{due: due.Sub(start), outcome: outcomeHung}
		// A session the generator could not start is a session that never ended.
		tally.add(outcomeHung, 0, 0, 0)
		prog.failed.Add(1)
	})
	stopProgress()
	if err != nil {
		return ts, nil, fmt.Errorf("drill: %s side: %w", side, err)
	}
	ts = ToolSide{Name: side, Sessions: p.requests, WallS: time.Since(start).Seconds(),
		Done: tally.outcomes[outcomeDone], Stale: tally.outcomes[outcomeStale], Partial: tally.outcomes[outcomePartial],
		Pending: tally.outcomes[outcomePending], Hung: tally.outcomes[outcomeHung],
		LogicalQueries: tally.logicalQueries, ModelSteps: tally.modelSteps, ModelAnswered: tally.modelAnswers}
	ts.QueryCalls, ts.Actions, ts.ActionsTwice, ts.DuplicateExecutions = backends.counts()
	ts.QueryAmplification = ratio(ts.QueryCalls, ts.LogicalQueries)
	if watch != nil {
		ts.SessionEvents, ts.ToolBreakers = p.agentEvents(watch.stop(ctx), start)
	}
	return ts, rows, nil
}

// toolMeshConfig is the mesh of a tool-storm run: the scenario's model route, and the
// agent's registry with the two tools at the drill's backends, every duration scaled.
func (p *plan) toolMeshConfig(simBaseURL, toolsURL string) mesh.Config {
	cfg := p.s.MeshConfig(simBaseURL, p.scale)
	p.s.addTools(&cfg, toolsURL, p.scale, p.rate)
	return cfg
}

// toolsPlaceholderURL is where MeshConfig points a tool storm's tools; a run points them
// at the backends it starts instead.
const toolsPlaceholderURL = "http://127.0.0.1:8082"

// addTools sets cfg's tenant, tool registry (at toolsURL) and sessions for a tool storm at
// time scale scale and rate sessions per second of scenario time.
func (s *Scenario) addTools(cfg *mesh.Config, toolsURL string, scale, rate float64) {
	// Tools and sessions belong to a tenant: the agents call with its key.
	cfg.Auth.Tenants = []rpc.TenantKey{{ID: "drill", KeySHA256: rpc.HashKey(toolStormKey)}}
	sc := scaler(scale)
	t := s.Tools
	object := map[string]any{"type": "object"}
	breaker := func(timeout time.Duration) resilience.BreakerConfig {
		return resilience.BreakerConfig{
			Window: sc.d(time.Minute), MinCalls: 10, FailureRate: 0.5, SlowCall: sc.d(timeout), SlowCallRate: 0.8,
			ConsecutiveFailures: 5, OpenDuration: sc.d(30 * time.Second), MaxOpenDuration: sc.d(2 * time.Minute),
			OpenJitter: 0.2, HalfOpenProbes: 1,
		}
	}
	budget := resilience.BudgetConfig{Ratio: 0.2, Floor: 5, Window: sc.d(time.Minute)}
	cfg.Agent.Tools = []agent.ToolConfig{
		{
			Name: toolQuery, Description: "A third party's forecast for a city.", Kind: agent.KindQuery, InputSchema: object,
			Backend: agent.BackendConfig{Type: agent.BackendHTTP, URL: toolsURL + "/query"},
			Timeout: sc.d(t.QueryTimeout),
			// The agent's default gears, scaled: retries after 0.5-1 s and 2-4 s.
			Retry:   agent.RetryConfig{MaxRetries: 2, Base: sc.d(time.Second), Multiplier: 4, MaxDelay: sc.d(4 * time.Second)},
			Cache:   agent.CacheConfig{MaxStaleness: sc.d(time.Hour)},
			Breaker: breaker(t.QueryTimeout), RetryBudget: budget,
		},
		{
			Name: toolAction, Description: "Places an order.", Kind: agent.KindAction, InputSchema: object,
			Backend: agent.BackendConfig{Type: agent.BackendHTTP, URL: toolsURL + "/action"},
			Timeout: sc.d(t.ActionTimeout), Breaker: breaker(t.ActionTimeout), RetryBudget: budget,
		},
	}
	cfg.Agent.Sessions = agent.DefaultConfig().Sessions
	ss := &cfg.Agent.Sessions
	ss.DefaultBudget.Deadline = sc.d(ss.DefaultBudget.Deadline)
	ss.Degradation.StickyFor = sc.d(ss.Degradation.StickyFor)
	ss.Degradation.RecoveryInterval = sc.d(ss.Degradation.RecoveryInterval)
	ss.Scheduler.Window = sc.d(ss.Scheduler.Window)
	// The limit is per minute of wall time, which a scaled run compresses.
	ss.NewSessionsPerMinute = max(ss.NewSessionsPerMinute, int(rate/scale*60*2)+60)
}

// toolChecks evaluates the tool-storm targets on mantle's side.
func (p *plan) toolChecks(m *ToolSide) []Check {
	t := p.s.Targets
	var out []Check
	if t.DuplicateActions != nil {
		out = append(out, Check{"actions executed twice", fmt.Sprintf("<= %d", *t.DuplicateActions),
			fmt.Sprint(m.ActionsTwice), int64(m.ActionsTwice) <= *t.DuplicateActions})
	}
	if t.QueryAmplification != nil {
		out = append(out, Check{"query calls per logical query", fmt.Sprintf("<= %.2f", *t.QueryAmplification),
			fmt.Sprintf("%.3f", m.QueryAmplification), m.QueryAmplification <= *t.QueryAmplification})
	}
	if t.SessionsEnd {
		out = append(out, Check{"sessions that ended (done, partial or pending)", "all",
			fmt.Sprintf("%d of %d", m.Sessions-m.Hung, m.Sessions), m.Hung == 0})
	}
	return out
}

// toolRows is the side-by-side table of a tool-storm report.
func (r *Report) toolRows() []row {
	var rows []row
	add := func(label string, f func(s *ToolSide) string) {
		rw := row{label: label}
		for i := range r.Tools.Sides {
			rw.values = append(rw.values, f(&r.Tools.Sides[i]))
		}
		rows = append(rows, rw)
	}
	share := func(n, of int) string { return fmt.Sprintf("%.2f%% (%d)", ratio(n, of)*100, n) }
	add("sessions", func(s *ToolSide) string { return fmt.Sprint(s.Sessions) })
	add("  completed, fresh", func(s *ToolSide) string { return share(s.Done, s.Sessions) })
	add("  completed, stale data", func(s *ToolSide) string { return share(s.Stale, s.Sessions) })
	add("  partial (a step failed)", func(s *ToolSide) string { return share(s.Partial, s.Sessions) })
	add("  pending confirmation", func(s *ToolSide) string { return share(s.Pending, s.Sessions) })
	add("  hung (never ended)", func(s *ToolSide) string { return share(s.Hung, s.Sessions) })
	add("actions performed", func(s *ToolSide) string { return fmt.Sprint(s.Actions) })
	add("  actions executed twice or more", func(s *ToolSide) string {
		return fmt.Sprintf("%d (%d extra executions)", s.ActionsTwice, s.DuplicateExecutions)
	})
	add("query calls per logical query", func(s *ToolSide) string {
		return fmt.Sprintf("%.3f (%d calls for %d queries)", s.QueryAmplification, s.QueryCalls, s.LogicalQueries)
	})
	add("model steps answered", func(s *ToolSide) string { return share(s.ModelAnswered, s.ModelSteps) })
	add("session events on NATS", func(s *ToolSide) string {
		if s.SessionEvents == nil {
			return "-"
		}
		return fmt.Sprintf("degraded %d, pending confirmation %d, ended %d",
			s.SessionEvents["degraded"], s.SessionEvents["pending_confirmation"], s.SessionEvents["ended"])
	})
	add("tool breaker transitions", func(s *ToolSide) string {
		if s.SessionEvents == nil {
			return "-"
		}
		return toolBreakerSummary(s.ToolBreakers, r.IncidentStartS)
	})
	return rows
}

// mantleAgent runs a session through mantle's HTTP door, once per step: mantle is what
// retries, degrades and keeps the session.
type mantleAgent struct {
	p     *plan
	base  string
	http  *http.Client
	guard time.Duration
	model *mantleClient
}

func (a *mantleAgent) run(ctx context.Context, i int) toolSession {
	var s toolSession
	id := fmt.Sprintf("drill-%s-%d", a.p.runID, i)
	q1, action, q2 := a.p.toolArgs(i, id)
	a.modelStep(ctx, &s, i, id, "plan")
	a.toolStep(ctx, &s, id, "lookup-1", toolQuery, q1)
	a.toolStep(ctx, &s, id, "order", toolAction, action)
	a.toolStep(ctx, &s, id, "lookup-2", toolQuery, q2)
	a.modelStep(ctx, &s, i, id, "answer")
	if s.hung {
		return s
	}
	status, _, err := a.post(ctx, "/v1/sessions/"+id+"/complete", nil)
	switch {
	case isGuard(err):
		s.hung = true
	case err != nil || status != http.StatusOK:
		// The session ended on its own (a budget): what it recorded is a partial result.
		s.failed = true
	}
	return s
}

func (a *mantleAgent) modelStep(ctx context.Context, s *toolSession, i int, id, step string) {
	s.modelSteps++
	r := requestFor(a.p.s, i)
	r.session, r.step = id, step
	if step != "plan" {
		// Its own request id: the router takes a repeated one for a retry of the first.
		r.index += a.p.requests
		r.prompt += " Answer with what the tools found."
	}
	res := a.model.do(ctx, r)
	switch {
	case res.answered:
		s.answers++
	case res.failure == "client_timeout":
		s.hung = true
	default:
		s.failed = true
	}
}

func (a *mantleAgent) toolStep(ctx context.Context, s *toolSession, id, step, tool, args string) {
	if tool == toolQuery {
		s.queries++
	}
	body := fmt.Sprintf(`{"arguments":%s,"session_id":%q,"step_id":%q}`, args, id, step)
	status, raw, err := a.post(ctx, "/v1/tools/"+tool+"/call", []byte(body))
	if err != nil {
		if isGuard(err) {
			s.hung = true
		} else {
			s.failed = true
		}
		return
	}
	var out struct {
		Status string `json:"status"`
	}
	if status != http.StatusOK || json.Unmarshal(raw, &out) != nil {
		s.failed = true
		return
	}
	switch out.Status {
	case "stale":
		s.stale = true
	case "pending_confirmation":
		s.pending = true
	}
}

// errGuard is a call that outlived the agent's guard.
var errGuard = errors.New("no answer within the drill's guard")

func isGuard(err error) bool { return errors.Is(err, errGuard) }

func (a *mantleAgent) post(ctx context.Context, path string, body []byte) (int, []byte, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, a.guard, errGuard)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.base+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+toolStormKey)
	resp, err := a.http.Do(req)
	if err != nil {
		if errors.Is(context.Cause(ctx), errGuard) {
			return 0, nil, errGuard
		}
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := httpbody.Response(resp, 1<<20)
	if err != nil && errors.Is(context.Cause(ctx), errGuard) {
		return 0, nil, errGuard
	}
	return resp.StatusCode, raw, err
}

// naiveAgent runs a session the way an agent without mantle does: the model and the tools
// called directly, each call with a static timeout and a fixed number of retries a fixed
// delay apart, actions retried as blindly as queries.
type naiveAgent struct {
	p       *plan
	url     string
	http    *http.Client
	timeout time.Duration
	retries int
	delay   time.Duration
	model   *naiveClient
}

func (a *naiveAgent) run(ctx context.Context, i int) toolSession {
	var s toolSession
	id := fmt.Sprintf("naive-%s-%d", a.p.runID, i)
	q1, action, q2 := a.p.toolArgs(i, id)
	for _, step := range []struct{ path, args string }{{"", "plan"}, {"/query", q1}, {"/action", action}, {"/query", q2}, {"", "answer"}} {
		if step.path == "" {
			s.modelSteps++
			r := requestFor(a.p.s, i)
			if step.args != "plan" {
				r.prompt += " Answer with what the tools found."
			}
			if a.model.do(ctx, r).answered {
				s.answers++
			} else {
				s.failed = true
			}
			continue
		}
		if step.path == "/query" {
			s.queries++
		}
		if !a.call(ctx, step.path, step.args) {
			s.failed = true
		}
	}
	return s
}

// call POSTs args to the backend with the naive client's timeout and retries.
func (a *naiveAgent) call(ctx context.Context, path, args string) bool {
	for try := 0; try <= a.retries; try++ {
		if try > 0 && !pause(ctx, a.delay) {
			return false
		}
		if a.once(ctx, path, args) {
			return true
		}
	}
	return false
}

func (a *naiveAgent) once(ctx context.Context, path, args string) bool {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.url+path, strings.NewReader(args))
	if err != nil {
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.http.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode == http.StatusOK
}

// toolBackends are the query and action tools of one side: in-process HTTP backends that
// misbehave on the scenario's schedule and count what they received.
type toolBackends struct {
	url    string
	hs     *http.Server
	served chan error
	cfg    ToolStorm
	inc    Window
	sc     scaler
	scale  float64
	seed   int64
	// hangCap bounds a hanging call, should its caller never go away.
	hangCap time.Duration

	armed      atomic.Bool
	mu         sync.Mutex
	start      time.Time
	rng        *rand.Rand
	queryCalls int
	executions map[string]int
}

// maxToolBody bounds what a backend reads of a call.
const maxToolBody = 64 << 10

func startToolBackends(ctx context.Context, p *plan) (*toolBackends, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("drill: tool backends: listen: %w", err)
	}
	b := &toolBackends{url: "http://" + ln.Addr().String(), served: make(chan error, 1), cfg: *p.s.Tools, inc: *p.s.Incident,
		sc: p.sc, scale: p.scale, seed: p.s.Seed, hangCap: p.toolGuard(), executions: map[string]int{},
		rng: rand.New(rand.NewPCG(uint64(p.s.Seed), 0x700150))}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /query", b.query)
	mux.HandleFunc("POST /action", b.action)
	b.hs = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { b.served <- b.hs.Serve(ln) }()
	return b, nil
}

// arm starts the scenario's clock.
func (b *toolBackends) arm() {
	b.mu.Lock()
	b.start = time.Now()
	b.mu.Unlock()
	b.armed.Store(true)
}

// inIncident says whether now is in the incident, in scenario time.
func (b *toolBackends) inIncident() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	at := time.Duration(float64(time.Since(b.start)) / b.scale)
	return at >= b.inc.Start && at < b.inc.End
}

func (b *toolBackends) query(w http.ResponseWriter, r *http.Request) {
	var args struct {
		City string `json:"city"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, maxToolBody)).Decode(&args); err != nil || !b.armed.Load() {
		http.Error(w, "bad call", http.StatusBadRequest)
		return
	}
	incident := b.inIncident()
	b.mu.Lock()
	b.queryCalls++
	fail := incident && b.rng.Float64() < b.cfg.QueryFailRate
	hang := fail && b.rng.Float64() < b.cfg.QueryHangShare
	b.mu.Unlock()
	switch {
	case hang:
		b.hang(r.Context())
		return
	case fail:
		http.Error(w, "upstream unavailable", http.StatusServiceUnavailable)
		return
	}
	if !pause(r.Context(), b.sc.d(b.cfg.QueryLatency)) {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprintf(w, `{"city":%q,"forecast":"sunny"}`, args.City)
}

func (b *toolBackends) action(w http.ResponseWriter, r *http.Request) {
	var args struct {
		Order string `json:"order"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, maxToolBody)).Decode(&args); err != nil || args.Order == "" || !b.armed.Load() {
		http.Error(w, "bad call", http.StatusBadRequest)
		return
	}
	// The action happens as soon as the call arrives, whatever becomes of the answer.
	b.mu.Lock()
	b.executions[args.Order]++
	n := b.executions[args.Order]
	b.mu.Unlock()
	if !pause(r.Context(), b.sc.d(b.cfg.ActionLatency)) {
		return
	}
	if b.lost(args.Order, n) {
		b.hang(r.Context())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprintf(w, `{"order":%q,"placed":true}`, args.Order)
}

// lost decides, from the seed, the order and the execution's number, whether the answer of
// an execution is lost: the same on both sides, whatever the timing.
func (b *toolBackends) lost(order string, n int) bool {
	h := fnv.New64a()
	_, _ = h.Write([]byte(order[strings.LastIndexByte(order, '-')+1:]))
	return rand.New(rand.NewPCG(uint64(b.seed), h.Sum64()+uint64(n))).Float64() < b.cfg.ActionLostRate
}

// hang holds a call until its caller gives up (or the cap, should it never).
func (b *toolBackends) hang(ctx context.Context) {
	t := time.NewTimer(b.hangCap)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// counts returns the query calls, and the actions performed, performed more than once,
// and the extra executions.
func (b *toolBackends) counts() (queryCalls, actions, twice, extra int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, n := range b.executions {
		actions++
		if n > 1 {
			twice++
			extra += n - 1
		}
	}
	return b.queryCalls, actions, twice, extra
}

func (b *toolBackends) close() error {
	// Close, not Shutdown: hanging calls end when their connections close.
	err := b.hs.Close()
	if serr := <-b.served; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// agentEvents counts the session events by kind and lists the tool breaker transitions,
// at scenario time since start.
func (p *plan) agentEvents(msgs []*nats.Msg, start time.Time) (map[string]int, []ToolBreakerTransition) {
	counts := map[string]int{}
	var breakers []ToolBreakerTransition
	for _, m := range msgs {
		switch m.Subject {
		case events.SubjectSession:
			ev := &eventsv1.SessionEvent{}
			if proto.Unmarshal(m.Data, ev) != nil {
				counts["malformed"]++
				continue
			}
			counts[strings.ToLower(strings.TrimPrefix(ev.GetKind().String(), "SESSION_EVENT_KIND_"))]++
		case events.SubjectToolBreaker:
			ev := &eventsv1.ToolBreakerEvent{}
			if proto.Unmarshal(m.Data, ev) != nil {
				counts["malformed"]++
				continue
			}
			breakers = append(breakers, ToolBreakerTransition{
				AtS:  ev.GetAt().AsTime().Sub(start).Seconds() / p.scale,
				Tool: ev.GetTool(), From: stateName(ev.GetFrom()), To: stateName(ev.GetTo()), Reason: ev.GetReason(),
			})
		}
	}
	return counts, breakers
}

// toolBreakerSummary says, per tool, how often its breaker opened and when first after
// the incident began.
func toolBreakerSummary(trs []ToolBreakerTransition, incidentStart *float64) string {
	if len(trs) == 0 {
		return "none"
	}
	type tally struct {
		opened int
		first  *float64
	}
	var order []string
	by := map[string]*tally{}
	for _, tr := range trs {
		t, ok := by[tr.Tool]
		if !ok {
			t = &tally{}
			by[tr.Tool] = t
			order = append(order, tr.Tool)
		}
		if tr.To != "open" {
			continue
		}
		t.opened++
		if incidentStart != nil && t.first == nil && tr.AtS >= *incidentStart {
			after := tr.AtS - *incidentStart
			t.first = &after
		}
	}
	var parts []string
	for _, name := range order {
		t := by[name]
		s := fmt.Sprintf("%s opened %d times", name, t.opened)
		if t.first != nil {
			s += fmt.Sprintf(", first %.0f s into the incident", *t.first)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

// subjectWatch collects every message on some subjects of a NATS connection until stop.
type subjectWatch struct {
	nc   *nats.Conn
	subs []*nats.Subscription
	msgs chan *nats.Msg
	done chan struct{}
	out  chan []*nats.Msg

	once   sync.Once
	result []*nats.Msg
}

func watchSubjects(nc *nats.Conn, subjects ...string) (*subjectWatch, error) {
	w := &subjectWatch{nc: nc, msgs: make(chan *nats.Msg, 4096), done: make(chan struct{}), out: make(chan []*nats.Msg, 1)}
	for _, s := range subjects {
		sub, err := nc.ChanSubscribe(s, w.msgs)
		if err != nil {
			w.unsubscribe()
			return nil, fmt.Errorf("drill: subscribe to %s: %w", s, err)
		}
		w.subs = append(w.subs, sub)
	}
	// Known to the server before the load starts, as watchBreakers.
	if err := nc.Flush(); err != nil {
		w.unsubscribe()
		return nil, fmt.Errorf("drill: subscribe to agent events: %w", err)
	}
	go w.collect()
	return w, nil
}

func (w *subjectWatch) unsubscribe() {
	for _, s := range w.subs {
		_ = s.Unsubscribe()
	}
}

func (w *subjectWatch) collect() {
	var got []*nats.Msg
	for {
		select {
		case m := <-w.msgs:
			got = append(got, m)
		case <-w.done:
			for {
				select {
				case m := <-w.msgs:
					got = append(got, m)
				default:
					w.out <- got
					return
				}
			}
		}
	}
}

// stop ends the subscriptions and returns what arrived, as breakerWatch.stop does (the
// in-process mesh publishes on this connection, so after Flush every event is in the
// channel). It may be called more than once.
func (w *subjectWatch) stop(ctx context.Context) []*nats.Msg {
	w.once.Do(func() {
		flushEvents(ctx, w.nc)
		w.unsubscribe()
		close(w.done)
		w.result = <-w.out
	})
	return w.result
}
