package review

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/events"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/verifier/internal/rules"
)

// Subjects. The work queue lives outside mantle.events.> because a JetStream subject can
// belong to one stream only, and MANTLE_EVENTS owns mantle.events.>.
const (
	// SubjectRequests is the work-queue subject review requests are published on.
	SubjectRequests = "mantle.review.requests"
	// SubjectOpened announces a stored review (the ReviewRequestEvent, for dashboards).
	SubjectOpened = events.SubjectReview
	// SubjectDecision carries ReviewDecisionEvent.
	SubjectDecision = events.SubjectReview + ".decision"
	// SubjectTimeout carries ReviewTimeoutEvent.
	SubjectTimeout = events.SubjectReview + ".timeout"
	// SubjectDraftRule carries DraftRuleDecisionEvent.
	SubjectDraftRule = events.SubjectReview + ".draft_rule"
)

// Publisher sends an event without blocking (app.Publisher satisfies it).
type Publisher interface {
	Publish(ctx context.Context, subject string, msg proto.Message)
}

// RuleSink makes approved draft rules live. The verifier implements it with its rule
// engine; Approve must reject a rule that does not compile with the live set.
type RuleSink interface {
	Approve(ctx context.Context, r rules.Rule) error
	// Check compiles r on its own, before a draft is stored.
	Check(r rules.Rule) error
}

// Acker acknowledges the queue message of a review once its outcome is stored.
type Acker interface {
	Ack(ctx context.Context, reviewID string)
}

// ConflictError: the review is not in a state that allows the call.
type ConflictError struct{ Reason string }

func (e *ConflictError) Error() string { return e.Reason }

// RulesRejectedError: an approved draft rule does not compile with the live rule set.
type RulesRejectedError struct{ Err error }

func (e *RulesRejectedError) Error() string { return "rule rejected: " + e.Err.Error() }
func (e *RulesRejectedError) Unwrap() error { return e.Err }

// Config are the service's timings.
type Config struct {
	// Lease is how long a claim lasts when the reviewer asks for no particular length.
	Lease time.Duration
	// MaxLease bounds what a reviewer may ask for.
	MaxLease time.Duration
}

// Service is the review workbench. It is safe for concurrent use.
type Service struct {
	store  *Store
	cfg    Config
	clock  clockwork.Clock
	events Publisher
	rules  RuleSink
	log    *slog.Logger
	acker  atomic.Pointer[Acker]
}

// NewService builds a Service over store.
func NewService(cfg Config, store *Store, clock clockwork.Clock, pub Publisher, sink RuleSink, log *slog.Logger) *Service {
	return &Service{store: store, cfg: cfg, clock: clock, events: pub, rules: sink, log: log}
}

// SetAcker installs the queue that holds review messages (JetStream mode).
func (s *Service) SetAcker(a Acker) { s.acker.Store(&a) }

func (s *Service) ack(ctx context.Context, id string) {
	if a := s.acker.Load(); a != nil {
		(*a).Ack(ctx, id)
	}
}

// Open stores a new pending review. It is idempotent by id: when the review exists, the
// stored one is returned with created false.
func (s *Service) Open(ctx context.Context, r Review) (Review, bool, error) {
	r.State = StatePending
	if r.CreatedAt.IsZero() {
		r.CreatedAt = s.clock.Now()
	}
	stored, created, err := s.store.createReview(ctx, r)
	if err != nil || !created {
		return stored, false, err
	}
	s.audit(ctx, AuditEntry{At: s.clock.Now(), ReviewID: r.ID, Actor: SystemActor, Action: AuditCreated,
		Detail: fmt.Sprintf("reason=%s risk=%.2f due=%s", r.Reason, r.RiskScore, r.DueAt.UTC().Format(time.RFC3339))})
	s.events.Publish(ctx, SubjectOpened, ToEvent(r))
	return stored, true, nil
}

// audit appends an entry. The step it records has happened already, so a failure is logged
// rather than returned: the caller's state change must not be reported as failed.
func (s *Service) audit(ctx context.Context, e AuditEntry) {
	if err := s.store.appendAudit(ctx, e); err != nil {
		s.log.ErrorContext(ctx, "review audit entry not stored", "review_id", e.ReviewID, "action", e.Action, "err", err)
	}
}

// visible reports whether a caller limited to scope (a tenant; "" for operators) may see r.
func visible(scope string, r Review) bool { return scope == "" || scope == r.Tenant }

