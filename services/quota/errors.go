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
	// ErrExhausted: a bucket cannot cover the cost now; waiting helps. The concrete
	// error is an *ExhaustedError.
	ErrExhausted = errors.New("quota exhausted")
	// ErrRequestTooLarge: the cost exceeds a bucket's capacity; waiting cannot help. The
	// concrete error is a *TooLargeError.
	ErrRequestTooLarge = errors.New("request larger than the quota")
	// ErrReservationNotFound: the reservation does not exist, was settled already,
	// expired, or belongs to another tenant.
	ErrReservationNotFound = errors.New("reservation not found")
	// ErrTenantMismatch: the request names a tenant other than the authenticated one.
	ErrTenantMismatch = errors.New("quality.tenant does not match the authenticated tenant")
)

// ExhaustedError is a refusal that waiting RetryAfter will lift.
type ExhaustedError struct {
	// Bucket names the bucket that refused, for example "tenant:acme:tpm".
	Bucket string
	// Cost is what the request needed from that bucket.
	Cost int64
	// Remaining is what the bucket held.
	Remaining int64
	// RetryAfter is how long until the bucket can cover Cost, if nothing else takes
	// from it meanwhile.
	RetryAfter time.Duration
}

func (e *ExhaustedError) Error() string {
	return fmt.Sprintf("quota %s exhausted: needs %d, has %d; retry after %s", e.Bucket, e.Cost, e.Remaining, e.RetryAfter)
}

// Unwrap makes errors.Is(err, ErrExhausted) true.
func (e *ExhaustedError) Unwrap() error { return ErrExhausted }

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
