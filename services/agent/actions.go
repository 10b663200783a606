package agent

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// actionState is where an action's record is.
type actionState string

const (
	// actionRunning: claimed; the backend call is in flight (or its replica died).
	actionRunning actionState = "running"
	// actionDone: the action ran; result is recorded.
	actionDone actionState = "done"
	// actionUnknown: the outcome is unknown; a person confirms (confirmation id).
	actionUnknown actionState = "unknown"
)

// actionRecord is what the idempotency store keeps under an action's key.
type actionRecord struct {
	State actionState `json:"state"`
	// Fingerprint is a digest of the tool and its canonical arguments: the same key with
	// another call is refused.
	Fingerprint    string     `json:"fingerprint"`
	Tool           string     `json:"tool"`
	Started        time.Time  `json:"started"`
	Result         CallResult `json:"result,omitzero"`
	ConfirmationID string     `json:"confirmation_id,omitempty"`
	// Reason is why the outcome is unknown.
	Reason string `json:"reason,omitempty"`
	// Run counts the runs of the key: 1, and one more each time a person says the action
	// did not happen and it runs again. Each run's unknown outcome is its own confirmation.
	Run int `json:"run,omitempty"`
}

// errClaimed is claim's answer when the key already has a record.
var errClaimed = errors.New("idempotency key already claimed")

// actionStore keeps action records per tenant and key. A backend that cannot be reached
// returns an error wrapping ErrActionsUnavailable.
type actionStore interface {
	// claim creates rec under key when there is none; otherwise it returns the existing
	// record, its revision and errClaimed.
	claim(ctx context.Context, key string, rec actionRecord) (actionRecord, uint64, error)
	// update replaces the record at revision (0: whatever it is).
	update(ctx context.Context, key string, rec actionRecord, revision uint64) error
	// release deletes the record: the action did not run, its key is free again.
	release(ctx context.Context, key string) error
}

// Confirmation is an action whose outcome a person must confirm.
type Confirmation struct {
	Tenant, Tool, Arguments, IdempotencyKey, SessionID, StepID, RequestID, Reason string
	// Attempt names the run of the key (actionRecord.Run): after "not happened" the action
	// runs again, and an unknown outcome then is a new confirmation, not the decided one.
	Attempt string
}

// Decision is a person's answer about an action's outcome.
type Decision int

// Decisions about an action's outcome.
const (
	// DecisionPending: nobody decided yet.
	DecisionPending Decision = iota
	// DecisionHappened: the action ran (with Result, when the person gave one).
	DecisionHappened
	// DecisionNotHappened: the action did not run.
	DecisionNotHappened
)

// confirmer opens and reads "confirm outcome" reviews (the verifier's review queue).
type confirmer interface {
	open(ctx context.Context, c Confirmation) (id string, err error)
	get(ctx context.Context, tenant, id string) (d Decision, result string, err error)
}

// storeKey is the key of an action record: tenant-scoped, and a digest so that any
// caller key is a valid KV key.
func storeKey(tenant, key string) string {
	return "t." + tenant + "." + digest([]byte(key))[:40]
}

// backendKey is the Idempotency-Key the backend sees: a digest of tenant and key, so two
// tenants that chose the same key never meet at the backend.
func backendKey(tenant, key string) string {
	return "mantle-" + hex.EncodeToString([]byte(digest([]byte(tenant), []byte(key))[:32]))[:32]
}

