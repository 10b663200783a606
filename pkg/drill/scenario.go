package drill

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/mantle-mesh/mantle/pkg/sim"
	"github.com/mantle-mesh/mantle/services/router"
)

// Scenario is one drill: the simulated models and how they misbehave, the load, and the
// route mantle serves it with. Every duration in it is scenario time: what a real incident
// would take. A run multiplies them all by its time scale (the simulator's latencies and
// phases, the load's duration, the router's budget, timeouts, breaker windows and
// backoffs, the naive client's timeout and retry delay), so a scaled run is the same
// experiment replayed faster, and the report converts measured times back.
type Scenario struct {
	Name        string `yaml:"name"`
	Description string `yaml:"description"`
	// Seed makes both sides of a run draw the same simulated outcomes.
	Seed int64 `yaml:"seed"`
	// TimeScale is this scenario's default time scale (0.1 replays ten minutes in one);
	// the command line can override it.
	TimeScale float64 `yaml:"time_scale"`
	Load      Load    `yaml:"load"`
	// Budget is the whole-request deadline of the route (3 s for chat).
	Budget time.Duration `yaml:"budget"`
	// Incident marks when the fault is on, for the report: breaker trip time is measured
	// from its start and recovery from its end, and charts shade it. Optional.
	Incident *Window `yaml:"incident,omitempty"`
	// Models are the simulated models, first the route's primary.
	Models []Model `yaml:"models"`
	Route  Route   `yaml:"route"`
	// Router holds the resilience settings mantle runs the drill with.
	Router RouterSettings `yaml:"router"`
	// Naive is the baseline client.
	Naive Naive `yaml:"naive"`
	// Targets are what mantle's side should achieve; the report checks them. They are
	// measured, never asserted by tests: a drill is evidence, not a unit test.
	Targets Targets `yaml:"targets"`
	// Tools, when set, makes the scenario a tool storm (toolstorm.go): the load is agent
	// sessions of model and tool steps, against tool backends the drill runs.
	Tools *ToolStorm `yaml:"tools,omitempty"`
}

// Targets are optional goals for mantle's side of a drill; unset ones are not checked.
type Targets struct {
	// SuccessRate is the least share of requests that got a correct answer: not degraded,
	// not a ladder answer, not a wrong answer passed on.
	SuccessRate *float64 `yaml:"success_rate,omitempty"`
	// P99 is the longest acceptable 99th percentile latency (scenario time).
	P99 *time.Duration `yaml:"p99,omitempty"`
	// Amplification is the most upstream calls per request.
	Amplification *float64 `yaml:"amplification,omitempty"`
	// DuplicateBilled is the most billed calls that repeat an already billed request.
	DuplicateBilled *int64 `yaml:"duplicate_billed,omitempty"`
	// BreakerOpenWithin is the longest time from the incident's start until a breaker of
	// the primary opens.
	BreakerOpenWithin *time.Duration `yaml:"breaker_open_within,omitempty"`
	// AnsweredWithinBudget is the least share of requests answered within the budget.
	AnsweredWithinBudget *float64 `yaml:"answered_within_budget,omitempty"`
	// DegradedMarked: every ladder answer (L2, L3) says it is one.
	DegradedMarked bool `yaml:"degraded_marked,omitempty"`
	// ProbesWithinCap: no breaker lets more than router.breaker.half_open_probes calls
	// through in one half-open period.
	ProbesWithinCap bool `yaml:"probes_within_cap,omitempty"`
	// DuplicateActions (tool storms) is the most actions the action backend may perform
	// more than once.
	DuplicateActions *int64 `yaml:"duplicate_actions,omitempty"`
	// QueryAmplification (tool storms) is the most query backend calls per query step.
	QueryAmplification *float64 `yaml:"query_amplification,omitempty"`
	// SessionsEnd (tool storms): every session ends, done, partial or pending
	// confirmation; none hangs.
	SessionsEnd bool `yaml:"sessions_end,omitempty"`
}

// Window is a period of scenario time.
type Window struct {
	Start time.Duration `yaml:"start"`
	End   time.Duration `yaml:"end"`
}

