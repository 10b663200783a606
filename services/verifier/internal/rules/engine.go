package rules

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/ext"
	"cel.dev/cel-go/interpreter"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// DefaultCostLimit bounds one condition's evaluation. CEL charges roughly one unit per
// operation and per element or byte visited, so this allows scanning a few answers' worth of
// text and small comprehensions, and stops a runaway rule in microseconds.
const DefaultCostLimit = 100_000

// Input is what conditions see. The verifier builds one per answer.
type Input struct {
	Scenario string
	Tenant   string
	Model    string
	Question string
	// Messages are the request's turns.
	Messages []Message
	// ResponseFormat is text, json_object or json_schema.
	ResponseFormat string
	// Text is the answer as L1 will deliver it.
	Text string
	// Output is the parsed JSON answer (map[string]any, []any, string, float64, bool) or nil.
	Output   any
	Degraded bool
	// Quality is the request's QualityContext; nil is seen as an empty one.
	Quality *mantlev1.QualityContext
}

// Message is one turn of the conversation.
type Message struct {
	Role    string
	Content string
}

// Engine compiles rule sets and holds the live one.
type Engine struct {
	env       *cel.Env
	costLimit uint64

	live    atomic.Pointer[Set]
	mu      sync.Mutex // serialises Load so versions increase with the swap order
	version uint64
}

