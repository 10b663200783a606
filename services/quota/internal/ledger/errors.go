package ledger

import (
	"errors"
	"fmt"
	"time"
)

// Refusals a store returns; callers branch with errors.Is and errors.As.
var (
	// ErrExhausted: a bucket, the budget or the queue cannot take the request now;
	// waiting helps. The concrete error is an *ExhaustedError.
	ErrExhausted = errors.New("quota exhausted")
	// ErrReservationNotFound: the reservation does not exist, was settled already,
	// expired, or belongs to another tenant.
	ErrReservationNotFound = errors.New("reservation not found")
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
	switch e.EffectiveCause() {
	case CauseQueueFull:
		return "quota queue full"
	case CauseShed:
		return "displaced from the quota queue by a higher priority request"
	case CauseDeadline:
		return fmt.Sprintf("quota %s would not cover the request before the deadline; retry after %s", e.Bucket, e.RetryAfter)
	}
	return fmt.Sprintf("quota %s exhausted: needs %d, has %d; retry after %s", e.Bucket, e.Cost, e.Remaining, e.RetryAfter)
}

// EffectiveCause is Cause, or CauseBucket when Cause is empty.
func (e *ExhaustedError) EffectiveCause() string {
	if e.Cause == "" {
		return CauseBucket
	}
	return e.Cause
}

// Unwrap makes errors.Is(err, ErrExhausted) true.
func (e *ExhaustedError) Unwrap() error { return ErrExhausted }

// LongestWait returns the refusal with the longest wait, naming every short bucket.
func LongestWait(short []*ExhaustedError) *ExhaustedError {
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