// Load is the open-loop load of a scenario, in scenario time.
type Load struct {
	// Rate is requests per second of scenario time; the generator sends Rate/time_scale
	// per second of wall-clock time.
	Rate float64 `yaml:"rate"`
	// Duration is how long requests keep arriving.
	Duration time.Duration `yaml:"duration"`
	// Stream is the share of requests that ask for a streamed answer, in [0, 1].
	Stream float64 `yaml:"stream"`
	// JSON is the share of requests that ask for a JSON object answer, in [0, 1].
	JSON float64 `yaml:"json"`
	// PromptWords is the length of each generated prompt. Prompts are distinct sentences
	// drawn from the seed, so the cache cannot answer them and every request tests the
	// providers.
	PromptWords int `yaml:"prompt_words"`
}

// Model is one simulated model.
type Model struct {
	Name string `yaml:"name"`
	// SimProfile is the built-in sim profile the model starts from (default healthy).
	SimProfile string `yaml:"sim_profile"`
	// Sim overrides keys of that profile (any key of a sim profile file: latency, errors,
	// phases, ...). A block that is set replaces the base's block of the same key.
	Sim yaml.Node `yaml:"sim"`
	// Timeout is mantle's per-try timeout for the model. Set it from the budget: the first
	// hop gets part of it (1.2 s of 3 s) so a failover still fits.
	Timeout time.Duration `yaml:"timeout"`
	// MaxConcurrency is the model's bulkhead; 0 means unlimited.
	MaxConcurrency int `yaml:"max_concurrency"`
	// Prices in US dollars per million tokens, for the cost estimate.
	InputPricePerMillion  float64 `yaml:"input_price_per_million"`
	OutputPricePerMillion float64 `yaml:"output_price_per_million"`
	// FormatStability and Tier feed mantle's failure-aware fallback.
	FormatStability float64 `yaml:"format_stability"`
	Tier            int     `yaml:"tier"`
	// AcceptsPrefill lets mantle continue a stream cut mid-answer on this model (the
	// simulator continues a prefilled assistant message).
	AcceptsPrefill bool `yaml:"accepts_prefill"`

	// Profile is the resolved sim profile (base plus overrides), before time scaling.
	Profile sim.Profile `yaml:"-"`
}

// Route is how mantle serves the scenario's requests.
type Route struct {
	// Candidates are model names, first choice first.
	Candidates []string `yaml:"candidates"`
	// FirstTokenTimeout and StallTimeout bound streams; 0 keeps the router's defaults.
	FirstTokenTimeout time.Duration       `yaml:"first_token_timeout"`
	StallTimeout      time.Duration       `yaml:"stall_timeout"`
	Hedge             router.HedgeConfig  `yaml:"hedge"`
	Ladder            router.LadderConfig `yaml:"ladder"`
}

// RouterSettings are the router's resilience settings for the drill; omitted keys keep
// mantle's defaults (router.DefaultConfig).
type RouterSettings struct {
	HopReserve  time.Duration            `yaml:"hop_reserve"`
	Retry       router.RetryConfig       `yaml:"retry"`
	RetryBudget router.BudgetConfig      `yaml:"retry_budget"`
	HedgeBudget router.HedgeBudgetConfig `yaml:"hedge_budget"`
	Breaker     router.BreakerConfig     `yaml:"breaker"`
}

// Naive is the baseline client the seeds' incident started from: a static timeout, fixed
// retries on any error, no breaker, no budget, no idempotency, one model.
type Naive struct {
	// Model is the model it calls; default the route's first candidate.
	Model      string        `yaml:"model"`
	Timeout    time.Duration `yaml:"timeout"`
	Retries    int           `yaml:"retries"`
	RetryDelay time.Duration `yaml:"retry_delay"`
}

// RouteName is the name the drill gives its route in the mesh.
const RouteName = "drill"

