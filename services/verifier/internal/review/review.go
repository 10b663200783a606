package review

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/mantle-mesh/mantle/services/verifier/internal/rules"
)

// State is where a review is in its life.
type State string

// The states. The strings are stored, so they never change.
const (
	StatePending  State = "pending"
	StateClaimed  State = "claimed"
	StateDecided  State = "decided"
	StateTimedOut State = "timed_out"
)

// Final reports whether nothing more can happen to a review in state s.
func (s State) Final() bool { return s == StateDecided || s == StateTimedOut }

// Verdict is a reviewer's judgement of the answer.
type Verdict string

// The verdicts.
const (
	VerdictApprove Verdict = "approve"
	VerdictReject  Verdict = "reject"
	VerdictCorrect Verdict = "correct"
)

// RootCause is why an answer went wrong, from a fixed list so that causes
// can be counted.
type RootCause string

// The root causes.
const (
	CauseNone              RootCause = "none"
	CauseKnowledgeCutoff   RootCause = "knowledge_cutoff"
	CauseContextTruncation RootCause = "context_truncation"
	CauseTermMisread       RootCause = "term_misread"
	CauseHallucination     RootCause = "hallucination"
	CauseRuleViolation     RootCause = "rule_violation"
	CauseFormatError       RootCause = "format_error"
	CausePromptDefect      RootCause = "prompt_defect"
	CauseOther             RootCause = "other"
)

// CorrectiveAction is what a reviewer prescribes against a recurrence.
type CorrectiveAction string

// The corrective actions.
const (
	ActionNone                CorrectiveAction = "none"
	ActionAppendKnowledge     CorrectiveAction = "append_knowledge"
	ActionAdjustPrompt        CorrectiveAction = "adjust_prompt"
	ActionBlockTokens         CorrectiveAction = "block_tokens"
	ActionAddRule             CorrectiveAction = "add_rule"
	ActionRouteToFresherModel CorrectiveAction = "route_to_fresher_model"
)

// ruleAction is the L2 action a drafted rule gets for each corrective action.
var ruleAction = map[CorrectiveAction]rules.ActionType{
	ActionAppendKnowledge:     rules.ActionNotice,
	ActionAdjustPrompt:        rules.ActionReview, // keep a human on it until the prompt is fixed
	ActionBlockTokens:         rules.ActionMask,
	ActionAddRule:             rules.ActionBlock,
	ActionRouteToFresherModel: rules.ActionBlock, // a block sends the router to a fresher model
}

// DefaultActionType is what happens to an answer whose review timed out.
type DefaultActionType string

// The default actions.
const (
	// DefaultKeep: the answer stands.
	DefaultKeep DefaultActionType = "keep"
	// DefaultRetract: the answer is withdrawn (the business shows nothing or a generic text).
	DefaultRetract DefaultActionType = "retract"
	// DefaultReplace: the answer is replaced by the scenario's text (for example an FAQ list).
	DefaultReplace DefaultActionType = "replace"
)

// DefaultAction is a scenario's action on timeout.
type DefaultAction struct {
	// Type is keep (the delivered answer stands), retract or replace (needs text).
	Type DefaultActionType `json:"type" yaml:"type"`
	// Text replaces the answer when the type is replace.
	Text string `json:"text,omitempty" yaml:"text,omitempty"`
}

// Validate checks the action.
func (a DefaultAction) Validate() error {
	switch a.Type {
	case DefaultKeep, DefaultRetract:
		return nil
	case DefaultReplace:
		if a.Text == "" {
			return errors.New("text: required for replace")
		}
		return nil
	}
	return fmt.Errorf("type: want keep, retract or replace, got %q", a.Type)
}

