package quota

import (
	"errors"
	"fmt"
	"time"
)

// Domain errors. Invalid requests are *rpc.ValidationError. server.go maps all of them
// to gRPC statuses in toStatus; callers of the domain branch with errors.Is and
// errors.As.
var (
	// ErrExhausted: a bucket, the budget or the queue cannot take the request now;
	// waiting helps. The concrete error is an *ExhaustedError.
	ErrExhausted = errors.New("quota exhausted")
	// ErrRequestTooLarge: the cost exceeds a bucket's capacity; waiting cannot help. The
	// concrete error is a *TooLargeError.
	ErrRequestTooLarge = errors.New("request larger than the quota")
	// ErrReservationNotFound: the reservation does not exist, was settled already,
	// expired, or belongs to another tenant.
	ErrReservationNotFound = errors.New("reservation not found")
	// ErrTenantMismatch: the request names a tenant other than the authenticated one.
	ErrTenantMismatch = errors.New("quality.tenant does not match the authenticated tenant")
	// ErrBudgetUnavailable: the tenant has a money budget and its state cannot be read
	// (Redis is unreachable). Money budgets fail closed.
	ErrBudgetUnavailable = errors.New("the money budget's state is unavailable; budgets fail closed")
	// ErrStoreUnavailable: the state a call needs cannot be reached, and there is no
	// local stand-in for it (settling a reservation held in an unreachable Redis).
	ErrStoreUnavailable = errors.New("quota state unavailable")
	// ErrPriceUnknown: the tenant has a money budget and the model has no price. The
	// concrete error is a *PriceUnknownError.
	ErrPriceUnknown = errors.New("no price for the model")
	// ErrShuttingDown: the replica stopped while the request waited.
	ErrShuttingDown = errors.New("quota service is shutting down")
)

// Causes of an ExhaustedError, as ErrorInfo metadata "cause" shows them.
const (
	CauseBucket    = "bucket"     // a rate bucket is short
	CauseBudget    = "budget"     // the daily money budget is spent
	CauseQueueFull = "queue_full" // no waiting room left
	CauseShed      = "shed"       // displaced from the queue by a higher priority
	CauseDeadline  = "deadline"   // the wait would outlast the caller's deadline
)

// ExhaustedError is a refusal that waiting RetryAfter may lift.
type ExhaustedError struct {
	// Bucket names the bucket that refused, for example "tenant:acme:tpm", or "queue".
	Bucket string
	// Cost is what the request needed from that bucket.
	Cost int64
	// Remaining is what the bucket held.
	Remaining int64
	// RetryAfter is how long until the bucket can cover Cost, if nothing else takes
	// from it meanwhile.
	RetryAfter time.Duration
	// Cause is one of the Cause constants; empty means CauseBucket.
	Cause string
	// Short names every enforced bucket that could not cover its part, Bucket included;
	// the queue keeps them for the waiting request, so that lower priorities do not take
	// what it waits for.
	Short []string
	// Waited is how long the request waited in the queue before it was refused.
	Waited time.Duration
}

func (e *ExhaustedError) Error() string {
	switch e.cause() {
	case CauseQueueFull:
		return "quota queue full"
	case CauseShed:
		return "displaced from the quota queue by a higher priority request"
	case CauseDeadline:
		return fmt.Sprintf("quota %s would not cover the request before the deadline; retry after %s", e.Bucket, e.RetryAfter)
	}
	return fmt.Sprintf("quota %s exhausted: needs %d, has %d; retry after %s", e.Bucket, e.Cost, e.Remaining, e.RetryAfter)
}

func (e *ExhaustedError) cause() string {
	if e.Cause == "" {
		return CauseBucket
	}
	return e.Cause
}

// Unwrap makes errors.Is(err, ErrExhausted) true.
func (e *ExhaustedError) Unwrap() error { return ErrExhausted }

// longestWait returns the refusal with the longest wait, naming every short bucket.
func longestWait(short []*ExhaustedError) *ExhaustedError {
	longest := short[0]
	names := make([]string, 0, len(short))
	for _, e := range short {
		if e.RetryAfter > longest.RetryAfter {
			longest = e
		}
		names = append(names, e.Bucket)
	}
	longest.Short = names
	return longest
}

// TooLargeError is a request that needs more than a bucket can ever hold.
type TooLargeError struct {
	// Bucket names the bucket, for example "tenant:acme:tpm".
	Bucket string
	// Field is the request field to change: input_tokens or messages when the input
	// alone is too large, max_output_tokens otherwise.
	Field string
	Cost  int64
	Limit int64
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("request needs %d from %s, which holds at most %d", e.Cost, e.Bucket, e.Limit)
}

// Unwrap makes errors.Is(err, ErrRequestTooLarge) true.
func (e *TooLargeError) Unwrap() error { return ErrRequestTooLarge }

// PriceUnknownError is a budgeted request for a model without a price.
type PriceUnknownError struct {
	Model string
}

func (e *PriceUnknownError) Error() string {
	return fmt.Sprintf("the tenant has a money budget and model %q has no price (budgets.prices, budgets.default_price)", e.Model)
}

// Unwrap makes errors.Is(err, ErrPriceUnknown) true.
func (e *PriceUnknownError) Unwrap() error { return ErrPriceUnknown }