// NewEngine builds an engine whose conditions may cost at most costLimit (0: the default).
// It starts with an empty live set.
func NewEngine(costLimit uint64) (*Engine, error) {
	if costLimit == 0 {
		costLimit = DefaultCostLimit
	}
	env, err := cel.NewEnv(
		cel.Types(&mantlev1.QualityContext{}),
		cel.Variable("text", cel.StringType),
		cel.Variable("output", cel.DynType),
		cel.Variable("question", cel.StringType),
		cel.Variable("request", cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable("scenario", cel.StringType),
		cel.Variable("model", cel.StringType),
		cel.Variable("tenant", cel.StringType),
		cel.Variable("degraded", cel.BoolType),
		cel.Variable("quality", cel.ObjectType("mantle.v1.QualityContext")),
		ext.Strings(),
	)
	if err != nil {
		return nil, fmt.Errorf("cel environment: %w", err)
	}
	e := &Engine{env: env, costLimit: costLimit}
	e.live.Store(&Set{byScenario: map[string][]*compiled{}})
	return e, nil
}

// Set is an immutable compiled rule set.
type Set struct {
	// Version increases with every set an Engine accepts; 0 is the initial empty set.
	Version uint64
	rules   []*compiled
	// byScenario lists, per scenario some rule names, the rules that apply there in
	// configuration order; global lists the rules that apply everywhere.
	byScenario map[string][]*compiled
	global     []*compiled
}

type compiled struct {
	rule    Rule
	program cel.Program
	path    []pathSegment
	pattern *regexp.Regexp
}

// Rules returns the set's rules in configuration order.
func (s *Set) Rules() []Rule {
	out := make([]Rule, 0, len(s.rules))
	for _, c := range s.rules {
		out = append(out, c.rule)
	}
	return out
}

// Applies reports whether any rule applies to the scenario.
func (s *Set) Applies(scenario string) bool {
	if rules, ok := s.byScenario[scenario]; ok {
		return len(rules) > 0
	}
	return len(s.global) > 0
}

// Len is the number of rules.
func (s *Set) Len() int { return len(s.rules) }

// Live returns the set in use.
func (e *Engine) Live() *Set { return e.live.Load() }

// Compile compiles rules into a set without making it live. The error lists every bad rule
// as rules[i] (id): reason.
func (e *Engine) Compile(rules []Rule) (*Set, error) {
	s := &Set{byScenario: map[string][]*compiled{}}
	var errs []error
	seen := map[string]int{}
	for i, r := range rules {
		prefix := fmt.Sprintf("rules[%d] (%s)", i, r.ID)
		if j, dup := seen[r.ID]; dup {
			errs = append(errs, fmt.Errorf("%s: id: duplicates rules[%d]", prefix, j))
			continue
		}
		seen[r.ID] = i
		c, err := e.compile(r)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", prefix, err))
			continue
		}
		s.rules = append(s.rules, c)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	scenarios := map[string]bool{}
	for _, c := range s.rules {
		for _, sc := range c.rule.Scenarios {
			scenarios[sc] = true
		}
	}
	for _, c := range s.rules {
		if len(c.rule.Scenarios) == 0 {
			s.global = append(s.global, c)
		}
	}
	for sc := range scenarios {
		for _, c := range s.rules {
			if len(c.rule.Scenarios) == 0 || slices.Contains(c.rule.Scenarios, sc) {
				s.byScenario[sc] = append(s.byScenario[sc], c)
			}
		}
	}
	return s, nil
}

func (e *Engine) compile(r Rule) (*compiled, error) {
	if err := r.validate(); err != nil {
		return nil, err
	}
	ast, iss := e.env.Compile(r.Condition)
	if iss.Err() != nil {
		return nil, fmt.Errorf("condition: %w", iss.Err())
	}
	if t := ast.OutputType(); !t.IsExactType(types.BoolType) && !t.IsExactType(types.DynType) {
		return nil, fmt.Errorf("condition: must be a bool, is %s", t)
	}
	program, err := e.env.Program(ast, cel.CostLimit(e.costLimit))
	if err != nil {
		return nil, fmt.Errorf("condition: %w", err)
	}
	c := &compiled{rule: r, program: program}
	if r.Action.Field != "" {
		c.path, _ = parsePath(r.Action.Field) // validated above
	}
	if r.Action.Pattern != "" {
		c.pattern = regexp.MustCompile(r.Action.Pattern) // validated above
	}
	return c, nil
}

// Load compiles rules and, when every rule compiles, makes them the live set. On error the
// live set is unchanged.
func (e *Engine) Load(rules []Rule) (*Set, error) {
	s, err := e.Compile(rules)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.version++
	s.Version = e.version
	e.live.Store(s)
	return s, nil
}

// Match is a rule whose condition held.
type Match struct {
	Rule Rule
	c    *compiled
}

// RuleError is a condition that could not be evaluated; the rule did not apply.
type RuleError struct {
	RuleID string
	Err    error
	// CostExceeded is true when the evaluation was stopped at the cost limit.
	CostExceeded bool
}

// Result is the outcome of evaluating a set against one answer.
type Result struct {
	Matches []Match
	Errors  []RuleError
}

// Evaluate runs the conditions of the rules that apply to in.Scenario, in order.
func (s *Set) Evaluate(in *Input) Result {
	rules, ok := s.byScenario[in.Scenario]
	if !ok {
		rules = s.global
	}
	var res Result
	if len(rules) == 0 {
		return res
	}
	act := &activation{in: in}
	for _, c := range rules {
		out, _, err := c.program.Eval(act)
		if err != nil {
			var cancelled interpreter.EvalCancelledError
			res.Errors = append(res.Errors, RuleError{
				RuleID:       c.rule.ID,
				Err:          err,
				CostExceeded: errors.As(err, &cancelled) && cancelled.Cause == interpreter.CostLimitExceeded,
			})
			continue
		}
		if b, ok := out.Value().(bool); ok && b {
			res.Matches = append(res.Matches, Match{Rule: c.rule, c: c})
		} else if !ok {
			res.Errors = append(res.Errors, RuleError{RuleID: c.rule.ID, Err: fmt.Errorf("condition returned %s, not a bool", out.Type())})
		}
	}
	return res
}

// activation resolves the condition variables from an Input without building a map per
// answer; request is built only when a condition reads it.
type activation struct {
	in      *Input
	request map[string]any
}

var emptyQuality = &mantlev1.QualityContext{}

func (a *activation) ResolveName(name string) (any, bool) {
	in := a.in
	switch name {
	case "text":
		return in.Text, true
	case "output":
		if in.Output == nil {
			return types.NullValue, true
		}
		return in.Output, true
	case "question":
		return in.Question, true
	case "scenario":
		return in.Scenario, true
	case "model":
		return in.Model, true
	case "tenant":
		return in.Tenant, true
	case "degraded":
		return in.Degraded, true
	case "quality":
		if in.Quality == nil {
			return emptyQuality, true
		}
		return in.Quality, true
	case "request":
		if a.request == nil {
			msgs := make([]any, 0, len(in.Messages))
			for _, m := range in.Messages {
				msgs = append(msgs, map[string]any{"role": m.Role, "content": m.Content})
			}
			a.request = map[string]any{
				"model": in.Model, "scenario": in.Scenario, "tenant": in.Tenant,
				"question": in.Question, "response_format": in.ResponseFormat, "messages": msgs,
			}
		}
		return a.request, true
	}
	return nil, false
}

func (a *activation) Parent() interpreter.Activation { return nil }
