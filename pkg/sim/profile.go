package sim

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Profile describes how a simulated model behaves: how long it takes, how it fails, and how
// that changes over time. Profiles are plain values; a Server reads them and never changes
// them.
//
// The zero Profile answers instantly, never fails and reports no rate-limit headers, which
// is what most tests want. Builtin returns realistic ones and LoadProfile reads one from
// YAML on top of the healthy defaults.
type Profile struct {
	// Name identifies the profile in logs and in the x-sim-profile response header.
	Name string `yaml:"name"`
	// Description says what the profile is for; it is for people only.
	Description string `yaml:"description,omitempty"`

	// Latency is the time to a complete non-streamed answer.
	Latency Latency `yaml:"latency"`
	// TTFT is the time to the first content chunk of a stream. It is a separate
	// distribution because, as the seeds stress, first-token delay and total generation
	// time behave differently and the router budgets them separately.
	TTFT Latency `yaml:"ttft"`
	// TokenDelay is the pause between stream chunks after the first.
	TokenDelay time.Duration `yaml:"token_delay"`

	// Errors is the probability of each failure; the remainder answers normally.
	Errors ErrorMix `yaml:"errors"`
	// RetryAfter is the hint sent with rate_limited 429s (Retry-After and retry-after-ms).
	// Zero means one second.
	RetryAfter time.Duration `yaml:"retry_after,omitempty"`
	// RateLimit is the simulated per-minute capacity of the key behind the model.
	RateLimit RateLimit `yaml:"rate_limit"`
	// Opening starts every answer instead of "sim answer to: ", so that two models say
	// different things for the same prompt (a restarted stream that must not be spliced).
	Opening string `yaml:"opening,omitempty"`

	// Phases change latency and errors over time, measured from the server's start.
	// They are sorted by Start and do not overlap; outside every phase the profile's own
	// settings apply.
	Phases []Phase `yaml:"phases,omitempty"`

	// TimeScale multiplies every latency, delay, retry hint, rate-limit window and phase
	// offset: 0.1 runs the profile ten times faster. Zero means 1.
	TimeScale float64 `yaml:"time_scale,omitempty"`

	// Seed, when not zero, seeds this profile's random outcomes instead of the server's
	// seed, so one model's behaviour can be pinned while others vary.
	Seed int64 `yaml:"seed,omitempty"`

	// Script fixes the outcomes of a model's first calls, in order, whatever the error mix
	// and the phase say ("500 once, then fine": [server_error]); later calls draw from the
	// mix as usual. Every call still makes its random draws, so the latencies of a run do
	// not depend on the script. A simulated rate limit still refuses calls beyond it.
	Script []Outcome `yaml:"script,omitempty"`
}

