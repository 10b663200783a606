package quota

import (
	"errors"
	"fmt"

	"github.com/mantle-mesh/mantle/services/quota/internal/admission"
)

// Domain errors. Invalid requests are *rpc.ValidationError. server.go maps all of them
// to gRPC statuses in toStatus; callers of the domain branch with errors.Is and
// errors.As.
var (
	// ErrRequestTooLarge: the cost exceeds a bucket's capacity; waiting cannot help. The
	// concrete error is a *TooLargeError.
	errRequestTooLarge = errors.New("request larger than the quota")
	// ErrBudgetUnavailable: the tenant has a money budget and its state cannot be read
	// (Redis is unreachable). Money budgets fail closed.
	errBudgetUnavailable = errors.New("the money budget's state is unavailable; budgets fail closed")
	// ErrStoreUnavailable: the state a call needs cannot be reached, and there is no
	// local stand-in for it (settling a reservation held in an unreachable Redis).
	errStoreUnavailable = errors.New("quota state unavailable")
	// ErrPriceUnknown: the tenant has a money budget and the model has no price. The
	// concrete error is a *PriceUnknownError.
	errPriceUnknown = errors.New("no price for the model")
	// ErrShuttingDown: the replica stopped while the request waited.
	errShuttingDown = admission.ErrShuttingDown
)

// tooLargeError is a request that needs more than a bucket can ever hold.
type tooLargeError struct {
	// Bucket names the bucket, for example "tenant:acme:tpm".
	Bucket string
	// Field is the request field to change: input_tokens or messages when the input
	// alone is too large, max_output_tokens otherwise.
	Field string
	Cost  int64
	Limit int64
}

func (e *tooLargeError) Error() string {
	return fmt.Sprintf("request needs %d from %s, which holds at most %d", e.Cost, e.Bucket, e.Limit)
}

// Unwrap makes errors.Is(err, ErrRequestTooLarge) true.
func (e *tooLargeError) Unwrap() error { return errRequestTooLarge }

// priceUnknownError is a budgeted request for a model without a price.
type priceUnknownError struct {
	Model string
}

func (e *priceUnknownError) Error() string {
	return fmt.Sprintf("the tenant has a money budget and model %q has no price (budgets.prices, budgets.default_price)", e.Model)
}

// Unwrap makes errors.Is(err, ErrPriceUnknown) true.
func (e *priceUnknownError) Unwrap() error { return errPriceUnknown }
