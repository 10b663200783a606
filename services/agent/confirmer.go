package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/pkg/jsonfield"
)

// confirmTimeout bounds one call to the verifier: a verifier that does not answer leaves
// the action pending, it never holds the caller.
const confirmTimeout = 5 * time.Second

// verifierConfirmer opens and reads "confirm outcome" reviews in the verifier's review
// queue over gRPC (service plane: this module's service identity, never a tenant key).
type verifierConfirmer struct {
	client verifierv1.VerifierServiceClient
}

func (v verifierConfirmer) open(ctx context.Context, c Confirmation) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, confirmTimeout)
	defer cancel()
	resp, err := v.client.OpenConfirmation(ctx, &verifierv1.OpenConfirmationRequest{
		Tenant: c.Tenant, Tool: c.Tool, IdempotencyKey: c.IdempotencyKey, SessionId: c.SessionID,
		StepId: c.StepID, RequestId: c.RequestID, Arguments: c.Arguments, Reason: c.Reason, Attempt: c.Attempt,
	})
	if err != nil {
		return "", fmt.Errorf("open confirmation: %w", err)
	}
	if resp.GetConfirmation().GetId() == "" {
		return "", fmt.Errorf("open confirmation: the verifier answered without an id")
	}
	return resp.GetConfirmation().GetId(), nil
}

func (v verifierConfirmer) get(ctx context.Context, tenant, id string) (Decision, string, error) {
	ctx, cancel := context.WithTimeout(ctx, confirmTimeout)
	defer cancel()
	resp, err := v.client.GetConfirmation(ctx, &verifierv1.GetConfirmationRequest{ConfirmationId: id, Tenant: tenant})
	if err != nil {
		return DecisionPending, "", fmt.Errorf("read confirmation %s: %w", id, err)
	}
	c := resp.GetConfirmation()
	switch c.GetState() {
	case verifierv1.ConfirmationState_CONFIRMATION_STATE_HAPPENED:
		return DecisionHappened, resultJSON(c.GetResult()), nil
	case verifierv1.ConfirmationState_CONFIRMATION_STATE_NOT_HAPPENED:
		return DecisionNotHappened, "", nil
	}
	return DecisionPending, "", nil
}

// resultJSON is the result a person recorded, as a tool result: JSON as given, other
// text as a JSON string, nothing as "" (the caller answers null).
func resultJSON(s string) string {
	if s == "" || jsonfield.Valid([]byte(s)) {
		return s
	}
	quoted, _ := json.Marshal(s) // a string always marshals
	return string(quoted)
}
