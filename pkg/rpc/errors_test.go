package rpc_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/mantle-mesh/mantle/pkg/rpc"
)

func TestValidationErrorError(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  *rpc.ValidationError
		want string
	}{
		{"no violations", &rpc.ValidationError{}, "invalid request"},
		{"one", rpc.Invalid("request.model", "required"), "invalid request.model: required"},
		{"formatted", rpc.Invalid("request.max_tokens", "must be at most %d, got %d", 10, 11), "invalid request.max_tokens: must be at most 10, got 11"},
		{"three", rpc.Invalid("a", "x").Add("b", "y").Add("c", "z"), "invalid a: x (and 2 more)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := tt.err.Error(); got != tt.want {
				t.Errorf("Error() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestValidationErrorOrNil(t *testing.T) {
	t.Parallel()
	withOne := rpc.Invalid("request.model", "required")
	tests := []struct {
		name    string
		err     *rpc.ValidationError
		wantNil bool
	}{
		{"nil pointer", nil, true},
		{"empty", &rpc.ValidationError{}, true},
		{"one violation", withOne, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := tt.err.OrNil()
			if tt.wantNil {
				// A typed nil in an error interface would make `err != nil` true for callers.
				if got != nil {
					t.Fatalf("OrNil() = %#v, want untyped nil", got)
				}
				return
			}
			var v *rpc.ValidationError
			if !errors.As(got, &v) || v != tt.err {
				t.Fatalf("OrNil() = %v, want the same *ValidationError", got)
			}
		})
	}
}

// roundTrip sends err's status through its wire form, as a client would receive it.
func roundTrip(t *testing.T, err error) error {
	t.Helper()
	b, mErr := proto.Marshal(status.Convert(err).Proto())
	if mErr != nil {
		t.Fatalf("marshal status: %v", mErr)
	}
	var p spb.Status
	if uErr := proto.Unmarshal(b, &p); uErr != nil {
		t.Fatalf("unmarshal status: %v", uErr)
	}
	return status.FromProto(&p).Err()
}

func TestInvalidArgumentRoundTrip(t *testing.T) {
	t.Parallel()
	v := rpc.Invalid("request.model", "required").Add("request.messages[0].role", "bad role")
	err := roundTrip(t, rpc.InvalidArgument("router.mantle", v))

	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument {
		t.Errorf("code = %v, want InvalidArgument", st.Code())
	}
	if st.Message() != v.Error() {
		t.Errorf("message = %q, want %q", st.Message(), v.Error())
	}
	wantInfo := &errdetails.ErrorInfo{Reason: rpc.ReasonInvalidRequest, Domain: "router.mantle"}
	if info := rpc.ErrorInfo(err); !proto.Equal(info, wantInfo) {
		t.Errorf("ErrorInfo = %v, want %v", info, wantInfo)
	}
	if diff := cmp.Diff([]string{"request.model", "request.messages[0].role"}, rpc.BadRequestFields(err)); diff != "" {
		t.Errorf("BadRequestFields (-want +got):\n%s", diff)
	}
	if d, ok := rpc.RetryDelay(err); ok {
		t.Errorf("RetryDelay = %v, true; want none on INVALID_ARGUMENT", d)
	}
}

func TestResourceExhaustedRoundTrip(t *testing.T) {
	t.Parallel()
	err := roundTrip(t, rpc.ResourceExhausted("quota.mantle", "tenant:acme", "tenant acme is over its TPM", 1500*time.Millisecond))

	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted || st.Message() != "tenant acme is over its TPM" {
		t.Errorf("status = %v %q, want ResourceExhausted %q", st.Code(), st.Message(), "tenant acme is over its TPM")
	}
	if info := rpc.ErrorInfo(err); info.GetReason() != rpc.ReasonQuotaExhausted || info.GetDomain() != "quota.mantle" {
		t.Errorf("ErrorInfo = %v, want reason %s domain quota.mantle", info, rpc.ReasonQuotaExhausted)
	}
	if d, ok := rpc.RetryDelay(err); !ok || d != 1500*time.Millisecond {
		t.Errorf("RetryDelay = %v, %t; want 1.5s, true", d, ok)
	}
	var qf *errdetails.QuotaFailure
	for _, d := range st.Details() {
		if q, ok := d.(*errdetails.QuotaFailure); ok {
			qf = q
		}
	}
	if len(qf.GetViolations()) != 1 || qf.Violations[0].Subject != "tenant:acme" {
		t.Errorf("QuotaFailure = %v, want one violation for tenant:acme", qf)
	}
	if fields := rpc.BadRequestFields(err); fields != nil {
		t.Errorf("BadRequestFields = %v, want none", fields)
	}
}

func TestDetailHelpersOnErrorsWithoutDetails(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
	}{
		{"nil", nil},
		{"plain error", errors.New("boom")},
		{"bare status", status.Error(codes.Unavailable, "down")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if info := rpc.ErrorInfo(tt.err); info != nil {
				t.Errorf("ErrorInfo = %v, want nil", info)
			}
			if d, ok := rpc.RetryDelay(tt.err); ok {
				t.Errorf("RetryDelay = %v, true; want false", d)
			}
			if f := rpc.BadRequestFields(tt.err); f != nil {
				t.Errorf("BadRequestFields = %v, want nil", f)
			}
		})
	}
}

func TestStatusKeepsExtraDetails(t *testing.T) {
	t.Parallel()
	err := rpc.Status(codes.Unavailable, "router.mantle", "ALL_CANDIDATES_FAILED", "no candidate could answer",
		&errdetails.RetryInfo{})
	if got := status.Code(err); got != codes.Unavailable {
		t.Errorf("code = %v, want Unavailable", got)
	}
	if got := rpc.ErrorInfo(err).GetReason(); got != "ALL_CANDIDATES_FAILED" {
		t.Errorf("reason = %q, want ALL_CANDIDATES_FAILED", got)
	}
	if d, ok := rpc.RetryDelay(err); !ok || d != 0 {
		t.Errorf("RetryDelay = %v, %t; want 0, true", d, ok)
	}
}

func TestContextStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		err      error
		wantCode codes.Code // codes.OK: not a context error, nil status
		wantMsg  string
	}{
		{"nil", nil, codes.OK, ""},
		{"another error", errors.New("boom"), codes.OK, ""},
		{"canceled", context.Canceled, codes.Canceled, "context canceled"},
		{"wrapped canceled", fmt.Errorf("confirm: %w", context.Canceled), codes.Canceled, "confirm: context canceled"},
		{"deadline", context.DeadlineExceeded, codes.DeadlineExceeded, "context deadline exceeded"},
		{"wrapped deadline", fmt.Errorf("tool: %w", context.DeadlineExceeded), codes.DeadlineExceeded, "tool: context deadline exceeded"},
		{"both: canceled wins", errors.Join(context.DeadlineExceeded, context.Canceled), codes.Canceled, "context deadline exceeded\ncontext canceled"},
		{"a status is not a context error", status.Error(codes.Canceled, "upstream canceled"), codes.OK, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := rpc.ContextStatus(tt.err)
			if tt.wantCode == codes.OK {
				if got != nil {
					t.Fatalf("ContextStatus(%v) = %v, want nil", tt.err, got)
				}
				return
			}
			st, ok := status.FromError(got)
			if !ok || st.Code() != tt.wantCode || st.Message() != tt.wantMsg {
				t.Errorf("ContextStatus(%v) = %v, want %v %q", tt.err, got, tt.wantCode, tt.wantMsg)
			}
		})
	}
}
