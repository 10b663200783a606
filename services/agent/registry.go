package agent

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"

	"github.com/jonboulle/clockwork"
	"golang.org/x/time/rate"

	"github.com/mantle-mesh/mantle/pkg/resilience"
)

// tool is one registered tool: its configuration (defaults filled), its backend and the
// protections that live as long as its configuration does not change.
type tool struct {
	cfg ToolConfig
	// inputSchema and outputSchema are the schemas as JSON text ("" when none).
	inputSchema, outputSchema string
	backend                   backend
	breaker                   *resilience.Breaker
	bulkhead                  *resilience.Bulkhead
	budget                    *resilience.Budget
	// limiter is nil without a rate limit.
	limiter *rate.Limiter
	stats   *toolStats
}

// registry is one version of the tool registry; a reload builds a new one and swaps it
// in whole, so a call sees one version from start to end.
type registry struct {
	tools map[string]*tool
	// names in configuration order: ListTools answers in it.
	names    []string
	revision string
	limits   argLimits
}

// toolDeps are what building a tool needs besides its configuration.
type toolDeps struct {
	clock  clockwork.Clock
	rand   func() float64
	getenv func(string) string
	// newBackend builds a tool's backend; tests replace it.
	newBackend func(cfg ToolConfig, maxResultBytes int) (backend, error)
	// onTransition reports a tool's breaker transitions.
	onTransition func(tool, kind string, t resilience.Transition)
	stats        func(tool string) *toolStats
}

// buildRegistry builds the registry of cfg (which has been validated), keeping the tools
// of prev whose configuration is unchanged, with their breakers, bulkheads, budgets and
// backend connections. It returns the tools prev had that the new registry dropped or
// rebuilt: the caller closes their backends once calls in flight are done with them.
func buildRegistry(cfg Config, prev *registry, deps toolDeps) (*registry, []*tool, error) {
	r := &registry{
		tools:  make(map[string]*tool, len(cfg.Tools)),
		limits: argLimits{bytes: cfg.MaxArgumentBytes, depth: cfg.MaxArgumentDepth, nodes: cfg.MaxArgumentNodes},
	}
	var built []*tool
	for _, tc := range cfg.Tools {
		tc = tc.withDefaults()
		if prev != nil {
			if old, ok := prev.tools[tc.Name]; ok && reflect.DeepEqual(old.cfg, tc) {
				r.tools[tc.Name] = old
				r.names = append(r.names, tc.Name)
				continue
			}
		}
		t, err := newTool(tc, cfg.MaxResultBytes, deps)
		if err != nil {
			for _, b := range built {
				b.backend.close()
			}
			return nil, nil, fmt.Errorf("tools %s: %w", tc.Name, err)
		}
		built = append(built, t)
		r.tools[tc.Name] = t
		r.names = append(r.names, tc.Name)
	}
	var retired []*tool
	if prev != nil {
		for name, old := range prev.tools {
			if r.tools[name] != old {
				retired = append(retired, old)
			}
		}
	}
	r.revision = revisionOf(r)
	return r, retired, nil
}

func newTool(tc ToolConfig, maxResultBytes int, deps toolDeps) (*tool, error) {
	in, err := compactJSON(tc.InputSchema)
	if err != nil {
		return nil, fmt.Errorf("input_schema: %w", err)
	}
	out, err := compactJSON(tc.OutputSchema)
	if err != nil {
		return nil, fmt.Errorf("output_schema: %w", err)
	}
	b, err := deps.newBackend(tc, maxResultBytes)
	if err != nil {
		return nil, fmt.Errorf("backend: %w", err)
	}
	name, kind := tc.Name, tc.Kind
	t := &tool{
		cfg: tc, inputSchema: in, outputSchema: out, backend: b,
		breaker: resilience.NewBreaker(tc.Breaker, deps.clock, deps.rand, func(tr resilience.Transition) {
			if deps.onTransition != nil {
				deps.onTransition(name, kind, tr)
			}
		}),
		bulkhead: resilience.NewBulkhead(tc.MaxInFlight),
		budget:   resilience.NewBudget(tc.RetryBudget, deps.clock),
		stats:    deps.stats(name),
	}
	if tc.RateLimit.PerSecond > 0 {
		t.limiter = rate.NewLimiter(rate.Limit(tc.RateLimit.PerSecond), tc.RateLimit.Burst)
	}
	return t, nil
}

// revisionOf is a digest of what agents see of the registry: it changes when a tool is
// added, removed, or changes its name, description, kind or schemas.
func revisionOf(r *registry) string {
	var parts [][]byte
	for _, name := range r.names {
		t := r.tools[name]
		parts = append(parts, []byte(t.cfg.Name), []byte(t.cfg.Description), []byte(t.cfg.Kind), []byte(t.inputSchema), []byte(t.outputSchema))
	}
	return digest(parts...)[:16]
}

// list returns the tools in configuration order.
func (r *registry) list() []*tool {
	out := make([]*tool, 0, len(r.names))
	for _, n := range r.names {
		out = append(out, r.tools[n])
	}
	return out
}

// toolNames lists the registry's names sorted, for messages.
func (r *registry) toolNames() string {
	names := slices.Sorted(maps.Keys(r.tools))
	if len(names) > 20 {
		return fmt.Sprintf("%v and %s more", names[:20], strconv.Itoa(len(names)-20))
	}
	return fmt.Sprint(names)
}