func defaults() Scenario {
	rc := router.DefaultConfig()
	return Scenario{
		Seed:      1,
		TimeScale: 1,
		Budget:    3 * time.Second,
		Load:      Load{PromptWords: 12},
		Router: RouterSettings{
			HopReserve:  rc.HopReserve,
			Retry:       rc.Retry,
			RetryBudget: rc.RetryBudget,
			HedgeBudget: rc.HedgeBudget,
			Breaker:     rc.Breaker,
		},
		Naive: Naive{Timeout: 5 * time.Second, Retries: 3, RetryDelay: 100 * time.Millisecond},
	}
}

// Parse reads a scenario from YAML on top of the defaults. Unknown keys are errors, and the
// result is validated and its sim profiles resolved.
func Parse(r io.Reader) (*Scenario, error) {
	s := defaults()
	dec := yaml.NewDecoder(r)
	dec.KnownFields(true)
	if err := dec.Decode(&s); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("drill: scenario: empty document")
		}
		return nil, fmt.Errorf("drill: scenario: %w", err)
	}
	for i := range s.Models {
		m := &s.Models[i]
		p, err := resolveProfile(m.SimProfile, &m.Sim)
		if err != nil {
			return nil, fmt.Errorf("drill: scenario %q: models[%d] (%s): %w", s.Name, i, m.Name, err)
		}
		p.Name = m.Name
		m.Profile = p
	}
	if s.Naive.Model == "" && len(s.Route.Candidates) > 0 {
		s.Naive.Model = s.Route.Candidates[0]
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

// resolveProfile applies the overrides in node to the named built-in profile.
func resolveProfile(base string, node *yaml.Node) (sim.Profile, error) {
	if base == "" {
		base = "healthy"
	}
	p, ok := sim.Builtin(base)
	if !ok {
		return sim.Profile{}, fmt.Errorf("sim_profile: unknown profile %q (have %s)", base, strings.Join(sim.ProfileNames(), ", "))
	}
	if node.Kind != 0 {
		// Re-encoding the node lets the strict decoder check its keys, which decoding a
		// yaml.Node directly does not.
		raw, err := yaml.Marshal(inlineAliases(node))
		if err != nil {
			return sim.Profile{}, fmt.Errorf("sim: %w", err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(raw))
		dec.KnownFields(true)
		if err := dec.Decode(&p); err != nil {
			return sim.Profile{}, fmt.Errorf("sim: %w", err)
		}
	}
	if err := p.Validate(); err != nil {
		return sim.Profile{}, err
	}
	return p, nil
}

// inlineAliases returns a copy of n with every alias replaced by what it refers to, so the
// node can be encoded on its own: an anchor defined elsewhere in the scenario file would
// otherwise be unknown to the document it is encoded into.
func inlineAliases(n *yaml.Node) *yaml.Node {
	if n == nil {
		return nil
	}
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		return inlineAliases(n.Alias)
	}
	c := *n
	c.Anchor = ""
	c.Content = make([]*yaml.Node, len(n.Content))
	for i, child := range n.Content {
		c.Content[i] = inlineAliases(child)
	}
	return &c
}

// Validate reports every problem with s, each named by its YAML key.
func (s *Scenario) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if s.Name == "" {
		add("name: required")
	}
	if !(s.TimeScale > 0 && s.TimeScale <= 10) {
		add("time_scale: must be in (0, 10], got %g", s.TimeScale)
	}
	if !(s.Load.Rate > 0) {
		add("load.rate: must be positive, got %g", s.Load.Rate)
	}
	if s.Load.Duration <= 0 {
		add("load.duration: must be positive, got %s", s.Load.Duration)
	}
	if s.Load.Stream < 0 || s.Load.Stream > 1 {
		add("load.stream: must be in [0, 1], got %g", s.Load.Stream)
	}
	if s.Load.JSON < 0 || s.Load.JSON > 1 {
		add("load.json: must be in [0, 1], got %g", s.Load.JSON)
	}
	if s.Load.PromptWords < 1 || s.Load.PromptWords > 200 {
		add("load.prompt_words: must be in [1, 200], got %d", s.Load.PromptWords)
	}
	if s.Budget <= s.Router.HopReserve {
		add("budget: must be more than router.hop_reserve (%s), got %s", s.Router.HopReserve, s.Budget)
	}
	if w := s.Incident; w != nil && (w.Start < 0 || w.End <= w.Start) {
		add("incident: want 0 <= start < end, got %s and %s", w.Start, w.End)
	}
	names := map[string]bool{}
	for i, m := range s.Models {
		switch {
		case m.Name == "":
			add("models[%d].name: required", i)
		case names[m.Name]:
			add("models[%d].name: duplicate model %q", i, m.Name)
		case m.Name == RouteName:
			add("models[%d].name: %q is the drill's route name", i, m.Name)
		}
		names[m.Name] = true
		if m.Timeout <= 0 {
			add("models[%d].timeout: must be positive, got %s", i, m.Timeout)
		}
		if m.MaxConcurrency < 0 {
			add("models[%d].max_concurrency: must not be negative", i)
		}
		if m.InputPricePerMillion < 0 || m.OutputPricePerMillion < 0 {
			add("models[%d]: prices must not be negative", i)
		}
	}
	if len(s.Models) == 0 {
		add("models: at least one model is required")
	}
	if len(s.Route.Candidates) == 0 {
		add("route.candidates: at least one model is required")
	}
	for i, c := range s.Route.Candidates {
		if !names[c] {
			add("route.candidates[%d]: unknown model %q", i, c)
		}
	}
	for i, c := range s.Route.Ladder.Smaller {
		if !names[c] {
			add("route.ladder.smaller[%d]: unknown model %q", i, c)
		}
	}
	if !names[s.Naive.Model] {
		add("naive.model: unknown model %q", s.Naive.Model)
	}
	if s.Naive.Timeout <= 0 {
		add("naive.timeout: must be positive, got %s", s.Naive.Timeout)
	}
	if s.Naive.Retries < 0 || s.Naive.Retries > 10 {
		add("naive.retries: must be in [0, 10], got %d", s.Naive.Retries)
	}
	if s.Naive.RetryDelay < 0 {
		add("naive.retry_delay: must not be negative, got %s", s.Naive.RetryDelay)
	}
	if s.Tools != nil {
		s.Tools.validate(s, add)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("drill: scenario %q:\n%w", s.Name, err)
	}
	return nil
}

