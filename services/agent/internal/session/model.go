package session

import (
	"time"
)

// Kind is what a step calls.
type Kind string

// Step kinds.
const (
	KindModel Kind = "model"
	KindTool  Kind = "tool"
)

// StepStatus is where a step is, and what its result is worth.
type StepStatus string

// Step statuses.
const (
	// StatusRunning: begun, not ended.
	StatusRunning StepStatus = "running"
	// StatusDone: completed with a fresh result.
	StatusDone StepStatus = "done"
	// StatusDegraded: completed by a fallback (another model, a backup tool, a ladder level).
	StatusDegraded StepStatus = "degraded"
	// StatusStale: completed with a tool's last good result, which may be out of date.
	StatusStale StepStatus = "stale"
	// StatusSkipped: not run, because the session ended first.
	StatusSkipped StepStatus = "skipped"
	// StatusPendingConfirmation: an action whose outcome a person must confirm.
	StatusPendingConfirmation StepStatus = "pending_confirmation"
	// StatusFailed: failed; Reason says why.
	StatusFailed StepStatus = "failed"
	// StatusCancelled: cancelled with its session while it ran.
	StatusCancelled StepStatus = "cancelled"
)

// completed reports whether a step with this status has a result the agent can use, so
// that beginning it again replays it.
func (s StepStatus) completed() bool {
	return s == StatusDone || s == StatusDegraded || s == StatusStale
}

// endable reports whether EndStep may set this status.
func (s StepStatus) endable() bool {
	switch s {
	case StatusDone, StatusDegraded, StatusStale, StatusPendingConfirmation, StatusFailed, StatusCancelled:
		return true
	}
	return false
}

// State is where a session is in its life.
type State string

// Session states.
const (
	StateActive    State = "active"
	StateCompleted State = "completed"
	StateCancelled State = "cancelled"
	// StateEndedPartial: a budget ran out or a required step failed; the steps recorded
	// are the partial result.
	StateEndedPartial State = "ended_partial"
)

// End reasons (Session.EndReason).
const (
	EndCompleted          = "completed"
	EndCancelled          = "cancelled"
	EndDeadline           = "deadline"
	EndTokens             = "tokens"
	EndCost               = "cost"
	EndSteps              = "steps"
	EndRequiredStepFailed = "required_step_failed"
)

// Tool kinds, as the tool registry names them (Step.ToolKind). Actions in flight when a
// session is cancelled are marked for confirmation; other steps are cancelled.
const (
	ToolQuery    = "query"
	ToolAction   = "action"
	ToolExternal = "external"
)

// Budget bounds a session. Every field is positive once the session exists: a request
// that leaves one at zero gets the configured default.
type Budget struct {
	// Deadline is the session's wall-clock time from its first step.
	Deadline time.Duration `json:"deadline"`
	// Tokens bounds model tokens (input and output) over every step.
	Tokens int64 `json:"tokens"`
	// CostUSD bounds money over every step.
	CostUSD float64 `json:"cost_usd"`
	// Steps bounds the steps begun (replays are not counted).
	Steps int `json:"steps"`
}

// Left is what is left of a session's budget; a step runs under it.
type Left struct {
	Time    time.Duration
	Tokens  int64
	CostUSD float64
	Steps   int
}

// Step is one step of a session.
type Step struct {
	ID     string     `json:"id"`
	Kind   Kind       `json:"kind"`
	Status StepStatus `json:"status"`
	// Target is the model or tool the step called; AnsweredBy the one that answered.
	Target     string `json:"target,omitempty"`
	AnsweredBy string `json:"answered_by,omitempty"`
	// Required: a failure of the step ends the session with a partial result.
	Required bool `json:"required,omitempty"`
	// Fingerprint is a digest of the step's request: a step id reused for another request
	// is refused.
	Fingerprint string `json:"fingerprint,omitempty"`
	// ResultKey names the store key of the recorded result ("" when none was recorded).
	ResultKey string `json:"result_key,omitempty"`
	// ResultBytes is the recorded result's size, counted against the session's bound.
	ResultBytes int `json:"result_bytes,omitempty"`
	// RecordTooLarge: the step completed, but its result was over the bound and was not
	// recorded; beginning the step again runs it again.
	RecordTooLarge bool   `json:"record_too_large,omitempty"`
	Reason         string `json:"reason,omitempty"`
	// For a tool step: the tool's kind, the action's idempotency key and its open
	// confirmation, and the age of a stale result.
	ToolKind       string        `json:"tool_kind,omitempty"`
	IdempotencyKey string        `json:"idempotency_key,omitempty"`
	ConfirmationID string        `json:"confirmation_id,omitempty"`
	StaleAge       time.Duration `json:"stale_age,omitempty"`
	Tokens         int64         `json:"tokens,omitempty"`
	CostUSD        float64       `json:"cost_usd,omitempty"`
	// Attempts counts the times the step was run (begun without a replay).
	Attempts  int       `json:"attempts"`
	StartedAt time.Time `json:"started_at"`
	EndedAt   time.Time `json:"ended_at,omitzero"`
	// LeaseUntil is when a running step is presumed abandoned (its runner died): then the
	// step may be begun again. It is the runner's deadline, within the session's.
	LeaseUntil time.Time `json:"lease_until,omitzero"`
	// Result is the recorded result, loaded from ResultKey on a replay or when asked for;
	// it is never part of the session's own record.
	Result []byte `json:"-"`
}

