package rpc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Stable ErrorInfo reasons shared by every service. Clients branch on these, never on
// message text.
const (
	ReasonInvalidRequest   = "INVALID_REQUEST"
	ReasonUnauthenticated  = "UNAUTHENTICATED"
	ReasonPermissionDenied = "PERMISSION_DENIED"
	ReasonQuotaExhausted   = "QUOTA_EXHAUSTED"
	ReasonInternal         = "INTERNAL"
	// ReasonOverloaded is a request refused because the server is short of capacity: a
	// moment's retry is expected, so the call log keeps it out of warnings.
	ReasonOverloaded = "OVERLOADED"
)

// FieldViolation names one invalid request field.
type FieldViolation struct {
	Field       string
	Description string
}

// ValidationError is a request that fails validation. Services return it from their domain
// code; Status turns it into INVALID_ARGUMENT with BadRequest details.
type ValidationError struct {
	Violations []FieldViolation
}

// Invalid builds a ValidationError with one violation.
func Invalid(field, format string, args ...any) *ValidationError {
	return &ValidationError{Violations: []FieldViolation{{Field: field, Description: fmt.Sprintf(format, args...)}}}
}

func (e *ValidationError) Error() string {
	if len(e.Violations) == 0 {
		return "invalid request"
	}
	v := e.Violations[0]
	msg := fmt.Sprintf("invalid %s: %s", v.Field, v.Description)
	if n := len(e.Violations) - 1; n > 0 {
		msg += fmt.Sprintf(" (and %d more)", n)
	}
	return msg
}

// Add appends a violation and returns the error for chaining.
func (e *ValidationError) Add(field, format string, args ...any) *ValidationError {
	e.Violations = append(e.Violations, FieldViolation{Field: field, Description: fmt.Sprintf(format, args...)})
	return e
}

// OrNil returns nil when there are no violations, so callers can collect and return once.
func (e *ValidationError) OrNil() error {
	if e == nil || len(e.Violations) == 0 {
		return nil
	}
	return e
}

// Status builds a gRPC status with an ErrorInfo detail and any extra details.
func Status(code codes.Code, domain, reason, msg string, extra ...protoadapt.MessageV1) error {
	st := status.New(code, msg)
	details := append([]protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: domain}}, extra...)
	withDetails, err := st.WithDetails(details...)
	if err != nil {
		// Details are our own well-formed messages; failing to attach them is a programming
		// error, and the bare status is still correct for the caller.
		return st.Err()
	}
	return withDetails.Err()
}

// InvalidArgument maps a ValidationError to INVALID_ARGUMENT with BadRequest details.
func InvalidArgument(domain string, v *ValidationError) error {
	br := &errdetails.BadRequest{}
	for _, fv := range v.Violations {
		br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{Field: fv.Field, Description: fv.Description})
	}
	return Status(codes.InvalidArgument, domain, ReasonInvalidRequest, v.Error(), br)
}

// ResourceExhausted builds RESOURCE_EXHAUSTED with RetryInfo and QuotaFailure details.
func ResourceExhausted(domain, subject, description string, retryAfter time.Duration) error {
	return Status(codes.ResourceExhausted, domain, ReasonQuotaExhausted, description,
		&errdetails.RetryInfo{RetryDelay: durationpb.New(retryAfter)},
		&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{Subject: subject, Description: description}}},
	)
}

// ErrorInfo returns the ErrorInfo detail of err, if it has one.
func ErrorInfo(err error) *errdetails.ErrorInfo {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	return nil
}

// RetryDelay returns the RetryInfo delay of err, if it has one.
func RetryDelay(err error) (time.Duration, bool) {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

// BadRequestFields returns the field names of err's BadRequest detail.
func BadRequestFields(err error) []string {
	var fields []string
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				fields = append(fields, v.GetField())
			}
		}
	}
	return fields
}

// ContextStatus is the status of an error that ends in the call's own context:
// CANCELLED or DEADLINE_EXCEEDED with err's message, so that a caller who gave up or ran
// out of time is not told of an internal error. It is nil for any other error. An error
// that wraps both counts as canceled. Services map their domain errors first and try
// this last, before INTERNAL.
func ContextStatus(err error) error {
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return nil
}