// Model returns the named model.
func (s *Scenario) Model(name string) (Model, bool) {
	i := slices.IndexFunc(s.Models, func(m Model) bool { return m.Name == name })
	if i < 0 {
		return Model{}, false
	}
	return s.Models[i], true
}

//go:embed scenarios/*.yaml
var builtinFS embed.FS

// Builtin returns the named built-in scenario, freshly parsed.
func Builtin(name string) (*Scenario, error) {
	data, err := builtinFS.ReadFile(path.Join("scenarios", name+".yaml"))
	if err != nil {
		return nil, fmt.Errorf("drill: unknown scenario %q (have %s)", name, strings.Join(Names(), ", "))
	}
	return Parse(bytes.NewReader(data))
}

// BuiltinSource returns the YAML of the named built-in scenario, for users to copy and edit.
func BuiltinSource(name string) ([]byte, error) {
	data, err := builtinFS.ReadFile(path.Join("scenarios", name+".yaml"))
	if err != nil {
		return nil, fmt.Errorf("drill: unknown scenario %q (have %s)", name, strings.Join(Names(), ", "))
	}
	return data, nil
}

// Names lists the built-in scenarios in the order the drill runs them with --scenario all.
func Names() []string {
	entries, _ := fs.ReadDir(builtinFS, "scenarios") // embedded: cannot fail
	var names []string
	for _, e := range entries {
		names = append(names, strings.TrimSuffix(e.Name(), ".yaml"))
	}
	// The primary scenario first; the rest alphabetically.
	slices.SortFunc(names, func(a, b string) int {
		switch {
		case a == "seed-incident":
			return -1
		case b == "seed-incident":
			return 1
		}
		return strings.Compare(a, b)
	})
	return names
}