// live reports whether the step is running under a lease that has not run out.
func (st *Step) live(now time.Time) bool {
	return st.Status == StatusRunning && now.Before(st.LeaseUntil)
}

// Session is an agent session: its budget and usage, its steps and its degradation state.
type Session struct {
	ID     string `json:"id"`
	Tenant string `json:"tenant"`
	State  State  `json:"state"`
	// EndReason says why an ended session ended (End* constants).
	EndReason string `json:"end_reason,omitempty"`
	Budget    Budget `json:"budget"`
	// Usage charged so far.
	Tokens     int64   `json:"tokens"`
	CostUSD    float64 `json:"cost_usd"`
	StepsBegun int     `json:"steps_begun"`
	// ResultBytes is the size of every result recorded, bounded by the configuration.
	ResultBytes int `json:"result_bytes"`
	// Steps in the order they began.
	Steps []*Step `json:"steps"`
	// Sticky degradation: the session serves its degraded form until DegradedUntil, then
	// one step (ProbeStep) tries the full form; its outcome recovers the session or keeps
	// it degraded for another recovery interval.
	Degraded      bool      `json:"degraded,omitempty"`
	DegradedUntil time.Time `json:"degraded_until,omitzero"`
	ProbeStep     string    `json:"probe_step,omitempty"`
	// Degradations counts the times the session degraded (a first degradation, and every
	// recovery probe that degraded again); from the configured count on, its action tools
	// need confirmation.
	Degradations            int       `json:"degradations,omitempty"`
	ActionsNeedConfirmation bool      `json:"actions_need_confirmation,omitempty"`
	CreatedAt               time.Time `json:"created_at"`
	UpdatedAt               time.Time `json:"updated_at"`
	EndedAt                 time.Time `json:"ended_at,omitzero"`
}

// step returns the step with the id, or nil.
func (s *Session) step(id string) *Step {
	for _, st := range s.Steps {
		if st.ID == id {
			return st
		}
	}
	return nil
}

// active reports whether the session still takes steps.
func (s *Session) active() bool { return s.State == StateActive }

// deadline is when the session's time budget runs out.
func (s *Session) deadline() time.Time { return s.CreatedAt.Add(s.Budget.Deadline) }

// Left is what is left of the budget at now.
func (s *Session) Left(now time.Time) Left { return s.left(now) }

// left is what is left of the budget at now.
func (s *Session) left(now time.Time) Left {
	return Left{
		Time:    s.deadline().Sub(now),
		Tokens:  s.Budget.Tokens - s.Tokens,
		CostUSD: s.Budget.CostUSD - s.CostUSD,
		Steps:   s.Budget.Steps - s.StepsBegun,
	}
}

// exhausted names the first budget that has run out at now, or "" when none has. Steps
// count only when a new step is about to begin (newStep).
func (s *Session) exhausted(now time.Time, newStep bool) string {
	l := s.left(now)
	switch {
	case l.Time <= 0:
		return EndDeadline
	case l.Tokens <= 0:
		return EndTokens
	case l.CostUSD <= 0:
		return EndCost
	case newStep && l.Steps <= 0:
		return EndSteps
	}
	return ""
}

// end moves an active session to state with reason. Steps still running are cancelled,
// except running actions, whose outcome nobody knows: a person confirms them.
func (s *Session) end(now time.Time, state State, reason string) {
	if !s.active() {
		return
	}
	s.State, s.EndReason, s.EndedAt = state, reason, now
	for _, st := range s.Steps {
		if st.Status != StatusRunning {
			continue
		}
		st.EndedAt = now
		if st.Kind == KindTool && st.ToolKind == ToolAction {
			st.Status = StatusPendingConfirmation
			st.Reason = "the session ended while the action ran: its outcome needs a person's confirmation"
			continue
		}
		st.Status = StatusCancelled
		st.Reason = "the session ended (" + reason + ") while the step ran"
	}
}

// clone returns a deep copy of the session's record (results are not copied: they are
// not part of it).
func (s *Session) clone() *Session {
	c := *s
	c.Steps = make([]*Step, len(s.Steps))
	for i, st := range s.Steps {
		sc := *st
		c.Steps[i] = &sc
	}
	return &c
}