// ErrorMix is the probability of each failure mode. Probabilities are in [0, 1] and sum to
// at most 1; whatever is left is a normal answer. Fields whose names start with "stream"
// describe failures of a stream after its headers were sent; a non-streamed request that
// draws one gets the same failure on its JSON body (cut, or stalled, after the headers).
type ErrorMix struct {
	// RateLimited is a 429 with Retry-After and x-ratelimit-reset-* hints.
	RateLimited float64 `yaml:"rate_limited,omitempty"`
	// RateLimitedNoHint is a 429 with no hint at all, so the client must pick its own
	// backoff.
	RateLimitedNoHint float64 `yaml:"rate_limited_no_hint,omitempty"`
	// ServerError is a 500.
	ServerError float64 `yaml:"server_error,omitempty"`
	// Overloaded is a 503.
	Overloaded float64 `yaml:"overloaded,omitempty"`
	// Reset closes the connection (with a TCP RST) before any response header.
	Reset float64 `yaml:"reset,omitempty"`
	// Hang accepts the request and never answers until the client goes away.
	Hang float64 `yaml:"hang,omitempty"`
	// ErrorIn200 is a 200 whose body is an {"error": {...}} object (some vendors
	// do this instead of a status code).
	ErrorIn200 float64 `yaml:"error_in_200,omitempty"`
	// MalformedJSON is a 200 whose JSON is broken: the body itself for plain requests, the
	// answer's content for requests that asked for a JSON object (that is where real models
	// break it).
	MalformedJSON float64 `yaml:"malformed_json,omitempty"`
	// Refusal is a 200 whose answer is a refusal ("I'm sorry, but I can't help with that.").
	Refusal float64 `yaml:"refusal,omitempty"`
	// Truncated is a 200 whose answer is cut in half with finish_reason "length".
	Truncated float64 `yaml:"truncated,omitempty"`
	// StreamCut sends part of the answer, then closes the connection without [DONE].
	StreamCut float64 `yaml:"stream_cut,omitempty"`
	// StreamStall sends part of the answer, then sends nothing until the client goes away.
	StreamStall float64 `yaml:"stream_stall,omitempty"`
	// ContextLengthExceeded is a 400 with code context_length_exceeded: the prompt does not
	// fit this model, and only a model with a larger context window can answer.
	ContextLengthExceeded float64 `yaml:"context_length_exceeded,omitempty"`
	// ContentFilter is a 400 with code content_policy_violation: the provider's safety
	// system refused the prompt, and its message is the reason the caller is owed.
	ContentFilter float64 `yaml:"content_filter,omitempty"`
	// ContentFilterFinish is a 200 whose answer the safety system stopped: no content and
	// finish_reason content_filter (in a stream, the finish chunk says so).
	ContentFilterFinish float64 `yaml:"content_filter_finish,omitempty"`
	// StreamNoDone sends the whole answer with its finish reason (and usage when asked for),
	// then ends the body without the [DONE] marker, as some OpenAI-compatible servers do.
	// A non-streamed request that draws it gets a normal answer.
	StreamNoDone float64 `yaml:"stream_no_done,omitempty"`
}

// RateLimit is a simulated per-minute capacity. When a limit is set, every answer carries
// OpenAI's x-ratelimit-* headers for it, and calls beyond it in the current window get a
// hinted 429 (outcome rate_limited) until the window rolls over. Zero means no limit and no
// headers. Windows are fixed, start at the first call, and last a minute times TimeScale.
type RateLimit struct {
	RequestsPerMinute int64 `yaml:"requests_per_minute,omitempty"`
	TokensPerMinute   int64 `yaml:"tokens_per_minute,omitempty"`
}

// Phase is a period of a profile's timeline with its own behaviour. Each override that is
// set replaces the profile's whole block (a phase's errors replace the whole mix, they are
// not added to it); an override left nil keeps the profile's.
type Phase struct {
	Name string `yaml:"name"`
	// Start is the offset from the server's start (before TimeScale).
	Start time.Duration `yaml:"start"`
	// Duration bounds the phase; zero means it lasts until the next phase starts, or forever.
	Duration time.Duration `yaml:"duration,omitempty"`

	Latency    *Latency       `yaml:"latency,omitempty"`
	TTFT       *Latency       `yaml:"ttft,omitempty"`
	TokenDelay *time.Duration `yaml:"token_delay,omitempty"`
	Errors     *ErrorMix      `yaml:"errors,omitempty"`
}