// actionKey is the key a call runs under: the caller's, or one derived from its session
// and step. An action call with neither is refused: without a key, a repeat would run it
// twice.
func actionKey(req CallRequest) (string, error) {
	switch k := req.IdempotencyKey; {
	case k != "":
		if len(k) > 128 || strings.IndexFunc(k, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0 {
			return "", rpc.Invalid("idempotency_key", "want 1 to 128 printable ASCII characters without spaces")
		}
		return k, nil
	case req.SessionID != "" && req.StepID != "":
		return "session/" + req.SessionID + "/" + req.StepID, nil
	}
	return "", rpc.Invalid("idempotency_key", "required for action tools (or session_id and step_id, from which one is derived)")
}

// callAction runs an action at most once per key: claim, call once, record. An unknown
// outcome is confirmed by a person; a repeated key answers from the record.
func (t *Tools) callAction(ctx context.Context, _ *registry, tl *tool, req CallRequest, args, canonical []byte) (CallResult, error) {
	key, err := actionKey(req)
	if err != nil {
		return CallResult{}, err
	}
	fingerprint := digest([]byte(tl.cfg.Name), canonical)
	sk := storeKey(req.Tenant, key)
	now := t.clock.Now()
	rec, rev, err := t.actions.claim(ctx, sk, actionRecord{State: actionRunning, Fingerprint: fingerprint, Tool: tl.cfg.Name, Started: now, Run: 1})
	switch {
	case errors.Is(err, errClaimed):
		return t.repeated(ctx, tl, req, key, sk, fingerprint, rec, rev, args, canonical)
	case err != nil:
		return CallResult{}, fmt.Errorf("%w: %w", ErrActionsUnavailable, err)
	}
	return t.runAction(ctx, tl, req, key, sk, fingerprint, args, 1)
}

// runAction makes the one backend call of a claimed action and records its outcome.
func (t *Tools) runAction(ctx context.Context, tl *tool, req CallRequest, key, sk, fingerprint string, args []byte, run int) (CallResult, error) {
	started := t.clock.Now()
	res, at, err := t.attempt(ctx, tl, backendCall{args: args, idempotencyKey: backendKey(req.Tenant, key), requestID: req.RequestID})
	attempts := []Attempt{at}
	// The outcome is recorded even when the caller has gone: the action ran or may have.
	recordCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var ce *callError
	if err != nil && !errors.As(err, &ce) {
		// The caller went away mid-call: the outcome is unknown.
		ce = &callError{failure: failUnknown, outcome: "cancelled", err: err}
	}
	if ce == nil {
		result := CallResult{Result: res.result, Status: StatusOK, IsError: res.isError, IdempotencyKey: key, Attempts: attempts, Kind: KindAction, AnsweredBy: tl.cfg.Name}
		if err := t.actions.update(recordCtx, sk, actionRecord{State: actionDone, Fingerprint: fingerprint, Tool: tl.cfg.Name, Started: started, Result: result, Run: run}, 0); err != nil {
			// The action ran; only its record is missing. A repeat finds the claim
			// running and is told so rather than running it again.
			t.log.ErrorContext(ctx, "action ran but its record was not written", "tool", tl.cfg.Name, "err", err)
		}
		return result, nil
	}
	switch nextGear(situation{kind: KindAction, failure: ce.failure}) {
	case gearConfirm:
		return t.pendingConfirmation(recordCtx, tl, req, key, sk, fingerprint, started, run, attempts, ce.Error())
	default: // gearNotDone
		if err := t.actions.release(recordCtx, sk); err != nil {
			t.log.WarnContext(ctx, "claim of an action that did not run not released; its key stays taken until the record expires", "tool", tl.cfg.Name, "err", err)
		}
		return CallResult{}, &UnavailableError{Tool: tl.cfg.Name, Attempts: attempts, NotRun: true, Cause: ce}
	}
}

// pendingConfirmation opens the "confirm outcome" review of an action and records it.
// When the review cannot be opened now, the record says unknown without one, and the next
// call with the key opens it.
func (t *Tools) pendingConfirmation(ctx context.Context, tl *tool, req CallRequest, key, sk, fingerprint string, started time.Time, run int, attempts []Attempt, reason string) (CallResult, error) {
	id, err := t.confirm.open(ctx, Confirmation{
		Tenant: req.Tenant, Tool: tl.cfg.Name, Arguments: argsText(req.Arguments), IdempotencyKey: key,
		SessionID: req.SessionID, StepID: req.StepID, RequestID: req.RequestID, Reason: reason,
		Attempt: strconv.Itoa(run),
	})
	if err != nil {
		t.log.WarnContext(ctx, "confirmation review not opened yet; the next call with the key opens it", "tool", tl.cfg.Name, "err", err)
	}
	result := CallResult{Status: StatusPendingConfirmation, IdempotencyKey: key, ConfirmationID: id, Attempts: attempts, Kind: KindAction, AnsweredBy: tl.cfg.Name,
		Notice: "the outcome of this action is unknown; a person confirms whether it happened"}
	rec := actionRecord{State: actionUnknown, Fingerprint: fingerprint, Tool: tl.cfg.Name, Started: started, Result: result, ConfirmationID: id, Reason: reason, Run: run}
	if err := t.actions.update(ctx, sk, rec, 0); err != nil {
		t.log.ErrorContext(ctx, "outcome-unknown record not written; the claim stays running", "tool", tl.cfg.Name, "err", err)
	}
	t.metrics.confirmations.WithLabelValues(tl.cfg.Name).Inc()
	return result, nil
}

// repeated answers a call whose key already has a record.
func (t *Tools) repeated(ctx context.Context, tl *tool, req CallRequest, key, sk, fingerprint string, rec actionRecord, rev uint64, args, canonical []byte) (CallResult, error) {
	if rec.Fingerprint != fingerprint {
		return CallResult{}, fmt.Errorf("%w: %q ran a call of %s with other arguments; use a new key for a new call", ErrKeyReused, key, rec.Tool)
	}
	switch rec.State {
	case actionDone:
		res := rec.Result
		res.Status, res.Attempts = StatusReplayed, nil
		return res, nil
	case actionRunning:
		// A claim older than the tool's timeout (and a margin) belongs to a replica that
		// died mid-call: its outcome is unknown.
		if t.clock.Since(rec.Started) <= 2*tl.cfg.Timeout+10*time.Second {
			return CallResult{}, ErrActionInProgress
		}
		return t.pendingConfirmation(ctx, tl, req, key, sk, fingerprint, rec.Started, rec.Run, nil, "the call's replica stopped before recording its outcome")
	}
	// actionUnknown: ask the confirmation, opening it when that failed before.
	if rec.ConfirmationID == "" {
		return t.pendingConfirmation(ctx, tl, req, key, sk, fingerprint, rec.Started, rec.Run, nil, rec.Reason)
	}
	d, result, err := t.confirm.get(ctx, req.Tenant, rec.ConfirmationID)
	if err != nil {
		t.log.WarnContext(ctx, "confirmation not read; still pending", "tool", tl.cfg.Name, "confirmation", rec.ConfirmationID, "err", err)
		d = DecisionPending
	}
	switch d {
	case DecisionHappened:
		res := rec.Result
		res.Status, res.Result, res.Notice, res.Attempts = StatusReplayed, result, "a person confirmed that this action happened", nil
		if res.Result == "" {
			res.Result = "null"
		}
		done := actionRecord{State: actionDone, Fingerprint: fingerprint, Tool: tl.cfg.Name, Started: rec.Started, Result: res, ConfirmationID: rec.ConfirmationID, Run: rec.Run}
		if err := t.actions.update(ctx, sk, done, rev); err != nil {
			t.log.WarnContext(ctx, "confirmed outcome not recorded; the next repeat reads the review again", "err", err)
		}
		return res, nil
	case DecisionNotHappened:
		// The caller repeats an action a person says did not run: it runs now, once.
		run := rec.Run + 1
		if err := t.actions.update(ctx, sk, actionRecord{State: actionRunning, Fingerprint: fingerprint, Tool: tl.cfg.Name, Started: t.clock.Now(), Run: run}, rev); err != nil {
			if errors.Is(err, errClaimed) {
				return CallResult{}, ErrActionInProgress
			}
			return CallResult{}, fmt.Errorf("%w: %w", ErrActionsUnavailable, err)
		}
		return t.runAction(ctx, tl, req, key, sk, fingerprint, args, run)
	}
	res := rec.Result
	res.Attempts = nil
	return res, nil
}

// marshalRecord and unmarshalRecord are the stored form of a record.
func marshalRecord(rec actionRecord) ([]byte, error) { return json.Marshal(rec) }

func unmarshalRecord(b []byte) (actionRecord, error) {
	var rec actionRecord
	err := json.Unmarshal(b, &rec)
	return rec, err
}