// Get returns a review as of now.
func (s *Service) Get(ctx context.Context, scope, id string) (Review, error) {
	r, _, err := s.store.getReview(ctx, id)
	if err != nil {
		return Review{}, err
	}
	if !visible(scope, r) {
		return Review{}, ErrNotFound
	}
	return r.view(s.clock.Now()), nil
}

// Filter selects reviews.
type Filter struct {
	// Scope limits to one tenant; "" is every tenant.
	Scope    string
	State    State
	Scenario string
}

// Page is a slice of a sorted listing: Token is an offset from a previous NextToken.
type Page struct {
	Size  int
	Token string
}

func (p Page) bounds(n int) (int, int, string, error) {
	size := cmp.Or(p.Size, 50)
	if size < 0 || size > 500 {
		return 0, 0, "", rpc.Invalid("page_size", "must be between 0 and 500, got %d", p.Size)
	}
	start := 0
	if p.Token != "" {
		v, err := strconv.Atoi(p.Token)
		if err != nil || v < 0 {
			return 0, 0, "", rpc.Invalid("page_token", "is not a token this service issued")
		}
		start = min(v, n)
	}
	end := min(start+size, n)
	next := ""
	if end < n {
		next = strconv.Itoa(end)
	}
	return start, end, next, nil
}

