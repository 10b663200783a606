package router

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/provider"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

func TestToStatus(t *testing.T) {
	t.Parallel()
	overloaded := &provider.Error{Class: mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, StatusCode: 503, Message: "try later"}
	tests := []struct {
		name       string
		err        error
		wantCode   codes.Code
		wantReason string
		wantMsg    string // substring
	}{
		{"validation", rpc.Invalid("request.model", "required"), codes.InvalidArgument, rpc.ReasonInvalidRequest, "invalid request.model: required"},
		{"wrapped validation", fmt.Errorf("validate: %w", rpc.Invalid("request.model", "required")), codes.InvalidArgument, rpc.ReasonInvalidRequest, "request.model"},
		{"unknown route", &unknownRouteError{name: "gpt-9"}, codes.NotFound, ReasonUnknownRoute, `unknown model or route "gpt-9"`},
		{"content filtered", &rejectedError{class: mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED,
			cause: &provider.Error{Class: mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED, StatusCode: 400, Message: "flagged: self-harm"}},
			codes.FailedPrecondition, ReasonContentFiltered, "flagged: self-harm"},
		{"content filtered without a provider message", &rejectedError{class: mantlev1.ErrorClass_ERROR_CLASS_CONTENT_FILTERED, cause: errors.New("filtered")},
			codes.FailedPrecondition, ReasonContentFiltered, "filtered"},
		{"bad request", &rejectedError{class: mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST,
			cause: &provider.Error{Class: mantlev1.ErrorClass_ERROR_CLASS_BAD_REQUEST, StatusCode: 400, Message: "unsupported parameter: foo"}},
			codes.InvalidArgument, ReasonUpstreamRejected, "the provider rejected the request: unsupported parameter: foo"},
		{"budget", &exhaustedError{class: mantlev1.ErrorClass_ERROR_CLASS_BUDGET_EXHAUSTED, cause: overloaded, tried: []string{"a"}},
			codes.DeadlineExceeded, ReasonDeadlineExceeded, "the deadline budget ran out (tried a): provider: overloaded (HTTP 503): try later"},
		{"budget before any candidate", &exhaustedError{class: mantlev1.ErrorClass_ERROR_CLASS_BUDGET_EXHAUSTED},
			codes.DeadlineExceeded, ReasonDeadlineExceeded, "the deadline budget ran out"},
		{"canceled attempts", &exhaustedError{class: mantlev1.ErrorClass_ERROR_CLASS_CANCELED, cause: context.Canceled},
			codes.Canceled, "", "request canceled"},
		{"all candidates failed", &exhaustedError{class: mantlev1.ErrorClass_ERROR_CLASS_OVERLOADED, cause: overloaded, tried: []string{"a", "b"}},
			codes.Unavailable, ReasonAllCandidatesFailed, "no candidate could answer (tried a, b)"},
		{"context canceled", context.Canceled, codes.Canceled, "", "request canceled"},
		{"wrapped context canceled", fmt.Errorf("lookup: %w", context.Canceled), codes.Canceled, "", "request canceled"},
		{"context deadline", context.DeadlineExceeded, codes.DeadlineExceeded, ReasonDeadlineExceeded, "deadline exceeded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := toStatus(tt.err)
			st, ok := status.FromError(got)
			if !ok {
				t.Fatalf("toStatus(%v) = %v, not a status", tt.err, got)
			}
			if st.Code() != tt.wantCode {
				t.Errorf("code = %v, want %v", st.Code(), tt.wantCode)
			}
			info := rpc.ErrorInfo(got)
			if info.GetReason() != tt.wantReason {
				t.Errorf("reason = %q, want %q", info.GetReason(), tt.wantReason)
			}
			if info != nil && info.GetDomain() != errorDomain {
				t.Errorf("domain = %q, want %s", info.GetDomain(), errorDomain)
			}
			if !strings.Contains(st.Message(), tt.wantMsg) {
				t.Errorf("message = %q, want it to contain %q", st.Message(), tt.wantMsg)
			}
		})
	}
}

func TestToStatusPassesOtherStatusesThrough(t *testing.T) {
	t.Parallel()
	quota := rpc.ResourceExhausted("quota.mantle", "tenant:acme", "tenant acme is over its TPM", 3*time.Second)
	withDetails := rpc.Status(codes.PermissionDenied, "verifier.mantle", rpc.ReasonPermissionDenied, "tenant mismatch",
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "quality.tenant"}}})
	tests := []struct {
		name string
		err  error
	}{
		{"quota exhausted", quota},
		{"permission denied with details", withDetails},
		{"bare unavailable", status.Error(codes.Unavailable, "connection refused")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := toStatus(tt.err)
			if diff := cmp.Diff(status.Convert(tt.err).Proto(), status.Convert(got).Proto(), protocmp.Transform()); diff != "" {
				t.Errorf("status changed (-want +got):\n%s", diff)
			}
		})
	}
	if d, ok := rpc.RetryDelay(toStatus(quota)); !ok || d != 3*time.Second {
		t.Errorf("RetryDelay after toStatus = %v, %t; want 3s", d, ok)
	}
}

func TestToStatusLeavesOtherErrorsToTheBackstop(t *testing.T) {
	t.Parallel()
	if toStatus(nil) != nil {
		t.Error("toStatus(nil) != nil")
	}
	plain := errors.New("bug")
	if got := toStatus(plain); got != plain { //nolint:errorlint // the very same error, not one that wraps it
		t.Errorf("toStatus(plain) = %v, want the error unchanged for the rpc backstop", got)
	}
}
