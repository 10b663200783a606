package verifier

import (
	"strings"
	"unicode/utf8"

	"github.com/mantle-mesh/mantle/pkg/formatcheck"
	"github.com/mantle-mesh/mantle/services/verifier/internal/rules"
)

// Risk explains a risk score: three dimensions in [0,1], each the strongest
// of its signals, weighed into Score. Answers at or above Threshold go to human review.
type Risk struct {
	Input   float64
	Output  float64
	Context float64
	Score   float64
	// Threshold is the review threshold for this answer (adapted when degraded).
	Threshold float64
	// Signals are the names of the signals that contributed.
	Signals []string
}

// Signal names. Stable: they appear in review requests and events.
const (
	SignalSensitiveTerm    = "sensitive_term"
	SignalLongInput        = "long_input"
	SignalInputEncoding    = "input_encoding"
	SignalFailed           = "failed"
	SignalRepetition       = "repetition"
	SignalRuleApplied      = "rule_applied"
	SignalFormatWarning    = "format_warning"
	SignalLowConfidence    = "low_l3_confidence"
	SignalDivergence       = "divergence"
	SignalDegradedStreak   = "degraded_streak"
	SignalUserDissatisfied = "user_dissatisfied"
	SignalRetries          = "retries"
)

type dimension int

const (
	dimInput dimension = iota
	dimOutput
	dimContext
)

type signal struct {
	name  string
	dim   dimension
	value float64
}

// riskInputs is what the risk of one answer is made of before L3; L3 adds its output
// signals and scores again.
type riskInputs struct {
	weights   RiskWeights // normalised to sum to 1
	threshold float64
	signals   []signal
}

// score combines the signals (and extra ones from L3) into a Risk.
func (in riskInputs) score(extra []signal) Risk {
	r := Risk{Threshold: in.threshold}
	for _, s := range append(in.signals[:len(in.signals):len(in.signals)], extra...) {
		if s.value <= 0 {
			continue
		}
		r.Signals = append(r.Signals, s.name)
		switch s.dim {
		case dimInput:
			r.Input = max(r.Input, s.value)
		case dimOutput:
			r.Output = max(r.Output, s.value)
		case dimContext:
			r.Context = max(r.Context, s.value)
		}
	}
	r.Score = min(1, in.weights.Input*r.Input+in.weights.Output*r.Output+in.weights.Context*r.Context)
	return r
}

// riskInputs gathers the synchronous signals of an answer.
func (v *Verifier) riskInputs(a Answer, verdict Verdict, l1 formatcheck.Result, degraded bool) riskInputs {
	cfg := v.cfg.Risk
	sc := v.cfg.Scenarios[a.scenario()]
	weights := cfg.Weights
	if sc.Weights != nil {
		weights = *sc.Weights
	}
	sum := weights.Input + weights.Output + weights.Context
	weights = RiskWeights{Input: weights.Input / sum, Output: weights.Output / sum, Context: weights.Context / sum}
	threshold := cfg.ReviewThreshold
	if sc.ReviewThreshold > 0 {
		threshold = sc.ReviewThreshold
	}
	if degraded {
		threshold *= v.cfg.Degraded.ReviewThresholdFactor
	}
	in := riskInputs{weights: weights, threshold: threshold}
	add := func(name string, dim dimension, value float64) {
		in.signals = append(in.signals, signal{name: name, dim: dim, value: value})
	}

	// Input: what the user sent.
	chars := 0
	sensitive, badEncoding := false, false
	for _, m := range a.Messages {
		chars += utf8.RuneCountInString(m.Content)
		if m.Role == "user" && !sensitive && containsTerm(m.Content, cfg.SensitiveTerms) {
			sensitive = true
		}
		if !badEncoding && formatcheck.Misencoded(m.Content) {
			badEncoding = true
		}
	}
	if sensitive {
		add(SignalSensitiveTerm, dimInput, 1)
	}
	if chars > cfg.LongInputChars {
		add(SignalLongInput, dimInput, 1)
	}
	if badEncoding {
		add(SignalInputEncoding, dimInput, 1)
	}

	// Output: what the model said.
	if !verdict.Passed {
		add(SignalFailed, dimOutput, 1)
	}
	if repetitionRatio(l1) > cfg.RepetitionRatio {
		add(SignalRepetition, dimOutput, 1)
	}
	for _, act := range verdict.Actions {
		if act.Action == rules.ActionMask || act.Action == rules.ActionReplace || act.Action == rules.ActionNotice {
			add(SignalRuleApplied, dimOutput, 0.5)
			break
		}
	}
	for _, f := range verdict.Findings {
		if !f.Blocking && f.Layer == LayerL1 {
			add(SignalFormatWarning, dimOutput, 0.3)
			break
		}
	}

	// Context: what happened around it.
	streak, dissatisfied := v.sessions.context(a.Tenant, a.SessionID, a.Quality.GetRequestId(), degraded)
	if streak >= cfg.DegradedStreak {
		add(SignalDegradedStreak, dimContext, 1)
	}
	if dissatisfied {
		add(SignalUserDissatisfied, dimContext, 1)
	}
	if a.Quality.GetRetryCount() >= 2 {
		add(SignalRetries, dimContext, 0.5)
	}
	return in
}

// containsTerm reports whether s contains one of terms, ignoring ASCII case.
func containsTerm(s string, terms []string) bool {
	if len(terms) == 0 {
		return false
	}
	lower := strings.ToLower(s)
	for _, t := range terms {
		if strings.Contains(lower, strings.ToLower(t)) {
			return true
		}
	}
	return false
}

// repetitionRatio is the share of an answer's sentences (or, for JSON, string values) that
// occur more than once: "关键字段重复率", the repeated-key-field rate (three equal fields of four: 0.75).
// Fewer than three items say nothing.
func repetitionRatio(l1 formatcheck.Result) float64 {
	var items []string
	if l1.JSON {
		items = l1.Strings()
	} else {
		items = formatcheck.Sentences(l1.Content)
	}
	if len(items) < 3 {
		return 0
	}
	counts := make(map[string]int, len(items))
	for _, s := range items {
		counts[s]++
	}
	repeated := 0
	for _, n := range counts {
		if n > 1 {
			repeated += n
		}
	}
	return float64(repeated) / float64(len(items))
}
