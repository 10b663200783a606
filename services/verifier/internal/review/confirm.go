package review

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// ConfirmState is where a "confirm outcome" review is. The strings are stored.
type ConfirmState string

// The confirmation states.
const (
	ConfirmPending     ConfirmState = "pending"
	ConfirmHappened    ConfirmState = "happened"
	ConfirmNotHappened ConfirmState = "not_happened"
)

// Bounds of a confirmation's fields. Texts the agent saw (arguments, reason) are cut with
// a marker, so that a confirmation is always opened; what a person writes is refused
// when too long.
const (
	maxConfirmName      = 128
	maxConfirmID        = 512
	maxConfirmArguments = 16 << 10
	maxConfirmReason    = 2 << 10
	// MaxConfirmResult bounds the result a person records with "happened".
	MaxConfirmResult = 64 << 10
	maxConfirmNote   = 4 << 10
)

// Confirmation is an action tool call whose outcome is unknown (the agent saw a timeout
// or a reset): a person confirms whether it happened. It lives in the review store beside
// the reviews, with the same retention, and its steps go to the same audit trail.
type Confirmation struct {
	ID             string       `json:"id"`
	Tenant         string       `json:"tenant"`
	Tool           string       `json:"tool"`
	IdempotencyKey string       `json:"idempotency_key"`
	SessionID      string       `json:"session_id,omitempty"`
	StepID         string       `json:"step_id,omitempty"`
	RequestID      string       `json:"request_id,omitempty"`
	Attempt        string       `json:"attempt"`
	Arguments      string       `json:"arguments,omitempty"`
	Reason         string       `json:"reason,omitempty"`
	State          ConfirmState `json:"state"`
	Result         string       `json:"result,omitempty"`
	DecidedBy      string       `json:"decided_by,omitempty"`
	Note           string       `json:"note,omitempty"`
	CreatedAt      time.Time    `json:"created_at"`
	DecidedAt      time.Time    `json:"decided_at,omitzero"`
}

// ConfirmationPrefix starts every confirmation id.
const ConfirmationPrefix = "cf_"

// ConfirmationID is the id of one run of a tenant's key: opening it again finds it.
func ConfirmationID(tenant, key, attempt string) string {
	sum := sha256.Sum256([]byte(tenant + "\x00" + key + "\x00" + attempt))
	return ConfirmationPrefix + hex.EncodeToString(sum[:12])
}

const confirmPrefix = "confirm."

// OpenConfirmation stores a pending confirmation of c (its ID, state and times are set
// here). It is idempotent: when the confirmation exists, the stored one is returned with
// created false.
func (s *Service) OpenConfirmation(ctx context.Context, c Confirmation) (Confirmation, bool, error) {
	verr := &rpc.ValidationError{}
	for _, f := range []struct {
		name, value string
		max         int
	}{
		{"tenant", c.Tenant, maxConfirmName}, {"tool", c.Tool, maxConfirmName},
		{"idempotency_key", c.IdempotencyKey, maxConfirmID}, {"attempt", c.Attempt, maxConfirmID},
	} {
		switch {
		case f.value == "":
			verr.Add(f.name, "is required")
		case len(f.value) > f.max:
			verr.Add(f.name, "at most %d bytes, got %d", f.max, len(f.value))
		}
	}
	for _, f := range []struct{ name, value string }{{"session_id", c.SessionID}, {"step_id", c.StepID}, {"request_id", c.RequestID}} {
		if len(f.value) > maxConfirmID {
			verr.Add(f.name, "at most %d bytes, got %d", maxConfirmID, len(f.value))
		}
	}
	if err := verr.OrNil(); err != nil {
		return Confirmation{}, false, err
	}
	c.ID = ConfirmationID(c.Tenant, c.IdempotencyKey, c.Attempt)
	c.Arguments = truncateText(c.Arguments, maxConfirmArguments)
	c.Reason = truncateText(c.Reason, maxConfirmReason)
	c.State, c.Result, c.DecidedBy, c.Note, c.DecidedAt = ConfirmPending, "", "", "", time.Time{}
	c.CreatedAt = s.clock.Now()
	stored, created, err := createJSON(ctx, s.store.kv, confirmPrefix+c.ID, c)
	if err != nil {
		return Confirmation{}, false, err
	}
	if created {
		s.audit(ctx, AuditEntry{At: c.CreatedAt, ReviewID: c.ID, Actor: SystemActor, Action: AuditCreated,
			Detail: fmt.Sprintf("confirm outcome: tenant=%s tool=%s key=%s: %s", c.Tenant, c.Tool, c.IdempotencyKey, c.Reason)})
		s.log.InfoContext(ctx, "action outcome unknown: confirmation opened", "confirmation_id", c.ID, "tenant", c.Tenant, "tool", c.Tool)
	}
	return stored, created, nil
}

