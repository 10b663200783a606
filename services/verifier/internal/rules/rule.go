package rules

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// ActionType is what a rule does when its condition holds.
type ActionType string

// The action types. The strings are the configuration and API names.
const (
	ActionBlock   ActionType = "block"
	ActionMask    ActionType = "mask"
	ActionReplace ActionType = "replace"
	ActionNotice  ActionType = "notice"
	ActionDegrade ActionType = "degrade"
	ActionReview  ActionType = "review"
)

// DefaultMask replaces masked text when a mask action sets no value.
const DefaultMask = "***"

// Action is a rule's action, as configured.
type Action struct {
	// Type is what the rule does to a matching answer: block, mask, replace, notice,
	// degrade or review.
	Type ActionType `json:"type" yaml:"type"`
	// Field is a dot path into a JSON answer ("diagnosis", "patient.phone", "items.0.name")
	// for mask, replace and notice; empty means the whole text.
	Field string `json:"field,omitempty" yaml:"field,omitempty"`
	// Pattern is an RE2 expression that limits a mask to the matching substrings.
	Pattern string `json:"pattern,omitempty" yaml:"pattern,omitempty"`
	// Value is the replacement (replace) or the mask text (mask; default "***").
	Value string `json:"value,omitempty" yaml:"value,omitempty"`
	// Notice is shown to the end user; the notice action also appends it to the answer.
	Notice string `json:"notice,omitempty" yaml:"notice,omitempty"`
}

// Rule is one L2 business rule, as configured.
type Rule struct {
	// ID names the rule in findings, events and logs: up to 64 lower-case letters, digits,
	// '.', '_' and '-', starting with a letter or digit.
	ID string `json:"id" yaml:"id"`
	// Description says what the rule is for; it is for people only.
	Description string `json:"description,omitempty" yaml:"description,omitempty"`
	// Scenarios are the scenarios the rule applies to; empty means every scenario.
	Scenarios []string `json:"scenarios,omitempty" yaml:"scenarios,omitempty"`
	// Condition is a CEL expression that evaluates to a bool.
	Condition string `json:"condition" yaml:"condition"`
	// Action is what happens to an answer the condition holds for.
	Action Action `json:"action" yaml:"action"`
}

var ruleID = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

// validate checks everything about a rule except its condition, which only the compiler
// can judge. Messages name the key relative to the rule.
func (r Rule) validate() error {
	var errs []error
	if !ruleID.MatchString(r.ID) {
		errs = append(errs, fmt.Errorf("id: want 1-64 of a-z, 0-9, '.', '_', '-' starting with a letter or digit, got %q", r.ID))
	}
	if strings.TrimSpace(r.Condition) == "" {
		errs = append(errs, errors.New("condition: required"))
	}
	for i, s := range r.Scenarios {
		if strings.TrimSpace(s) == "" {
			errs = append(errs, fmt.Errorf("scenarios[%d]: must not be empty", i))
		}
	}
	a := r.Action
	if a.Field != "" {
		if _, err := parsePath(a.Field); err != nil {
			errs = append(errs, fmt.Errorf("action.field: %w", err))
		}
	}
	if a.Pattern != "" {
		if _, err := regexp.Compile(a.Pattern); err != nil {
			errs = append(errs, fmt.Errorf("action.pattern: %w", err))
		}
	}
	noTarget := func() {
		if a.Field != "" || a.Pattern != "" || a.Value != "" {
			errs = append(errs, fmt.Errorf("action: %s takes no field, pattern or value", a.Type))
		}
	}
	switch a.Type {
	case ActionBlock, ActionDegrade, ActionReview:
		noTarget()
	case ActionMask:
	case ActionReplace:
		if a.Pattern != "" {
			errs = append(errs, errors.New("action.pattern: only mask takes a pattern"))
		}
	case ActionNotice:
		if strings.TrimSpace(a.Notice) == "" {
			errs = append(errs, errors.New("action.notice: required for notice"))
		}
		if a.Pattern != "" || a.Value != "" {
			errs = append(errs, errors.New("action: notice takes no pattern or value"))
		}
	default:
		errs = append(errs, fmt.Errorf("action.type: want block, mask, replace, notice, degrade or review, got %q", a.Type))
	}
	return errors.Join(errs...)
}

