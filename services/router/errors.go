package router

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// errorDomain is the ErrorInfo domain of router errors.
const errorDomain = "router.mantle"

// ErrorInfo reasons documented in router.proto.
const (
	ReasonUnknownRoute        = "UNKNOWN_ROUTE"
	ReasonContentFiltered     = "CONTENT_FILTERED"
	ReasonUpstreamRejected    = "UPSTREAM_REJECTED"
	ReasonAllCandidatesFailed = "ALL_CANDIDATES_FAILED"
	// ReasonUpstreamRateLimited: every candidate's provider keys are rate limited; the
	// RetryInfo says when the first is free again.
	ReasonUpstreamRateLimited = "UPSTREAM_RATE_LIMITED"
	ReasonDeadlineExceeded    = "DEADLINE_EXCEEDED"
	ReasonOverloaded          = rpc.ReasonOverloaded
)

// failedRequest is a request that ended in an error, with its QualityContext: the attempts
// and the audit trail go back to the caller as a status detail, so "why did this fail"
// is answered in the response itself.
type failedRequest struct {
	err     error
	quality *mantlev1.QualityContext
}

func (e *failedRequest) Error() string { return e.err.Error() }
func (e *failedRequest) Unwrap() error { return e.err }

// maxDetailBytes bounds the QualityContext a status carries. Status details travel in a
// trailer, and some gRPC clients refuse metadata over 8 KiB (grpc-java's default); the
// detail is base64 there, so 4 KiB of message is about 5.5 KiB of header.
const maxDetailBytes = 4 << 10

// detailQuality is qc as a status detail: whole when it fits in maxDetailBytes, else
// without the audit trail, else without the attempts too.
func detailQuality(qc *mantlev1.QualityContext) *mantlev1.QualityContext {
	if proto.Size(qc) <= maxDetailBytes {
		return qc
	}
	trimmed := proto.CloneOf(qc)
	trimmed.Audit = nil
	if proto.Size(trimmed) > maxDetailBytes {
		trimmed.Attempts = nil
	}
	return trimmed
}

// FailedQuality returns the QualityContext a failed request carries, from a router error
// or from its gRPC status details; nil when there is none.
func FailedQuality(err error) *mantlev1.QualityContext {
	var failed *failedRequest
	if errors.As(err, &failed) {
		return failed.quality
	}
	if st, ok := status.FromError(err); ok {
		for _, d := range st.Details() {
			if qc, ok := d.(*mantlev1.QualityContext); ok {
				return qc
			}
		}
	}
	return nil
}

// unknownRouteError is a model name that is neither a model nor a route.
type unknownRouteError struct{ name string }

func (e *unknownRouteError) Error() string { return fmt.Sprintf("unknown model or route %q", e.name) }

// rejectedError is a failure that no other candidate could fix (bad request, content
// filter): retrying elsewhere would only spend money.
type rejectedError struct {
	class mantlev1.ErrorClass
	cause error
}

func (e *rejectedError) Error() string { return e.cause.Error() }
func (e *rejectedError) Unwrap() error { return e.cause }

// exhaustedError means every candidate that could answer failed, or the budget ran out.
type exhaustedError struct {
	class  mantlev1.ErrorClass
	cause  error
	tried  []string
	forced string // the ladder level an operator forced, when that is why
	// retryDenied: the retry budget refused the next attempt.
	retryDenied bool
	// partial: part of a streamed answer reached the caller, so no ladder answer may follow.
	partial bool
	// diverged: a fallback restarted the answer and said something else than the caller
	// already had.
	diverged bool
	// throttled: every candidate ended on its keys' rate limits; throttledFor is the soonest
	// a key is free again (0 when no provider said).
	throttled    bool
	throttledFor time.Duration
}

func (e *exhaustedError) Error() string {
	msg := "no candidate could answer"
	if e.forced != "" {
		return "route forced to the " + e.forced + " level"
	}
	switch {
	case e.class == mantlev1.ErrorClass_ERROR_CLASS_BUDGET_EXHAUSTED:
		msg = "the deadline budget ran out"
	case e.throttled:
		msg = "every candidate's provider keys are rate limited"
	case e.retryDenied:
		msg = "retry budget exhausted"
	case e.diverged:
		msg = "the stream broke mid-answer and a restart on a fallback diverged from the text already sent"
	}
	if len(e.tried) > 0 {
		msg += " (tried " + strings.Join(e.tried, ", ") + ")"
	}
	if e.cause != nil {
		msg += ": " + e.cause.Error()
	}
	return msg
}

func (e *exhaustedError) Unwrap() error { return e.cause }

// toStatus maps router errors to gRPC statuses; it is the only place that does. Statuses
// from the services the router called (quota's RESOURCE_EXHAUSTED with RetryInfo, say)
// pass through unchanged so callers see their details.
func toStatus(err error) error {
	var failed *failedRequest
	if errors.As(err, &failed) {
		out := toStatus(failed.err)
		st, ok := status.FromError(out)
		if !ok || failed.quality == nil {
			return out // not a status: the rpc backstop answers INTERNAL
		}
		if detailed, derr := st.WithDetails(detailQuality(failed.quality)); derr == nil {
			return detailed.Err()
		}
		return out
	}
	var (
		invalid  *rpc.ValidationError
		unknown  *unknownRouteError
		rejected *rejectedError
		exhaust  *exhaustedError
	)
	switch {
	case err == nil:
		return nil
	case errors.As(err, &invalid):
		return rpc.InvalidArgument(errorDomain, invalid)
	case errors.As(err, &unknown):
		return rpc.Status(codes.NotFound, errorDomain, ReasonUnknownRoute, unknown.Error())
	case errors.As(err, &rejected):
		if rejected.class == mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED {
			return rpc.Status(codes.FailedPrecondition, errorDomain, ReasonContentFiltered, providerMessage(rejected.cause))
		}
		return rpc.Status(codes.InvalidArgument, errorDomain, ReasonUpstreamRejected, "the provider rejected the request: "+providerMessage(rejected.cause))
	case errors.As(err, &exhaust):
		if exhaust.class == mantlev1.ErrorClass_ERROR_CLASS_BUDGET_EXHAUSTED {
			return rpc.Status(codes.DeadlineExceeded, errorDomain, ReasonDeadlineExceeded, exhaust.Error())
		}
		if exhaust.class == mantlev1.ErrorClass_ERROR_CLASS_CANCELED {
			return status.Error(codes.Canceled, "request canceled")
		}
		if exhaust.throttled {
			// Every provider key is rate limited: the truthful answer is "come back then",
			// which clients and SDKs honour (429 with Retry-After), not "the providers failed".
			var extra []protoadapt.MessageV1
			if exhaust.throttledFor > 0 {
				extra = append(extra, &errdetails.RetryInfo{RetryDelay: durationpb.New(exhaust.throttledFor)})
			}
			return rpc.Status(codes.ResourceExhausted, errorDomain, ReasonUpstreamRateLimited, exhaust.Error(), extra...)
		}
		return rpc.Status(codes.Unavailable, errorDomain, ReasonAllCandidatesFailed, exhaust.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, "request canceled")
	case errors.Is(err, context.DeadlineExceeded):
		return rpc.Status(codes.DeadlineExceeded, errorDomain, ReasonDeadlineExceeded, "deadline exceeded")
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return err // the rpc backstop logs it and answers INTERNAL
}

func providerMessage(err error) string {
	var pe *provider.Error
	if errors.As(err, &pe) && pe.Message != "" {
		return pe.Message
	}
	return err.Error()
}