// Review is one answer waiting for, or given, a human decision. It is stored as JSON.
type Review struct {
	ID          string    `json:"id"`
	RequestID   string    `json:"request_id"`
	Tenant      string    `json:"tenant"`
	Scenario    string    `json:"scenario"`
	SessionID   string    `json:"session_id,omitempty"`
	Model       string    `json:"model,omitempty"`
	State       State     `json:"state"`
	Reason      string    `json:"reason"`
	Signals     []string  `json:"signals,omitempty"`
	RiskScore   float64   `json:"risk_score"`
	InputRisk   float64   `json:"input_risk"`
	OutputRisk  float64   `json:"output_risk"`
	ContextRisk float64   `json:"context_risk"`
	Question    string    `json:"question"`
	Content     string    `json:"content"`
	CreatedAt   time.Time `json:"created_at"`
	DueAt       time.Time `json:"due_at"`
	// Default is the action taken if nobody decides by DueAt.
	Default DefaultAction `json:"default_action"`
	// Quality is the request's QualityContext in protobuf wire format.
	Quality    []byte    `json:"quality,omitempty"`
	ClaimedBy  string    `json:"claimed_by,omitempty"`
	LeaseUntil time.Time `json:"lease_until,omitzero"`
	Decision   *Decision `json:"decision,omitempty"`
	TimedOutAt time.Time `json:"timed_out_at,omitzero"`
}

// view returns the review as callers should see it at now: a claim whose lease has run out
// is pending again (the stored record changes at the next claim).
func (r Review) view(now time.Time) Review {
	if r.State == StateClaimed && !now.Before(r.LeaseUntil) {
		r.State = StatePending
		r.ClaimedBy = ""
		r.LeaseUntil = time.Time{}
	}
	return r
}

// Decision is what a reviewer concluded.
type Decision struct {
	Reviewer         string           `json:"reviewer"`
	Verdict          Verdict          `json:"verdict"`
	RootCause        RootCause        `json:"root_cause"`
	CorrectiveAction CorrectiveAction `json:"corrective_action"`
	CorrectedContent string           `json:"corrected_content,omitempty"`
	Note             string           `json:"note,omitempty"`
	DecidedAt        time.Time        `json:"decided_at"`
	DraftRuleID      string           `json:"draft_rule_id,omitempty"`
}

// AuditEntry is one thing that happened to a review or a draft rule.
type AuditEntry struct {
	At          time.Time `json:"at"`
	ReviewID    string    `json:"review_id"`
	Actor       string    `json:"actor"`
	Action      string    `json:"action"`
	Detail      string    `json:"detail,omitempty"`
	DraftRuleID string    `json:"draft_rule_id,omitempty"`
}

// Audit actions.
const (
	AuditCreated       = "created"
	AuditClaimed       = "claimed"
	AuditDecided       = "decided"
	AuditTimedOut      = "timed_out"
	AuditDraftCreated  = "draft_created"
	AuditDraftApproved = "draft_approved"
	AuditDraftRejected = "draft_rejected"
)

// SystemActor is the actor of automatic steps.
const SystemActor = "verifier"

// DraftState is where a drafted rule is in its approval.
type DraftState string

// The draft states.
const (
	DraftProposed DraftState = "proposed"
	DraftApproved DraftState = "approved"
	DraftRejected DraftState = "rejected"
)

// DraftRule is an L2 rule drafted from a decision, waiting for approval.
type DraftRule struct {
	ID        string     `json:"id"`
	ReviewID  string     `json:"review_id"`
	Tenant    string     `json:"tenant"`
	Rule      rules.Rule `json:"rule"`
	State     DraftState `json:"state"`
	CreatedBy string     `json:"created_by"`
	CreatedAt time.Time  `json:"created_at"`
	DecidedBy string     `json:"decided_by,omitempty"`
	DecidedAt time.Time  `json:"decided_at,omitzero"`
	// Widened: an operator approved the rule for every tenant, without its tenant
	// condition.
	Widened bool `json:"widened,omitempty"`
}

// ID returns the review id for a request: one review per request, so a second trigger (the
// L3 follow-up after a rule already opened one) finds the first instead of opening another.
func ID(tenant, requestID string) string {
	sum := sha256.Sum256([]byte(tenant + "\x00" + requestID))
	return "rv_" + hex.EncodeToString(sum[:12])
}