// List returns reviews matching f, ordered by deadline.
func (s *Service) List(ctx context.Context, f Filter, p Page) ([]Review, string, error) {
	all, err := s.store.listReviews(ctx)
	if err != nil {
		return nil, "", err
	}
	now := s.clock.Now()
	var out []Review
	for _, r := range all {
		r = r.view(now)
		if visible(f.Scope, r) && (f.State == "" || r.State == f.State) && (f.Scenario == "" || r.Scenario == f.Scenario) {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, byDeadline)
	start, end, next, err := p.bounds(len(out))
	if err != nil {
		return nil, "", err
	}
	return out[start:end], next, nil
}

func byDeadline(a, b Review) int {
	if c := a.DueAt.Compare(b.DueAt); c != 0 {
		return c
	}
	return strings.Compare(a.ID, b.ID)
}

// ClaimRequest asks for a lease on a review.
type ClaimRequest struct {
	Scope string
	// ID is the review; "" claims the pending review with the nearest deadline.
	ID       string
	Reviewer string
	Lease    time.Duration
	// Scenario limits the choice when ID is "".
	Scenario string
}

// Claim takes (or renews) a lease on a review for a reviewer.
func (s *Service) Claim(ctx context.Context, req ClaimRequest) (Review, error) {
	verr := &rpc.ValidationError{}
	if strings.TrimSpace(req.Reviewer) == "" {
		verr.Add("reviewer", "is required")
	}
	lease := cmp.Or(req.Lease, s.cfg.Lease)
	if lease < 0 || lease > s.cfg.MaxLease {
		verr.Add("lease", "must be between 0 and %s, got %s", s.cfg.MaxLease, req.Lease)
	}
	if err := verr.OrNil(); err != nil {
		return Review{}, err
	}
	if req.ID != "" {
		if _, err := s.Get(ctx, req.Scope, req.ID); err != nil {
			return Review{}, err
		}
		return s.claim(ctx, req.ID, req.Reviewer, lease)
	}
	pending, _, err := s.List(ctx, Filter{Scope: req.Scope, State: StatePending, Scenario: req.Scenario}, Page{Size: 500})
	if err != nil {
		return Review{}, err
	}
	now := s.clock.Now()
	for _, r := range pending {
		if !now.Before(r.DueAt) {
			continue // the sweeper is about to time it out
		}
		claimed, err := s.claim(ctx, r.ID, req.Reviewer, lease)
		var conflict *ConflictError
		if errors.As(err, &conflict) {
			continue // another reviewer was faster
		}
		return claimed, err
	}
	return Review{}, fmt.Errorf("%w: no pending review to claim", ErrNotFound)
}

func (s *Service) claim(ctx context.Context, id, reviewer string, lease time.Duration) (Review, error) {
	var detail string
	r, err := s.store.updateReview(ctx, id, func(r *Review) error {
		now := s.clock.Now()
		v := r.view(now)
		switch {
		case v.State.Final():
			return stopError{&ConflictError{Reason: fmt.Sprintf("review %s is %s", id, v.State)}}
		case !now.Before(r.DueAt):
			return stopError{&ConflictError{Reason: fmt.Sprintf("review %s passed its deadline %s; the default action applies", id, r.DueAt.UTC().Format(time.RFC3339))}}
		case v.State == StateClaimed && v.ClaimedBy != reviewer:
			return stopError{&ConflictError{Reason: fmt.Sprintf("review %s is claimed by %s until %s", id, v.ClaimedBy, v.LeaseUntil.UTC().Format(time.RFC3339))}}
		}
		detail = "lease until " + now.Add(lease).UTC().Format(time.RFC3339)
		switch {
		case v.State == StateClaimed:
			detail += " (renewed)"
		case r.State == StateClaimed:
			detail += fmt.Sprintf(" (the lease of %s had expired)", r.ClaimedBy)
		}
		r.State, r.ClaimedBy, r.LeaseUntil = StateClaimed, reviewer, now.Add(lease)
		return nil
	})
	if err != nil {
		return Review{}, unstop(err)
	}
	s.audit(ctx, AuditEntry{At: s.clock.Now(), ReviewID: id, Actor: reviewer, Action: AuditClaimed, Detail: detail})
	return r, nil
}

func unstop(err error) error {
	var stop stopError
	if errors.As(err, &stop) {
		return stop.err
	}
	return err
}

// DecideRequest is a reviewer's decision.
type DecideRequest struct {
	Scope            string
	ID               string
	Reviewer         string
	Verdict          Verdict
	RootCause        RootCause
	CorrectiveAction CorrectiveAction
	CorrectedContent string
	Note             string
	// Draft, when set, asks for a draft rule; its Action and ReviewID are filled in here.
	Draft *rules.Hint
}

var (
	verdicts    = []Verdict{VerdictApprove, VerdictReject, VerdictCorrect}
	rootCauses  = []RootCause{CauseNone, CauseKnowledgeCutoff, CauseContextTruncation, CauseTermMisread, CauseHallucination, CauseRuleViolation, CauseFormatError, CausePromptDefect, CauseOther}
	corrections = []CorrectiveAction{ActionNone, ActionAppendKnowledge, ActionAdjustPrompt, ActionBlockTokens, ActionAddRule, ActionRouteToFresherModel}
)

// Decide records the decision of the reviewer holding the claim, drafts a rule when asked,
// announces the decision and acknowledges the review's queue message.
func (s *Service) Decide(ctx context.Context, req DecideRequest) (Review, *DraftRule, error) {
	verr := &rpc.ValidationError{}
	if strings.TrimSpace(req.Reviewer) == "" {
		verr.Add("reviewer", "is required")
	}
	if !slices.Contains(verdicts, req.Verdict) {
		verr.Add("verdict", "want approve, reject or correct, got %q", req.Verdict)
	}
	if !slices.Contains(rootCauses, req.RootCause) {
		verr.Add("root_cause", "want one of %v, got %q", rootCauses, req.RootCause)
	}
	if !slices.Contains(corrections, req.CorrectiveAction) {
		verr.Add("corrective_action", "want one of %v, got %q", corrections, req.CorrectiveAction)
	}
	if req.Verdict == VerdictCorrect && strings.TrimSpace(req.CorrectedContent) == "" {
		verr.Add("corrected_content", "is required for the correct verdict")
	}
	if err := verr.OrNil(); err != nil {
		return Review{}, nil, err
	}
	current, err := s.Get(ctx, req.Scope, req.ID)
	if err != nil {
		return Review{}, nil, err
	}

	var draft *DraftRule
	if req.Draft != nil {
		if draft, err = s.draft(current, req); err != nil {
			return Review{}, nil, err
		}
	}
	r, err := s.store.updateReview(ctx, req.ID, func(r *Review) error {
		now := s.clock.Now()
		v := r.view(now)
		switch {
		case v.State.Final():
			return stopError{&ConflictError{Reason: fmt.Sprintf("review %s is already %s", req.ID, v.State)}}
		case !now.Before(r.DueAt):
			return stopError{&ConflictError{Reason: fmt.Sprintf("review %s passed its deadline; the default action applies", req.ID)}}
		case v.State != StateClaimed || v.ClaimedBy != req.Reviewer:
			return stopError{&ConflictError{Reason: fmt.Sprintf("%s holds no claim on review %s: claim it first", req.Reviewer, req.ID)}}
		}
		r.State, r.ClaimedBy, r.LeaseUntil = StateDecided, "", time.Time{}
		r.Decision = &Decision{
			Reviewer: req.Reviewer, Verdict: req.Verdict, RootCause: req.RootCause,
			CorrectiveAction: req.CorrectiveAction, CorrectedContent: req.CorrectedContent,
			Note: req.Note, DecidedAt: now,
		}
		if draft != nil {
			r.Decision.DraftRuleID = draft.ID
		}
		return nil
	})
	if err != nil {
		return Review{}, nil, unstop(err)
	}
	now := s.clock.Now()
	s.audit(ctx, AuditEntry{At: now, ReviewID: r.ID, Actor: req.Reviewer, Action: AuditDecided,
		Detail: fmt.Sprintf("verdict=%s root_cause=%s corrective_action=%s", req.Verdict, req.RootCause, req.CorrectiveAction)})
	s.events.Publish(ctx, SubjectDecision, decisionEvent(r))
	// The outcome is stored: only now may the queue forget the request.
	s.ack(ctx, r.ID)

	if draft != nil {
		draft.CreatedAt = now
		if err := s.store.createDraft(ctx, *draft); err != nil && !errors.Is(err, errExists) {
			return r, nil, fmt.Errorf("decision stored, but draft rule %s was not: %w", draft.ID, err)
		}
		s.audit(ctx, AuditEntry{At: now, ReviewID: r.ID, Actor: req.Reviewer, Action: AuditDraftCreated,
			DraftRuleID: draft.ID, Detail: draft.Rule.Condition + " -> " + string(draft.Rule.Action.Type)})
	}
	return r, draft, nil
}

// draft builds and checks the rule a decision asks for.
func (s *Service) draft(r Review, req DecideRequest) (*DraftRule, error) {
	action, ok := ruleAction[req.CorrectiveAction]
	if !ok {
		return nil, rpc.Invalid("draft_rule", "corrective action %q has no rule to draft", req.CorrectiveAction)
	}
	hint := *req.Draft
	hint.ReviewID, hint.Action, hint.Tenant = r.ID, action, r.Tenant
	if hint.Scenario == "" {
		hint.Scenario = r.Scenario
	}
	id := "draft-" + strings.ReplaceAll(r.ID, "_", "-")
	rule, err := rules.Draft(id, hint)
	if err == nil {
		err = s.rules.Check(rule)
	}
	if err != nil {
		return nil, rpc.Invalid("draft_rule", "%v", err)
	}
	return &DraftRule{ID: id, ReviewID: r.ID, Tenant: r.Tenant, Rule: rule, State: DraftProposed, CreatedBy: req.Reviewer}, nil
}

// Sweep times out every open review whose deadline has passed: the scenario's default
// action is recorded and announced, and the queue message acknowledged. It returns how many
// reviews it timed out. Replicas may sweep concurrently; compare-and-swap lets one win.
func (s *Service) Sweep(ctx context.Context) (int, error) {
	all, err := s.store.listReviews(ctx)
	if err != nil {
		return 0, err
	}
	now := s.clock.Now()
	n := 0
	for _, r := range all {
		if r.State.Final() || now.Before(r.DueAt) {
			continue
		}
		var holder string
		updated, err := s.store.updateReview(ctx, r.ID, func(r *Review) error {
			if r.State.Final() {
				return stopError{&ConflictError{Reason: "already final"}}
			}
			holder = r.view(now).ClaimedBy
			r.State, r.TimedOutAt, r.ClaimedBy, r.LeaseUntil = StateTimedOut, now, "", time.Time{}
			return nil
		})
		var conflict *ConflictError
		if errors.As(unstop(err), &conflict) {
			s.ack(ctx, r.ID)
			continue
		}
		if err != nil {
			return n, err
		}
		n++
		detail := "default action " + string(updated.Default.Type)
		if holder != "" {
			detail += "; claimed by " + holder
		}
		s.audit(ctx, AuditEntry{At: now, ReviewID: r.ID, Actor: SystemActor, Action: AuditTimedOut, Detail: detail})
		s.events.Publish(ctx, SubjectTimeout, &eventsv1.ReviewTimeoutEvent{
			At: timestamppb.New(now), ReviewId: updated.ID, RequestId: updated.RequestID, Tenant: updated.Tenant,
			Scenario: updated.Scenario, DueAt: timestamppb.New(updated.DueAt),
			DefaultAction: string(updated.Default.Type), DefaultActionText: updated.Default.Text, ClaimedBy: holder,
		})
		s.ack(ctx, r.ID)
	}
	return n, nil
}

// AuditFilter selects audit entries.
type AuditFilter struct {
	Scope    string
	ReviewID string
	Actor    string
}

// Audit lists the audit trail, oldest first.
func (s *Service) Audit(ctx context.Context, f AuditFilter, p Page) ([]AuditEntry, string, error) {
	switch {
	case strings.HasPrefix(f.ReviewID, ConfirmationPrefix):
		// Confirmations are the operators' alone (the RPCs say so); a tenant never sees
		// their trail.
		if f.Scope != "" {
			return nil, "", ErrNotFound
		}
		if _, err := s.GetConfirmation(ctx, "", f.ReviewID); err != nil {
			return nil, "", err
		}
	case f.ReviewID != "":
		if _, err := s.Get(ctx, f.Scope, f.ReviewID); err != nil {
			return nil, "", err
		}
	}
	entries, err := s.store.listAudit(ctx, f.ReviewID)
	if err != nil {
		return nil, "", err
	}
	var tenants map[string]string // review id -> tenant, for scoped callers
	if f.Scope != "" && f.ReviewID == "" {
		all, err := s.store.listReviews(ctx)
		if err != nil {
			return nil, "", err
		}
		tenants = make(map[string]string, len(all))
		for _, r := range all {
			tenants[r.ID] = r.Tenant
		}
	}
	out := entries[:0]
	for _, e := range entries {
		if (f.Actor == "" || e.Actor == f.Actor) && (tenants == nil || tenants[e.ReviewID] == f.Scope) {
			out = append(out, e)
		}
	}
	start, end, next, err := p.bounds(len(out))
	if err != nil {
		return nil, "", err
	}
	return out[start:end], next, nil
}

// Drafts lists draft rules, oldest first; state "" lists all.
func (s *Service) Drafts(ctx context.Context, scope string, state DraftState) ([]DraftRule, error) {
	all, err := s.store.listDrafts(ctx)
	if err != nil {
		return nil, err
	}
	out := all[:0]
	for _, d := range all {
		if (scope == "" || d.Tenant == scope) && (state == "" || d.State == state) {
			out = append(out, d)
		}
	}
	return out, nil
}

// ApprovedRules returns the rules of approved drafts, for loading at start.
func (s *Service) ApprovedRules(ctx context.Context) ([]rules.Rule, error) {
	drafts, err := s.Drafts(ctx, "", DraftApproved)
	if err != nil {
		return nil, err
	}
	out := make([]rules.Rule, 0, len(drafts))
	for _, d := range drafts {
		out = append(out, d.Rule)
	}
	return out, nil
}

// DraftDecision is a decision on a proposed draft rule.
type DraftDecision struct {
	ID       string
	Reviewer string
	Approve  bool
	// Widen, with Approve, drops the rule's tenant condition, so that it applies to every
	// tenant's answers, not only those of the tenant whose review drafted it.
	Widen bool
	// Operator is the operator key that made the call, for the audit trail and the event.
	Operator string
}

// DecideDraft approves (making the rule live) or rejects a proposed draft rule. Every
// decision is audited and announced (SubjectDraftRule); a widening is logged as well.
func (s *Service) DecideDraft(ctx context.Context, scope string, dec DraftDecision) (DraftRule, error) {
	if strings.TrimSpace(dec.Reviewer) == "" {
		return DraftRule{}, rpc.Invalid("reviewer", "is required")
	}
	if dec.Widen && !dec.Approve {
		return DraftRule{}, rpc.Invalid("widen", "only an approval can widen a rule")
	}
	d, rev, err := s.store.getDraft(ctx, dec.ID)
	if err != nil {
		return DraftRule{}, err
	}
	if scope != "" && d.Tenant != scope {
		return DraftRule{}, ErrNotFound
	}
	if d.State != DraftProposed {
		return DraftRule{}, &ConflictError{Reason: fmt.Sprintf("draft rule %s is already %s", dec.ID, d.State)}
	}
	if dec.Widen {
		wide, err := rules.Widen(d.Rule, d.Tenant)
		if err != nil {
			return DraftRule{}, rpc.Invalid("widen", "%v", err)
		}
		d.Rule, d.Widened = wide, true
	}
	action := AuditDraftRejected
	d.State = DraftRejected
	if dec.Approve {
		if err := s.rules.Approve(ctx, d.Rule); err != nil {
			return DraftRule{}, &RulesRejectedError{Err: err}
		}
		action, d.State = AuditDraftApproved, DraftApproved
	}
	d.DecidedBy, d.DecidedAt = dec.Reviewer, s.clock.Now()
	if err := s.store.updateDraft(ctx, d, rev); err != nil {
		if errors.Is(err, errRevision) {
			return DraftRule{}, &ConflictError{Reason: fmt.Sprintf("draft rule %s was decided concurrently", dec.ID)}
		}
		return DraftRule{}, err
	}
	detail := "for tenant " + d.Tenant
	if d.Widened {
		detail = "widened to every tenant (drafted for tenant " + d.Tenant + ")"
		s.log.WarnContext(ctx, "draft rule widened beyond its tenant: it now applies to every tenant's answers",
			"draft_rule_id", d.ID, "tenant", d.Tenant, "operator", dec.Operator, "reviewer", dec.Reviewer, "condition", d.Rule.Condition)
	}
	if dec.Operator != "" {
		detail += "; operator " + dec.Operator
	}
	s.audit(ctx, AuditEntry{At: d.DecidedAt, ReviewID: d.ReviewID, Actor: dec.Reviewer, Action: action, DraftRuleID: dec.ID, Detail: detail})
	s.events.Publish(ctx, SubjectDraftRule, &eventsv1.DraftRuleDecisionEvent{
		At: timestamppb.New(d.DecidedAt), DraftRuleId: d.ID, ReviewId: d.ReviewID, Tenant: d.Tenant,
		Reviewer: dec.Reviewer, Operator: dec.Operator, Approved: d.State == DraftApproved, Widened: d.Widened,
		Condition: d.Rule.Condition, Action: string(d.Rule.Action.Type),
	})
	return d, nil
}

// ToEvent converts a review to the ReviewRequestEvent that carries it on the queue.
func ToEvent(r Review) *eventsv1.ReviewRequestEvent {
	ev := &eventsv1.ReviewRequestEvent{
		At: timestamppb.New(r.CreatedAt), RequestId: r.RequestID, Tenant: r.Tenant, Scenario: r.Scenario,
		RiskScore: r.RiskScore, Reason: r.Reason, Content: r.Content, DueAt: timestamppb.New(r.DueAt),
		DefaultAction: string(r.Default.Type), DefaultActionText: r.Default.Text,
		ReviewId: r.ID, Question: r.Question, Model: r.Model, SessionId: r.SessionID, Signals: r.Signals,
		InputRisk: r.InputRisk, OutputRisk: r.OutputRisk, ContextRisk: r.ContextRisk,
	}
	if len(r.Quality) > 0 {
		q := &mantlev1.QualityContext{}
		if proto.Unmarshal(r.Quality, q) == nil {
			ev.Quality = q
		}
	}
	return ev
}

// FromEvent converts a queued ReviewRequestEvent back to a review.
func FromEvent(ev *eventsv1.ReviewRequestEvent) Review {
	r := Review{
		ID: ev.GetReviewId(), RequestID: ev.GetRequestId(), Tenant: ev.GetTenant(), Scenario: ev.GetScenario(),
		SessionID: ev.GetSessionId(), Model: ev.GetModel(), State: StatePending, Reason: ev.GetReason(),
		Signals: ev.GetSignals(), RiskScore: ev.GetRiskScore(), InputRisk: ev.GetInputRisk(),
		OutputRisk: ev.GetOutputRisk(), ContextRisk: ev.GetContextRisk(), Question: ev.GetQuestion(),
		Content: ev.GetContent(), CreatedAt: ev.GetAt().AsTime(), DueAt: ev.GetDueAt().AsTime(),
		Default: DefaultAction{Type: DefaultActionType(ev.GetDefaultAction()), Text: ev.GetDefaultActionText()},
	}
	if ev.GetQuality() != nil {
		r.Quality, _ = proto.Marshal(ev.GetQuality())
	}
	if r.ID == "" {
		r.ID = ID(r.Tenant, r.RequestID)
	}
	return r
}

func decisionEvent(r Review) *eventsv1.ReviewDecisionEvent {
	d := r.Decision
	return &eventsv1.ReviewDecisionEvent{
		At: timestamppb.New(d.DecidedAt), ReviewId: r.ID, RequestId: r.RequestID, Tenant: r.Tenant,
		Scenario: r.Scenario, Reviewer: d.Reviewer, Verdict: string(d.Verdict), RootCause: string(d.RootCause),
		CorrectiveAction: string(d.CorrectiveAction), CorrectedContent: d.CorrectedContent, Note: d.Note,
		DraftRuleId: d.DraftRuleID, DecidedAfter: durationpb.New(d.DecidedAt.Sub(r.CreatedAt)),
	}
}