// GetConfirmation returns a confirmation; scope ("" for every tenant) limits it to one
// tenant's, as reviews are.
func (s *Service) GetConfirmation(ctx context.Context, scope, id string) (Confirmation, error) {
	c, _, err := getJSON[Confirmation](ctx, s.store.kv, confirmPrefix+id)
	if err != nil {
		return Confirmation{}, err
	}
	if scope != "" && c.Tenant != scope {
		return Confirmation{}, ErrNotFound
	}
	return c, nil
}

// ConfirmFilter selects confirmations.
type ConfirmFilter struct {
	Tenant string
	State  ConfirmState
}

// ListConfirmations lists confirmations, oldest first.
func (s *Service) ListConfirmations(ctx context.Context, f ConfirmFilter, p Page) ([]Confirmation, string, error) {
	keys, err := s.store.kv.Keys(ctx, confirmPrefix)
	if err != nil {
		return nil, "", err
	}
	out := make([]Confirmation, 0, len(keys))
	for _, k := range keys {
		c, _, err := getJSON[Confirmation](ctx, s.store.kv, k)
		if errors.Is(err, ErrNotFound) {
			continue // expired between listing and reading
		}
		if err != nil {
			return nil, "", err
		}
		if (f.Tenant == "" || c.Tenant == f.Tenant) && (f.State == "" || c.State == f.State) {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b Confirmation) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	start, end, next, err := p.bounds(len(out))
	if err != nil {
		return nil, "", err
	}
	return out[start:end], next, nil
}

// ConfirmDecision is a person's answer about an action's outcome.
type ConfirmDecision struct {
	ID       string
	Reviewer string
	// State is ConfirmHappened or ConfirmNotHappened.
	State  ConfirmState
	Result string
	Note   string
}

// DecideConfirmation records a decision. A decision is final: the agent may already have
// answered by it (returned the result, or run the action again).
func (s *Service) DecideConfirmation(ctx context.Context, d ConfirmDecision) (Confirmation, error) {
	verr := &rpc.ValidationError{}
	if strings.TrimSpace(d.Reviewer) == "" {
		verr.Add("reviewer", "is required")
	} else if len(d.Reviewer) > maxConfirmName {
		verr.Add("reviewer", "at most %d bytes, got %d", maxConfirmName, len(d.Reviewer))
	}
	switch d.State {
	case ConfirmHappened:
		if len(d.Result) > MaxConfirmResult {
			verr.Add("result", "at most %d bytes, got %d", MaxConfirmResult, len(d.Result))
		}
	case ConfirmNotHappened:
		if d.Result != "" {
			verr.Add("result", "only a decision that the action happened has a result")
		}
	default:
		verr.Add("decision", "want happened or not_happened, got %q", d.State)
	}
	if len(d.Note) > maxConfirmNote {
		verr.Add("note", "at most %d bytes, got %d", maxConfirmNote, len(d.Note))
	}
	if err := verr.OrNil(); err != nil {
		return Confirmation{}, err
	}
	key := confirmPrefix + d.ID
	for attempt := 0; ; attempt++ {
		c, rev, err := getJSON[Confirmation](ctx, s.store.kv, key)
		if err != nil {
			return Confirmation{}, err
		}
		if c.State != ConfirmPending {
			return Confirmation{}, &ConflictError{Reason: fmt.Sprintf("confirmation %s is already decided: %s", d.ID, c.State)}
		}
		c.State, c.Result, c.Note, c.DecidedBy, c.DecidedAt = d.State, d.Result, d.Note, d.Reviewer, s.clock.Now()
		err = updateJSON(ctx, s.store.kv, key, c, rev)
		if errors.Is(err, errRevision) && attempt < 8 {
			continue
		}
		if err != nil {
			return Confirmation{}, fmt.Errorf("update confirmation %s: %w", d.ID, err)
		}
		s.audit(ctx, AuditEntry{At: c.DecidedAt, ReviewID: c.ID, Actor: d.Reviewer, Action: AuditDecided,
			Detail: fmt.Sprintf("confirm outcome: %s (tenant=%s tool=%s key=%s)", c.State, c.Tenant, c.Tool, c.IdempotencyKey)})
		s.log.InfoContext(ctx, "action outcome confirmed", "confirmation_id", c.ID, "tenant", c.Tenant, "tool", c.Tool,
			"decision", string(c.State), "reviewer", d.Reviewer)
		return c, nil
	}
}