// LoadProfile reads one profile from YAML. Keys that are omitted keep the values of the
// built-in healthy profile (so a file may say only what it changes); unknown keys are
// errors, and the result is validated.
func LoadProfile(r io.Reader) (Profile, error) {
	p := healthy()
	p.Name, p.Description = "", ""
	dec := yaml.NewDecoder(r)
	dec.KnownFields(true)
	if err := dec.Decode(&p); err != nil {
		if errors.Is(err, io.EOF) {
			return Profile{}, errors.New("sim: profile: empty document")
		}
		return Profile{}, fmt.Errorf("sim: profile: %w", err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return Profile{}, errors.New("sim: profile: more than one YAML document")
	}
	if err := p.Validate(); err != nil {
		return Profile{}, err
	}
	return p, nil
}

// Validate reports every problem with p, each named by its YAML key (for example
// "phases[1].errors: probabilities sum to 1.2, above 1").
func (p Profile) Validate() error {
	var problems []string
	problems = append(problems, p.Latency.validate("latency")...)
	problems = append(problems, p.TTFT.validate("ttft")...)
	if p.TokenDelay < 0 {
		problems = append(problems, fmt.Sprintf("token_delay: negative duration %s", p.TokenDelay))
	}
	problems = append(problems, p.Errors.validate("errors")...)
	if p.RetryAfter < 0 {
		problems = append(problems, fmt.Sprintf("retry_after: negative duration %s", p.RetryAfter))
	}
	if p.RateLimit.RequestsPerMinute < 0 {
		problems = append(problems, "rate_limit.requests_per_minute: negative")
	}
	if p.RateLimit.TokensPerMinute < 0 {
		problems = append(problems, "rate_limit.tokens_per_minute: negative")
	}
	if p.TimeScale < 0 {
		problems = append(problems, fmt.Sprintf("time_scale: %g is negative", p.TimeScale))
	}
	for i, o := range p.Script {
		if !o.valid() {
			problems = append(problems, fmt.Sprintf("script[%d]: unknown outcome %q", i, o))
		}
	}
	for i, ph := range p.Phases {
		problems = append(problems, ph.validate(fmt.Sprintf("phases[%d]", i))...)
		if i == 0 {
			continue
		}
		prev := p.Phases[i-1]
		if ph.Start <= prev.Start {
			problems = append(problems, fmt.Sprintf("phases[%d].start: %s is not after phases[%d].start %s (phases must be sorted)",
				i, ph.Start, i-1, prev.Start))
		} else if prev.Duration > 0 && prev.Start+prev.Duration > ph.Start {
			problems = append(problems, fmt.Sprintf("phases[%d].start: %s is inside phases[%d], which ends at %s",
				i, ph.Start, i-1, prev.Start+prev.Duration))
		}
	}
	if len(problems) == 0 {
		return nil
	}
	name := p.Name
	if name == "" {
		name = "unnamed"
	}
	return fmt.Errorf("sim: profile %q: %s", name, strings.Join(problems, "; "))
}

func (ph Phase) validate(path string) []string {
	var problems []string
	if ph.Name == "" {
		problems = append(problems, path+".name: required")
	}
	if ph.Start < 0 {
		problems = append(problems, fmt.Sprintf("%s.start: negative duration %s", path, ph.Start))
	}
	if ph.Duration < 0 {
		problems = append(problems, fmt.Sprintf("%s.duration: negative duration %s", path, ph.Duration))
	}
	if ph.Latency != nil {
		problems = append(problems, ph.Latency.validate(path+".latency")...)
	}
	if ph.TTFT != nil {
		problems = append(problems, ph.TTFT.validate(path+".ttft")...)
	}
	if ph.TokenDelay != nil && *ph.TokenDelay < 0 {
		problems = append(problems, fmt.Sprintf("%s.token_delay: negative duration %s", path, *ph.TokenDelay))
	}
	if ph.Errors != nil {
		problems = append(problems, ph.Errors.validate(path+".errors")...)
	}
	return problems
}

// PhaseAt returns the name of the phase active at elapsed (real time since the server
// started, so TimeScale applies), or "" when no phase is.
func (p Profile) PhaseAt(elapsed time.Duration) string {
	ph, ok := p.phaseAt(elapsed)
	if !ok {
		return ""
	}
	return ph.Name
}

func (p Profile) phaseAt(elapsed time.Duration) (Phase, bool) {
	// Phases are sorted and disjoint, so only the last one that has started can be active.
	for i := len(p.Phases) - 1; i >= 0; i-- {
		ph := p.Phases[i]
		start := p.scaled(ph.Start)
		if elapsed < start {
			continue
		}
		if ph.Duration > 0 && elapsed >= start+p.scaled(ph.Duration) {
			return Phase{}, false
		}
		return ph, true
	}
	return Phase{}, false
}

// settings is what governs one call: the profile with the active phase's overrides applied.
type settings struct {
	phase      string
	latency    Latency
	ttft       Latency
	tokenDelay time.Duration
	errors     ErrorMix
}

func (p Profile) settingsAt(elapsed time.Duration) settings {
	s := settings{latency: p.Latency, ttft: p.TTFT, tokenDelay: p.TokenDelay, errors: p.Errors}
	ph, ok := p.phaseAt(elapsed)
	if !ok {
		return s
	}
	s.phase = ph.Name
	if ph.Latency != nil {
		s.latency = *ph.Latency
	}
	if ph.TTFT != nil {
		s.ttft = *ph.TTFT
	}
	if ph.TokenDelay != nil {
		s.tokenDelay = *ph.TokenDelay
	}
	if ph.Errors != nil {
		s.errors = *ph.Errors
	}
	return s
}

// scaled applies TimeScale to d.
func (p Profile) scaled(d time.Duration) time.Duration {
	if p.TimeScale == 0 || p.TimeScale == 1 {
		return d
	}
	return time.Duration(float64(d) * p.TimeScale)
}

func (p Profile) retryAfter() time.Duration {
	if p.RetryAfter == 0 {
		return p.scaled(time.Second)
	}
	return p.scaled(p.RetryAfter)
}

// Outcome is what the simulator did with one call. The failure outcomes are named like the
// ErrorMix keys.
type Outcome string

// Outcomes.
const (
	OutcomeOK                Outcome = "ok"
	OutcomeRateLimited       Outcome = "rate_limited"
	OutcomeRateLimitedNoHint Outcome = "rate_limited_no_hint"
	OutcomeServerError       Outcome = "server_error"
	OutcomeOverloaded        Outcome = "overloaded"
	OutcomeReset             Outcome = "reset"
	OutcomeHang              Outcome = "hang"
	OutcomeErrorIn200        Outcome = "error_in_200"
	OutcomeMalformedJSON     Outcome = "malformed_json"
	OutcomeRefusal           Outcome = "refusal"
	OutcomeTruncated         Outcome = "truncated"
	OutcomeStreamCut         Outcome = "stream_cut"
	OutcomeStreamStall       Outcome = "stream_stall"
	// OutcomeContextLength and the outcomes after it come last in the mix's order, so that
	// adding them left the outcomes of existing seeded runs unchanged.
	OutcomeContextLength       Outcome = "context_length_exceeded"
	OutcomeContentFilter       Outcome = "content_filter"
	OutcomeContentFilterFinish Outcome = "content_filter_finish"
	OutcomeStreamNoDone        Outcome = "stream_no_done"
)

// valid reports whether o is an outcome the simulator knows.
func (o Outcome) valid() bool {
	if o == OutcomeOK {
		return true
	}
	for _, w := range (ErrorMix{}).weights() {
		if w.outcome == o {
			return true
		}
	}
	return false
}

type weighted struct {
	outcome Outcome
	p       float64
}

// weights lists the mix in a fixed order; the order is part of reproducibility, since a
// uniform draw is mapped to an outcome by walking it.
func (m ErrorMix) weights() []weighted {
	return []weighted{
		{OutcomeRateLimited, m.RateLimited},
		{OutcomeRateLimitedNoHint, m.RateLimitedNoHint},
		{OutcomeServerError, m.ServerError},
		{OutcomeOverloaded, m.Overloaded},
		{OutcomeReset, m.Reset},
		{OutcomeHang, m.Hang},
		{OutcomeErrorIn200, m.ErrorIn200},
		{OutcomeMalformedJSON, m.MalformedJSON},
		{OutcomeRefusal, m.Refusal},
		{OutcomeTruncated, m.Truncated},
		{OutcomeStreamCut, m.StreamCut},
		{OutcomeStreamStall, m.StreamStall},
		{OutcomeContextLength, m.ContextLengthExceeded},
		{OutcomeContentFilter, m.ContentFilter},
		{OutcomeContentFilterFinish, m.ContentFilterFinish},
		{OutcomeStreamNoDone, m.StreamNoDone},
	}
}

// pick maps a uniform draw u in [0, 1) to an outcome.
func (m ErrorMix) pick(u float64) Outcome {
	var cum float64
	for _, w := range m.weights() {
		cum += w.p
		if u < cum {
			return w.outcome
		}
	}
	return OutcomeOK
}

func (m ErrorMix) validate(path string) []string {
	var problems []string
	var sum float64
	for _, w := range m.weights() {
		if w.p < 0 || w.p > 1 {
			problems = append(problems, fmt.Sprintf("%s.%s: probability %g outside [0, 1]", path, w.outcome, w.p))
		}
		sum += w.p
	}
	// A little slack absorbs float rounding in hand-written mixes like 0.1 + 0.2 + 0.7.
	if sum > 1+1e-9 {
		problems = append(problems, fmt.Sprintf("%s: probabilities sum to %g, above 1", path, sum))
	}
	return problems
}