// pathSegment is one step of a field path: an object key, or an array index when the
// segment is a number and the value there is an array.
type pathSegment string

func parsePath(path string) ([]pathSegment, error) {
	parts := strings.Split(path, ".")
	segs := make([]pathSegment, 0, len(parts))
	for _, p := range parts {
		if p == "" {
			return nil, fmt.Errorf("%q has an empty segment", path)
		}
		segs = append(segs, pathSegment(p))
	}
	return segs, nil
}

// Hint is what a reviewer says about a bad answer, from which Draft builds a rule.
type Hint struct {
	// ReviewID names the rule and goes into its description.
	ReviewID string
	Scenario string
	// Tenant, when set, limits the rule to that tenant's answers: a rule drafted from one
	// tenant's review is that tenant's until an operator writes a wider one.
	Tenant string
	// QuestionTerms must all occur in the question.
	QuestionTerms []string
	// AnswerTerms: at least one must occur in the answer.
	AnswerTerms []string
	// Knowledge is the notice text for a notice rule.
	Knowledge   string
	Description string
	// Action is the action type the corrective action maps to.
	Action ActionType
}

// Widen returns a rule Draft made for tenant without its tenant condition, so that it
// applies to every tenant's answers: an operator's decision, never a tenant's. A rule whose
// condition does not start with the condition Draft writes for tenant is refused rather
// than edited: it was not drafted for that tenant, or was changed since.
func Widen(r Rule, tenant string) (Rule, error) {
	prefix := "tenant == " + strconv.Quote(tenant) + " && "
	if tenant == "" || !strings.HasPrefix(r.Condition, prefix) || len(r.Condition) == len(prefix) {
		return Rule{}, fmt.Errorf("rule %s is not limited to tenant %q by its first condition, so it cannot be widened", r.ID, tenant)
	}
	r.Condition = strings.TrimPrefix(r.Condition, prefix)
	return r, nil
}

// Draft builds a rule from a reviewer's hint ("when the question contains
// 工伤认定 and the answer says 无需鉴定, insert the regulation's text"). The result still
// has to compile and be approved before it goes live.
func Draft(id string, h Hint) (Rule, error) {
	var conds []string
	for _, t := range h.QuestionTerms {
		if t = strings.TrimSpace(t); t != "" {
			conds = append(conds, "question.contains("+strconv.Quote(t)+")")
		}
	}
	var any []string
	for _, t := range h.AnswerTerms {
		if t = strings.TrimSpace(t); t != "" {
			any = append(any, "text.contains("+strconv.Quote(t)+")")
		}
	}
	if len(conds) == 0 && len(any) == 0 {
		return Rule{}, errors.New("a draft rule needs question terms or answer terms")
	}
	switch len(any) {
	case 0:
	case 1:
		conds = append(conds, any[0])
	default:
		conds = append(conds, "("+strings.Join(any, " || ")+")")
	}
	if h.Tenant != "" {
		conds = append([]string{"tenant == " + strconv.Quote(h.Tenant)}, conds...)
	}
	r := Rule{
		ID:          id,
		Description: h.Description,
		Condition:   strings.Join(conds, " && "),
		Action:      Action{Type: h.Action},
	}
	if r.Description == "" {
		r.Description = "drafted from review " + h.ReviewID
	}
	if h.Scenario != "" {
		r.Scenarios = []string{h.Scenario}
	}
	switch h.Action {
	case ActionNotice:
		if strings.TrimSpace(h.Knowledge) == "" {
			return Rule{}, errors.New("a notice rule needs the knowledge text")
		}
		r.Action.Notice = h.Knowledge
	case ActionMask:
		if len(any) == 0 {
			return Rule{}, errors.New("a mask rule needs answer terms to mask")
		}
		quoted := make([]string, 0, len(h.AnswerTerms))
		for _, t := range h.AnswerTerms {
			if t = strings.TrimSpace(t); t != "" {
				quoted = append(quoted, regexp.QuoteMeta(t))
			}
		}
		r.Action.Pattern = strings.Join(quoted, "|")
	}
	return r, r.validate()
}
